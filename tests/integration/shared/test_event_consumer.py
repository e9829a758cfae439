"""The shared EventConsumer on SQLite and PostgreSQL: a busy stream is applied in few, full
transactions with the durable cursor, an idle stream's single event is applied alone and at once, and
a restart resumes after the stored cursor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from boss.common.v1 import events_pb2
from opentelemetry import trace
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.tracing import context_of
from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.outbox import EventLog, NewEvent, StoredEvent, define_outbox_tables
from tests.conftest import DatabaseTarget
from tests.tracing_support import ids, ids_of, recorded_spans, spans_named

# Events per upstream response: neither a divisor nor a multiple of the consumer's batch size (200).
RUN = 70


class Upstream:
    """A stream stand-in: yields published envelopes after the requested sequence, then waits."""

    def __init__(self) -> None:
        self.envelopes: list[events_pb2.EventEnvelope] = []
        self.grown = asyncio.Event()

    def publish(self, count: int) -> None:
        for _ in range(count):
            sequence = len(self.envelopes) + 1
            self.envelopes.append(
                events_pb2.EventEnvelope(
                    sequence=sequence, type="test.happened", payload_json=f'{{"n":{sequence}}}'
                )
            )
        self.grown.set()

    async def open(self, after_sequence: int) -> AsyncIterator[list[events_pb2.EventEnvelope]]:
        """Runs of up to RUN envelopes, as WatchEvents responses carry them (a run does not line
        up with the consumer's batches, so runs are split across transactions)."""
        cursor = after_sequence
        while True:
            while cursor < len(self.envelopes):
                run = self.envelopes[cursor : cursor + RUN]
                yield run
                cursor += len(run)
                await asyncio.sleep(0)
            self.grown.clear()
            await self.grown.wait()


async def make_consumer(
    target: DatabaseTarget, upstream: Upstream, batches: list[list[int]]
) -> tuple[Database, EventConsumer]:
    metadata = MetaData()
    _events, _sequencer, cursors = define_outbox_tables(metadata)
    database = Database.connect(target.url, target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)

    async def handle(_connection: AsyncConnection, events: list[StoredEvent]) -> list[NewEvent]:
        batches.append([event.payload["n"] for event in events])
        return []

    consumer = EventConsumer(
        stream_name="upstream",
        database=database,
        cursors=cursors,
        open_stream=upstream.open,
        handle=handle,
        batch_size=200,
    )
    return database, consumer


async def test_busy_stream_fills_batches_and_idle_event_goes_alone(database_target: DatabaseTarget) -> None:
    upstream = Upstream()
    batches: list[list[int]] = []
    database, consumer = await make_consumer(database_target, upstream, batches)
    task = asyncio.create_task(consumer.run())
    try:
        upstream.publish(1_000)
        await consumer.wait_for(1_000)
        applied = [n for batch in batches for n in batch]
        assert applied == list(range(1, 1_001)), "every event once, in order"
        assert max(len(batch) for batch in batches) == 200
        assert len(batches) <= 12, f"{len(batches)} transactions for 1,000 queued events"

        await asyncio.sleep(0.05)
        before = len(batches)
        upstream.publish(1)
        await consumer.wait_for(1_001)
        assert batches[before:] == [[1_001]]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    resumed_batches: list[list[int]] = []
    _database, resumed = await make_consumer(database_target, upstream, resumed_batches)
    task = asyncio.create_task(resumed.run())
    try:
        assert await resumed.load_cursor() == 1_001
        upstream.publish(2)
        await resumed.wait_for(1_003)
        assert [n for batch in resumed_batches for n in batch] == [1_002, 1_003]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await _database.dispose()
        await database.dispose()


async def test_upcoming_shows_what_the_next_batch_starts_with(database_target: DatabaseTarget) -> None:
    upstream = Upstream()
    batches: list[list[int]] = []
    seen_ahead: list[list[int]] = []
    database, consumer = await make_consumer(database_target, upstream, batches)
    apply_batch = consumer._handle

    async def handle(connection: AsyncConnection, events: list[StoredEvent]) -> list[NewEvent]:
        seen_ahead.append([event.payload["n"] for event in consumer.upcoming()])
        return await apply_batch(connection, events)

    consumer._handle = handle
    assert consumer.upcoming() == []  # not following yet
    task = asyncio.create_task(consumer.run())
    try:
        upstream.publish(1_000)
        await consumer.wait_for(1_000)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await database.dispose()

    assert consumer.upcoming() == []  # stopped following
    assert any(seen_ahead[:-1]), "a busy stream has events waiting behind the batch in flight"
    for ahead, following in zip(seen_ahead, batches[1:], strict=False):
        assert len(ahead) <= 200
        assert following[: len(ahead)] == ahead, "upcoming events are the next batch's first ones"
    assert seen_ahead[-1] == [], "nothing waits behind the last batch"


async def test_a_batch_partly_applied_by_another_process_is_applied_from_where_that_stopped(
    database_target: DatabaseTarget,
) -> None:
    """Two consumers of one stream on one database (as two processes of a service would be): the
    second, whose in-memory cursor is behind, applies only what the first has not, and the stored
    cursor ends at the last event. On PostgreSQL the overlap is found when the cursor moves at the
    end of the transaction, which is then rolled back and retried; on SQLite at its start."""
    applied_by_first: list[list[int]] = []
    applied_by_second: list[list[int]] = []
    database, first = await make_consumer(database_target, Upstream(), applied_by_first)
    second_database, second = await make_consumer(database_target, Upstream(), applied_by_second)
    events = [
        StoredEvent(n, "test.happened", datetime.now(UTC), "", "", "", {"n": n}, {}) for n in range(1, 6)
    ]
    try:
        await first.apply(events[:3])
        await second.apply(events)
        assert await first.load_cursor() == 5
    finally:
        await database.dispose()
        await second_database.dispose()
    assert applied_by_first == [[1, 2, 3]]
    if database_target.backend == "postgresql":  # the first attempt was rolled back
        assert applied_by_second == [[1, 2, 3, 4, 5], [4, 5]]
    else:
        assert applied_by_second == [[4, 5]]
    assert second.last_sequence == 5


async def test_a_traced_batch_links_to_its_events_traces_and_passes_its_own_on(
    database_target: DatabaseTarget,
) -> None:
    """With tracing on, a batch is applied in one span of its own that links to each distinct
    trace its events carry (once each), and the events it publishes carry that span's context."""
    metadata = MetaData()
    _events, _sequencer, cursors = define_outbox_tables(metadata)
    database = Database.connect(database_target.url, database_target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()

    async def echo(_connection: AsyncConnection, events: list[StoredEvent]) -> list[NewEvent]:
        return [NewEvent("test.echoed", {"n": len(events)})]

    upstream = Upstream()
    consumer = EventConsumer(
        stream_name="upstream",
        database=database,
        cursors=cursors,
        open_stream=upstream.open,
        handle=echo,
        event_log=event_log,
    )
    tracer = trace.get_tracer("test")
    task: asyncio.Task[None] | None = None
    try:
        with recorded_spans() as spans:
            senders = [tracer.start_span(name) for name in ("report a", "report b")]
            carried = [dict(context_of(span)) for span in senders]
            upstream.publish(4)
            for envelope, context in zip(
                upstream.envelopes, [carried[0], carried[1], carried[0], {}], strict=True
            ):
                envelope.trace_context.update(context)
            task = asyncio.create_task(consumer.run())
            await consumer.wait_for(4)
        [batch] = spans_named(spans, "apply upstream events")
        [echoed] = await event_log.read_after(0)
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await database.dispose()

    assert batch.parent is None, "a trace of its own"
    assert [(link.context.trace_id, link.context.span_id) for link in batch.links] == [
        (sender.get_span_context().trace_id, sender.get_span_context().span_id) for sender in senders
    ]
    assert dict(batch.attributes or {}) == {
        "messaging.destination.name": "upstream",
        "messaging.batch.message_count": 4,
        "code.function.name": echo.__qualname__,
    }
    assert echoed.payload == {"n": 4}
    assert ids_of(echoed.trace_context) == ids(batch)
