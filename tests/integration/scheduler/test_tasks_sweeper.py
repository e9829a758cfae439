"""The task sweeper on SQLite and PostgreSQL, in database time: a claim never started goes back to
the queue, a run whose agent stopped answering fails `device_lost` (never run again), and a queued
task of an offline device says so once, clears it when the device is back, and expires."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb

from services.shared.time import from_timestamp, isoformat_utc
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import QUIET, running_task_scheduler, task_request

SHORT = replace(
    QUIET,
    claim_lease=timedelta(seconds=0.3),
    run_lease=timedelta(seconds=0.3),
    presence_window=timedelta(seconds=0.5),
    queue_expiry=timedelta(seconds=1.2),
    presence_write_interval=timedelta(0),
)


async def test_a_run_whose_agent_stopped_answering_fails_device_lost_and_frees_its_thread(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target, SHORT) as running:
        assert not (await running.claim()).HasField("task")
        await running.enqueue(task_request("first", thread="thread-a"))
        await running.enqueue(task_request("second", thread="thread-a"))
        claim = await running.claim()
        await running.start("first", claim.lease_id)
        beat = await running.heartbeat("first", claim.lease_id)
        assert await running.app.tasks.sweep() == []
        await asyncio.sleep(0.4)

        [lost] = await running.app.tasks.sweep()
        heartbeat = from_timestamp(beat.heartbeat_at)
        assert lost.task_id == "first" and lost.status.value == "failed"
        assert lost.failure_kind.value == "device_lost"
        assert lost.status_detail == f"the device n1 stopped answering at {isoformat_utc(heartbeat)}"
        assert lost.lease_expires_at is None and lost.finished_at is not None

        with pytest.raises(grpc.aio.AioRpcError) as late:
            await running.finish("first", claim.lease_id, reply_text="too late")
        assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await running.get("first")).status == pb.TASK_STATUS_FAILED

        second = await running.claim()
        assert second.task.task_id == "second"
        events = await running.status_events("first")
        assert [e["status"] for e in events] == ["queued", "claimed", "running", "failed"]
        assert events[-1]["failure_kind"] == "device_lost" and events[-1]["attempt"] == 1


async def test_a_queued_task_says_its_device_is_offline_once_then_expires(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target, SHORT) as running:
        assert not (await running.claim("w1", "n1")).HasField("task")
        await asyncio.sleep(0.6)
        await running.enqueue(task_request("task-1", node="n1"))
        queued = await running.get("task-1")
        device_seen = isoformat_utc(from_timestamp(queued.device_last_seen_at))
        assert queued.status == pb.TASK_STATUS_QUEUED
        assert queued.status_detail == f"device n1 last seen at {device_seen}"

        assert await running.app.tasks.sweep() == []
        await asyncio.sleep(1.3)
        [expired] = await running.app.tasks.sweep()
        assert expired.status.value == "expired" and expired.finished_at is not None
        assert expired.status_detail == (
            f"expired after waiting 1 s in the queue: device n1 was last seen at {device_seen}"
        )
        events = await running.status_events("task-1")
        assert [(e["status"], e["status_detail"]) for e in events] == [
            ("queued", f"device n1 last seen at {device_seen}"),
            ("expired", expired.status_detail),
        ]


async def test_an_offline_notice_comes_once_and_is_cleared_when_the_device_is_back(
    database_target: DatabaseTarget,
) -> None:
    settings = replace(SHORT, run_lease=timedelta(hours=1), queue_expiry=timedelta(hours=1))
    async with running_task_scheduler(database_target, settings) as running:
        await running.enqueue(task_request("blocker", thread="thread-a", node="n1"))
        claim = await running.claim()
        await running.start("blocker", claim.lease_id)
        await running.enqueue(task_request("waiting", thread="thread-a", node="n1"))
        await running.enqueue(task_request("never", thread="thread-b", node="n9"))
        assert (await running.get("waiting")).status_detail == ""
        assert (await running.get("never")).status_detail == "device n9 has not connected yet"

        await asyncio.sleep(0.6)
        [noted] = await running.app.tasks.sweep()
        device_seen = isoformat_utc(from_timestamp(claim.task.device_last_seen_at))
        assert noted.task_id == "waiting" and noted.status_detail == f"device n1 last seen at {device_seen}"
        assert await running.app.tasks.sweep() == []

        assert not (await running.claim()).HasField("task")
        [cleared] = await running.app.tasks.sweep()
        assert cleared.task_id == "waiting" and cleared.status_detail == ""
        details = [e["status_detail"] for e in await running.status_events("waiting")]
        assert details == ["", noted.status_detail, ""]
        assert [e["status_detail"] for e in await running.status_events("never")] == [
            "device n9 has not connected yet"
        ]
        assert (await running.get("blocker")).status == pb.TASK_STATUS_RUNNING


async def test_the_background_sweeper_requeues_a_claim_that_was_never_started(
    database_target: DatabaseTarget,
) -> None:
    settings = replace(SHORT, sweep_interval=timedelta(seconds=0.05))
    async with running_task_scheduler(database_target, settings) as running:
        await running.enqueue(task_request("task-1"))
        first = await running.claim()
        assert first.task.attempt == 1
        again = await running.claim(wait=10)
        assert again.task.task_id == "task-1" and again.task.attempt == 2
        assert again.lease_id != first.lease_id
        statuses = [e["status"] for e in await running.status_events("task-1")]
        assert statuses == ["queued", "claimed", "queued", "claimed"]
