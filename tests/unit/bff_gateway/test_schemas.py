"""Validation of the ingest body (pydantic model; pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from services.bff_gateway.schemas import ThreadContextReport
from tests.unit.bff_gateway.seed_example import SEED


def rejected_fields(**changes: object) -> list[str]:
    """The fields pydantic names when the seed body with `changes` is validated (it must fail)."""
    with pytest.raises(ValidationError) as caught:
        ThreadContextReport.model_validate({**SEED, **changes})
    return [".".join(str(part) for part in error["loc"]) for error in caught.value.errors()]


def test_seed_body_is_valid_and_instants_become_utc() -> None:
    report = ThreadContextReport.model_validate(SEED)

    assert report.captured_at == datetime(2026, 3, 25, 7, 56, tzinfo=UTC)
    assert report.captured_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("bad", [True, False, "37", "abc", None, float("nan"), float("inf"), 100.01, -1])
def test_percent_takes_only_finite_numbers_in_0_100(bad: object) -> None:
    assert rejected_fields(context_budget_remaining_pct=bad) == ["context_budget_remaining_pct"]


@pytest.mark.parametrize("good", [0, 100, 37.25, 0.0])
def test_percent_accepts_numbers_in_range(good: float) -> None:
    assert ThreadContextReport.model_validate({**SEED, "context_budget_remaining_pct": good})


def test_integer_fields_reject_booleans_fractions_and_strings_but_take_whole_floats() -> None:
    assert rejected_fields(compaction_count=True) == ["compaction_count"]
    assert rejected_fields(compaction_count=1.5) == ["compaction_count"]
    assert rejected_fields(estimated_remaining_turns="5") == ["estimated_remaining_turns"]
    assert rejected_fields(codex_context_left_pct=101) == ["codex_context_left_pct"]
    assert rejected_fields(last_total_tokens=2**53) == ["last_total_tokens"]
    assert ThreadContextReport.model_validate({**SEED, "compaction_count": 3.0}).compaction_count == 3


def test_boolean_field_takes_only_json_booleans() -> None:
    assert rejected_fields(must_finish_before_compaction=1) == ["must_finish_before_compaction"]
    assert rejected_fields(must_finish_before_compaction="true") == ["must_finish_before_compaction"]


@pytest.mark.parametrize(
    "bad", ["2026-03-25T15:56:00", "2026-03-25", "1774425360", 1774425360, "25/03/2026 15:56 +08:00"]
)
def test_instants_need_rfc3339_text_with_offset(bad: object) -> None:
    assert rejected_fields(captured_at=bad) == ["captured_at"]


def test_instant_outside_utc_years_1_to_9999_is_rejected_not_raised() -> None:
    assert rejected_fields(captured_at="0001-01-01T00:00:00+01:00") == ["captured_at"]
    assert rejected_fields(last_compaction_at="9999-12-31T23:59:59-01:00") == ["last_compaction_at"]


def test_z_and_fractional_seconds_are_accepted() -> None:
    report = ThreadContextReport.model_validate({**SEED, "captured_at": "2026-03-25T07:56:00.123456Z"})

    assert report.captured_at == datetime(2026, 3, 25, 7, 56, 0, 123456, tzinfo=UTC)


def test_unknown_enum_values_and_unknown_fields_are_rejected() -> None:
    assert rejected_fields(context_budget_level="panic") == ["context_budget_level"]
    assert rejected_fields(source_kind="codex_cli") == ["source_kind"]
    assert rejected_fields(context_budget_remaining_percent=37) == ["context_budget_remaining_percent"]


def test_text_must_be_utf8_without_nul_and_ids_non_empty() -> None:
    assert rejected_fields(thread_id="") == ["thread_id"]
    assert rejected_fields(node_id="mac\x00-01") == ["node_id"]
    assert rejected_fields(codex_folder="/home/\ud800") == ["codex_folder"]
    assert rejected_fields(worker_id="w" * 201) == ["worker_id"]
