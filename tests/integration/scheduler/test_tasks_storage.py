"""Task storage on SQLite and PostgreSQL: the migration creates exactly the tables and indexes the
definitions say, the unique index holds one claimed or running task per thread, and the claim
statement picks what the pure claim rule (`rules.claimable`) says, over random queues."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from services.scheduler import server as scheduler_server
from services.scheduler.adapters.tables import metadata
from services.scheduler.tasks.model import Task, TaskStatus, TaskType
from services.scheduler.tasks.repository import SqlAlchemyTaskRepository
from services.scheduler.tasks.rules import QueueEntry, claimable
from services.scheduler.tasks.tables import device_presence, tasks
from services.shared.db import Database
from services.shared.migrations import sync_url
from tests.conftest import DatabaseTarget

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def stored_task(task_id: str, thread: str, node: str, status: TaskStatus, position: int) -> Task:
    """A task row as the handlers would store it, `position` seconds after NOW."""
    at = NOW + timedelta(seconds=position)
    active = status in {TaskStatus.CLAIMED, TaskStatus.RUNNING}
    return Task(
        task_id=task_id,
        task_type=TaskType.CONVERSATION_REPLY,
        status=status,
        owner_id="owner-1",
        project_id=f"project-{thread}",
        target_project_id=f"project-{thread}",
        target_thread_id=thread,
        device_id=node,
        codex_folder_ref="/repo",
        codex_thread_ref=f"ref-{thread}",
        request_message_id=f"message-{task_id}",
        instruction_text="hello",
        dispatch_plan_id="",
        retry_of_task_id="",
        attempt=1 if status is not TaskStatus.QUEUED else 0,
        worker_id="w1" if active else "",
        lease_id=f"lease-{task_id}" if active else "",
        created_at=at,
        updated_at=at,
        lease_expires_at=at + timedelta(hours=1) if active else None,
    )


async def migrated(target: DatabaseTarget) -> Database:
    """The scheduler's migrated database for `target`."""
    schema = target.schema or "scheduler"
    await scheduler_server.migrate(target.url, schema)
    return Database.connect(target.url, schema)


async def test_the_migration_matches_the_task_table_definitions(database_target: DatabaseTarget) -> None:
    schema = database_target.schema or "scheduler"
    await scheduler_server.migrate(database_target.url, schema)
    engine = create_engine(sync_url(database_target.url))
    try:
        with engine.connect() as connection:
            if database_target.backend == "postgresql":
                connection.execute(text(f'SET search_path TO "{schema}"'))
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
            inspector = inspect(connection)
            indexes = {index["name"]: index for index in inspector.get_indexes("tasks")}
    finally:
        engine.dispose()
    assert differences == []
    assert {"ix_tasks_node_queue", "ix_tasks_thread_open", "ix_tasks_lease", "ux_tasks_thread_active"} <= set(
        indexes
    )
    assert indexes["ux_tasks_thread_active"]["unique"]
    assert tasks.name in metadata.tables and device_presence.name in metadata.tables


async def test_a_thread_never_holds_two_claimed_or_running_tasks(database_target: DatabaseTarget) -> None:
    database = await migrated(database_target)
    repository = SqlAlchemyTaskRepository(database.dialect)
    try:
        async with database.transaction() as connection:
            await repository.insert(connection, [stored_task("a", "thread-1", "n1", TaskStatus.RUNNING, 0)])
        with pytest.raises(IntegrityError):
            async with database.transaction() as connection:
                await repository.insert(
                    connection, [stored_task("b", "thread-1", "n1", TaskStatus.CLAIMED, 1)]
                )
        async with database.transaction() as connection:
            inserted = await repository.insert(
                connection,
                [
                    stored_task("c", "thread-1", "n1", TaskStatus.QUEUED, 2),
                    stored_task("d", "thread-2", "n1", TaskStatus.CLAIMED, 3),
                    stored_task("a", "thread-9", "n9", TaskStatus.QUEUED, 4),
                ],
            )
        assert inserted == {"c", "d"}
    finally:
        await database.dispose()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_claim_statement_follows_the_claim_rule(database_target: DatabaseTarget, seed: int) -> None:
    rng = random.Random(seed)
    database = await migrated(database_target)
    repository = SqlAlchemyTaskRepository(database.dialect)
    statuses = [TaskStatus.QUEUED] * 5 + [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.EXPIRED]
    rows: list[Task] = []
    active_threads: set[str] = set()
    for position in range(40):
        thread = f"thread-{rng.randrange(8)}"
        status = rng.choice(statuses + ([] if thread in active_threads else [TaskStatus.RUNNING]))
        if status is TaskStatus.RUNNING:
            active_threads.add(thread)
        rows.append(stored_task(f"task-{position:02d}", thread, rng.choice(["n1", "n2"]), status, position))
    entries = [
        QueueEntry(i, t.task_id, t.target_thread_id, t.device_id, t.status) for i, t in enumerate(rows)
    ]
    try:
        async with database.transaction() as connection:
            await repository.insert(connection, rows)
        for node in ("n1", "n2"):
            expected = [entry.task_id for entry in claimable(entries, node)]
            claimed_ids = []
            async with database.transaction() as connection:
                while (
                    task := await repository.claim(
                        connection, node, "w1", "lease", timedelta(seconds=30), owner_id="owner-1"
                    )
                ) is not None:
                    claimed_ids.append(task.task_id)
            assert claimed_ids == expected
            entries = [
                replace(entry, status=TaskStatus.CLAIMED) if entry.task_id in claimed_ids else entry
                for entry in entries
            ]
    finally:
        await database.dispose()
