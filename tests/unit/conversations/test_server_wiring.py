"""The scheduler stream is asked for every event type the service applies, and only those."""

from __future__ import annotations

from services.conversations.server import SCHEDULER_TYPES


def test_the_scheduler_stream_carries_the_handoff_strategy_and_task_events() -> None:
    assert sorted(SCHEDULER_TYPES) == [
        "project.context_strategy.updated",
        "task.status_changed",
        "thread.handoff.closed",
        "thread.handoff.consumed",
        "thread.handoff.expired",
        "thread.handoff.ready",
        "thread.handoff.required",
    ]
