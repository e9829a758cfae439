"""The request body of seed §5.2, verbatim (offsets +08:00), shared by the gateway tests."""

from __future__ import annotations

SEED = {
    "node_id": "mac-01",
    "worker_id": "worker-mac-01",
    "thread_id": "thread-abc",
    "project_id": "proj-001",
    "task_id": "task-017",
    "source_kind": "worker_estimator",
    "context_budget_remaining_pct": 37,
    "context_budget_level": "urgent",
    "compaction_expected_at": "2026-03-25T16:08:30+08:00",
    "must_finish_before_compaction": True,
    "estimated_remaining_turns": 5,
    "estimated_remaining_large_messages": 2,
    "last_compaction_at": "2026-03-25T15:12:10+08:00",
    "compaction_count": 1,
    "captured_at": "2026-03-25T15:56:00+08:00",
}
