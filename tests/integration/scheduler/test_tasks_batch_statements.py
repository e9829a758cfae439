"""The write batches' statements on SQLite and PostgreSQL (one statement per kind on PostgreSQL):
a batch of claims takes what the claim rule says, each fenced call of a batch gets its own answer
in its place (a wrong lease, node, worker or status matching nothing, a call repeated within the
batch matching once), and a claim in the same batch as a finish sees the thread that finish freed."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import timedelta

import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from sqlalchemy import select

from services.scheduler.tasks.model import FailureKind, Task, TaskStatus
from services.scheduler.tasks.repository import ClaimCall, LeaseCall, SqlAlchemyTaskRepository
from services.scheduler.tasks.rules import FinishOutcome, QueueEntry, claimable
from services.scheduler.tasks.tables import device_presence
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import running_task_scheduler, task_request
from tests.integration.scheduler.test_tasks_storage import migrated, stored_task

LEASE = timedelta(seconds=30)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_batch_of_claims_takes_what_the_claim_rule_says(
    database_target: DatabaseTarget, seed: int
) -> None:
    rng = random.Random(seed)
    database = await migrated(database_target)
    repository = SqlAlchemyTaskRepository(database.dialect)
    statuses = [TaskStatus.QUEUED] * 5 + [TaskStatus.COMPLETED, TaskStatus.FAILED]
    rows: list[Task] = []
    active_threads: set[str] = set()
    for position in range(60):
        thread = f"thread-{rng.randrange(12)}"
        status = rng.choice(statuses + ([] if thread in active_threads else [TaskStatus.RUNNING]))
        if status is TaskStatus.RUNNING:
            active_threads.add(thread)
        rows.append(
            stored_task(f"task-{position:02d}", thread, rng.choice(["n1", "n2", "n3"]), status, position)
        )
    entries = [
        QueueEntry(i, t.task_id, t.target_thread_id, t.device_id, t.status) for i, t in enumerate(rows)
    ]
    calls = [
        ClaimCall(rng.choice(["n1", "n2", "n3", "n4"]), "w1", f"lease-{index}", "owner-1")
        for index in range(14)
    ]
    expected: list[str | None] = []
    for call in calls:
        available = claimable(entries, call.node_id)
        expected.append(available[0].task_id if available else None)
        if available:
            entries = [
                replace(entry, status=TaskStatus.CLAIMED) if entry is available[0] else entry
                for entry in entries
            ]
    try:
        async with database.transaction() as connection:
            await repository.insert(connection, rows)
        async with database.transaction() as connection:
            claimed = await repository.claim_many(connection, calls, LEASE)
        assert [task.task_id if task else None for task in claimed] == expected
        for call, task in zip(calls, claimed, strict=True):
            if task is not None:
                assert (task.status, task.lease_id, task.device_id, task.attempt) == (
                    TaskStatus.CLAIMED,
                    call.lease_id,
                    call.node_id,
                    1,
                )
    finally:
        await database.dispose()


async def test_each_fenced_call_of_a_batch_gets_its_own_answer(database_target: DatabaseTarget) -> None:
    database = await migrated(database_target)
    repository = SqlAlchemyTaskRepository(database.dialect)
    rows = [
        stored_task("claimed-1", "thread-1", "n1", TaskStatus.CLAIMED, 0),
        stored_task("claimed-2", "thread-2", "n1", TaskStatus.CLAIMED, 1),
        stored_task("claimed-3", "thread-3", "n1", TaskStatus.CLAIMED, 2),
        stored_task("running-4", "thread-4", "n1", TaskStatus.RUNNING, 3),
        stored_task("running-5", "thread-5", "n1", TaskStatus.RUNNING, 4),
    ]
    try:
        async with database.transaction() as connection:
            await repository.insert(connection, rows)

        def call(task_id: str, node: str = "n1", worker: str = "w1", lease: str = "") -> LeaseCall:
            return LeaseCall(task_id, node, worker, lease or f"lease-{task_id}", "owner-1")

        starts = [
            call("claimed-1"),
            call("claimed-2", lease="an-old-lease"),
            call("claimed-3", node="n2"),
            call("claimed-3", worker="w2"),
            call("running-4"),
            call("no-such-task"),
            call("claimed-3"),
            call("claimed-3"),
        ]
        async with database.transaction() as connection:
            started = await repository.start_many(connection, starts, LEASE)
        assert [task.task_id if task else None for task in started[:6]] == [
            "claimed-1",
            None,
            None,
            None,
            None,
            None,
        ]
        assert [task.task_id if task else None for task in started[6:]].count("claimed-3") == 1
        assert started[0] is not None and started[0].status is TaskStatus.RUNNING

        async with database.transaction() as connection:
            renewed = await repository.heartbeat_many(
                connection, [call("running-4"), call("claimed-2"), call("running-5", lease="x")], LEASE
            )
        assert [task.task_id if task else None for task in renewed] == ["running-4", None, None]
        assert renewed[0] is not None and renewed[0].heartbeat_at is not None

        completed = FinishOutcome(
            TaskStatus.COMPLETED, reply_text="All 12 tests pass.", codex_session_id="s-1"
        )
        failed = FinishOutcome(
            TaskStatus.FAILED, failure_kind=FailureKind.MODEL_ERROR, status_detail="the model"
        )
        async with database.transaction() as connection:
            finished = await repository.finish_many(
                connection,
                [(call("running-4"), completed), (call("running-5"), failed), (call("claimed-2"), completed)],
            )
        assert [task.task_id if task else None for task in finished] == ["running-4", "running-5", None]
        four, five = finished[0], finished[1]
        assert four is not None and five is not None
        assert (four.status, four.reply_text, four.codex_session_id) == (
            TaskStatus.COMPLETED,
            "All 12 tests pass.",
            "s-1",
        )
        assert (five.status, five.failure_kind, five.status_detail, five.codex_session_id) == (
            TaskStatus.FAILED,
            FailureKind.MODEL_ERROR,
            "the model",
            "",
        )
        assert four.lease_expires_at is None and four.finished_at is not None
        async with database.read() as connection:
            untouched = await repository.task(connection, "claimed-2")
        assert untouched is not None and untouched.status is TaskStatus.CLAIMED
    finally:
        await database.dispose()


async def test_presence_of_a_device_named_twice_in_a_batch_is_written_once_per_owner(
    database_target: DatabaseTarget,
) -> None:
    database = await migrated(database_target)
    repository = SqlAlchemyTaskRepository(database.dialect)
    try:
        async with database.transaction() as connection:
            await repository.record_presence_many(
                connection, [("a", "n1", "w1"), ("a", "n2", "w2"), ("a", "n1", "w3"), ("b", "n1", "w4")]
            )
        async with database.read() as connection:
            columns = (device_presence.c.owner_id, device_presence.c.node_id, device_presence.c.worker_id)
            seen = (await connection.execute(select(*columns))).all()
        assert sorted(tuple(row) for row in seen) == [("a", "n1", "w3"), ("a", "n2", "w2"), ("b", "n1", "w4")]
    finally:
        await database.dispose()


async def test_a_claim_in_the_batch_of_a_finish_takes_the_thread_it_freed(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        await running.enqueue(task_request("task-1", thread="thread-1"))
        await running.enqueue(task_request("task-2", thread="thread-1"))
        first = await running.claim()
        await running.start("task-1", first.lease_id)
        tasks = running.app.tasks
        batches = tasks.writes.batches
        done = FinishOutcome(TaskStatus.COMPLETED, reply_text="done")
        finished, claimed = await asyncio.gather(
            tasks.finish("w1", "n1", "task-1", first.lease_id, done, owner_id="owner-1"),
            tasks.claim("w1", "n1", 0, owner_id="owner-1"),
        )
        assert tasks.writes.batches == batches + 1
        assert finished.status is TaskStatus.COMPLETED
        assert claimed is not None and claimed.task_id == "task-2" and claimed.status is TaskStatus.CLAIMED
        statuses = [(e["task_id"], e["status"]) for e in await running.status_events()]
        assert statuses[-2:] == [("task-1", "completed"), ("task-2", "claimed")]
        assert (await running.get("task-2")).status == pb.TASK_STATUS_CLAIMED
