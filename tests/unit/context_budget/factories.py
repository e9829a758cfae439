"""Builders of valid domain values for the context budget unit tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from services.context_budget.domain.model import (
    ContextBudgetLevel,
    Snapshot,
    SnapshotInput,
    SourceKind,
    ThreadState,
)

NOW = datetime(2026, 3, 25, 8, 0, tzinfo=UTC)


def raw_timestamp(value: datetime) -> tuple[int, int]:
    """(seconds, nanos) of an aware datetime, as protobuf carries it."""
    micros = (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return micros // 1_000_000, (micros % 1_000_000) * 1_000


def make_input(**overrides: Any) -> SnapshotInput:
    """A valid snapshot as sent (seed §5.2 example values), with `overrides`."""
    base = SnapshotInput(
        snapshot_id="",
        project_id="proj-001",
        task_id="task-017",
        thread_id="thread-abc",
        node_id="mac-01",
        worker_id="worker-mac-01",
        source_kind=3,
        context_budget_remaining_pct=37.0,
        context_budget_level=3,
        compaction_expected_at=raw_timestamp(NOW + timedelta(minutes=12, seconds=30)),
        must_finish_before_compaction=True,
        estimated_remaining_turns=5,
        estimated_remaining_large_messages=2,
        last_compaction_at=raw_timestamp(NOW - timedelta(minutes=44)),
        compaction_count=1,
        snapshot_version=7,
        captured_at=raw_timestamp(NOW - timedelta(seconds=5)),
        last_total_tokens=160_000,
        model_context_window=258_400,
        auto_compact_token_limit=244_800,
        codex_context_left_pct=40,
        must_finish_reason="uncommitted changes in 3 files",
        codex_folder="/src/app",
    )
    return replace(base, **overrides)


def make_snapshot(**overrides: Any) -> Snapshot:
    """A valid, validated snapshot with `overrides` (no compaction expectation by default)."""
    base = Snapshot(
        snapshot_id="snap-1",
        project_id="proj-001",
        task_id="task-017",
        thread_id="thread-abc",
        node_id="mac-01",
        worker_id="worker-mac-01",
        source_kind=SourceKind.WORKER_ESTIMATOR,
        context_budget_remaining_pct=80.0,
        reported_level=None,
        compaction_expected_at=None,
        must_finish_before_compaction=False,
        estimated_remaining_turns=None,
        estimated_remaining_large_messages=None,
        last_compaction_at=None,
        compaction_count=0,
        snapshot_version=1,
        captured_at=NOW - timedelta(seconds=5),
        last_total_tokens=50_000,
        model_context_window=258_400,
        auto_compact_token_limit=244_800,
        codex_context_left_pct=85,
        must_finish_reason="",
        codex_folder="/src/app",
    )
    return replace(base, **overrides)


def make_state(snapshot: Snapshot, level: ContextBudgetLevel, **overrides: Any) -> ThreadState:
    """A stored current state of `snapshot` at `level`."""
    base = ThreadState(snapshot, level, None, None, NOW - timedelta(minutes=1))
    return replace(base, **overrides)
