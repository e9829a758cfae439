"""An owner's cancel of a task through real gRPC on SQLite and PostgreSQL: conversations'
`task.cancel_requested` cancels a task the scheduler still holds queued or claimed (a claim's
StartTask is then refused, so Codex never runs), frees the thread's next task, and is published as
`task.status_changed`; a task Codex started runs to its end with a status_detail saying the cancel
came too late; another owner's cancel changes nothing."""

from __future__ import annotations

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from grpc_status import rpc_status

from services.scheduler.tasks.rules import CANCEL_TOO_LATE_DETAIL, CANCELLED_DETAIL
from services.shared.errors import reason_of
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import cancel_request, running_task_scheduler, task_request


async def refusal_reason(call: object) -> tuple[grpc.StatusCode, str | None]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    return raised.value.code(), reason_of(rpc_status.from_call(raised.value))


async def test_a_queued_task_is_cancelled_and_the_threads_next_task_becomes_claimable(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        await running.enqueue(task_request("task-2"))
        await running.cancel("task-1")

        cancelled = await running.get("task-1")
        assert (cancelled.status, cancelled.status_detail) == (pb.TASK_STATUS_CANCELLED, CANCELLED_DETAIL)
        assert cancelled.HasField("finished_at") and cancelled.attempt == 0
        claimed = await running.claim()
        assert claimed.task.task_id == "task-2"
        assert [e["status"] for e in await running.status_events("task-1")] == ["queued", "cancelled"]

        await running.cancel("task-1")
        assert [e["status"] for e in await running.status_events("task-1")] == ["queued", "cancelled"]


async def test_a_claimed_task_is_cancelled_and_its_start_is_refused(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        claim = await running.claim()
        await running.cancel("task-1")

        assert (await refusal_reason(running.start("task-1", claim.lease_id))) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "LEASE_LOST",
        )
        assert (await running.get("task-1")).status == pb.TASK_STATUS_CANCELLED
        assert [e["status"] for e in await running.status_events("task-1")] == [
            "queued",
            "claimed",
            "cancelled",
        ]


async def test_a_running_task_runs_to_its_end_and_says_the_cancel_came_too_late(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        claim = await running.claim()
        await running.start("task-1", claim.lease_id)
        await running.cancel("task-1")

        running_task = await running.get("task-1")
        assert (running_task.status, running_task.status_detail) == (
            pb.TASK_STATUS_RUNNING,
            CANCEL_TOO_LATE_DETAIL,
        )
        await running.cancel("task-1")
        done = await running.finish("task-1", claim.lease_id, reply_text="Done.")
        assert (done.status, done.status_detail) == (pb.TASK_STATUS_COMPLETED, "")
        events = await running.status_events("task-1")
        assert [(e["status"], e["status_detail"]) for e in events[1:]] == [
            ("claimed", ""),
            ("running", ""),
            ("running", CANCEL_TOO_LATE_DETAIL),
            ("completed", ""),
        ]


async def test_another_owners_cancel_and_a_cancel_of_an_unknown_task_change_nothing(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        await running.cancel("task-1", owner="owner-2")
        await running.cancel("task-unknown")
        await running.enqueue({"task_id": "task-1"}, "task.cancel_requested")

        assert (await running.get("task-1")).status == pb.TASK_STATUS_QUEUED
        assert [e["status"] for e in await running.status_events("task-1")] == ["queued"]
        assert (await running.claim()).task.task_id == "task-1"


async def test_a_cancel_in_the_same_batch_as_its_request_cancels_the_task_at_creation(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue_together(
            (task_request("task-1"), "task.requested"),
            (cancel_request("task-1"), "task.cancel_requested"),
            (task_request("task-2"), "task.requested"),
        )

        assert (await running.get("task-1")).status == pb.TASK_STATUS_CANCELLED
        assert [e["status"] for e in await running.status_events("task-1")] == ["cancelled"]
        assert (await running.claim()).task.task_id == "task-2"
