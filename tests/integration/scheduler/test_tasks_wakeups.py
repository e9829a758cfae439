"""ClaimTask's long poll on SQLite and PostgreSQL: it waits when nothing is claimable, and wakes at
once when an enqueue commits (in this process, and through LISTEN/NOTIFY for an enqueue another
scheduler process committed) or when the thread's earlier task finishes (in this process or
another)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc

from services.scheduler.tasks.repository import ClaimCall
from services.shared.auth import bearer_metadata
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import (
    QUIET,
    TaskScheduler,
    running_task_scheduler,
    start_scheduler,
    stop_scheduler,
    task_request,
)

WAIT = 10.0


async def waiting_claim(
    running: TaskScheduler, stub: scheduler_pb2_grpc.SchedulerServiceStub | None = None
) -> asyncio.Task[pb.ClaimTaskResponse]:
    """A ClaimTask long poll of WAIT seconds, started and verified to be waiting."""
    stub = stub or running.stub

    async def claim() -> pb.ClaimTaskResponse:
        request = pb.ClaimTaskRequest(worker_id="w1", node_id="n1", wait_seconds=WAIT)
        return await stub.ClaimTask(request, metadata=running.worker())

    call = asyncio.create_task(claim())
    await asyncio.sleep(0.3)
    assert not call.done(), "the claim should be waiting"
    return call


async def test_an_empty_long_poll_waits_then_answers_without_a_task(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        started = time.monotonic()
        response = await running.claim(wait=0.5)
        assert not response.HasField("task") and response.lease_id == ""
        assert time.monotonic() - started >= 0.45


async def test_a_waiting_claim_wakes_when_a_task_is_enqueued(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        call = await waiting_claim(running)
        started = time.monotonic()
        await running.enqueue(task_request("task-1"))
        async with asyncio.timeout(WAIT / 2):
            response = await call
        assert response.task.task_id == "task-1" and response.task.status == pb.TASK_STATUS_CLAIMED
        assert time.monotonic() - started < WAIT / 2


async def test_a_waiting_claim_wakes_when_the_threads_earlier_task_finishes(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("first"))
        await running.enqueue(task_request("second"))
        first = await running.claim()
        await running.start("first", first.lease_id)
        call = await waiting_claim(running)
        await running.finish("first", first.lease_id, reply_text="done")
        async with asyncio.timeout(WAIT / 2):
            response = await call
        assert response.task.task_id == "second"


async def test_a_claim_waiting_on_another_scheduler_process_wakes_through_notify(
    database_target: DatabaseTarget,
) -> None:
    if database_target.backend != "postgresql":
        pytest.skip("LISTEN/NOTIFY between scheduler processes is PostgreSQL's")
    async with running_task_scheduler(database_target) as running:
        other, server, port, tasks = await start_scheduler(database_target, None, running.budget_port, QUIET)
        try:
            assert other.task_consumer is None and other.task_listener is not None
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
                call = await waiting_claim(running, stub)
                wakes = other.tasks.wakeups.wakes
                await running.enqueue(task_request("task-1"))
                async with asyncio.timeout(WAIT / 2):
                    response = await call
                assert response.task.task_id == "task-1"
                assert other.tasks.wakeups.wakes > wakes
                got = await stub.GetTask(
                    pb.GetTaskRequest(task_id="task-1"),
                    metadata=bearer_metadata(running.authority.issue_service("test")),
                )
                assert got.task.status == pb.TASK_STATUS_CLAIMED

                await running.enqueue(task_request("task-2"))
                await running.start("task-1", response.lease_id)
                call = await waiting_claim(running, stub)
                await running.finish("task-1", response.lease_id, reply_text="done")
                async with asyncio.timeout(WAIT / 2):
                    second = await call
                assert second.task.task_id == "task-2"
        finally:
            await stop_scheduler(other, server, tasks)


async def waiting_claim_and_start(
    running: TaskScheduler, worker_id: str = "w1"
) -> asyncio.Task[pb.ClaimTaskResponse]:
    """A ClaimTask long poll asking to start its task, verified to be waiting in the scheduler."""
    call = asyncio.create_task(running.claim(worker_id=worker_id, wait=WAIT, start=True))
    async with asyncio.timeout(WAIT / 2):
        while running.app.tasks.waiting_claims.count("owner-1", "n1") == 0:
            await asyncio.sleep(0.01)
    assert not call.done(), "the claim should be waiting"
    return call


async def test_the_enqueue_hands_its_task_to_a_waiting_claim_and_start_in_its_own_transaction(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        call = await waiting_claim_and_start(running)
        batches = running.app.tasks.writes.batches
        await running.enqueue(task_request("task-1"))
        async with asyncio.timeout(WAIT / 2):
            response = await call
        assert response.task.task_id == "task-1" and response.task.status == pb.TASK_STATUS_RUNNING
        assert response.task.worker_id == "w1" and response.task.attempt == 1 and response.lease_id
        # No write batch of its own: the enqueue's transaction claimed and started it.
        assert running.app.tasks.writes.batches == batches
        events = await running.status_events("task-1")
        assert [event["status"] for event in events] == ["queued", "claimed", "running"]
        stored = await running.get("task-1")
        assert stored.status == pb.TASK_STATUS_RUNNING and stored.started_at == stored.claimed_at
        # The answered lease is the task's: it beats and finishes.
        await running.heartbeat("task-1", response.lease_id)
        done = await running.finish("task-1", response.lease_id, reply_text="all green")
        assert done.status == pb.TASK_STATUS_COMPLETED and done.reply_text == "all green"


async def test_a_thread_busy_with_an_earlier_task_keeps_its_new_task_queued_for_the_waiting_claim(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("first"))
        first = await running.claim(start=True)
        call = await waiting_claim_and_start(running, worker_id="w2")
        await running.enqueue(task_request("second"))
        await asyncio.sleep(0.3)
        assert not call.done(), "a thread's second task must wait for its first"
        assert (await running.get("second")).status == pb.TASK_STATUS_QUEUED
        await running.finish("first", first.lease_id, reply_text="done")
        async with asyncio.timeout(WAIT / 2):
            response = await call
        assert response.task.task_id == "second" and response.task.status == pb.TASK_STATUS_RUNNING


async def test_a_task_handed_to_a_claim_that_stopped_waiting_goes_back_to_the_queue(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        handlers = running.app.tasks
        # A claim the enqueue takes while its long poll is ending (its answer refused from then on).
        gone = handlers.waiting_claims.add(ClaimCall("n1", "w-gone", "lease-gone", "owner-1"))
        gone.answer.cancel()
        await running.enqueue(task_request("task-1"))
        async with asyncio.timeout(WAIT / 2):
            while (await running.get("task-1")).status != pb.TASK_STATUS_QUEUED:
                await asyncio.sleep(0.02)
        statuses = [event["status"] for event in await running.status_events("task-1")]
        assert statuses == ["queued", "claimed", "running", "queued"]
        assert "w-gone went away before it received this task" in (await running.get("task-1")).status_detail
        claimed = await running.claim(start=True)
        assert claimed.task.task_id == "task-1" and claimed.task.worker_id == "w1"


async def test_a_waiting_claim_whose_caller_went_away_takes_nothing(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        call = await waiting_claim_and_start(running)
        call.cancel()
        async with asyncio.timeout(WAIT / 2):
            while running.app.tasks.waiting_claims.count("owner-1", "n1"):
                await asyncio.sleep(0.01)
        await running.enqueue(task_request("task-1"))
        assert (await running.get("task-1")).status == pb.TASK_STATUS_QUEUED
        assert [event["status"] for event in await running.status_events("task-1")] == ["queued"]
