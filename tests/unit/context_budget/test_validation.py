"""Snapshot validation: every rule, collected violations, field paths, and property tests."""

from __future__ import annotations

import math
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.context_budget.domain.model import (
    CompactionLimitSource,
    ContextBudgetLevel,
    SnapshotInput,
    SourceKind,
)
from services.context_budget.domain.validation import (
    SNAPSHOT_ID_NAMESPACE,
    derive_snapshot_id,
    validate_batch_size,
    validate_snapshot,
)
from services.shared.errors import InvalidArgument
from services.shared.identifiers import THREAD_ID_CHARACTERS
from tests.unit.context_budget.factories import NOW, make_input, raw_timestamp


def violations_of(raw: SnapshotInput, prefix: str = "snapshot") -> list[str]:
    with pytest.raises(InvalidArgument) as raised:
        validate_snapshot(raw, now=NOW, prefix=prefix)
    return [v.field for v in raised.value.violations]


def test_seed_example_is_valid_and_converted() -> None:
    snapshot = validate_snapshot(make_input(), now=NOW, prefix="snapshot")
    assert snapshot.source_kind is SourceKind.WORKER_ESTIMATOR
    assert snapshot.reported_level is ContextBudgetLevel.URGENT
    assert snapshot.captured_at == NOW - timedelta(seconds=5)
    assert snapshot.captured_at.tzinfo is not None
    assert snapshot.compaction_expected_at == NOW + timedelta(minutes=12, seconds=30)
    assert snapshot.last_compaction_at == NOW - timedelta(minutes=44)
    assert snapshot.estimated_remaining_turns == 5
    assert (snapshot.last_total_tokens, snapshot.model_context_window, snapshot.auto_compact_token_limit) == (
        160_000,
        258_400,
        244_800,
    )


def test_missing_snapshot_id_is_derived_stably() -> None:
    first = validate_snapshot(make_input(), now=NOW, prefix="s")
    again = validate_snapshot(make_input(), now=NOW + timedelta(seconds=3), prefix="s")
    other_version = validate_snapshot(make_input(snapshot_version=8), now=NOW, prefix="s")
    captured_us = (NOW - timedelta(seconds=5) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert first.snapshot_id == again.snapshot_id
    assert first.snapshot_id == derive_snapshot_id("worker-mac-01", "thread-abc", 7, captured_us)
    assert other_version.snapshot_id != first.snapshot_id
    assert validate_snapshot(make_input(snapshot_id="mine"), now=NOW, prefix="s").snapshot_id == "mine"


def test_all_violations_are_collected_with_stream_paths() -> None:
    raw = make_input(
        thread_id="",
        worker_id="w\x00",
        source_kind=0,
        context_budget_remaining_pct=math.nan,
        captured_at=None,
        compaction_count=-1,
    )
    assert violations_of(raw, prefix="snapshots[3]") == [
        "snapshots[3].thread_id",
        "snapshots[3].worker_id",
        "snapshots[3].source_kind",
        "snapshots[3].context_budget_remaining_pct",
        "snapshots[3].captured_at",
        "snapshots[3].compaction_count",
    ]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.01, 100.01])
def test_budget_must_be_a_finite_percentage(value: float) -> None:
    assert violations_of(make_input(context_budget_remaining_pct=value)) == [
        "snapshot.context_budget_remaining_pct"
    ]


@pytest.mark.parametrize("value", [0.0, 100.0, 24.999])
def test_budget_bounds_are_inclusive(value: float) -> None:
    snapshot = validate_snapshot(make_input(context_budget_remaining_pct=value), now=NOW, prefix="s")
    assert snapshot.context_budget_remaining_pct == value


def test_unknown_enum_numbers_are_rejected_not_raised() -> None:
    assert violations_of(make_input(source_kind=99)) == ["snapshot.source_kind"]
    assert violations_of(make_input(source_kind=-3)) == ["snapshot.source_kind"]
    assert violations_of(make_input(context_budget_level=9)) == ["snapshot.context_budget_level"]


def test_unset_reported_level_is_fine() -> None:
    assert validate_snapshot(make_input(context_budget_level=0), now=NOW, prefix="s").reported_level is None


def test_captured_at_window() -> None:
    five_minutes = NOW + timedelta(minutes=5)
    validate_snapshot(make_input(captured_at=raw_timestamp(five_minutes)), now=NOW, prefix="s")
    too_late = raw_timestamp(five_minutes + timedelta(microseconds=1))
    assert violations_of(make_input(captured_at=too_late)) == ["snapshot.captured_at"]
    assert violations_of(make_input(captured_at=(946_684_799, 999_999_999))) == ["snapshot.captured_at"]
    validate_snapshot(make_input(captured_at=(946_684_800, 0), last_compaction_at=None), now=NOW, prefix="s")
    assert violations_of(make_input(captured_at=(1_700_000_000, -1))) == ["snapshot.captured_at"]
    assert violations_of(make_input(captured_at=(1_700_000_000, 1_000_000_000))) == ["snapshot.captured_at"]
    assert violations_of(make_input(captured_at=(10**15, 0))) == ["snapshot.captured_at"]


def test_optional_instants_must_be_sane() -> None:
    assert violations_of(make_input(compaction_expected_at=(0, 0))) == ["snapshot.compaction_expected_at"]
    far = raw_timestamp(datetime(2100, 1, 1, 0, 0, 1, tzinfo=UTC))
    assert violations_of(make_input(compaction_expected_at=far)) == ["snapshot.compaction_expected_at"]
    future = raw_timestamp(NOW + timedelta(minutes=6))
    assert violations_of(make_input(last_compaction_at=future)) == ["snapshot.last_compaction_at"]
    none = validate_snapshot(
        make_input(compaction_expected_at=None, last_compaction_at=None), now=NOW, prefix="s"
    )
    assert none.compaction_expected_at is None and none.last_compaction_at is None


@pytest.mark.parametrize(
    "field",
    [
        "compaction_count",
        "estimated_remaining_turns",
        "estimated_remaining_large_messages",
        "last_total_tokens",
        "model_context_window",
        "auto_compact_token_limit",
    ],
)
def test_counts_and_token_figures_must_not_be_negative(field: str) -> None:
    assert violations_of(make_input(**{field: -1})) == [f"snapshot.{field}"]


def test_codex_percent_and_version_bounds() -> None:
    assert violations_of(make_input(codex_context_left_pct=101)) == ["snapshot.codex_context_left_pct"]
    assert violations_of(make_input(snapshot_version=2**63)) == ["snapshot.snapshot_version"]
    validate_snapshot(
        make_input(snapshot_version=2**63 - 1, codex_context_left_pct=None), now=NOW, prefix="s"
    )


def test_identifiers_length_and_control_characters() -> None:
    validate_snapshot(make_input(thread_id="t" * 200, project_id="", task_id=""), now=NOW, prefix="s")
    assert violations_of(make_input(thread_id="t" * 201)) == ["snapshot.thread_id"]
    assert violations_of(make_input(node_id="a\nb")) == ["snapshot.node_id"]
    assert violations_of(make_input(project_id="p\x7f")) == ["snapshot.project_id"]
    assert violations_of(make_input(snapshot_id="s\x85")) == ["snapshot.snapshot_id"]
    assert violations_of(make_input(worker_id="w\u202e1")) == ["snapshot.worker_id"]


@pytest.mark.parametrize("thread_id", ["a/b", "a\u202eb", "x\u200fy", "caf\u00e9", "with space", "tab\tid"])
def test_a_thread_id_outside_the_documented_alphabet_is_refused(thread_id: str) -> None:
    assert violations_of(make_input(thread_id=thread_id)) == ["snapshot.thread_id"]


def test_a_uuid_and_the_other_characters_of_the_alphabet_make_a_thread_id() -> None:
    for thread_id in ("0199c2a4-5b1e-7c2d-9e3f-a1b2c3d4e5f6", "Team_1.thread:2@node+x"):
        assert validate_snapshot(make_input(thread_id=thread_id), now=NOW, prefix="s").thread_id == thread_id


def test_reason_allows_newlines_but_not_other_control_characters() -> None:
    validate_snapshot(make_input(must_finish_reason="patch\n\ttests"), now=NOW, prefix="s")
    assert violations_of(make_input(must_finish_reason="bell\x07")) == ["snapshot.must_finish_reason"]
    assert violations_of(make_input(codex_folder="/a\nb")) == ["snapshot.codex_folder"]
    assert violations_of(make_input(must_finish_reason="x" * 2_001)) == ["snapshot.must_finish_reason"]


def test_batch_size_rules() -> None:
    validate_batch_size(1)
    validate_batch_size(1_000)
    for count in (0, 1_001):
        with pytest.raises(InvalidArgument) as raised:
            validate_batch_size(count)
        assert [v.field for v in raised.value.violations] == ["snapshots"]


# --- property tests ------------------------------------------------------------------------------

EARLY = datetime(2000, 1, 1, tzinfo=UTC)
ids = st.text(
    alphabet=st.characters(blacklist_categories=["Cc", "Cs"], blacklist_characters="\x85"),
    min_size=1,
    max_size=200,
)
optional_ids = st.one_of(st.just(""), ids)
thread_ids = st.text(alphabet=sorted(THREAD_ID_CHARACTERS), min_size=1, max_size=200)
past_instants = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=NOW.replace(tzinfo=None) + timedelta(minutes=5),
    timezones=st.just(UTC),
)
expected_instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC)
)
non_negative_int32 = st.integers(min_value=0, max_value=2**31 - 1)
non_negative_int64 = st.integers(min_value=0, max_value=2**63 - 1)
clean_text = st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"]), max_size=50)


@st.composite
def valid_inputs(draw: st.DrawFn) -> SnapshotInput:
    return SnapshotInput(
        snapshot_id=draw(optional_ids),
        project_id=draw(optional_ids),
        task_id=draw(optional_ids),
        thread_id=draw(thread_ids),
        node_id=draw(ids),
        worker_id=draw(ids),
        source_kind=draw(st.integers(1, 3)),
        context_budget_remaining_pct=draw(st.floats(0, 100, allow_nan=False)),
        context_budget_level=draw(st.integers(0, 4)),
        compaction_expected_at=draw(st.none() | expected_instants.map(raw_timestamp)),
        must_finish_before_compaction=draw(st.booleans()),
        estimated_remaining_turns=draw(st.none() | non_negative_int32),
        estimated_remaining_large_messages=draw(st.none() | non_negative_int32),
        last_compaction_at=draw(st.none() | past_instants.map(raw_timestamp)),
        compaction_count=draw(non_negative_int32),
        snapshot_version=draw(st.integers(0, 2**64 - 1).filter(lambda v: v < 2**63)),
        captured_at=draw(past_instants.map(raw_timestamp)),
        last_total_tokens=draw(non_negative_int64),
        model_context_window=draw(non_negative_int64),
        auto_compact_token_limit=draw(non_negative_int64),
        codex_context_left_pct=draw(st.none() | st.integers(0, 100)),
        must_finish_reason=draw(clean_text),
        codex_folder=draw(clean_text),
    )


bad_ids = st.sampled_from(["", "x" * 201, "a\x00b", "tab\tid", "del\x7f"])
bad_optional_ids = st.sampled_from(["x" * 201, "a\x00b", "line\nbreak"])
too_early = st.integers(-(10**10), 946_684_799).map(lambda s: (s, 0))
too_late = st.integers(int(NOW.timestamp()) + 301, 10**12).map(lambda s: (s, 0))
bad_nanos = st.tuples(
    st.integers(946_684_800, 1_700_000_000), st.sampled_from([-1, 1_000_000_000, 2**31 - 1])
)
negative = st.integers(max_value=-1, min_value=-(2**31))

CORRUPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "thread_id": bad_ids,
    "node_id": bad_ids,
    "worker_id": bad_ids,
    "project_id": bad_optional_ids,
    "task_id": bad_optional_ids,
    "snapshot_id": bad_optional_ids,
    "source_kind": st.sampled_from([0, 4, 5, 99, -1]),
    "context_budget_remaining_pct": st.sampled_from([math.nan, math.inf, -math.inf])
    | st.floats(min_value=100.0, exclude_min=True, allow_infinity=False)
    | st.floats(max_value=0.0, exclude_max=True, allow_infinity=False),
    "context_budget_level": st.integers(5, 2**31 - 1) | st.integers(-(2**31), -1),
    "captured_at": st.none() | too_early | too_late | bad_nanos,
    "compaction_expected_at": too_early
    | st.integers(4_102_444_801, 10**12).map(lambda s: (s, 0))
    | bad_nanos,
    "last_compaction_at": too_early | too_late | bad_nanos,
    "compaction_count": negative,
    "estimated_remaining_turns": negative,
    "estimated_remaining_large_messages": negative,
    "last_total_tokens": st.integers(max_value=-1, min_value=-(2**63)),
    "model_context_window": st.integers(max_value=-1, min_value=-(2**63)),
    "auto_compact_token_limit": st.integers(max_value=-1, min_value=-(2**63)),
    "codex_context_left_pct": st.integers(101, 2**31 - 1) | negative,
    "snapshot_version": st.integers(2**63, 2**64 - 1),
    "must_finish_reason": st.sampled_from(["\x07", "x" * 2_001, "nul\x00"]),
    "codex_folder": st.sampled_from(["/a\nb", "x" * 4_097, "\x1b[31m"]),
}


@settings(max_examples=200, deadline=None)
@given(raw=valid_inputs())
def test_valid_random_snapshots_pass(raw: SnapshotInput) -> None:
    snapshot = validate_snapshot(raw, now=NOW, prefix="snapshot")
    assert snapshot.thread_id == raw.thread_id
    assert snapshot.snapshot_id
    assert EARLY <= snapshot.captured_at <= NOW + timedelta(minutes=5)


@settings(max_examples=300, deadline=None)
@given(
    raw=valid_inputs(), field=st.sampled_from(sorted(CORRUPTIONS)), index=st.integers(0, 999), data=st.data()
)
def test_any_single_corrupted_field_is_reported_by_its_name(
    raw: SnapshotInput, field: str, index: int, data: st.DataObject
) -> None:
    corrupted = replace(raw, **{field: data.draw(CORRUPTIONS[field], label=field)})
    with pytest.raises(InvalidArgument) as raised:
        validate_snapshot(corrupted, now=NOW, prefix=f"snapshots[{index}]")
    assert [v.field for v in raised.value.violations] == [f"snapshots[{index}].{field}"]


@given(worker=ids, thread=ids, version=st.integers(0, 2**63 - 1), micros=st.integers(0, 2**62))
def test_derived_id_is_the_rfc4122_uuid5_of_the_reading(
    worker: str, thread: str, version: int, micros: int
) -> None:
    expected = uuid.uuid5(SNAPSHOT_ID_NAMESPACE, f"{worker}\n{thread}\n{version}\n{micros}")
    assert derive_snapshot_id(worker, thread, version, micros) == str(expected)


def test_the_compaction_limit_source_and_the_awaiting_flag_are_kept() -> None:
    snapshot = validate_snapshot(
        make_input(compaction_limit_source=1, awaiting_reading_after_compaction=True),
        now=NOW,
        prefix="snapshot",
    )
    assert snapshot.compaction_limit_source is CompactionLimitSource.CONFIGURED
    assert snapshot.awaiting_reading_after_compaction is True
    unset = validate_snapshot(make_input(), now=NOW, prefix="snapshot")
    assert (unset.compaction_limit_source, unset.awaiting_reading_after_compaction) == (None, False)


def test_an_unknown_compaction_limit_source_is_rejected_naming_the_field() -> None:
    assert violations_of(make_input(compaction_limit_source=7)) == ["snapshot.compaction_limit_source"]
