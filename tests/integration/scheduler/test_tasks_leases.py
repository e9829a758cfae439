"""Tasks through real gRPC on SQLite and PostgreSQL: created from conversations' `task.requested`
events (idempotently), claimed only by their own node's agent, started, heartbeated and finished
under a fenced lease, one at a time and in order per Codex thread, and published as
`task.status_changed` events."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from grpc_status import rpc_status

from services.shared.errors import field_violations_of, reason_of
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import (
    QUIET,
    TaskScheduler,
    running_task_scheduler,
    task_request,
)


async def refused(call: object) -> tuple[grpc.StatusCode, str | None, list[str]]:
    """Awaits a call that must fail; its code, ErrorInfo reason and violated fields."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    status = rpc_status.from_call(raised.value)
    return (
        raised.value.code(),
        reason_of(status),
        [v.field for v in field_violations_of(status)] if status else [],
    )


async def claimed(running: TaskScheduler, node: str = "n1", worker: str = "w1") -> tuple[pb.Task, str]:
    """Claims the node's next task (no wait) and asserts there was one."""
    response = await running.claim(worker, node)
    assert response.HasField("task"), "expected a claimable task"
    return response.task, response.lease_id


async def test_a_task_requested_event_creates_one_queued_task_and_publishes_it(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1", text="run the parser tests"))
        await running.enqueue(task_request("task-1", text="a repeat of the same request"))
        await running.enqueue(
            {"owner_id": "owner-1", "text": "not for the scheduler"}, "conversation.updated"
        )

        task = await running.get("task-1")
        assert task.status == pb.TASK_STATUS_QUEUED
        assert task.task_type == pb.TASK_TYPE_CONVERSATION_REPLY
        assert (task.owner_id, task.target_thread_id, task.device_id) == ("owner-1", "thread-1", "n1")
        assert (task.codex_folder_ref, task.codex_thread_ref) == ("/home/dev/repo", "0199-thread-1")
        assert (task.request_message_id, task.instruction_text) == ("message-task-1", "run the parser tests")
        assert task.attempt == 0 and not task.HasField("lease_expires_at")
        assert task.status_detail == "device n1 has not connected yet"

        [event] = await running.status_events()
        assert event["task_id"] == "task-1" and event["status"] == "queued"
        assert event["owner_id"] == "owner-1" and event["failure_kind"] == ""
        assert event["claimed_at"] is None and event["created_at"].endswith("Z")
        assert "lease_id" not in event
        # The task consumer's stream (the device events have a stream of their own).
        assert ["task.requested", "task.cancel_requested"] in running.conversations.requested_types


async def test_an_unusable_request_is_stored_failed_so_the_conversation_hears_of_it(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-broken", device_id="", codex_thread_ref=""))
        task = await running.get("task-broken")
        assert task.status == pb.TASK_STATUS_FAILED and task.failure_kind == pb.FAILURE_KIND_OTHER
        assert task.status_detail == "the task request could not run: no device_id, no codex_thread_ref"
        [event] = await running.status_events("task-broken")
        assert event["status"] == "failed" and event["failure_kind"] == "other"


async def test_claim_start_heartbeat_finish_under_one_lease(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        task, lease_id = await claimed(running)
        assert task.task_id == "task-1" and task.status == pb.TASK_STATUS_CLAIMED
        assert task.attempt == 1 and task.worker_id == "w1" and len(lease_id) == 32
        assert task.lease_expires_at.ToDatetime() - task.claimed_at.ToDatetime() == timedelta(seconds=30)
        assert task.HasField("device_last_seen_at") and task.status_detail == ""

        started = await running.start("task-1", lease_id)
        assert started.status == pb.TASK_STATUS_RUNNING
        assert started.lease_expires_at.ToDatetime() - started.started_at.ToDatetime() == timedelta(
            seconds=30
        )
        assert (await running.start("task-1", lease_id)) == started

        beat = await running.heartbeat("task-1", lease_id)
        assert beat.status == pb.TASK_STATUS_RUNNING
        assert beat.lease_expires_at.ToDatetime() - beat.heartbeat_at.ToDatetime() == timedelta(seconds=30)

        done = await running.finish(
            "task-1", lease_id, reply_text="All 12 tests pass.", codex_session_id="0199-s"
        )
        assert done.status == pb.TASK_STATUS_COMPLETED and done.reply_text == "All 12 tests pass."
        assert done.codex_session_id == "0199-s" and not done.HasField("lease_expires_at")
        assert done.HasField("finished_at")
        again = await running.finish("task-1", lease_id, reply_text="All 12 tests pass.")
        assert again == done
        code, reason, _ = await refused(
            running.finish("task-1", lease_id, pb.TASK_STATUS_FAILED, failure_kind=pb.FAILURE_KIND_OTHER)
        )
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")

        events = await running.status_events("task-1")
        assert [e["status"] for e in events] == ["queued", "claimed", "running", "completed"]
        assert events[-1]["reply_text"] == "All 12 tests pass." and events[-1]["lease_expires_at"] is None
        assert events[1]["worker_id"] == "w1" and events[1]["attempt"] == 1
        assert await running.get("task-1") == done


async def test_a_claim_that_asks_to_start_answers_the_task_running_under_the_run_lease(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        await running.enqueue(task_request("task-2", thread="thread-2"))
        await running.enqueue(task_request("task-3"))
        answer = await running.claim(start=True)
        task, lease_id = answer.task, answer.lease_id
        assert task.task_id == "task-1" and task.status == pb.TASK_STATUS_RUNNING and len(lease_id) == 32
        assert task.attempt == 1 and task.worker_id == "w1"
        # One transaction: the same database instant on PostgreSQL, the next statement's on SQLite.
        assert (
            timedelta(0) <= task.started_at.ToDatetime() - task.claimed_at.ToDatetime() < timedelta(seconds=1)
        )
        assert task.lease_expires_at.ToDatetime() - task.started_at.ToDatetime() == timedelta(seconds=30)
        # The claim's lease is the run's: a StartTask repeat answers it unchanged, heartbeats hold.
        assert (await running.start("task-1", lease_id)) == task
        beat = await running.heartbeat("task-1", lease_id)
        assert beat.status == pb.TASK_STATUS_RUNNING
        # The thread is busy: its next task waits, another thread's is claimable (and stays claimed
        # when the claim does not ask to start).
        other = await running.claim()
        assert other.task.task_id == "task-2" and other.task.status == pb.TASK_STATUS_CLAIMED
        assert not (await running.claim(start=True)).HasField("task")

        done = await running.finish("task-1", lease_id, reply_text="Done.")
        assert done.status == pb.TASK_STATUS_COMPLETED
        events = await running.status_events("task-1")
        assert [e["status"] for e in events] == ["queued", "claimed", "running", "completed"]
        assert events[1]["worker_id"] == "w1" and events[2]["lease_expires_at"] is not None


async def test_a_claim_and_start_whose_caller_went_away_puts_the_task_back_in_the_queue(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        handlers = running.app.tasks
        batches = handlers.writes.batches
        claim = asyncio.ensure_future(handlers.claim("w1", "n1", 0, "owner-1", start=True))
        while not handlers.writes._queue:  # the claim's write is queued for the next batch
            await asyncio.sleep(0)
        claim.cancel()  # the agent's call is cancelled before the batch answers it
        with pytest.raises(asyncio.CancelledError):
            await claim

        for _ in range(500):  # the claim's batch commits, then the release's
            statuses = [e["status"] for e in await running.status_events("task-1")]
            if len(statuses) == 4:
                break
            await asyncio.sleep(0.01)
        assert statuses == ["queued", "claimed", "running", "queued"]
        assert handlers.writes.batches >= batches + 2
        queued = await running.get("task-1")
        assert queued.status == pb.TASK_STATUS_QUEUED and not queued.HasField("lease_expires_at")
        assert queued.status_detail == "worker w1 went away before it received this task; queued again"
        # The next claim gets it and runs it (attempt 2), as a claim lease running out would.
        again = await running.claim(start=True)
        assert again.task.task_id == "task-1" and again.task.status == pb.TASK_STATUS_RUNNING
        assert again.task.attempt == 2 and again.task.status_detail == ""


async def test_only_the_nodes_own_agent_claims_and_only_with_a_worker_token(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-n2", node="n2", thread="thread-2"))
        assert not (await running.claim("w1", "n1")).HasField("task")

        wrong_node = running.stub.ClaimTask(
            pb.ClaimTaskRequest(worker_id="w1", node_id="n2"), metadata=running.worker("w1", "n1")
        )
        assert (await refused(wrong_node))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "NODE_MISMATCH")
        for metadata in (running.client(), running.service()):
            call = running.stub.ClaimTask(
                pb.ClaimTaskRequest(worker_id="w2", node_id="n2"), metadata=metadata
            )
            assert (await refused(call))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "WORKER_TOKEN_REQUIRED")
        too_long = running.stub.ClaimTask(
            pb.ClaimTaskRequest(worker_id="w2", node_id="n2", wait_seconds=61),
            metadata=running.worker("w2", "n2"),
        )
        assert await refused(too_long) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            ["wait_seconds"],
        )
        huge = running.stub.ClaimTask(
            pb.ClaimTaskRequest(worker_id="w" * 100_000, node_id="n2\x00"),
            metadata=running.worker("w2", "n2"),
        )
        assert await refused(huge) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            ["worker_id", "node_id"],
        )
        assert (await running.get("task-n2")).status == pb.TASK_STATUS_QUEUED

        task, lease_id = await claimed(running, "n2", "w2")
        assert task.task_id == "task-n2"
        other_node = running.start("task-n2", lease_id, "w1", "n1")
        assert (await refused(other_node))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "NODE_MISMATCH")
        unknown = running.start("task-unknown", lease_id, "w2", "n2")
        assert (await refused(unknown))[:2] == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")


async def test_a_stale_lease_is_refused_everywhere_and_changes_nothing(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(
        database_target, replace(QUIET, claim_lease=timedelta(seconds=0.3))
    ) as running:
        await running.enqueue(task_request("task-1"))
        _, stale = await claimed(running)
        await asyncio.sleep(0.4)
        [requeued] = await running.app.tasks.sweep()
        assert requeued.status.value == "queued"
        assert requeued.status_detail.startswith("worker w1 claimed it at ")

        task, lease_id = await claimed(running)
        assert task.attempt == 2 and lease_id != stale
        before = await running.get("task-1")
        for call in (
            running.start("task-1", stale),
            running.heartbeat("task-1", stale),
            running.finish("task-1", stale, reply_text="late reply"),
        ):
            assert (await refused(call))[:2] == (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
        assert await running.get("task-1") == before

        await running.start("task-1", lease_id)
        assert (await refused(running.start("task-1", stale)))[1] == "LEASE_LOST"
        done = await running.finish("task-1", lease_id, reply_text="done")
        assert done.status == pb.TASK_STATUS_COMPLETED
        statuses = [e["status"] for e in await running.status_events("task-1")]
        assert statuses == ["queued", "claimed", "queued", "claimed", "running", "completed"]


async def test_a_threads_tasks_run_one_at_a_time_in_order_and_a_failure_does_not_block_the_next(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("first", thread="thread-a"))
        await running.enqueue(task_request("second", thread="thread-a"))
        await running.enqueue(task_request("other", thread="thread-b"))

        first, first_lease = await claimed(running)
        assert first.task_id == "first"
        other, _ = await claimed(running)
        assert other.task_id == "other"
        assert not (await running.claim()).HasField("task")

        await running.start("first", first_lease)
        assert not (await running.claim()).HasField("task")
        failed = await running.finish(
            "first",
            first_lease,
            pb.TASK_STATUS_FAILED,
            failure_kind=pb.FAILURE_KIND_MODEL_ERROR,
            status_detail="the model answered 500",
        )
        assert failed.status == pb.TASK_STATUS_FAILED and failed.status_detail == "the model answered 500"

        second, _ = await claimed(running)
        assert second.task_id == "second" and second.attempt == 1


async def test_concurrent_claimers_never_share_a_task(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        for index in range(5):
            await running.enqueue(task_request(f"task-{index}", thread=f"thread-{index}"))
        await running.enqueue(task_request("task-0-later", thread="thread-0"))

        responses = await asyncio.gather(*(running.claim("w1") for _ in range(10)))
        claimed_ids = [r.task.task_id for r in responses if r.HasField("task")]
        assert sorted(claimed_ids) == [f"task-{index}" for index in range(5)]
        assert len({r.lease_id for r in responses if r.HasField("task")}) == 5
        assert (await running.get("task-0-later")).status == pb.TASK_STATUS_QUEUED


async def test_finish_refuses_bad_outcomes_naming_the_field_and_changes_nothing(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        _, lease_id = await claimed(running)
        await running.start("task-1", lease_id)
        before = await running.get("task-1")
        cases = [
            (running.finish("task-1", lease_id), ["reply_text"]),
            (running.finish("task-1", lease_id, reply_text="x" * 100_001), ["reply_text"]),
            (running.finish("task-1", lease_id, pb.TASK_STATUS_FAILED), ["failure_kind"]),
            (
                running.finish(
                    "task-1",
                    lease_id,
                    pb.TASK_STATUS_FAILED,
                    failure_kind=pb.FAILURE_KIND_OTHER,
                    status_detail="y" * 2_001,
                ),
                ["status_detail"],
            ),
            (running.finish("task-1", lease_id, pb.TASK_STATUS_QUEUED), ["status"]),
            (
                running.finish(
                    "task-1", lease_id, pb.TASK_STATUS_TIMED_OUT, failure_kind=pb.FAILURE_KIND_MODEL_ERROR
                ),
                ["failure_kind"],
            ),
            (running.finish("task-1", "", reply_text="ok"), ["lease_id"]),
        ]
        for call, fields in cases:
            assert await refused(call) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", fields)
        assert await running.get("task-1") == before
        timed_out = await running.finish(
            "task-1",
            lease_id,
            pb.TASK_STATUS_TIMED_OUT,
            failure_kind=pb.FAILURE_KIND_STALLED,
            status_detail="no output from Codex for 300 s",
        )
        assert (
            timed_out.status == pb.TASK_STATUS_TIMED_OUT and timed_out.failure_kind == pb.FAILURE_KIND_STALLED
        )


async def test_get_task_shows_a_task_to_its_owner_its_node_and_services_only(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1", owner="owner-1", node="n1"))
        request = pb.GetTaskRequest(task_id="task-1")
        for metadata in (running.service(), running.client("owner-1"), running.worker("w1", "n1")):
            assert (await running.stub.GetTask(request, metadata=metadata)).task.task_id == "task-1"
        for metadata in (running.client("owner-2"), running.worker("w2", "n2")):
            call = running.stub.GetTask(request, metadata=metadata)
            assert (await refused(call))[:2] == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
        unknown = running.stub.GetTask(pb.GetTaskRequest(task_id="nope"), metadata=running.service())
        assert (await refused(unknown))[:2] == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")


async def test_a_device_of_another_owner_with_the_same_names_cannot_start_beat_or_finish_a_task(
    database_target: DatabaseTarget,
) -> None:
    """Even holding the task's id and its lease id, a worker token of another owner enrolled under
    the same worker and node names is told nothing (NOT_FOUND, as for an unknown task) and changes
    nothing; the owner's own agent goes on under its lease."""
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1"))
        _claimed, lease_id = await claimed(running)
        twin = running.worker("w1", "n1", owner_id="owner-2")

        def twin_calls() -> list[object]:
            return [
                running.stub.StartTask(
                    pb.StartTaskRequest(worker_id="w1", node_id="n1", task_id="task-1", lease_id=lease_id),
                    metadata=twin,
                ),
                running.stub.HeartbeatTask(
                    pb.HeartbeatTaskRequest(
                        worker_id="w1", node_id="n1", task_id="task-1", lease_id=lease_id
                    ),
                    metadata=twin,
                ),
                running.stub.FinishTask(
                    pb.FinishTaskRequest(
                        worker_id="w1",
                        node_id="n1",
                        task_id="task-1",
                        lease_id=lease_id,
                        status=pb.TASK_STATUS_COMPLETED,
                        reply_text="a reply from another owner",
                    ),
                    metadata=twin,
                ),
            ]

        for call in twin_calls():
            code, reason, _ = await refused(call)
            assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
        assert (await running.get("task-1")).status == pb.TASK_STATUS_CLAIMED

        await running.start("task-1", lease_id)
        for call in twin_calls():
            code, reason, _ = await refused(call)
            assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
        done = await running.finish("task-1", lease_id, reply_text="the owner's own reply")
        assert (done.status, done.reply_text) == (pb.TASK_STATUS_COMPLETED, "the owner's own reply")
        assert [e["status"] for e in await running.status_events("task-1")][-3:] == [
            "claimed",
            "running",
            "completed",
        ]
