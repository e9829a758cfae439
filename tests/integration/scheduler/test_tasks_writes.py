"""Group commit of the agents' writes on SQLite and PostgreSQL: writes that arrive together share
one transaction; a refused write fails alone; a database error rolls the batch back and every
write is run again alone, so only the failing one fails and nothing is published twice."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from grpc_status import rpc_status
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.tasks.model import TaskStatus
from services.scheduler.tasks.writes import Written
from services.shared.errors import FailedPrecondition, reason_of
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import running_task_scheduler, task_request
from tests.integration.scheduler.test_tasks_storage import stored_task


async def test_a_failed_batch_is_run_again_write_by_write(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target) as running:
        tasks = running.app.tasks
        batches = tasks.writes.batches

        async def inserts_a_task(connection: AsyncConnection) -> Written[str]:
            # A lease that is current in real time, so the running sweeper leaves the task alone.
            now = utc_now()
            task = replace(
                stored_task("kept", "thread-1", "n1", TaskStatus.RUNNING, 0),
                created_at=now,
                updated_at=now,
                lease_expires_at=now + timedelta(hours=1),
            )
            await tasks.repository.insert(connection, [task])
            return Written("inserted", [task])

        async def is_refused(connection: AsyncConnection) -> Written[str]:
            raise FailedPrecondition("not now", reason="LEASE_LOST")

        async def breaks_the_unique_index(connection: AsyncConnection) -> Written[str]:
            await tasks.repository.insert(
                connection, [stored_task("second", "thread-1", "n1", TaskStatus.CLAIMED, 1)]
            )
            return Written("never")

        kept, refused, broken = await asyncio.gather(
            tasks.writes.run(inserts_a_task),
            tasks.writes.run(is_refused),
            tasks.writes.run(breaks_the_unique_index),
            return_exceptions=True,
        )
        assert kept == "inserted"
        assert isinstance(refused, FailedPrecondition) and refused.reason == "LEASE_LOST"
        assert isinstance(broken, IntegrityError)
        assert tasks.writes.batches == batches + 2
        assert [e["task_id"] for e in await running.status_events()] == ["kept"]
        assert (await running.get("kept")).status == pb.TASK_STATUS_RUNNING
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await running.get("second")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_concurrent_agent_calls_share_transactions_and_a_stale_lease_fails_alone(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        for index in range(6):
            await running.enqueue(task_request(f"task-{index}", thread=f"thread-{index}"))
        claims = [await running.claim() for _ in range(6)]
        batches, writes = running.app.tasks.writes.batches, running.app.tasks.writes.writes
        calls = [running.start(c.task.task_id, c.lease_id) for c in claims[:5]]
        calls.append(running.start(claims[5].task.task_id, "a-stale-lease"))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [r.status for r in results[:5] if isinstance(r, pb.Task)] == [pb.TASK_STATUS_RUNNING] * 5
        stale = results[5]
        assert isinstance(stale, grpc.aio.AioRpcError) and stale.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(rpc_status.from_call(stale)) == "LEASE_LOST"
        assert running.app.tasks.writes.writes - writes == 6
        assert running.app.tasks.writes.batches - batches < 6
        assert (await running.get("task-5")).status == pb.TASK_STATUS_CLAIMED
        started = [e["task_id"] for e in await running.status_events() if e["status"] == "running"]
        assert sorted(started) == [f"task-{index}" for index in range(5)]
