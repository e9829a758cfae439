"""Event streams between contexts: the server side of `WatchEvents`, and a durable consumer.

Publisher: `watch_events()` turns a service's `EventLog` into runs of `EventEnvelope`s for its
`WatchEvents(after_sequence)` RPC: one response carries every event one read of the outbox found
(up to 500), so per-message gRPC work is paid per burst, not per event.

Consumer: `EventConsumer` follows another context's stream and applies events in batches; each batch
is applied in one transaction of the consumer's own database *together with* the stored cursor
(`event_cursors`), so a restart of either side loses and repeats nothing. Handlers must still be
idempotent by sequence for safety, and must not call other services.

Batching: a transaction costs a few milliseconds whatever its size, so under load the consumer must
apply many events per transaction to keep up with its upstream. A batch is everything the reader has
queued (up to `batch_size`), plus whatever it can take off the connection without waiting: the
applier yields to the event loop while that grows the batch, at most `SETTLE_YIELDS` times. Upstream
responses carry runs of up to 500 events (what one read of its outbox found), so a consumer that
falls behind receives big runs and its batches grow by themselves; an idle one applies a new event
almost at once. (Waiting a millisecond or more for further events, as an earlier version did on a
busy stream, only added latency once responses carried runs: bench/RESULTS.md.)

Traces (when tracing is on, boss_common/tracing.py): each batch is applied inside an
"apply <stream_name> events" span that starts a trace of its own and links to every distinct trace
context its events carry (at most `MAX_SPAN_LINKS`); the events the batch publishes carry that
span's context (the outbox captures the current one), so the next consumer links on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import grpc
import orjson
from boss.common.v1 import events_pb2
from opentelemetry import trace
from opentelemetry.context import Context
from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.reconnection import Reconnection
from boss_common.tracing import link_to, tracing_enabled
from services.shared.db import Database
from services.shared.outbox import CursorMove, EventLog, NewEvent, StoredEvent
from services.shared.sql_types import CarriedWrites
from services.shared.time import from_timestamp, to_timestamp, utc_now

log = logging.getLogger(__name__)

# How many times an idle consumer yields to the event loop while that still grows its batch.
SETTLE_YIELDS = 8
# Most links a batch span makes to the traces of its events (module docstring, "Traces").
MAX_SPAN_LINKS = 64


def to_envelope(event: StoredEvent) -> events_pb2.EventEnvelope:
    """The wire form of a stored event (its stored payload JSON as is, when it has it)."""
    return events_pb2.EventEnvelope(
        sequence=event.sequence,
        type=event.type,
        occurred_at=to_timestamp(event.occurred_at),
        thread_id=event.thread_id,
        project_id=event.project_id,
        node_id=event.node_id,
        payload_json=event.payload_json or json.dumps(event.payload, separators=(",", ":")),
        trace_context=event.trace_context,
    )


def from_envelope(envelope: events_pb2.EventEnvelope) -> StoredEvent:
    """A stored event from its wire form. Raises ValueError for a payload that is not a JSON object."""
    payload = orjson.loads(envelope.payload_json or "{}")
    if not isinstance(payload, dict):
        raise ValueError(f"event {envelope.sequence}: payload is not a JSON object")
    return StoredEvent(
        sequence=envelope.sequence,
        type=envelope.type,
        occurred_at=from_timestamp(envelope.occurred_at),
        thread_id=envelope.thread_id,
        project_id=envelope.project_id,
        node_id=envelope.node_id,
        payload=payload,
        # Most events carry no trace context; copying an empty protobuf map still costs a walk of it.
        trace_context=dict(envelope.trace_context) if envelope.trace_context else {},
    )


async def watch_events(
    event_log: EventLog, after_sequence: int, types: Sequence[str] = ()
) -> AsyncIterator[list[events_pb2.EventEnvelope]]:
    """Runs of envelopes (one `WatchEventsResponse` each) for every event after `after_sequence`,
    backlog first, then live, until the caller stops (the RPC is cancelled). A run is what one read
    of the outbox found (at most `FOLLOW_BATCH_LIMIT` events), so a burst committed together costs
    one message instead of one per event."""
    async for batch in event_log.follow_batches(after_sequence, types, decode=False):
        yield [to_envelope(stored) for stored in batch]


@dataclass(frozen=True)
class Publication:
    """What a handler's batch publishes, when it also hands over its last writes: `events` as a
    handler would return them, and `carrying`, writes that the outbox append makes in its own
    statement (PostgreSQL; `EventLog.append`), a round trip fewer per batch."""

    events: list[NewEvent]
    carrying: CarriedWrites | None = None


BatchHandler = Callable[[AsyncConnection, list[StoredEvent]], Awaitable[list[NewEvent] | Publication]]
StreamOpener = Callable[[int], AsyncIterator[Sequence[events_pb2.EventEnvelope]]]


class EventConsumer:
    """Follows one upstream stream into this service's database with a durable cursor.

    Args:
        stream_name: the cursor's key in `event_cursors`, e.g. "context_budget".
        database: this service's database.
        cursors: this service's `event_cursors` table.
        open_stream: opens the upstream `WatchEvents` after a sequence, yielding runs of envelopes
            (the `events` of each response).
        handle: applies a batch inside the given transaction and returns events to publish from
            this service's own outbox (written in the same transaction), or a `Publication` of
            them with writes for the append to carry (PostgreSQL only).
        event_log: this service's outbox, when handlers publish events.
        batch_size: most events applied per transaction.
        after_commit: called (synchronously, no arguments) after each batch's transaction committed,
            e.g. to hand what the batch changed to work that must only see committed rows.
    """

    def __init__(
        self,
        *,
        stream_name: str,
        database: Database,
        cursors: Table,
        open_stream: StreamOpener,
        handle: BatchHandler,
        event_log: EventLog | None = None,
        batch_size: int = 500,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        self.stream_name = stream_name
        self._database = database
        self._cursors = cursors
        self._open_stream = open_stream
        self._handle = handle
        self._event_log = event_log
        self._batch_size = batch_size
        self._after_commit = after_commit
        self._handler_name = getattr(handle, "__qualname__", type(handle).__name__)
        self.last_sequence = 0
        self.batches_applied = 0
        self.applied = asyncio.Condition()
        # False while the consumer waits to retry after a failed or ended stream (metrics).
        self.following = False
        self._inbox: _Inbox | None = None
        self._in_flight: list[StoredEvent] = []
        self._reconnection = Reconnection()

    def backlog(self) -> ConsumerBacklog:
        """What has been received and not yet committed: the batch being applied and the events
        queued behind it (for metrics; upstream events not yet received are not counted)."""
        waiting = self._inbox.waiting() if self._inbox is not None else (0, None)
        pending = len(self._in_flight) + waiting[0]
        oldest = self._in_flight[0].occurred_at if self._in_flight else waiting[1]
        return ConsumerBacklog(pending_events=pending, oldest_pending_at=oldest)

    def upcoming(self) -> list[StoredEvent]:
        """The events received after the batch being applied and not yet taken (at most
        `batch_size`, in order; empty when none or when the consumer is not following): what the
        next batch will start with. A handler may look at them while its batch is in flight, e.g. to
        compute ahead while its writes run (see the scheduler's `SchedulerHandlers`); they are not
        applied until that next batch."""
        return self._inbox.peek(self._batch_size) if self._inbox is not None else []

    async def load_cursor(self) -> int:
        """The last sequence applied (0 when never)."""
        async with self._database.read() as connection:
            value = (
                await connection.execute(
                    select(self._cursors.c.last_sequence).where(
                        self._cursors.c.stream_name == self.stream_name
                    )
                )
            ).scalar_one_or_none()
        self.last_sequence = int(value or 0)
        return self.last_sequence

    async def apply(self, batch: list[StoredEvent]) -> None:
        """Applies a batch and advances the cursor in one transaction; events at or below the cursor
        are dropped (a replay after reconnect).

        On PostgreSQL the cursor row is locked and moved at the end of the transaction, by the same
        statement as the outbox append of the events the batch publishes (a round trip fewer than
        a locking read first). When that finds the cursor already past the batch's first event
        (another process of this service applied part of it meanwhile), the transaction is rolled
        back and the rest of the batch applied again. SQLite serialises writers with
        `BEGIN IMMEDIATE`: its cursor is read at the start and written at the end."""
        fresh = [event for event in batch if event.sequence > self.last_sequence]
        self._in_flight = fresh
        try:
            with self._batch_span(fresh):
                while fresh:
                    try:
                        await self._apply_fresh(fresh)
                        return
                    except _AppliedElsewhere as moved:
                        async with self.applied:
                            self.last_sequence = max(self.last_sequence, moved.cursor)
                        fresh = [event for event in fresh if event.sequence > moved.cursor]
        finally:
            self._in_flight = []

    def _batch_span(self, events: list[StoredEvent]) -> contextlib.AbstractContextManager[object]:
        """The current span while a batch is applied (module docstring, "Traces"); nothing when
        tracing is off or the batch is empty."""
        if not events or not tracing_enabled():
            return contextlib.nullcontext()
        return trace.get_tracer(__name__).start_as_current_span(
            f"apply {self.stream_name} events",
            context=Context(),
            links=links_to_traces_of(events),
            attributes={
                "messaging.destination.name": self.stream_name,
                "messaging.batch.message_count": len(events),
                "code.function.name": self._handler_name,
            },
        )

    async def _apply_fresh(self, fresh: list[StoredEvent]) -> None:
        """`apply` for events past the in-memory cursor. Raises _AppliedElsewhere (after rolling
        back) when the stored cursor is past the first of them."""
        async with self._database.transaction() as connection:
            postgres = connection.dialect.name == "postgresql"
            stored: int | None = None
            if not postgres:
                stored = (
                    await connection.execute(
                        select(self._cursors.c.last_sequence)
                        .where(self._cursors.c.stream_name == self.stream_name)
                        .with_for_update()
                    )
                ).scalar_one_or_none()
                fresh = [event for event in fresh if event.sequence > int(stored or 0)]
                if not fresh:
                    return
            handled = await self._handle(connection, fresh)
            published, carrying = (
                (handled.events, handled.carrying) if isinstance(handled, Publication) else (handled, None)
            )
            appended: list[StoredEvent] = []
            if postgres:
                move = CursorMove(self._cursors.name, self.stream_name, fresh[-1].sequence)
                if self._event_log is not None:  # it moves the cursor with the append (or alone)
                    appended = await self._event_log.append(
                        connection, published, cursor_move=move, carrying=carrying
                    )
                else:
                    if carrying is not None:
                        await carrying.run(connection)
                    await move.run(connection)
                stored = move.previous
                if stored is not None and stored >= fresh[0].sequence:
                    raise _AppliedElsewhere(stored)
            elif carrying is not None:
                raise RuntimeError("carried writes are PostgreSQL driver SQL: the handler must write itself")
            elif published and self._event_log is not None:
                appended = await self._event_log.append(connection, published)
            values = {"last_sequence": fresh[-1].sequence, "updated_at": utc_now()}
            if stored is None:
                await connection.execute(
                    self._cursors.insert().values(stream_name=self.stream_name, **values)
                )
            elif not postgres:
                await connection.execute(
                    self._cursors.update()
                    .where(self._cursors.c.stream_name == self.stream_name)
                    .values(**values)
                )
        if appended and self._event_log is not None:
            self._event_log.kick(appended)
        if self._after_commit is not None:
            self._after_commit()
        self.batches_applied += 1
        async with self.applied:
            self.last_sequence = fresh[-1].sequence
            self.applied.notify_all()

    async def wait_for(self, sequence: int, timeout: float = 10.0) -> None:
        """Waits until the consumer applied `sequence` (for tests and read-your-writes)."""
        async with self.applied:
            async with asyncio.timeout(timeout):
                await self.applied.wait_for(lambda: self.last_sequence >= sequence)

    async def run(self) -> None:
        """Follows the upstream forever, reconnecting as `Reconnection` says: at once after a
        healthy stream ended (servers recycle connections every few minutes: logged at INFO), with
        backoff while the upstream is unavailable (WARNING). Cancel the task to stop."""
        reconnection = self._reconnection
        while True:
            reconnection.attempt_started()
            self.following = True
            try:
                await self._follow_once()
            except asyncio.CancelledError:
                self.following = False
                raise
            except (grpc.aio.AioRpcError, ConnectionError) as error:
                reason = error.code() if isinstance(error, grpc.aio.AioRpcError) else error
                delay = reconnection.ended(log, f"{self.stream_name} stream", reason)
                if isinstance(error, grpc.aio.AioRpcError) and reason == grpc.StatusCode.FAILED_PRECONDITION:
                    # e.g. EVENTS_PRUNED: the upstream no longer keeps what follows this cursor.
                    log.error(
                        "%s stream refused cursor %d: %s",
                        self.stream_name,
                        self.last_sequence,
                        error.details(),
                    )
            except Exception:
                delay = reconnection.next_delay()
                log.exception("%s consumer failed; retrying in %.1f s", self.stream_name, delay)
            self.following = False
            await asyncio.sleep(delay)

    async def _settle(self, inbox: _Inbox, batch: list[StoredEvent]) -> BaseException | None:
        """Grows a batch before it is applied (module docstring): yields to the loop and takes what
        arrived, for as long as each yield brings more (`SETTLE_YIELDS` times at most) and the
        batch is not full. Returns a failure the reader queued."""
        for _ in range(SETTLE_YIELDS):
            if len(batch) >= self._batch_size:
                return None
            seen = len(batch)
            await asyncio.sleep(0)
            failure = inbox.take(batch, self._batch_size)
            if failure is not None or len(batch) == seen:
                return failure
        return None

    async def _follow_once(self) -> None:
        cursor = await self.load_cursor()
        inbox = self._inbox = _Inbox()

        async def read() -> None:
            try:
                async for envelopes in self._open_stream(cursor):
                    self._reconnection.delivered()
                    await inbox.put([from_envelope(envelope) for envelope in envelopes])
                await inbox.put(ConnectionError(f"{self.stream_name} stream ended"))
            except asyncio.CancelledError:
                raise  # the applier stopped us: nobody would take a queued failure
            except Exception as error:  # handed to the applier, which re-raises it
                await inbox.put(error)

        reader = asyncio.create_task(read())
        try:
            while True:
                batch: list[StoredEvent] = []
                failure = await inbox.wait(batch, self._batch_size)
                if failure is None:
                    failure = await self._settle(inbox, batch)
                if batch:
                    await self.apply(batch)
                if failure is not None:
                    raise failure
        finally:
            self._inbox = None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


def links_to_traces_of(events: Sequence[StoredEvent]) -> list[trace.Link]:
    """A link to each distinct trace context the events carry, in order, at most MAX_SPAN_LINKS."""
    links: list[trace.Link] = []
    seen: set[str] = set()
    for event in events:
        parent = event.trace_context.get("traceparent")
        if not parent or parent in seen:
            continue
        seen.add(parent)
        link = link_to(event.trace_context)
        if link is not None:
            links.append(link)
            if len(links) >= MAX_SPAN_LINKS:
                break
    return links


@dataclass(frozen=True)
class ConsumerBacklog:
    """A consumer's received, uncommitted events: how many, and the `occurred_at` (UTC) of the
    oldest (None when there are none)."""

    pending_events: int
    oldest_pending_at: datetime | None


class _AppliedElsewhere(Exception):
    """The stored cursor (`cursor`) was past the first event of the batch being applied: another
    process of the service applied part of it. Raised inside the transaction to roll it back."""

    def __init__(self, cursor: int) -> None:
        super().__init__(f"cursor already at {cursor}")
        self.cursor = cursor


# Runs (WatchEvents responses) the reader may queue ahead of the applier.
INBOX_RUNS = 8


@dataclass
class _Inbox:
    """What the reader has received and the applier not yet taken: whole runs in `runs` (or a
    failure to re-raise), at most `capacity` of them (the reader waits for room), and the rest of a
    run that did not fit the previous batch in `carry`. One reader, one applier."""

    capacity: int = INBOX_RUNS
    runs: deque[list[StoredEvent] | BaseException] = field(default_factory=deque)
    carry: list[StoredEvent] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)

    async def put(self, item: list[StoredEvent] | BaseException) -> None:
        """Queues a run (or a failure), waiting while `capacity` runs are queued."""
        while len(self.runs) >= self.capacity:
            self.room.clear()
            await self.room.wait()
        self.runs.append(item)
        self.arrived.set()

    async def wait(self, batch: list[StoredEvent], limit: int) -> BaseException | None:
        """Waits for at least one event (unless some are carried) and moves up to `limit` into
        `batch`; returns a failure the reader queued instead, if that came first."""
        while not self.carry and not self.runs:
            self.arrived.clear()
            await self.arrived.wait()
        return self.take(batch, limit)

    def take(self, batch: list[StoredEvent], limit: int) -> BaseException | None:
        """Moves waiting events into `batch` until it holds `limit`; returns a queued failure."""
        while len(batch) < limit:
            if not self.carry:
                if not self.runs:
                    return None
                item = self.runs.popleft()
                self.room.set()
                if isinstance(item, BaseException):
                    return item
                self.carry = item
            room = limit - len(batch)
            batch.extend(self.carry[:room])
            self.carry = self.carry[room:]
        return None

    def waiting(self) -> tuple[int, datetime | None]:
        """How many events wait (carried and queued), and the oldest one's `occurred_at`."""
        count, oldest = len(self.carry), self.carry[0].occurred_at if self.carry else None
        for item in self.runs:
            if isinstance(item, BaseException) or not item:
                continue
            count += len(item)
            oldest = oldest or item[0].occurred_at
        return count, oldest

    def peek(self, limit: int) -> list[StoredEvent]:
        """The first `limit` waiting events (at most; up to a queued failure), without taking them:
        what the next `take` would move first."""
        events = self.carry[:limit]
        for item in self.runs:
            if len(events) >= limit or isinstance(item, BaseException):
                break
            events.extend(item[: limit - len(events)])
        return events
