"""The scheduler's metrics after real traffic: the task queue by status and the age of its oldest
queued task, its consumer of conversations' stream caught up, and compactions by whether their
handoff package was ready."""

from __future__ import annotations

from boss.scheduler.v1 import scheduler_pb2 as pb

from services.shared.metrics import configure_metrics
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.harness import budget_payload, running_scheduler
from tests.integration.scheduler.tasks_harness import running_task_scheduler, task_request
from tests.integration.scheduler.test_scheduler_service import next_commands
from tests.metrics_support import metric_value, scrape


async def test_task_queue_depth_age_and_consumer_position(database_target: DatabaseTarget) -> None:
    configure_metrics()
    async with running_task_scheduler(database_target) as running:
        empty = await scrape("scheduler")
        for number in (1, 2, 3):
            await running.enqueue(task_request(f"task-{number}", thread=f"thread-{number}"))
        claimed = await running.claim()
        assert claimed.HasField("task")
        exposition = await scrape("scheduler")

    assert metric_value(empty, "boss_scheduler_tasks", status="queued", service="scheduler") == 0
    assert metric_value(empty, "boss_scheduler_task_queue_oldest_age_seconds", service="scheduler") == 0
    tasks = {
        status: metric_value(exposition, "boss_scheduler_tasks", status=status, service="scheduler")
        for status in ("queued", "claimed", "running")
    }
    assert tasks == {"queued": 2.0, "claimed": 1.0, "running": 0.0}
    age = metric_value(exposition, "boss_scheduler_task_queue_oldest_age_seconds", service="scheduler")
    assert age is not None and 0 < age < 60
    consumer = {"service": "scheduler", "consumer": "conversations"}
    assert metric_value(exposition, "boss_event_consumer_position", **consumer) == 3
    assert metric_value(exposition, "boss_event_consumer_pending", **consumer) == 0
    assert metric_value(exposition, "boss_event_consumer_up", **consumer) == 1
    head = metric_value(exposition, "boss_outbox_head_sequence", service="scheduler")
    assert head is not None and head >= 3  # a task.status_changed per task at least


def compactions(exposition: str, handoff: str) -> float:
    return metric_value(exposition, "boss_scheduler_compactions_total", handoff=handoff) or 0.0


async def test_compactions_are_counted_by_whether_the_handoff_was_ready(
    database_target: DatabaseTarget,
) -> None:
    configure_metrics()
    async with running_scheduler(database_target) as running:
        before = await scrape()
        # t1 reaches urgent, its package is uploaded (ready), then it compacts.
        await running.publish(budget_payload(1, "urgent", 30))
        [*_, prepare] = await next_commands(running, 3)
        assert prepare.command_type == pb.COMMAND_TYPE_PREPARE_HANDOFF
        await running.stub.UploadHandoffPackage(
            pb.UploadHandoffPackageRequest(
                worker_id="w1",
                node_id="n1",
                command_id=prepare.command_id,
                handoff_package=pb.HandoffPackage(
                    handoff_package_id=prepare.handoff_package_id, summary_text="parser half done"
                ),
            ),
            metadata=running.worker(),
        )
        await running.publish(budget_payload(2, "safe", 95, compactions=1))
        # t2 compacts twice with no package at all.
        await running.publish(budget_payload(1, "urgent", 30, thread_id="t2"))
        await running.publish(budget_payload(2, "safe", 95, thread_id="t2", compactions=1))
        await running.publish(budget_payload(3, "safe", 90, thread_id="t2", compactions=2))
        after = await scrape()

    assert compactions(after, "ready") - compactions(before, "ready") == 1
    assert compactions(after, "missing") - compactions(before, "missing") == 2
