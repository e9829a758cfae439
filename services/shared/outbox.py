"""Transactional outbox with a single sequencer, and the resumable event stream built on it.

Every state change that other contexts must see is written as a row of `outbox_events` in the same
transaction as the change (`EventLog.append`). Rows get no stream position when written: an
auto-increment id is *not* a safe resume cursor on PostgreSQL, because ids are taken at INSERT time
but become visible at COMMIT time, so a reader that has seen id 11 may later find a committed id 10
and skip it. Instead one sequencer, serialised by a row lock on `outbox_sequencer`, numbers the
committed rows that have no sequence yet, in one transaction. A sequence therefore becomes visible
only together with every smaller one: `sequence > cursor` never skips.

Consumers read `sequence > after_sequence` in order (`EventLog.read_after`), or follow the stream
live (`EventLog.follow`), which replays the backlog and then waits for newly sequenced events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opentelemetry import propagate
from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from services.shared.db import Database
from services.shared.sql_types import UtcDateTime
from services.shared.time import utc_now

log = logging.getLogger(__name__)

SEQUENCER_BATCH = 5_000
SEQUENCER_POLL_SECONDS = 0.1
# Appends of at least this many events use binary COPY on PostgreSQL.
COPY_THRESHOLD = 8
_APPEND_COLUMNS = (
    "event_type",
    "occurred_at",
    "thread_id",
    "project_id",
    "node_id",
    "payload_json",
    "trace_context_json",
)
_APPEND_PG_TYPES = ["text", "timestamptz", "text", "text", "text", "text", "text"]


def define_outbox_tables(metadata: MetaData) -> tuple[Table, Table, Table]:
    """Adds `outbox_events`, `outbox_sequencer` and `event_cursors` to a service's metadata.

    `event_cursors` holds, per consumer, the last sequence it processed of another context's stream;
    it is written in the same transaction as the consumer's own changes.
    """
    events = Table(
        "outbox_events",
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
        Column("sequence", BigInteger, nullable=True, unique=True),
        Column("event_type", String(100), nullable=False),
        Column("occurred_at", UtcDateTime, nullable=False),
        Column("thread_id", String(200), nullable=False, default=""),
        Column("project_id", String(200), nullable=False, default=""),
        Column("node_id", String(200), nullable=False, default=""),
        Column("payload_json", Text, nullable=False),
        Column("trace_context_json", Text, nullable=False, default="{}"),
        Index(
            "ix_outbox_events_unsequenced",
            "id",
            sqlite_where=text("sequence IS NULL"),
            postgresql_where=text("sequence IS NULL"),
        ),
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


@dataclass(frozen=True)
class NewEvent:
    """An event to publish: `type` as in SPEC (e.g. "thread.context.updated"), a JSON-able payload."""

    type: str
    payload: dict[str, Any]
    thread_id: str = ""
    project_id: str = ""
    node_id: str = ""
    occurred_at: datetime = field(default_factory=utc_now)


@dataclass(frozen=True)
class StoredEvent:
    """A committed, sequenced event as consumers see it."""

    sequence: int
    type: str
    occurred_at: datetime
    thread_id: str
    project_id: str
    node_id: str
    payload: dict[str, Any]
    trace_context: dict[str, str]


class EventLog:
    """A service's outbox: append inside transactions, sequence after commit, read and follow.

    One instance per process. `run_sequencer()` must run as a background task for events to become
    visible; `kick()` after a commit makes it run at once instead of at its next poll.
    """

    def __init__(self, database: Database, metadata: MetaData) -> None:
        self._database = database
        self._events = metadata.tables["outbox_events"]
        self._sequencer = metadata.tables["outbox_sequencer"]
        self._wake_sequencer = asyncio.Event()
        self._sequenced = asyncio.Condition()
        self.last_sequence = 0

    async def append(self, connection: AsyncConnection, events: Iterable[NewEvent]) -> int:
        """Writes events in the caller's transaction; returns how many. Captures the trace context.

        On PostgreSQL a large append (COPY_THRESHOLD events or more) is one binary COPY: executemany
        costs a pipelined statement per row, several times the client CPU and server time of COPY.
        """
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        trace_json = json.dumps(carrier)
        rows = [
            (
                e.type,
                e.occurred_at,
                e.thread_id,
                e.project_id,
                e.node_id,
                json.dumps(e.payload, separators=(",", ":"), default=str),
                trace_json,
            )
            for e in events
        ]
        if not rows:
            return 0
        if len(rows) >= COPY_THRESHOLD and connection.dialect.name == "postgresql":
            await self._copy(connection, rows)
        else:
            await connection.execute(
                insert(self._events), [dict(zip(_APPEND_COLUMNS, row, strict=True)) for row in rows]
            )
        return len(rows)

    async def _copy(self, connection: AsyncConnection, rows: list[tuple[Any, ...]]) -> None:
        """Binary COPY of outbox rows in the connection's transaction (PostgreSQL, psycopg 3)."""
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        columns = ", ".join(_APPEND_COLUMNS)
        async with (
            driver.cursor() as cursor,
            cursor.copy(f"COPY {self._events.name} ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(_APPEND_PG_TYPES)
            for row in rows:
                await copy.write_row(row)

    def kick(self) -> None:
        """Asks the sequencer to run now (call after committing a transaction that appended)."""
        self._wake_sequencer.set()

    async def ensure_sequencer_row(self) -> None:
        """Creates the sequencer's single row if missing and loads the last sequence."""
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

    async def sequence_pending(self) -> int:
        """Numbers committed, unsequenced events in id order; returns how many got a sequence."""
        async with self._database.transaction() as connection:
            last = (
                await connection.execute(
                    select(self._sequencer.c.last_sequence).where(self._sequencer.c.id == 1).with_for_update()
                )
            ).scalar_one()
            result = await connection.execute(
                text(
                    "UPDATE outbox_events SET sequence = numbered.position "
                    "FROM (SELECT id, :base + row_number() OVER (ORDER BY id) AS position "
                    "      FROM outbox_events WHERE sequence IS NULL ORDER BY id LIMIT :limit) AS numbered "
                    "WHERE outbox_events.id = numbered.id"
                ),
                {"base": last, "limit": SEQUENCER_BATCH},
            )
            count = int(result.rowcount or 0)
            if count:
                await connection.execute(
                    self._sequencer.update()
                    .where(self._sequencer.c.id == 1)
                    .values(last_sequence=last + count)
                )
        if count:
            async with self._sequenced:
                self.last_sequence = int(last) + count
                self._sequenced.notify_all()
        return count

    async def run_sequencer(self) -> None:
        """Background loop: sequences pending events when kicked, or every 100 ms (for events
        written by other processes of the same service). Runs until cancelled."""
        await self.ensure_sequencer_row()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake_sequencer.wait(), SEQUENCER_POLL_SECONDS)
            self._wake_sequencer.clear()
            try:
                while await self.sequence_pending() == SEQUENCER_BATCH:
                    pass
            except Exception:
                log.exception("outbox sequencer failed; retrying")
                await asyncio.sleep(1)

    async def read_after(
        self, after_sequence: int, limit: int = 1_000, types: Sequence[str] = ()
    ) -> list[StoredEvent]:
        """Committed events with sequence > after_sequence, in order, at most `limit`."""
        query = (
            select(self._events)
            .where(self._events.c.sequence > after_sequence)
            .order_by(self._events.c.sequence)
            .limit(limit)
        )
        if types:
            query = query.where(self._events.c.event_type.in_(list(types)))
        async with self._database.read() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [
            StoredEvent(
                sequence=int(row["sequence"]),
                type=row["event_type"],
                occurred_at=row["occurred_at"],
                thread_id=row["thread_id"],
                project_id=row["project_id"],
                node_id=row["node_id"],
                payload=json.loads(row["payload_json"]),
                trace_context=json.loads(row["trace_context_json"]),
            )
            for row in rows
        ]

    async def wait_beyond(self, sequence: int, timeout: float) -> bool:
        """Waits until this process has sequenced past `sequence`, or `timeout` seconds pass.
        Returns True when there may be new events (always re-read: other processes may write too)."""
        async with self._sequenced:
            if self.last_sequence > sequence:
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sequenced.wait(), timeout)
            return self.last_sequence > sequence

    async def follow(
        self, after_sequence: int, types: Sequence[str] = (), poll_seconds: float = 0.5
    ) -> AsyncIterator[StoredEvent]:
        """Yields every event after `after_sequence`: the backlog first, then live ones as they are
        sequenced. Never skips and never repeats. Runs until the consumer stops iterating."""
        cursor = after_sequence
        while True:
            batch = await self.read_after(cursor, types=types)
            if not batch:
                await self.wait_beyond(max(cursor, self.last_sequence), poll_seconds)
                continue
            for stored in batch:
                yield stored
            cursor = batch[-1].sequence
