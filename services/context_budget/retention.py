"""Retention of the reading history (`thread_context_snapshots`): every reading for
`full_history` (default 7 days), then the latest reading per thread per `downsample_interval`
(default one hour, aligned to UTC), for ever. `thread_contexts` (each thread's current reading)
is never touched. Run by the service itself (services/shared/retention.py's `RetentionLoop`).

How a pass works, cheaply on PostgreSQL and SQLite alike:

- The window is [mark, cutoff): `cutoff` is now - full_history rounded down to an interval
  boundary, `mark` where the previous pass finished (table `retention_marks`, job
  `THINNED_JOB`; none on the first pass: from the oldest reading). Both are interval boundaries,
  so no bucket straddles two passes and finished history is never scanned again.
- Rows are read in (captured_at, snapshot_id) order by keyset pages over the index of that name,
  on the reading engine (SQLite's write lock is not taken while reading); `HistoryThinner` keeps,
  per thread, the latest row of the bucket it is in and hands back the ones it replaced.
- Those are deleted by primary key, `batch_rows` per transaction with a pause between, so an
  ingest transaction waits for at most one small delete.

A reading that arrives after its bucket was thinned (its `captured_at` is older than the mark: a
device that reports a backlog more than `full_history` late) is kept as it is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Table, and_, or_, select, text

from services.shared.db import Database
from services.shared.retention import DELETED, RetentionSettings
from services.shared.sql_types import upsert
from services.shared.time import utc_now

THINNED_JOB = "thread_context_snapshots.thinned"
# Rows per keyset page: small, so the service's event loop (which ingest shares) is never held for
# more than a few milliseconds by one page; the pause between pages lets ingest run.
READ_PAGE_ROWS = 2_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def bucket_of(instant: datetime, interval: timedelta) -> int:
    """The number of the UTC-aligned interval holding `instant` (intervals counted from 1970)."""
    return (instant - EPOCH) // interval


def floor_to_interval(instant: datetime, interval: timedelta) -> datetime:
    """The start of the UTC-aligned interval holding `instant`."""
    return EPOCH + bucket_of(instant, interval) * interval


def thinning_cutoff(now: datetime, full_history: timedelta, interval: timedelta) -> datetime:
    """Readings captured before this instant are thinned: now - full_history, rounded down to an
    interval boundary (so buckets are whole)."""
    return floor_to_interval(now - full_history, interval)


class HistoryThinner:
    """Decides which readings to drop, fed rows in (captured_at, snapshot_id) order: per thread it
    keeps the latest reading of each interval and returns the ones a later reading of the same
    interval replaced. Feed a whole window in order, in as many calls as pages; the state is one
    entry per thread."""

    def __init__(self, interval: timedelta) -> None:
        self._interval = interval
        self._latest: dict[str, tuple[int, str]] = {}

    def feed(self, rows: Iterable[tuple[str, str, datetime]]) -> list[str]:
        """Takes (snapshot_id, thread_id, captured_at) rows; returns snapshot ids to delete."""
        drops: list[str] = []
        for snapshot_id, thread_id, captured_at in rows:
            bucket = bucket_of(captured_at, self._interval)
            kept = self._latest.get(thread_id)
            if kept is not None and kept[0] == bucket:
                drops.append(kept[1])
            self._latest[thread_id] = (bucket, snapshot_id)
        return drops


@dataclass
class SnapshotRetention:
    """Thins `thread_context_snapshots` (module docstring)."""

    database: Database
    snapshots: Table
    marks: Table
    settings: RetentionSettings
    clock: Callable[[], datetime] = utc_now

    async def thin(self) -> int:
        """One pass; returns how many readings it deleted."""
        DELETED.add(0, {"table": "thread_context_snapshots", "service": "context_budget"})  # series exists
        interval = self.settings.downsample_interval
        cutoff = thinning_cutoff(self.clock(), self.settings.full_history, interval)
        mark = await self._mark()
        if mark is not None and mark >= cutoff:
            return 0
        thinner = HistoryThinner(interval)
        table = self.snapshots
        captured_at, snapshot_id = table.c.captured_at, table.c.snapshot_id
        window = captured_at < cutoff if mark is None else and_(captured_at >= mark, captured_at < cutoff)
        after: tuple[datetime, str] | None = None
        deleted = 0
        while True:
            query = select(snapshot_id, table.c.thread_id, captured_at).where(window)
            if after is not None:
                query = query.where(
                    or_(captured_at > after[0], and_(captured_at == after[0], snapshot_id > after[1]))
                )
            query = query.order_by(captured_at, snapshot_id).limit(READ_PAGE_ROWS)
            async with self.database.read() as connection:
                rows = [(str(a), str(b), c) for a, b, c in (await connection.execute(query)).all()]
            deleted += await self._delete(thinner.feed(rows))
            if len(rows) < READ_PAGE_ROWS:
                break
            after = (rows[-1][2], rows[-1][0])
            await asyncio.sleep(self.settings.pause_seconds)
        await self._set_mark(cutoff)
        return deleted

    async def _delete(self, snapshot_ids: list[str]) -> int:
        """Deletes by primary key, `batch_rows` per transaction, pausing between transactions. The
        ids travel as one parameter (a PostgreSQL array, a JSON array on SQLite), so a statement
        costs the same to build whatever its size."""
        deleted = 0
        size = self.settings.batch_rows
        table = self.snapshots.name
        for start in range(0, len(snapshot_ids), size):
            if start:
                await asyncio.sleep(self.settings.pause_seconds)
            chunk = snapshot_ids[start : start + size]
            async with self.database.transaction() as connection:
                if connection.dialect.name == "postgresql":
                    statement = text(f"DELETE FROM {table} WHERE snapshot_id = ANY(CAST(:ids AS text[]))")
                    result = await connection.execute(statement, {"ids": chunk})
                else:
                    statement = text(
                        f"DELETE FROM {table} WHERE snapshot_id IN (SELECT value FROM json_each(:ids))"
                    )
                    result = await connection.execute(statement, {"ids": json.dumps(chunk)})
            count = int(result.rowcount or 0)
            DELETED.add(count, {"table": "thread_context_snapshots", "service": "context_budget"})
            deleted += count
        return deleted

    async def _mark(self) -> datetime | None:
        async with self.database.read() as connection:
            value: datetime | None = (
                await connection.execute(
                    select(self.marks.c.done_through).where(self.marks.c.job == THINNED_JOB)
                )
            ).scalar_one_or_none()
        return value

    async def _set_mark(self, done_through: datetime) -> None:
        async with self.database.transaction() as connection:
            statement = upsert(connection.dialect.name, self.marks, ["done_through"], ["job"])
            await connection.execute(statement, {"job": THINNED_JOB, "done_through": done_through})
