"""The outbox sequencer and event stream on SQLite and PostgreSQL: committed events get gap-free
sequences in a visible order, a reader that resumes after a sequence loses and repeats nothing, and an
event whose transaction commits late is never skipped."""

from __future__ import annotations

import asyncio

from sqlalchemy import MetaData

from services.shared.db import Database
from services.shared.outbox import EventLog, NewEvent, define_outbox_tables
from tests.conftest import DatabaseTarget


async def open_log(target: DatabaseTarget) -> tuple[Database, EventLog]:
    metadata = MetaData()
    define_outbox_tables(metadata)
    database = Database.connect(target.url, target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    return database, event_log


async def publish(database: Database, event_log: EventLog, *names: str) -> None:
    async with database.transaction() as connection:
        await event_log.append(
            connection, [NewEvent("test.happened", {"name": n}, thread_id=n) for n in names]
        )


async def test_sequences_are_gap_free_and_resumable(database_target: DatabaseTarget) -> None:
    database, event_log = await open_log(database_target)
    try:
        await publish(database, event_log, "a", "b")
        await publish(database, event_log, "c")
        assert await event_log.sequence_pending() == 3
        assert await event_log.sequence_pending() == 0

        everything = await event_log.read_after(0)
        assert [(e.sequence, e.payload["name"]) for e in everything] == [(1, "a"), (2, "b"), (3, "c")]
        assert [e.payload["name"] for e in await event_log.read_after(2)] == ["c"]
        assert await event_log.read_after(3) == []
    finally:
        await database.dispose()


async def test_follow_replays_backlog_then_delivers_live_events(database_target: DatabaseTarget) -> None:
    database, event_log = await open_log(database_target)
    sequencer = asyncio.create_task(event_log.run_sequencer())
    try:
        await publish(database, event_log, "first", "second")
        event_log.kick()
        seen: list[tuple[int, str]] = []

        async def consume() -> None:
            async for event in event_log.follow(1):
                seen.append((event.sequence, event.payload["name"]))
                if len(seen) == 2:
                    return

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        await publish(database, event_log, "third")
        event_log.kick()
        await asyncio.wait_for(consumer, 5)
        assert seen == [(2, "second"), (3, "third")]
    finally:
        sequencer.cancel()
        await database.dispose()


async def test_late_committing_transaction_is_not_skipped(database_target: DatabaseTarget) -> None:
    """On PostgreSQL an open transaction holds a lower id while a later one commits first; the reader
    must still see both, in sequence order, once both committed."""
    database, event_log = await open_log(database_target)
    if database.dialect == "sqlite":
        # SQLite serialises writers (BEGIN IMMEDIATE), so there is no interleaving to test; the
        # ordering still holds trivially.
        await publish(database, event_log, "only")
        assert await event_log.sequence_pending() == 1
        await database.dispose()
        return
    try:
        slow_open = asyncio.Event()
        release = asyncio.Event()

        async def slow_writer() -> None:
            async with database.transaction() as connection:
                await event_log.append(connection, [NewEvent("test.happened", {"name": "slow"})])
                slow_open.set()
                await release.wait()

        slow = asyncio.create_task(slow_writer())
        await slow_open.wait()
        await publish(database, event_log, "fast")
        assert await event_log.sequence_pending() == 1
        first = await event_log.read_after(0)
        assert [e.payload["name"] for e in first] == ["fast"]

        release.set()
        await slow
        assert await event_log.sequence_pending() == 1
        rest = await event_log.read_after(first[-1].sequence)
        assert [(e.sequence, e.payload["name"]) for e in rest] == [(2, "slow")]
    finally:
        await database.dispose()
