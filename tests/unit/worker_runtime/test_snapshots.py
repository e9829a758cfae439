"""Reading -> ThreadContextSnapshot mapping, the worker's CB-7 level and the CB-8 must-finish rules."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from boss.context_budget.v1 import context_budget_pb2

from services.shared.time import from_timestamp
from worker.codex_sessions.budget import auto_compact_token_limit, context_budget_remaining_percent
from worker.codex_sessions.codex_config import LimitSource
from worker.codex_sessions.git_state import ChangedFile, DiffStat, GitState
from worker.codex_sessions.tracker import LastActivity, RecordedTestRun, ThreadBudgetReading, ToolRun
from worker.snapshots import (
    CRITICAL,
    MAX_REASON_CHARS,
    SAFE,
    URGENT,
    WATCH,
    Level,
    ThreadFacts,
    build_snapshot,
    level_for_percent,
    must_finish_before_compaction,
    same_reported_state,
    significant_change,
    snapshot_id_for,
    uncommitted_changes_reason,
    without_stale_prediction,
)

CAPTURED = datetime(2026, 3, 2, 9, 30, 15, 250_000, tzinfo=UTC)
THREAD = "019c8a4d-8f45-7010-8b5d-7fad920aa6f9"


def reading(**overrides: object) -> ThreadBudgetReading:
    values: dict[str, object] = {
        "codex_thread_id": THREAD,
        "cwd": "/home/dev/billing-api",
        "model": "gpt-5.3-codex",
        "last_total_tokens": 150_000,
        "model_context_window": 258_400,
        "context_window": 272_000,
        "auto_compact_token_limit": 244_800,
        "codex_context_left_pct": 44,
        "context_budget_remaining_pct": 40.5,
        "compaction_count": 1,
        "last_compaction_at": CAPTURED - timedelta(hours=1),
        "estimated_remaining_turns": 9,
        "estimated_remaining_large_messages": 11,
        "compaction_expected_at": CAPTURED + timedelta(minutes=42),
        "captured_at": CAPTURED,
        "reading_sequence": 17,
    }
    values.update(overrides)
    return ThreadBudgetReading(**values)  # type: ignore[arg-type]


def git_state(*paths: str) -> GitState:
    return GitState(
        folder=Path("/home/dev/billing-api"),
        branch="main",
        head_commit="86b4a8d9581d63089e53845daf7dd787129a9972",
        changed_files=tuple(ChangedFile(path=path, status=" M") for path in paths),
        has_uncommitted_changes=bool(paths),
        diff_stat=DiffStat(len(paths), 3 * len(paths), 0),
    )


def recorded_test_run(
    finished_at: datetime | None, outcome: str = "failed", summary: str | None = "2 failed, 5 passed"
) -> RecordedTestRun:
    run = ToolRun(
        call_id="call_1",
        tool_name="exec_command",
        command="pytest -q tests/test_invoices.py",
        arguments="{}",
        called_at=CAPTURED - timedelta(minutes=3),
        output=None if finished_at is None else "..F.F..\n2 failed, 5 passed in 0.41s",
        exit_code=None if finished_at is None else 1,
        finished_at=finished_at,
    )
    return RecordedTestRun(run, outcome, summary)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("percent", "level"),
    [
        (100.0, SAFE),
        (60.0, SAFE),
        (59.9, WATCH),
        (40.0, WATCH),
        (39.9, URGENT),
        (25.0, URGENT),
        (24.9, CRITICAL),
        (0.0, CRITICAL),
    ],
)
def test_level_for_percent_uses_cb7_defaults(percent: float, level: Level) -> None:
    assert level_for_percent(percent) == level


def test_snapshot_carries_every_reading_figure() -> None:
    snapshot = build_snapshot(reading(), thread_id=THREAD, worker_id="worker-mac", node_id="mac")

    assert snapshot.thread_id == THREAD
    assert snapshot.worker_id == "worker-mac"
    assert snapshot.node_id == "mac"
    assert snapshot.source_kind == context_budget_pb2.SOURCE_KIND_WORKER_ESTIMATOR
    assert snapshot.snapshot_version == 17
    assert snapshot.context_budget_remaining_pct == 40.5
    assert snapshot.context_budget_level == WATCH
    assert snapshot.last_total_tokens == 150_000
    assert snapshot.model_context_window == 258_400
    assert snapshot.auto_compact_token_limit == 244_800
    assert snapshot.HasField("codex_context_left_pct")
    assert snapshot.codex_context_left_pct == 44
    assert snapshot.compaction_count == 1
    assert from_timestamp(snapshot.captured_at) == CAPTURED
    assert from_timestamp(snapshot.last_compaction_at) == CAPTURED - timedelta(hours=1)
    assert from_timestamp(snapshot.compaction_expected_at) == CAPTURED + timedelta(minutes=42)
    assert snapshot.estimated_remaining_turns == 9
    assert snapshot.estimated_remaining_large_messages == 11
    assert snapshot.codex_folder == "/home/dev/billing-api"
    assert snapshot.project_id == ""
    assert snapshot.must_finish_before_compaction is False
    assert snapshot.must_finish_reason == ""


def test_absent_estimates_stay_unset() -> None:
    snapshot = build_snapshot(
        reading(
            estimated_remaining_turns=None,
            estimated_remaining_large_messages=None,
            compaction_expected_at=None,
            last_compaction_at=None,
            compaction_count=0,
        ),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
    )

    assert not snapshot.HasField("estimated_remaining_turns")
    assert not snapshot.HasField("estimated_remaining_large_messages")
    assert not snapshot.HasField("compaction_expected_at")
    assert not snapshot.HasField("last_compaction_at")


def test_percent_is_the_d1_value_of_the_raw_figures() -> None:
    total = 212_134
    limit = auto_compact_token_limit(272_000)
    percent = context_budget_remaining_percent(total, limit)
    snapshot = build_snapshot(
        reading(last_total_tokens=total, context_budget_remaining_pct=percent),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
    )

    expected = round(100 * (limit - total) / (limit - 12_000), 1)
    assert snapshot.context_budget_remaining_pct == pytest.approx(expected)
    assert snapshot.context_budget_level == CRITICAL


def test_project_and_task_come_from_the_facts() -> None:
    snapshot = build_snapshot(
        reading(),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
        facts=ThreadFacts(project_id="proj-7", task_id="task-3"),
    )

    assert (snapshot.project_id, snapshot.task_id) == ("proj-7", "task-3")


def test_snapshot_id_is_a_stable_uuid5_of_the_reading() -> None:
    first = build_snapshot(reading(), thread_id=THREAD, worker_id="w", node_id="n")
    again = build_snapshot(reading(), thread_id=THREAD, worker_id="w", node_id="n")
    next_version = build_snapshot(reading(reading_sequence=18), thread_id=THREAD, worker_id="w", node_id="n")
    other_worker = build_snapshot(reading(), thread_id=THREAD, worker_id="w2", node_id="n")

    assert first.snapshot_id == again.snapshot_id
    assert uuid.UUID(first.snapshot_id).version == 5
    assert len({first.snapshot_id, next_version.snapshot_id, other_worker.snapshot_id}) == 3


def test_snapshot_id_matches_the_servers_derivation() -> None:
    validation = pytest.importorskip("services.context_budget.domain.validation")
    micros = (CAPTURED - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    assert snapshot_id_for("w", THREAD, 17, CAPTURED) == validation.derive_snapshot_id(
        "w", THREAD, 17, micros
    )


def test_snapshot_id_rejects_a_naive_instant() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        snapshot_id_for("w", THREAD, 1, datetime(2026, 3, 2, 9, 0))


def test_a_later_captured_at_gives_a_new_id_for_the_same_reading() -> None:
    base = build_snapshot(reading(), thread_id=THREAD, worker_id="w", node_id="n")
    restamped = build_snapshot(
        reading(),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
        captured_at=CAPTURED + timedelta(microseconds=1),
    )

    assert restamped.snapshot_id != base.snapshot_id
    assert restamped.snapshot_version == base.snapshot_version
    assert from_timestamp(restamped.captured_at) == CAPTURED + timedelta(microseconds=1)
    assert same_reported_state(base, restamped)


def test_same_reported_state_sees_a_must_finish_change() -> None:
    clean = build_snapshot(reading(), thread_id=THREAD, worker_id="w", node_id="n")
    dirty = build_snapshot(
        reading(),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
        facts=ThreadFacts(git_state=git_state("a.py")),
    )

    assert not same_reported_state(clean, dirty)


def test_uncommitted_changes_set_must_finish_with_the_files_named() -> None:
    verdict = must_finish_before_compaction(git_state("a.py", "b.py", "src/c.py"), None)

    assert verdict.required is True
    assert verdict.reason == "uncommitted changes in 3 files: a.py, b.py, src/c.py"


def test_many_uncommitted_files_are_abbreviated() -> None:
    paths = [f"f{index}.py" for index in range(8)]

    assert (
        uncommitted_changes_reason(paths)
        == "uncommitted changes in 8 files: f0.py, f1.py, f2.py, f3.py, f4.py, …"
    )
    assert uncommitted_changes_reason(["only.py"]) == "uncommitted changes in 1 file: only.py"


def test_clean_or_unknown_git_state_does_not_require_finishing() -> None:
    assert must_finish_before_compaction(git_state(), None).required is False
    assert must_finish_before_compaction(None, None).required is False


def test_unsummarised_test_result_requires_finishing() -> None:
    finished = CAPTURED - timedelta(minutes=2)
    activity = LastActivity(
        last_agent_message="Running the tests now.",
        last_agent_message_at=CAPTURED - timedelta(minutes=4),
        last_test_run=recorded_test_run(finished),
    )

    verdict = must_finish_before_compaction(None, activity)

    assert verdict.required is True
    assert (
        verdict.reason
        == "test result not yet summarised: `pytest -q tests/test_invoices.py` failed (2 failed, 5 passed)"
    )


def test_summarised_or_running_tests_do_not_require_finishing() -> None:
    finished = CAPTURED - timedelta(minutes=2)
    summarised = LastActivity(
        last_agent_message="Two tests fail: the rounding rule is off by a cent.",
        last_agent_message_at=finished + timedelta(seconds=5),
        last_test_run=recorded_test_run(finished),
    )
    running = LastActivity(last_test_run=recorded_test_run(None, outcome="running", summary=None))

    assert must_finish_before_compaction(None, summarised).required is False
    assert must_finish_before_compaction(None, running).required is False


def test_both_rules_are_joined_in_the_reason() -> None:
    activity = LastActivity(
        last_test_run=recorded_test_run(CAPTURED, outcome="passed", summary="7 passed in 0.40s")
    )

    verdict = must_finish_before_compaction(git_state("a.py"), activity)

    assert verdict.reason == (
        "uncommitted changes in 1 file: a.py; "
        "test result not yet summarised: `pytest -q tests/test_invoices.py` passed (7 passed in 0.40s)"
    )


def test_reason_is_cleaned_of_control_characters_and_capped() -> None:
    colourful = LastActivity(
        last_test_run=recorded_test_run(CAPTURED, outcome="failed", summary="\x1b[31m1 failed\x1b[0m in 0.1s")
    )
    long_paths = git_state(*[("x" * 900) + f"{index}.py" for index in range(5)], "new\nline.py")

    colour_reason = must_finish_before_compaction(None, colourful).reason
    long_reason = must_finish_before_compaction(long_paths, None).reason

    assert colour_reason.endswith("failed (1 failed in 0.1s)")
    assert len(long_reason) == MAX_REASON_CHARS
    assert long_reason.endswith("…")
    assert "\n" not in must_finish_before_compaction(git_state("new\nline.py"), None).reason


def test_snapshot_records_the_must_finish_verdict() -> None:
    snapshot = build_snapshot(
        reading(),
        thread_id=THREAD,
        worker_id="w",
        node_id="n",
        facts=ThreadFacts(git_state=git_state("src/invoices.py")),
    )

    assert snapshot.must_finish_before_compaction is True
    assert snapshot.must_finish_reason == "uncommitted changes in 1 file: src/invoices.py"


def test_a_prediction_already_in_the_past_is_dropped_not_reported() -> None:
    """An idle thread's extrapolated compaction time lies in the past: it is absent, not invented."""
    stale = reading()
    expected = stale.compaction_expected_at
    assert expected is not None
    assert without_stale_prediction(stale, expected - timedelta(seconds=1)) is stale
    assert without_stale_prediction(stale, expected + timedelta(seconds=1)).compaction_expected_at is None


def test_the_snapshot_says_where_l_came_from() -> None:
    for source, number in (
        (LimitSource.CONFIGURED, context_budget_pb2.COMPACTION_LIMIT_SOURCE_CONFIGURED),
        (LimitSource.MODEL_DEFAULT, context_budget_pb2.COMPACTION_LIMIT_SOURCE_MODEL_DEFAULT),
        (LimitSource.ASSUMED, context_budget_pb2.COMPACTION_LIMIT_SOURCE_ASSUMED),
    ):
        snapshot = build_snapshot(
            reading(compaction_limit_source=source), thread_id=THREAD, worker_id="w", node_id="n"
        )
        assert snapshot.compaction_limit_source == number


def test_a_compaction_awaiting_its_first_reading_is_reported_as_such() -> None:
    awaiting = reading(
        last_total_tokens=0,
        codex_context_left_pct=None,
        context_budget_remaining_pct=100.0,
        compaction_count=2,
        last_compaction_at=CAPTURED,
        estimated_remaining_turns=None,
        estimated_remaining_large_messages=None,
        compaction_expected_at=None,
        awaiting_reading_after_compaction=True,
    )
    before = build_snapshot(
        reading(context_budget_remaining_pct=12.0), thread_id=THREAD, worker_id="w", node_id="n"
    )
    snapshot = build_snapshot(awaiting, thread_id=THREAD, worker_id="w", node_id="n")
    assert snapshot.awaiting_reading_after_compaction
    assert not snapshot.HasField("codex_context_left_pct")
    assert (snapshot.last_total_tokens, snapshot.context_budget_remaining_pct) == (0, 100.0)
    assert snapshot.context_budget_level == SAFE
    assert from_timestamp(snapshot.last_compaction_at) == CAPTURED
    assert not snapshot.HasField("compaction_expected_at")
    # It is sent at once: its compaction count (and level) changed.
    assert significant_change(before, snapshot) is not None
