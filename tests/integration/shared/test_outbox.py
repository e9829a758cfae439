"""The outbox sequencer and event stream on SQLite and PostgreSQL: committed events get gap-free
sequences in a visible order, a reader that resumes after a sequence loses and repeats nothing, and an
event whose transaction commits late is never skipped."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from opentelemetry import trace
from sqlalchemy import MetaData

from boss_common.tracing import context_of
from services.shared.db import Database
from services.shared.outbox import COPY_THRESHOLD, EventLog, NewEvent, StoredEvent, define_outbox_tables
from tests.conftest import DatabaseTarget
from tests.tracing_support import recorded_spans


async def open_log(target: DatabaseTarget) -> tuple[Database, EventLog]:
    metadata = MetaData()
    define_outbox_tables(metadata)
    database = Database.connect(target.url, target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    return database, event_log


async def publish(
    database: Database, event_log: EventLog, *names: str, event_type: str = "test.happened"
) -> list[StoredEvent]:
    async with database.transaction() as connection:
        return await event_log.append(
            connection, [NewEvent(event_type, {"name": n}, thread_id=n) for n in names]
        )


class CountingReads:
    """Counts `read_after` calls of an EventLog (reads of the table)."""

    def __init__(self, event_log: EventLog) -> None:
        self.count = 0
        read_after = event_log.read_after

        async def counted(*args: Any, **kwargs: Any) -> list[StoredEvent]:
            self.count += 1
            return await read_after(*args, **kwargs)

        event_log.read_after = counted  # type: ignore[method-assign]


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


async def test_append_returns_the_events_as_stored(database_target: DatabaseTarget) -> None:
    database, event_log = await open_log(database_target)
    try:
        await publish(database, event_log, "a")
        appended = await publish(database, event_log, *(f"n{i}" for i in range(10)))  # COPY on PostgreSQL
        small = await publish(database, event_log, "b", "c")
        stored = await event_log.read_after(1, decode=False)
    finally:
        await database.dispose()
    assert [e.sequence for e in appended + small] == list(range(2, 14))
    assert [(e.sequence, e.type, e.thread_id, e.payload_json) for e in appended + small] == [
        (e.sequence, e.type, e.thread_id, e.payload_json) for e in stored
    ]
    assert [e.occurred_at for e in appended + small] == [e.occurred_at for e in stored]


async def test_followers_take_kicked_events_from_memory(database_target: DatabaseTarget) -> None:
    """After `kick(committed)` a follower at the window's edge takes the events without reading the
    table, with the same content a read gives; a type filter skips the others in memory too."""
    database, event_log = await open_log(database_target)
    reads = CountingReads(event_log)
    runs = event_log.follow_batches(0, poll_seconds=30)
    wanted = event_log.follow_batches(0, poll_seconds=30, types=["test.wanted"], decode=False)
    try:
        first = await publish(database, event_log, "a")
        event_log.kick(first)
        assert [e.payload for e in await asyncio.wait_for(anext(runs), 5)] == [{"name": "a"}]
        reads_before = reads.count
        event_log.kick(await publish(database, event_log, "b", "c"))
        taken = await asyncio.wait_for(anext(runs), 5)
        assert [(e.sequence, e.payload) for e in taken] == [(2, {"name": "b"}), (3, {"name": "c"})]
        event_log.kick(await publish(database, event_log, "d", event_type="test.wanted"))
        taken = await asyncio.wait_for(anext(runs), 5)
        assert [(e.sequence, e.type) for e in taken] == [(4, "test.wanted")]
        assert reads.count == reads_before, "served from memory"
        filtered = await asyncio.wait_for(anext(wanted), 5)
        assert [(e.sequence, e.payload_json) for e in filtered] == [(4, '{"name":"d"}')]
        assert taken[0].trace_context == (await event_log.read_after(3))[0].trace_context
    finally:
        await runs.aclose()
        await wanted.aclose()
        await database.dispose()


async def test_a_gap_in_the_window_falls_back_to_the_table(database_target: DatabaseTarget) -> None:
    """Events another writer committed between two kicked runs (another process of the service, or
    a writer that kicked without its events) are read from the table: nothing is skipped."""
    database, event_log = await open_log(database_target)
    other_process = EventLog(database, event_log._events.metadata)
    runs = event_log.follow_batches(0, poll_seconds=30)
    try:
        event_log.kick(await publish(database, event_log, "a"))
        assert [e.sequence for e in await asyncio.wait_for(anext(runs), 5)] == [1]
        await publish(database, other_process, "from another process")
        event_log.kick(await publish(database, event_log, "c"))
        taken = await asyncio.wait_for(anext(runs), 5)
        assert [(e.sequence, e.payload["name"]) for e in taken] == [(2, "from another process"), (3, "c")]
        await publish(database, event_log, "kicked without events")
        event_log.kick()
        taken = await asyncio.wait_for(anext(runs), 5)
        assert [e.payload["name"] for e in taken] == ["kicked without events"]
        # The notifier seeing another process's commit beyond the window wakes a read of the table.
        await publish(database, other_process, "later")
        assert await event_log.refresh() > 0
        taken = await asyncio.wait_for(anext(runs), 5)
        assert [e.payload["name"] for e in taken] == ["later"]
    finally:
        await runs.aclose()
        await database.dispose()


async def test_end_followers_ends_a_waiting_follow_after_what_it_read(
    database_target: DatabaseTarget,
) -> None:
    """A draining process ends its event streams: a follower waiting for new events returns
    (instead of holding the shutdown for its grace period), after yielding what it had read, and a
    follow started later ends at once."""
    database, event_log = await open_log(database_target)
    try:
        event_log.kick(await publish(database, event_log, "a", "b"))
        seen: list[str] = []

        async def follow() -> None:
            async for run in event_log.follow_batches(0, poll_seconds=30):
                seen.extend(event.payload["name"] for event in run)

        following = asyncio.create_task(follow())
        while len(seen) < 2:
            await asyncio.sleep(0.01)
        assert not following.done()
        event_log.end_followers()
        await asyncio.wait_for(following, timeout=5)
        assert seen == ["a", "b"]
        later = [run async for run in event_log.follow_batches(0)]
        assert later == []
    finally:
        await database.dispose()


async def test_an_event_carries_its_own_trace_context_or_the_transactions(
    database_target: DatabaseTarget,
) -> None:
    """`NewEvent.trace_context` is stored and returned as given; the other events of the append
    carry the transaction's current one, in a one-statement append and a COPY-sized one alike."""
    database, event_log = await open_log(database_target)
    own = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    tracer = trace.get_tracer("test")
    try:
        with recorded_spans(), tracer.start_as_current_span("transaction") as span:
            current = dict(context_of(span))
            for size in (2, COPY_THRESHOLD + 1):
                async with database.transaction() as connection:
                    appended = await event_log.append(
                        connection,
                        [NewEvent("test.own", {}, trace_context=own)]
                        + [NewEvent("test.current", {}) for _ in range(size - 1)],
                    )
                stored = await event_log.read_after(appended[0].sequence - 1)
                for events in (appended, stored):
                    assert [event.trace_context for event in events] == [own] + [current] * (size - 1)
    finally:
        await database.dispose()
