"""A scheduler thread state with every field set, for tests of how states are stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
