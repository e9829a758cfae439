"""Transactional outbox with a lock-serialised sequence, and the resumable event stream built on it.

Every state change that other contexts must see is written as a row of `outbox_events` in the same
transaction as the change (`EventLog.append`). An auto-increment id is *not* a safe resume cursor on
PostgreSQL: ids are taken at INSERT time but become visible at COMMIT time, so a reader that has seen
id 11 may later find a committed id 10 and skip it. Instead `append` takes the row lock on the single
`outbox_sequencer` row, numbers its events from the stored high-water mark and advances it. The lock
is held until the transaction ends, and PostgreSQL makes a transaction visible before it releases its
locks, so the next writer can only number its events after this one is visible: sequences become
visible in order, and `sequence > cursor` never skips. (On SQLite, writers are serialised by
`BEGIN IMMEDIATE` anyway.) The cost is that appending transactions of one service commit one at a
time at their tail; append last, just before commit. A transaction's last writes can ride on the
append's statement (`append(carrying=...)`, PostgreSQL): they are made before it takes the lock, so
the lock stays the last one every transaction takes.

Consumers read `sequence > after_sequence` in order (`EventLog.read_after`), or follow the stream
live (`EventLog.follow_batches`), which replays the backlog and then waits for newly committed events.
Waking followers: `kick()` (called by a writer of this process after its commit) wakes them at
once, without a database read: its events are visible by then, and the followers re-read. The
notifier (`run_notifier`) also reads the committed high-water mark every 100 ms,
which is what wakes followers for events committed by other processes of the same service.

Recent events: a writer that hands its committed events to `kick(committed)` (what `append`
returned) also puts them in a small in-memory window of the latest contiguous sequences. A follower
whose cursor lies inside that window takes its next run from memory instead of reading the table,
and after it has taken everything in the window it waits without a read, unless the notifier saw a
higher committed sequence. The window only ever holds a gap-free run of committed sequences: events
from a `kick()` that do not continue it (another process wrote in between, or two local commits
kicked out of order) start it afresh, and a `kick()` without events (a writer that did not pass
them) empties it, so followers fall back to reading the table and never skip anything.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from opentelemetry import propagate
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.waiting import wait_until_set
from services.shared.db import Database
from services.shared.errors import FailedPrecondition, FieldViolation, InvalidArgument
from services.shared.retention import ConsumerPositions, check_retained
from services.shared.sql_types import CarriedWrites, UtcDateTime, driver_connection, run_driver_sql
from services.shared.time import utc_now

log = logging.getLogger(__name__)

SEQUENCER_POLL_SECONDS = 0.1
# Appends of at least this many events use binary COPY on PostgreSQL; smaller ones one INSERT from a
# JSON array, whose single round trip beats COPY's three (sequencer, COPY start, data) below it.
COPY_THRESHOLD = 64
# Most events one `follow_batches` run (and so one WatchEvents response) carries.
FOLLOW_BATCH_LIMIT = 500
MAX_SEQUENCE = 2**63 - 1
"""The largest sequence a reader may resume after: sequences are stored as signed 64-bit integers,
so a larger `after_sequence` (the wire's uint64 allows it) is bad input (`EventLog.admit`)."""
# Most committed events the in-memory window of recent events keeps (module docstring).
RECENT_EVENTS_LIMIT = 4 * FOLLOW_BATCH_LIMIT
_EVENT_COLUMNS = (
    "sequence",
    "event_type",
    "occurred_at",
    "thread_id",
    "project_id",
    "node_id",
    "payload_json",
    "trace_context_json",
)
# Payload encoding: compact JSON (orjson, several times faster than the standard library's encoder)
# with the standard encoder's conventions kept: non-string keys become strings, and datetimes and
# other values JSON cannot carry go through `str`.
_PAYLOAD_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)
_EVENT_PG_TYPES = ["int8", "text", "timestamptz", "text", "text", "text", "text", "text"]


def define_outbox_tables(metadata: MetaData) -> tuple[Table, Table, Table]:
    """Adds `outbox_events`, `outbox_sequencer` and `event_cursors` to a service's metadata.

    `event_cursors` holds, per consumer, the last sequence it processed of another context's stream;
    it is written in the same transaction as the consumer's own changes.
    """
    events = Table(
        "outbox_events",
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
        Column("sequence", BigInteger, nullable=False, unique=True),
        Column("event_type", String(100), nullable=False),
        Column("occurred_at", UtcDateTime, nullable=False),
        Column("thread_id", String(200), nullable=False, default=""),
        Column("project_id", String(200), nullable=False, default=""),
        Column("node_id", String(200), nullable=False, default=""),
        Column("payload_json", Text, nullable=False),
        Column("trace_context_json", Text, nullable=False, default="{}"),
    )
    sequencer = Table(
        "outbox_sequencer",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("last_sequence", BigInteger, nullable=False),
    )
    cursors = Table(
        "event_cursors",
        metadata,
        Column("stream_name", String(100), primary_key=True),
        Column("last_sequence", BigInteger, nullable=False),
        Column("updated_at", UtcDateTime, nullable=False),
    )
    return events, sequencer, cursors


@dataclass
class CursorMove:
    """A consumer's cursor advance on PostgreSQL: locks the `stream_name` row of `table`
    (`event_cursors`), moves it to `last` (never back) and records in `previous` the value it had
    (None when the row does not exist yet: the caller inserts it). Made by `EventLog.append` with
    the batch's events, or on its own by `run`; undone with the rest if the transaction rolls back."""

    table: str
    stream_name: str
    last: int
    previous: int | None = None

    def common_table_expressions(self) -> str:
        """`previous` and `moved` (its RETURNING `previous`), for a WITH clause."""
        return (
            f"previous AS (SELECT last_sequence FROM {self.table} WHERE stream_name = %(cursor_stream)s "
            f"FOR UPDATE), moved AS (UPDATE {self.table} SET last_sequence = "
            "GREATEST(previous.last_sequence, %(cursor_last)s), updated_at = %(cursor_now)s "
            f"FROM previous WHERE {self.table}.stream_name = %(cursor_stream)s "
            "RETURNING previous.last_sequence AS previous)"
        )

    def parameters(self) -> dict[str, Any]:
        """The statement parameters of `common_table_expressions`."""
        return {"cursor_stream": self.stream_name, "cursor_last": self.last, "cursor_now": utc_now()}

    async def run(self, connection: AsyncConnection) -> None:
        """Makes the move in a statement of its own."""
        rows = await run_driver_sql(
            connection,
            f"WITH {self.common_table_expressions()} SELECT previous FROM moved",
            self.parameters(),
        )
        self.previous = int(rows[0][0]) if rows else None


@dataclass(frozen=True)
class NewEvent:
    """An event to publish: `type` as in SPEC (e.g. "thread.context.updated"), a JSON-able payload.
    `trace_context`: the W3C trace context the event carries when it is not the appending
    transaction's current one (e.g. the span of the one report, among a batch's many, that caused
    it); None, the usual case, takes the current one."""

    type: str
    payload: dict[str, Any]
    thread_id: str = ""
    project_id: str = ""
    node_id: str = ""
    occurred_at: datetime = field(default_factory=utc_now)
    trace_context: dict[str, str] | None = None


@dataclass(frozen=True)
class StoredEvent:
    """A committed, sequenced event as consumers see it. `payload_json` is the payload's stored JSON
    text when the event was read from the outbox ("" otherwise), so a stream can send it on
    without serialising the payload again; it takes no part in comparisons."""

    sequence: int
    type: str
    occurred_at: datetime
    thread_id: str
    project_id: str
    node_id: str
    payload: dict[str, Any]
    trace_context: dict[str, str]
    payload_json: str = field(default="", compare=False, repr=False)


def _stored_event(row: Sequence[Any], decode: bool) -> StoredEvent:
    """A StoredEvent from a row of `_EVENT_COLUMNS` (payload decoded when `decode`)."""
    sequence, event_type, occurred_at, thread_id, project_id, node_id, payload_json, trace_json = row
    return StoredEvent(
        sequence=int(sequence),
        type=event_type,
        occurred_at=occurred_at,
        thread_id=thread_id,
        project_id=project_id,
        node_id=node_id,
        payload=json.loads(payload_json) if decode else {},
        trace_context=json.loads(trace_json) if trace_json != "{}" else {},
        payload_json=payload_json,
    )


def _trace_json(event: NewEvent, current: str) -> str:
    """The stored trace context of an appended event: its own, or else `current` (JSON text)."""
    return current if event.trace_context is None else json.dumps(event.trace_context)


def _sequenced(
    last: int, pending: list[NewEvent], payloads: list[str], trace_context: dict[str, str]
) -> list[StoredEvent]:
    """The appended events as stored: numbered from `last` + 1 (payloads left as JSON text), with
    their own trace context or else `trace_context`."""
    return [
        StoredEvent(
            sequence=last + position,
            type=event.type,
            occurred_at=event.occurred_at.astimezone(UTC),
            thread_id=event.thread_id,
            project_id=event.project_id,
            node_id=event.node_id,
            payload={},
            trace_context=trace_context if event.trace_context is None else event.trace_context,
            payload_json=body,
        )
        for position, (event, body) in enumerate(zip(pending, payloads, strict=True), start=1)
    ]


class EventLog:
    """A service's outbox: append (with sequences) inside transactions, read and follow.

    One instance per process. `kick()` after a commit wakes local followers at once; `run_notifier()`
    runs as a background task so that followers also wake for events other processes commit (within
    its 100 ms poll) and `last_sequence` tracks the committed high-water mark.
    """

    def __init__(self, database: Database, metadata: MetaData) -> None:
        self._database = database
        self._events = metadata.tables["outbox_events"]
        self._sequencer = metadata.tables["outbox_sequencer"]
        consumers = metadata.tables.get("event_consumers")
        self.consumer_positions = ConsumerPositions(database, consumers) if consumers is not None else None
        self._changed = asyncio.Event()
        self._recent: deque[StoredEvent] = deque(maxlen=RECENT_EVENTS_LIMIT)
        self._followers_ended = False
        self.last_sequence = 0

    @property
    def events_table(self) -> Table:
        """The `outbox_events` table."""
        return self._events

    async def admit(self, after_sequence: int, consumer: str = "", types: Sequence[str] = ()) -> None:
        """Lets a reader in at `after_sequence` (a `WatchEvents` or `ListEvents` call): raises
        FailedPrecondition, reason EVENTS_PRUNED, when events right after it were pruned (one
        index lookup), and records a named durable consumer's committed position and the `types`
        it follows (one small write) so that retention never prunes what it has not taken
        (services/shared/retention.py). Raises InvalidArgument naming after_sequence above
        MAX_SEQUENCE first, which no database could compare."""
        if after_sequence > MAX_SEQUENCE:
            raise InvalidArgument([FieldViolation("after_sequence", "must be at most 2^63-1")])
        positions = self.consumer_positions
        try:
            await check_retained(self._database, self._events, after_sequence)
        except FailedPrecondition:
            # A consumer of some types may resume behind pruned events that were all of other types.
            if not (
                consumer and positions is not None and await positions.covers(consumer, after_sequence, types)
            ):
                raise
        if consumer and positions is not None:
            await positions.record(consumer, after_sequence, event_types=types)

    @property
    def followers_ended(self) -> bool:
        """Whether `end_followers` was called: other long-lived readers of this process (e.g. the
        scheduler's command streams) end on it too."""
        return self._followers_ended

    def end_followers(self) -> None:
        """Ends every `follow_batches` of this process (now and later): each returns after what it
        already read, so a `WatchEvents` stream ends normally and its consumer reconnects, to
        another replica or to this service once it is back. Called when the process starts
        draining, so a shutdown does not wait out its grace period for streams that never end."""
        self._followers_ended = True
        self._signal()

    async def append(
        self,
        connection: AsyncConnection,
        events: Iterable[NewEvent],
        *,
        cursor_move: CursorMove | None = None,
        carrying: CarriedWrites | None = None,
    ) -> list[StoredEvent]:
        """Writes events in the caller's transaction with their stream sequences; returns them as
        stored (sequence, payload JSON text, trace context), for `kick()` after the commit.

        Takes the sequencer row lock until the caller's transaction ends (see the module docstring)
        and captures the current trace context, which every event without its own
        (`NewEvent.trace_context`) carries. On PostgreSQL a small append is one statement (the
        sequencer UPDATE numbering an INSERT from one JSON array of the events, `json_to_recordset`:
        one round trip instead of three, and one parameter, cheaper to adapt than an array per
        column) and a large one (COPY_THRESHOLD events or more) an UPDATE ... RETURNING and one
        binary COPY: executemany costs a pipelined statement per row, several times the client CPU
        and server time of COPY. Raises RuntimeError when the sequencer row is missing (the
        service's migrations were not applied).

        `cursor_move` (PostgreSQL): a consumer's cursor advance made by the same statement as a small
        append (one round trip fewer per consumer batch), or by its own statement otherwise; its
        `previous` is set to the value the cursor had (None when its row does not exist yet).

        `carrying` (PostgreSQL): the transaction's last writes, made by the same statement as a
        small append (a round trip fewer), before it takes the sequencer's lock
        (`CarriedWrites.completed_first`), or by a statement of their own first otherwise.
        """
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        trace_json = json.dumps(carrier)
        pending = list(events)
        payloads = [orjson.dumps(e.payload, default=str, option=_PAYLOAD_OPTIONS).decode() for e in pending]
        postgres = connection.dialect.name == "postgresql"
        if postgres and 0 < len(pending) < COPY_THRESHOLD:
            base = await self._append_in_one_statement(
                connection, pending, payloads, trace_json, cursor_move, carrying
            )
            return _sequenced(base, pending, payloads, carrier)
        # Otherwise the writes and the cursor move go first, each with a statement of its own.
        if carrying is not None:
            await carrying.run(connection)
        if cursor_move is not None:
            await cursor_move.run(connection)
        if not pending:
            return []
        last: int | None
        if postgres:
            advanced = await run_driver_sql(
                connection,
                f"UPDATE {self._sequencer.name} SET last_sequence = last_sequence + %(count)s "
                "WHERE id = 1 RETURNING last_sequence",
                {"count": len(pending)},
            )
            last = int(advanced[0][0]) - len(pending) if advanced else None
        else:
            last = (
                await connection.execute(
                    select(self._sequencer.c.last_sequence).where(self._sequencer.c.id == 1).with_for_update()
                )
            ).scalar_one_or_none()
        if last is None:
            raise RuntimeError("outbox_sequencer has no row: apply the service's migrations")
        rows = [
            (
                int(last) + i,
                e.type,
                e.occurred_at,
                e.thread_id,
                e.project_id,
                e.node_id,
                body,
                _trace_json(e, trace_json),
            )
            for i, (e, body) in enumerate(zip(pending, payloads, strict=True), start=1)
        ]
        if postgres:
            await self._copy(connection, rows)
            return _sequenced(int(last), pending, payloads, carrier)
        await connection.execute(
            insert(self._events), [dict(zip(_EVENT_COLUMNS, row, strict=True)) for row in rows]
        )
        advance = self._sequencer.update().where(self._sequencer.c.id == 1)
        await connection.execute(advance.values(last_sequence=int(last) + len(rows)))
        return _sequenced(int(last), pending, payloads, carrier)

    async def _append_in_one_statement(
        self,
        connection: AsyncConnection,
        pending: list[NewEvent],
        payloads: list[str],
        trace_json: str,
        cursor_move: CursorMove | None,
        carrying: CarriedWrites | None,
    ) -> int:
        """A small append on PostgreSQL in one round trip: the sequencer row's UPDATE (which takes its
        lock until commit, like SELECT ... FOR UPDATE) numbers the rows that the same statement
        inserts from one JSON array, and the same statement makes `cursor_move` and the `carrying`
        writes when given (those before the sequencer's lock). Returns the sequence before the
        first appended one. Raises RuntimeError when the sequencer row is missing."""
        events, sequencer = self._events.name, self._sequencer.name
        moved, returned, carried, writes_first = "", "", "", ""
        parameters: dict[str, Any] = {}
        if carrying is not None:
            carried = f"{carrying.with_clauses()}, "
            writes_first = f" AND {carrying.completed_first()}"
            parameters.update(carrying.parameters)
        if cursor_move is not None:
            moved = f"{cursor_move.common_table_expressions()}, "
            returned = ", (SELECT previous FROM moved)"
            parameters.update(cursor_move.parameters())
        statement = (
            f"WITH {carried}{moved}advanced AS (UPDATE {sequencer} "
            f"SET last_sequence = last_sequence + %(count)s WHERE id = 1{writes_first} "
            "RETURNING last_sequence - %(count)s AS base) "
            f"INSERT INTO {events} ({', '.join(_EVENT_COLUMNS)}) "
            "SELECT advanced.base + item.position, item.event_type, item.occurred_at, item.thread_id, "
            "item.project_id, item.node_id, item.payload_json, COALESCE(item.trace_context_json, %(trace)s) "
            "FROM advanced, json_to_recordset(%(items)s::json) AS item(position int, event_type text, "
            "occurred_at timestamptz, thread_id text, project_id text, node_id text, payload_json text, "
            "trace_context_json text) "
            f"RETURNING sequence{returned}"
        )
        items = [
            {
                "position": position,
                "event_type": event.type,
                "occurred_at": event.occurred_at,
                "thread_id": event.thread_id,
                "project_id": event.project_id,
                "node_id": event.node_id,
                "payload_json": body,
            }
            for position, (event, body) in enumerate(zip(pending, payloads, strict=True), start=1)
        ]
        for item, event in zip(items, pending, strict=True):
            if event.trace_context is not None:  # else the statement's %(trace)s
                item["trace_context_json"] = json.dumps(event.trace_context)
        rows = await run_driver_sql(
            connection,
            statement,
            {
                "count": len(pending),
                "trace": trace_json,
                "items": orjson.dumps(items, option=orjson.OPT_NAIVE_UTC).decode(),
                **parameters,
            },
        )
        sequences = [row[0] for row in rows]
        if cursor_move is not None and rows:
            cursor_move.previous = None if rows[0][1] is None else int(rows[0][1])
        if len(sequences) != len(pending):
            raise RuntimeError("outbox_sequencer has no row: apply the service's migrations")
        return int(min(sequences)) - 1

    async def _copy(self, connection: AsyncConnection, rows: list[tuple[Any, ...]]) -> None:
        """Binary COPY of outbox rows in the connection's transaction (PostgreSQL, psycopg 3)."""
        driver = await driver_connection(connection)
        columns = ", ".join(_EVENT_COLUMNS)
        async with (
            driver.cursor() as cursor,
            cursor.copy(f"COPY {self._events.name} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(_EVENT_PG_TYPES)
            for row in rows:
                await copy.write_row(row)

    def kick(self, committed: Sequence[StoredEvent] = ()) -> None:
        """Tells local followers to look for new events now (call after committing an append): they
        wake at once. Pass `committed`, what `append` returned for the committed transaction, and
        they take those events from memory (module docstring, "Recent events"); without it they
        re-read the table. No database read here: `last_sequence` (a hint for heads and waits,
        never a read bound) catches up at the notifier's next poll, within 100 ms."""
        if committed:
            recent = self._recent
            if recent and committed[0].sequence != recent[-1].sequence + 1:
                recent.clear()
            recent.extend(committed)
            self.last_sequence = max(self.last_sequence, committed[-1].sequence)
        else:
            self._recent.clear()
        self._signal()

    def _recent_after(
        self, cursor: int, limit: int, types: Sequence[str], decode: bool
    ) -> tuple[list[StoredEvent], int] | None:
        """What the window of recent events says comes after `cursor`: (matching events, the
        sequence up to which it looked), or None when the table must be read. An empty list with
        `cursor` means nothing newer is known (wait without reading)."""
        recent = self._recent
        if not recent or recent[0].sequence > cursor + 1:
            return None
        last = recent[-1].sequence
        if cursor >= last:
            return ([], cursor) if cursor == last and self.last_sequence <= last else None
        found: list[StoredEvent] = []
        scanned = cursor
        for event in itertools.islice(recent, cursor + 1 - recent[0].sequence, None):
            if len(found) >= limit:
                break
            scanned = event.sequence
            if types and event.type not in types:
                continue
            found.append(replace(event, payload=json.loads(event.payload_json)) if decode else event)
        return found, scanned

    def _signal(self) -> None:
        """Wakes every waiter of `wait_beyond` (each waits on the event current when it started)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def ensure_sequencer_row(self) -> None:
        """Creates the sequencer's single row if missing and loads the committed high-water mark."""
        async with self._database.transaction() as connection:
            current = (
                await connection.execute(
                    select(self._sequencer.c.last_sequence).where(self._sequencer.c.id == 1)
                )
            ).scalar_one_or_none()
            if current is None:
                await connection.execute(insert(self._sequencer).values(id=1, last_sequence=0))
                current = 0
        self.last_sequence = int(current)

    async def refresh(self) -> int:
        """Reads the committed high-water mark and wakes local followers when it advanced; returns
        how many events became visible since the last refresh."""
        async with self._database.read() as connection:
            committed = (
                await connection.execute(
                    select(self._sequencer.c.last_sequence).where(self._sequencer.c.id == 1)
                )
            ).scalar_one_or_none()
        committed = int(committed or 0)
        if committed <= self.last_sequence:
            return 0
        advanced = committed - self.last_sequence
        self.last_sequence = committed
        self._signal()
        return advanced

    async def run_notifier(self) -> None:
        """Background loop: refreshes the high-water mark every 100 ms, which wakes followers for
        events committed by other processes of the same service (local writers wake them with
        `kick()`), so followers never poll the event table. Runs until cancelled."""
        await self.ensure_sequencer_row()
        while True:
            await asyncio.sleep(SEQUENCER_POLL_SECONDS)
            try:
                await self.refresh()
            except Exception:
                log.exception("outbox notifier failed; retrying")
                await asyncio.sleep(1)

    async def read_after(
        self, after_sequence: int, limit: int = 1_000, types: Sequence[str] = (), decode: bool = True
    ) -> list[StoredEvent]:
        """Committed events with sequence > after_sequence, in order, at most `limit`. With
        `decode=False` the payloads are left as their JSON text (`payload_json`; `payload` is
        empty), for a stream that sends them on as they are."""
        async with self._database.read() as connection:
            if connection.dialect.name == "postgresql":
                rows = await self._rows_after_postgresql(connection, after_sequence, limit, types)
            else:
                query = (
                    select(*(self._events.c[name] for name in _EVENT_COLUMNS))
                    .where(self._events.c.sequence > after_sequence)
                    .order_by(self._events.c.sequence)
                    .limit(limit)
                )
                if types:
                    query = query.where(self._events.c.event_type.in_(list(types)))
                rows = [tuple(row) for row in await connection.execute(query)]
        return [_stored_event(row, decode) for row in rows]

    async def _rows_after_postgresql(
        self, connection: AsyncConnection, after_sequence: int, limit: int, types: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """`read_after`'s rows on PostgreSQL as driver SQL (every follower runs it on every wake:
        no statement compilation or per-column result processing); `occurred_at` in UTC as
        UtcDateTime returns it."""
        columns = ", ".join(_EVENT_COLUMNS)
        where = "sequence > %(after)s" + (" AND event_type = ANY(%(types)s::text[])" if types else "")
        rows = await run_driver_sql(
            connection,
            f"SELECT {columns} FROM {self._events.name} WHERE {where} ORDER BY sequence LIMIT %(limit)s",
            {"after": after_sequence, "limit": limit, "types": list(types)},
        )
        return [(row[0], row[1], row[2].astimezone(UTC), *row[3:]) for row in rows]

    def change_marker(self) -> asyncio.Event:
        """What the next wake-up (a local `kick()` or the notifier seeing the mark advance) sets.
        Take it *before* reading and pass it to `wait_beyond` after a read that found nothing, so a
        commit that lands during the read wakes the wait at once instead of at the next poll."""
        return self._changed

    async def wait_beyond(self, sequence: int, timeout: float, marker: asyncio.Event | None = None) -> bool:
        """Waits until the known high-water mark passes `sequence`, a local writer kicks (since
        `marker` was taken, when given: see `change_marker`), or `timeout` seconds pass. Returns
        True when there may be new events (always re-read: other processes may write too)."""
        if self.last_sequence > sequence:
            return True
        changed = self._changed if marker is None else marker
        return await wait_until_set(changed, timeout) or self.last_sequence > sequence

    async def follow_batches(
        self,
        after_sequence: int,
        types: Sequence[str] = (),
        poll_seconds: float = 0.5,
        limit: int = FOLLOW_BATCH_LIMIT,
        decode: bool = True,
    ) -> AsyncIterator[list[StoredEvent]]:
        """Yields every event after `after_sequence` in runs (never empty, in sequence order, at
        most `limit` each): the backlog first, then live ones as they are sequenced; one run is what
        one read found, so events committed together arrive together. Never skips and never
        repeats. Runs until the consumer stops iterating, or until `end_followers()`. `decode`: as
        for `read_after`."""
        cursor = after_sequence
        while not self._followers_ended:
            marker = self.change_marker()
            remembered = self._recent_after(cursor, limit, types, decode)
            if remembered is not None:
                batch, scanned = remembered
            else:
                batch = await self.read_after(cursor, limit=limit, types=types, decode=decode)
                scanned = batch[-1].sequence if batch else cursor
            if not batch:
                cursor = scanned
                await self.wait_beyond(max(cursor, self.last_sequence), poll_seconds, marker)
                continue
            yield batch
            cursor = scanned
