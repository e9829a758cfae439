"""Deciding ahead (SchedulerHandlers, "Deciding ahead"): while a batch's writes run, the scheduler
decides the next batch's reports from the states it just decided; the next batch reuses them only
while every thread involved still has exactly that state, and stores the same outcome as deciding
it from scratch. On SQLite nothing is decided ahead (the repository keeps no written states)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from services.scheduler import server as scheduler_server
from services.scheduler.adapters import tables
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.service import SchedulerHandlers
from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.migrations import sync_url
from services.shared.outbox import EventLog, StoredEvent
from tests.conftest import DatabaseTarget, drop_schema

START = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
LEVELS = [(95.0, "safe"), (52.0, "watch"), (31.0, "urgent"), (12.0, "critical")]


def budget_event(sequence: int, thread: int, step: int) -> StoredEvent:
    """Thread `thread`'s report number `step` (0-3: safe, watch, urgent, critical)."""
    percent, level = LEVELS[step]
    payload: dict[str, Any] = {
        "thread_id": f"thread-{thread}",
        "project_id": f"project-{thread % 2}",
        "node_id": "node-1",
        "worker_id": "worker-1",
        "context_budget_remaining_pct": percent,
        "context_budget_level": level,
        "compaction_count": 0,
        "snapshot_version": step + 1,
        "captured_at": (START + timedelta(seconds=sequence)).isoformat(),
        "last_total_tokens": 1000 * (step + 1),
    }
    return StoredEvent(
        sequence,
        "thread.context.updated",
        START,
        payload["thread_id"],
        payload["project_id"],
        "",
        payload,
        {},
    )


def batches() -> list[list[StoredEvent]]:
    """Four batches; each moves threads 0-3 one level down, so every batch's decisions depend on
    the previous batch's states."""
    return [[budget_event(step * 4 + thread + 1, thread, step) for thread in range(4)] for step in range(4)]


@contextlib.contextmanager
def another_database(target: DatabaseTarget, tmp_path: Path) -> Iterator[DatabaseTarget]:
    """A second empty database of the same backend as `target` (dropped afterwards)."""
    if target.backend == "sqlite":
        yield DatabaseTarget("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'other.sqlite3'}", "")
        return
    schema = f"{target.schema}_other"
    engine = create_engine(sync_url(target.url))
    with engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield DatabaseTarget("postgresql", target.url, schema)
    finally:
        drop_schema(engine, schema)
        engine.dispose()


async def open_scheduler(target: DatabaseTarget) -> tuple[Database, SchedulerHandlers, EventConsumer]:
    name = target.schema or "scheduler"
    await scheduler_server.migrate(target.url, name)
    database = Database.connect(target.url, name)
    event_log = EventLog(database, tables.metadata)
    await event_log.ensure_sequencer_row()
    handlers = SchedulerHandlers(database, event_log, SchedulerSettings())

    async def no_stream(_after: int) -> Any:  # pragma: no cover - batches are applied directly
        raise AssertionError("not opened")
        yield

    consumer = EventConsumer(
        stream_name="context_budget",
        database=database,
        cursors=tables.event_cursors,
        open_stream=no_stream,
        handle=handlers.apply_budget_events,
        event_log=event_log,
        after_commit=handlers.budget_batch_committed,
    )
    return database, handlers, consumer


async def outcome(database: Database) -> dict[str, Any]:
    """What the batches stored, without the random ids: each thread's level, flags and commands
    sent, and how many commands and packages of each kind exist."""
    async with database.read() as connection:
        threads = (
            await connection.execute(
                text(
                    "SELECT thread_id, level, remaining_pct, no_large_context_appends, "
                    "finish_current_subtask, context_growth_frozen, master_must_finish, commands_sent, "
                    "relay_thread_id <> '' AS has_relay, current_package_status FROM scheduled_threads "
                    "ORDER BY thread_id"
                )
            )
        ).all()
        commands = (
            await connection.execute(
                text(
                    "SELECT thread_id, command_type, count(*) FROM worker_commands "
                    "GROUP BY thread_id, command_type ORDER BY thread_id, command_type"
                )
            )
        ).all()
        packages = (
            await connection.execute(text("SELECT count(*) FROM thread_handoff_packages"))
        ).scalar_one()
    return {
        "threads": [tuple(row) for row in threads],
        "commands": [tuple(row) for row in commands],
        "packages": packages,
    }


async def run(target: DatabaseTarget, ahead: bool) -> tuple[dict[str, Any], SchedulerHandlers]:
    database, handlers, consumer = await open_scheduler(target)
    all_batches = batches()
    try:
        for index, batch in enumerate(all_batches):
            following = all_batches[index + 1] if ahead and index + 1 < len(all_batches) else []
            handlers.upcoming = following.copy
            await consumer.apply(batch)
        return await outcome(database), handlers
    finally:
        await database.dispose()


async def test_decisions_made_ahead_store_what_deciding_afresh_stores(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    with another_database(database_target, tmp_path) as other:
        afresh, _ = await run(other, ahead=False)
    reused, handlers = await run(database_target, ahead=True)

    assert reused == afresh
    assert [row[1] for row in reused["threads"]] == ["critical"] * 4
    assert all(row[8] for row in reused["threads"])  # relay threads pre-created at urgent
    assert ("thread-0", "prepare_handoff", 2) in reused["commands"]  # at urgent, and again at critical
    if database_target.backend == "postgresql":
        assert (handlers.batches_decided_ahead, handlers.batches_redecided) == (3, 0)
    else:
        assert (handlers.batches_decided_ahead, handlers.batches_redecided) == (0, 0)


async def apply_first_two_batches(
    target: DatabaseTarget,
    decided_ahead: list[StoredEvent],
    between: Callable[[SchedulerHandlers], Awaitable[Any]] | None = None,
) -> tuple[dict[str, Any], SchedulerHandlers]:
    """Applies batches 1 and 2 with `decided_ahead` as the events waiting behind batch 1, running
    `between` after batch 1; returns the outcome and the handlers."""
    database, handlers, consumer = await open_scheduler(target)
    first, second = batches()[:2]
    try:
        handlers.upcoming = decided_ahead.copy
        await consumer.apply(first)
        if between is not None:
            await between(handlers)
        handlers.upcoming = list
        await consumer.apply(second)
        return await outcome(database), handlers
    finally:
        await database.dispose()


async def test_a_thread_changed_meanwhile_is_decided_again_from_its_stored_state(
    database_target: DatabaseTarget,
) -> None:
    async def master_sets_must_finish(handlers: SchedulerHandlers) -> None:
        await handlers.set_must_finish("thread-2", True, "release branch")

    stored, handlers = await apply_first_two_batches(database_target, batches()[1], master_sets_must_finish)

    assert handlers.batches_decided_ahead == 0
    if database_target.backend == "postgresql":
        assert handlers.batches_redecided == 1
    thread_2 = next(row for row in stored["threads"] if row[0] == "thread-2")
    assert thread_2[1] == "watch" and bool(thread_2[6])  # the master's flag survived the batch


async def test_a_batch_that_does_not_start_with_the_decided_events_is_decided_afresh(
    database_target: DatabaseTarget,
) -> None:
    stored, handlers = await apply_first_two_batches(database_target, batches()[2])  # not what comes next

    assert handlers.batches_decided_ahead == 0
    assert [row[1] for row in stored["threads"]] == ["watch"] * 4
