"""The scheduler repository's PostgreSQL bulk forms agree with its row mapping (no database needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from services.scheduler.adapters.repository import (
    _UPSERT_THREADS,
    _iso,
    _state_row,
    _state_values,
    utc_state,
)
from services.scheduler.adapters.tables import scheduled_threads
from services.scheduler.domain.model import Level, PackageStatus, ThreadState

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def full_state() -> ThreadState:
    return ThreadState(
        thread_id="t1",
        project_id="p1",
        task_id="task",
        node_id="n1",
        worker_id="w1",
        codex_folder="/repo",
        level=Level.URGENT,
        remaining_pct=31.5,
        reported_must_finish=True,
        reported_must_finish_reason="uncommitted changes",
        master_must_finish=True,
        master_must_finish_reason="release",
        compaction_expected_at=NOW + timedelta(minutes=5),
        compaction_count=2,
        last_compaction_at=NOW - timedelta(hours=1),
        snapshot_version=7,
        captured_at=NOW,
        last_total_tokens=12_345,
        last_activity_at=NOW,
        task_importance=80,
        unsolidified_patch=True,
        busy=True,
        no_large_context_appends=True,
        finish_current_subtask=True,
        relay_thread_id="relay-1",
        current_package_id="pkg",
        current_package_status=PackageStatus.DRAFT,
        package_epoch=2,
        epoch=2,
        prepare_issued_at=NOW,
        commands_sent=frozenset({"prepare_handoff", "at_risk"}),
    )


def test_state_values_are_the_state_row_in_column_order_with_times_as_utc_text() -> None:
    state = full_state()
    row = _state_row(state, NOW)
    expected = [_iso(value) if isinstance(value, datetime) else value for value in row.values()]
    assert list(row) == list(scheduled_threads.c.keys())
    assert _state_values(state, _iso(NOW)) == expected
    empty = _state_values(ThreadState(thread_id="t2"), _iso(NOW))
    assert empty[:8] == ["t2", "", "", "", "", "", None, 100.0]


def test_the_array_upsert_names_every_column_once_in_table_order() -> None:
    names = ", ".join(f'"{column.name}"' for column in scheduled_threads.columns)
    assert f'INSERT INTO "scheduled_threads" ({names}) SELECT (item->>0), ' in _UPSERT_THREADS
    assert "(item->>7)::float8" in _UPSERT_THREADS and "(item->>16)::timestamptz" in _UPSERT_THREADS
    assert '"thread_id" = EXCLUDED' not in _UPSERT_THREADS


def test_utc_state_converts_other_offsets_and_keeps_utc_states_as_they_are() -> None:
    state = full_state()
    assert utc_state(state) is state
    plus_two = timezone(timedelta(hours=2))
    shifted = utc_state(ThreadState(thread_id="t", captured_at=NOW.astimezone(plus_two)))
    assert shifted.captured_at == NOW and shifted.captured_at.tzinfo is UTC
