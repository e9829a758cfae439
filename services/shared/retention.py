"""History that does not grow for ever: the retention settings, the outbox pruner and the consumer
positions it respects, and the background loop that runs every service's retention.

Outbox rows are deleted only when **every known consumer has committed past them** and they are
older than an age floor:

- A durable consumer names itself in `WatchEvents(consumer=...)` (its cursor's key, prefixed with
  its service, e.g. "scheduler/context_budget"). Its `after_sequence` is where its stored cursor
  is, so the producer records it in its own `event_consumers` table as that consumer's committed
  position, with the event types it asked for. Servers recycle connections every five minutes, so
  an active consumer reports at least that often. The producer never reads another service's
  tables.
- A consumer that asks for some types only advances its cursor on those: its position holds back
  only up to just before the first event of its types after it (`effective_position`), so a
  consumer of rare events does not keep the whole outbox.
- A consumer not heard from for `consumer_expiry` (default 7 days) no longer holds pruning back
  (a decommissioned consumer would otherwise keep every row for ever); a warning names it.
- Rows younger than `outbox_min_age` (default 3 days) are kept whatever the consumers say, so SSE
  clients and unnamed readers can resume after an absence that short.

A caller that asks for a position whose successors were pruned gets FAILED_PRECONDITION with
ErrorInfo reason `EVENTS_PRUNED` and a PreconditionFailure naming `after_sequence` and the oldest
kept sequence (`check_retained`),
never a silent gap; `after_sequence` 0 still means "everything kept". The gateway turns it into an
SSE `stream.resync` event (routers/events.py).

Deletes are batched (`batch_rows` per transaction, a pause between batches) so that neither SQLite's
single writer nor PostgreSQL's CPU is held for long, and every delete is a range over an index
(`sequence`; `thread_context_snapshots (captured_at, snapshot_id)` for readings, see
services/context_budget/retention.py).

| variable | default | meaning |
|---|---|---|
| BOSS_RETENTION_ENABLED | true | run retention at all |
| BOSS_RETENTION_FULL_HISTORY_DAYS | 7 | every context reading is kept this long (by `captured_at`) |
| BOSS_RETENTION_DOWNSAMPLE_SECONDS | 3600 | older readings: the latest per thread per this interval |
| BOSS_RETENTION_OUTBOX_MIN_AGE_DAYS | 3 | outbox rows younger than this are never pruned |
| BOSS_RETENTION_CONSUMER_EXPIRY_DAYS | 7 | a consumer silent this long stops holding rows back |
| BOSS_RETENTION_INTERVAL_SECONDS | 600 | time between two passes |
| BOSS_RETENTION_BATCH_ROWS | 2000 | rows deleted per transaction |
| BOSS_RETENTION_PAUSE_SECONDS | 0.05 | pause between two delete transactions |
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import (
    BigInteger,
    Column,
    MetaData,
    String,
    Table,
    Text,
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from services.shared.db import Database
from services.shared.errors import FailedPrecondition, PreconditionViolation
from services.shared.metrics import Probe, Reading, meter
from services.shared.sql_types import UtcDateTime, upsert
from services.shared.time import utc_now

log = logging.getLogger(__name__)

EVENTS_PRUNED = "EVENTS_PRUNED"
CONSUMER_NAME_MAX_LENGTH = 200

DELETED = meter.create_counter(
    "boss.retention.deleted",
    unit="{row}",
    description="Rows deleted by retention, by table",
)


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetentionSettings:
    """What retention keeps and how fast it deletes (module docstring's table).

    Attributes:
        enabled: run retention at all.
        full_history: every reading is kept this long, measured from now to its `captured_at`.
        downsample_interval: older readings keep the latest per thread per interval (UTC-aligned).
        outbox_min_age: outbox rows younger than this (by `occurred_at`) are never pruned.
        consumer_expiry: a consumer silent this long no longer holds outbox rows back.
        pass_interval_seconds: time between two passes, in seconds.
        batch_rows: rows deleted per transaction.
        pause_seconds: pause between two delete transactions, in seconds.
    """

    enabled: bool = True
    full_history: timedelta = timedelta(days=7)
    downsample_interval: timedelta = timedelta(hours=1)
    outbox_min_age: timedelta = timedelta(days=3)
    consumer_expiry: timedelta = timedelta(days=7)
    pass_interval_seconds: float = 600.0
    batch_rows: int = 2_000
    pause_seconds: float = 0.05

    def __post_init__(self) -> None:
        problems = [
            name
            for name, ok in (
                ("BOSS_RETENTION_FULL_HISTORY_DAYS", self.full_history > timedelta(0)),
                ("BOSS_RETENTION_DOWNSAMPLE_SECONDS", timedelta(seconds=1) <= self.downsample_interval),
                ("BOSS_RETENTION_OUTBOX_MIN_AGE_DAYS", self.outbox_min_age >= timedelta(0)),
                ("BOSS_RETENTION_CONSUMER_EXPIRY_DAYS", self.consumer_expiry > timedelta(0)),
                ("BOSS_RETENTION_INTERVAL_SECONDS", self.pass_interval_seconds > 0),
                ("BOSS_RETENTION_BATCH_ROWS", self.batch_rows >= 1),
                ("BOSS_RETENTION_PAUSE_SECONDS", self.pause_seconds >= 0),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"invalid retention settings: {', '.join(problems)} out of range")

    @classmethod
    def from_environment(cls) -> RetentionSettings:
        """The settings from BOSS_RETENTION_* (module docstring). Raises ValueError naming the
        variable when one is not a number or out of range."""

        def number(name: str, default: float) -> float:
            raw = os.environ.get(f"BOSS_RETENTION_{name}") or ""
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError:
                raise ValueError(f"BOSS_RETENTION_{name} must be a number, got {raw!r}") from None

        enabled = (os.environ.get("BOSS_RETENTION_ENABLED") or "true").strip().lower()
        if enabled not in {"true", "false", "1", "0", "yes", "no"}:
            raise ValueError(f"BOSS_RETENTION_ENABLED must be true or false, got {enabled!r}")
        return cls(
            enabled=enabled in {"true", "1", "yes"},
            full_history=timedelta(days=number("FULL_HISTORY_DAYS", 7)),
            downsample_interval=timedelta(seconds=number("DOWNSAMPLE_SECONDS", 3600)),
            outbox_min_age=timedelta(days=number("OUTBOX_MIN_AGE_DAYS", 3)),
            consumer_expiry=timedelta(days=number("CONSUMER_EXPIRY_DAYS", 7)),
            pass_interval_seconds=number("INTERVAL_SECONDS", 600),
            batch_rows=int(number("BATCH_ROWS", 2000)),
            pause_seconds=number("PAUSE_SECONDS", 0.05),
        )


# --- tables ------------------------------------------------------------------------------------


def define_retention_tables(metadata: MetaData) -> tuple[Table, Table]:
    """Adds `event_consumers` (per named consumer of this service's stream: the committed position
    it last reported and when) and `retention_marks` (per retention job: the instant up to which
    it has finished, e.g. readings thinned) to a service's metadata."""
    consumers = Table(
        "event_consumers",
        metadata,
        Column("consumer", String(CONSUMER_NAME_MAX_LENGTH), primary_key=True),
        Column("last_sequence", BigInteger, nullable=False),
        Column("reported_at", UtcDateTime, nullable=False),
        # The event types it follows, comma-separated; "" for every type.
        Column("event_types", Text, nullable=False, server_default=""),
    )
    marks = Table(
        "retention_marks",
        metadata,
        Column("job", String(100), primary_key=True),
        Column("done_through", UtcDateTime, nullable=False),
    )
    return consumers, marks


def create_retention_tables() -> None:
    """Creates what `define_retention_tables` defines, in a service's migration."""
    import sqlalchemy as sa
    from alembic import op

    op.create_table(
        "event_consumers",
        sa.Column("consumer", sa.String(CONSUMER_NAME_MAX_LENGTH), primary_key=True),
        sa.Column("last_sequence", sa.BigInteger(), nullable=False),
        sa.Column("reported_at", UtcDateTime(), nullable=False),
        sa.Column("event_types", sa.Text(), nullable=False, server_default=""),
    )
    op.create_table(
        "retention_marks",
        sa.Column("job", sa.String(100), primary_key=True),
        sa.Column("done_through", UtcDateTime(), nullable=False),
    )


def drop_retention_tables() -> None:
    """Drops what `create_retention_tables` created."""
    from alembic import op

    op.drop_table("retention_marks")
    op.drop_table("event_consumers")


# --- pure rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerPosition:
    """A named consumer's last reported committed position (`last_sequence`), when (UTC), and the
    event types it follows (empty: every type)."""

    consumer: str
    last_sequence: int
    reported_at: datetime
    event_types: tuple[str, ...] = ()


def prune_bound(positions: Sequence[ConsumerPosition], now: datetime, expiry: timedelta) -> int | None:
    """The highest sequence every live consumer has committed (events at or below it may go), or
    None when no live consumer is known: then only the age floor applies (and the newest row stays,
    `OutboxPruner.prune`). Consumers not heard from for `expiry` are left out."""
    live = [position.last_sequence for position in positions if now - position.reported_at < expiry]
    return min(live) if live else None


def valid_consumer_name(name: str) -> bool:
    """A consumer name is 1-200 printable characters without NUL (it is a primary key)."""
    return 0 < len(name) <= CONSUMER_NAME_MAX_LENGTH and name.isprintable() and "\x00" not in name


# --- adapters ----------------------------------------------------------------------------------


class ConsumerPositions:
    """The `event_consumers` table of a producing service."""

    def __init__(self, database: Database, table: Table) -> None:
        self._database = database
        self._table = table

    async def record(
        self,
        consumer: str,
        last_sequence: int,
        now: datetime | None = None,
        event_types: Sequence[str] = (),
    ) -> None:
        """Stores `consumer`'s reported committed position and followed types (replacing the
        previous ones: a consumer whose database was reset reports a lower position). A name
        `valid_consumer_name` refuses is ignored with a warning (the stream is still served)."""
        if not valid_consumer_name(consumer):
            log.warning("ignoring an unusable consumer name %r", consumer[:50])
            return
        values = {
            "last_sequence": int(last_sequence),
            "reported_at": now or utc_now(),
            "event_types": ",".join(sorted(set(event_types))),
        }
        async with self._database.transaction() as connection:
            statement = upsert(connection.dialect.name, self._table, values, ["consumer"])
            await connection.execute(statement, {"consumer": consumer, **values})

    async def forget(self, consumer: str) -> None:
        """Deletes `consumer`'s record."""
        async with self._database.transaction() as connection:
            await connection.execute(delete(self._table).where(self._table.c.consumer == consumer))

    async def covers(self, consumer: str, after_sequence: int, event_types: Sequence[str]) -> bool:
        """Whether pruning kept every event of `event_types` after `after_sequence` for this
        consumer: it is recorded with exactly those (non-empty) types at a position at or below
        `after_sequence`. Pruning may then have removed events right after it, but only ones of
        other types (`OutboxPruner._effective`), so the consumer misses nothing."""
        wanted = ",".join(sorted(set(event_types)))
        if not wanted:
            return False
        table = self._table
        async with self._database.read() as connection:
            row = (
                await connection.execute(
                    select(table.c.last_sequence, table.c.event_types).where(table.c.consumer == consumer)
                )
            ).one_or_none()
        return row is not None and row.event_types == wanted and int(row.last_sequence) <= after_sequence

    async def all(self) -> list[ConsumerPosition]:
        """Every recorded consumer, by name."""
        table = self._table
        async with self._database.read() as connection:
            rows = await connection.execute(select(table).order_by(table.c.consumer))
            return [
                ConsumerPosition(
                    row.consumer,
                    int(row.last_sequence),
                    row.reported_at,
                    tuple(name for name in row.event_types.split(",") if name),
                )
                for row in rows
            ]


async def oldest_sequence(connection: AsyncConnection, events: Table) -> int:
    """The lowest sequence in `outbox_events` (0 when the table is empty)."""
    value = (await connection.execute(select(func.min(events.c.sequence)))).scalar_one_or_none()
    return int(value or 0)


async def check_retained(database: Database, events: Table, after_sequence: int) -> None:
    """Raises FailedPrecondition (reason EVENTS_PRUNED, a violation of `after_sequence`) when events
    right after `after_sequence` (> 0) have been pruned: a reader resuming there would miss them.
    One index lookup."""
    if after_sequence <= 0:
        return
    async with database.read() as connection:
        oldest = await oldest_sequence(connection, events)
    if oldest > after_sequence + 1:
        raise FailedPrecondition(
            f"events after {after_sequence} are no longer kept (the oldest kept is {oldest}): "
            "rebuild from current state, then resume after the stream's head",
            reason=EVENTS_PRUNED,
            violations=[
                PreconditionViolation(
                    type=EVENTS_PRUNED,
                    subject="after_sequence",
                    description=f"the oldest kept event is {oldest}",
                )
            ],
        )


@dataclass
class OutboxPruner:
    """Deletes a service's outbox rows that every live consumer has committed and that are older
    than the age floor (module docstring), `settings.batch_rows` per transaction."""

    database: Database
    events: Table
    positions: ConsumerPositions
    settings: RetentionSettings
    service: str
    clock: Callable[[], datetime] = utc_now

    async def prune(self) -> int:
        """One pass; returns how many rows it deleted."""
        # The counter's series exists from the first pass, so an alert on it not growing
        # (docs/operations.md, BossRetentionStalled) sees a retention that never deleted anything.
        DELETED.add(0, {"table": "outbox_events", "service": self.service})
        now = self.clock()
        positions = await self._forget_expired(await self.positions.all(), now)
        async with self.database.read() as connection:
            head = (await connection.execute(select(func.max(self.events.c.sequence)))).scalar_one_or_none()
            positions = [await self._effective(connection, position) for position in positions]
        bound = prune_bound(positions, now, self.settings.consumer_expiry)
        if head is None:
            return 0
        # The newest row always stays, so the oldest kept sequence is known even when every event
        # was consumed (check_retained compares against it).
        bound = int(head) - 1 if bound is None else min(bound, int(head) - 1)
        older_than = now - self.settings.outbox_min_age
        deleted = 0
        while True:
            async with self.database.transaction() as connection:
                through = await self._prunable_through(connection, bound, older_than)
                if through is None:
                    break
                result = await connection.execute(
                    delete(self.events).where(self.events.c.sequence <= through)
                )
                count = int(result.rowcount or 0)
            deleted += count
            DELETED.add(count, {"table": "outbox_events", "service": self.service})
            if count < self.settings.batch_rows:
                break
            await asyncio.sleep(self.settings.pause_seconds)
        return deleted

    async def _effective(self, connection: AsyncConnection, position: ConsumerPosition) -> ConsumerPosition:
        """`position` with `last_sequence` moved to just before the first event of its types after
        it (a filtered consumer's cursor stays on the last event it took); unchanged for a consumer
        of every type. An index range scan from the position forward."""
        if not position.event_types:
            return position
        events = self.events
        first = (
            await connection.execute(
                select(func.min(events.c.sequence)).where(
                    events.c.sequence > position.last_sequence, events.c.event_type.in_(position.event_types)
                )
            )
        ).scalar_one_or_none()
        if first is None:  # nothing it would take: it holds nothing back (the newest row stays anyway)
            last = await connection.execute(select(func.max(events.c.sequence)))
            return replace(position, last_sequence=int(last.scalar_one_or_none() or position.last_sequence))
        return replace(position, last_sequence=int(first) - 1)

    async def _prunable_through(
        self, connection: AsyncConnection, bound: int, older_than: datetime
    ) -> int | None:
        """How far the oldest `batch_rows` rows may go, computed by the database in one statement
        over the sequence index (one row comes back, not the batch): the batch's last sequence at
        or below `bound`, stopping before its first row not older than `older_than`. Stopping there
        keeps the kept sequences one contiguous run, so "the oldest kept sequence" (the
        `check_retained` test) describes the table; None when the first row must stay."""
        events = self.events
        head = (
            select(events.c.sequence, events.c.occurred_at)
            .order_by(events.c.sequence)
            .limit(self.settings.batch_rows)
            .subquery()
        )
        first_young = (
            select(func.min(head.c.sequence)).where(head.c.occurred_at >= older_than).scalar_subquery()
        )
        query = select(func.max(head.c.sequence)).where(
            head.c.sequence <= bound, or_(first_young.is_(None), head.c.sequence < first_young)
        )
        through = (await connection.execute(query)).scalar_one_or_none()
        return None if through is None else int(through)

    async def _forget_expired(
        self, positions: list[ConsumerPosition], now: datetime
    ) -> list[ConsumerPosition]:
        """Forgets (deletes, with a warning) the consumers silent for `consumer_expiry`: they no
        longer hold rows back, and a forgotten consumer is refused like any reader if it comes
        back behind what was pruned. Returns the others."""
        live = [
            position for position in positions if now - position.reported_at < self.settings.consumer_expiry
        ]
        for position in positions:
            if position not in live:
                log.warning(
                    "consumer %s last reported %s (position %d); forgotten: it no longer holds back "
                    "pruning of %s's outbox",
                    position.consumer,
                    position.reported_at.isoformat(),
                    position.last_sequence,
                    self.service,
                )
                await self.positions.forget(position.consumer)
        return live


def outbox_probe(database: Database, events: Table) -> Probe:
    """`boss.outbox.oldest_sequence` (metrics): one index lookup."""

    async def probe() -> list[Reading]:
        async with database.read() as connection:
            return [Reading("boss.outbox.oldest_sequence", float(await oldest_sequence(connection, events)))]

    return probe


Job = Callable[[], Awaitable[int]]


@dataclass
class RetentionLoop:
    """Runs a service's retention jobs (each returns rows deleted) every
    `settings.pass_interval_seconds`, the first pass right at start; a failing job is logged and
    tried again at the next pass. Does nothing when retention is disabled."""

    service: str
    settings: RetentionSettings
    jobs: list[tuple[str, Job]]

    async def run_once(self) -> dict[str, int]:
        """One pass of every job; rows deleted by job name (failed jobs are left out)."""
        deleted: dict[str, int] = {}
        for name, job in self.jobs:
            try:
                deleted[name] = await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s retention job %s failed; trying again next pass", self.service, name)
        if any(deleted.values()):
            log.info("%s retention deleted %s", self.service, deleted)
        return deleted

    async def run(self) -> None:
        """Passes until cancelled. Disabled, it only waits to be cancelled: a service's background
        task that returns would stop the service (ServiceHost.run)."""
        if not self.settings.enabled:
            log.info("%s retention is off (BOSS_RETENTION_ENABLED=false)", self.service)
            await asyncio.Event().wait()
        while True:
            await self.run_once()
            await asyncio.sleep(self.settings.pass_interval_seconds)
