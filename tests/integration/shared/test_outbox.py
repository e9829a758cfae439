"""The outbox sequencer and event stream on SQLite and PostgreSQL: committed events get gap-free
sequences in a visible order, a reader that resumes after a sequence loses and repeats nothing, and an
event whose transaction commits late is never skipped."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlalchemy import MetaData

from services.shared.db import Database
from services.shared.outbox import EventLog, NewEvent, StoredEvent, define_outbox_tables
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
        assert await event_log.refresh() == 3
        assert await event_log.refresh() == 0
        await publish(database, event_log)
        assert await event_log.refresh() == 0, "an empty append publishes nothing"

        everything = await event_log.read_after(0)
        assert [(e.sequence, e.payload["name"]) for e in everything] == [(1, "a"), (2, "b"), (3, "c")]
        assert [e.payload["name"] for e in await event_log.read_after(2)] == ["c"]
        assert await event_log.read_after(3) == []
    finally:
        await database.dispose()


async def test_follow_replays_backlog_then_delivers_live_events(database_target: DatabaseTarget) -> None:
    database, event_log = await open_log(database_target)
    sequencer = asyncio.create_task(event_log.run_notifier())
    try:
        await publish(database, event_log, "first", "second")
        event_log.kick()
        seen: list[tuple[int, str]] = []

        async def consume() -> None:
            async for run in event_log.follow_batches(1):
                seen.extend((event.sequence, event.payload["name"]) for event in run)
                if len(seen) >= 2:
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


async def test_a_later_writer_waits_so_sequences_become_visible_in_order(
    database_target: DatabaseTarget,
) -> None:
    """While one transaction holds appended events uncommitted, another service transaction that
    appends must wait: otherwise it could commit a higher sequence first and a reader that resumed
    after it would skip the lower one for ever."""
    database, event_log = await open_log(database_target)
    try:
        slow_appended = asyncio.Event()
        release = asyncio.Event()

        async def slow_writer() -> None:
            async with database.transaction() as connection:
                await event_log.append(connection, [NewEvent("test.happened", {"name": "slow"})])
                slow_appended.set()
                await release.wait()

        slow = asyncio.create_task(slow_writer())
        await slow_appended.wait()
        fast = asyncio.create_task(publish(database, event_log, "fast"))
        await asyncio.sleep(0.3)
        assert not fast.done(), "a second writer appended while the first held uncommitted events"
        assert await event_log.read_after(0) == []

        release.set()
        await asyncio.wait_for(asyncio.gather(slow, fast), 10)
        events = await event_log.read_after(0)
        assert [(e.sequence, e.payload["name"]) for e in events] == [(1, "slow"), (2, "fast")]
        assert await event_log.refresh() == 2
    finally:
        await database.dispose()


async def test_a_commit_during_an_empty_read_wakes_the_follower_at_once(
    database_target: DatabaseTarget,
) -> None:
    """A writer that commits and kicks while a follower's read is under way (the read saw nothing)
    must wake that follower now, not at its next poll (30 s here; no notifier runs)."""
    database, event_log = await open_log(database_target)
    read_after = event_log.read_after
    reads = 0

    async def read_racing_a_commit(*args: Any, **kwargs: Any) -> list[StoredEvent]:
        nonlocal reads
        reads += 1
        found = await read_after(*args, **kwargs)
        if reads == 1:
            await publish(database, event_log, "late")
            event_log.kick()
        return found

    event_log.read_after = read_racing_a_commit  # type: ignore[method-assign]
    runs = event_log.follow_batches(0, poll_seconds=30)
    try:
        run = await asyncio.wait_for(anext(runs), 5)
    finally:
        await runs.aclose()
        await database.dispose()
    assert [(event.sequence, event.payload["name"]) for event in run] == [(1, "late")]
    assert reads == 2


async def test_runs_group_what_one_read_finds_and_can_leave_payloads_as_text(
    database_target: DatabaseTarget,
) -> None:
    database, event_log = await open_log(database_target)
    try:
        await publish(database, event_log, "a", "b", "c")
        await publish(database, event_log, "d")
        runs = event_log.follow_batches(0, limit=2, decode=False)
        first, second = await anext(runs), await anext(runs)
        await runs.aclose()
    finally:
        await database.dispose()

    assert [e.sequence for e in first] == [1, 2] and [e.sequence for e in second] == [3, 4]
    assert [e.payload for e in first + second] == [{}, {}, {}, {}], "left undecoded"
    assert [e.payload_json for e in second] == ['{"name":"c"}', '{"name":"d"}']
    assert all(e.occurred_at.utcoffset() == timedelta(0) for e in first + second), "times in UTC"
    assert [e.thread_id for e in first + second] == ["a", "b", "c", "d"]
