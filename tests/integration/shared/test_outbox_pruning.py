"""The outbox pruner on SQLite and PostgreSQL with events whose times are out of order: it deletes
only the leading run of old events (so the kept sequences stay contiguous and a reader behind them
is refused, never silently skipped), never the newest event, in batches."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from sqlalchemy import MetaData, select

from services.shared.db import Database
from services.shared.errors import FailedPrecondition
from services.shared.outbox import EventLog, NewEvent, define_outbox_tables
from services.shared.retention import (
    ConsumerPositions,
    OutboxPruner,
    RetentionSettings,
    define_retention_tables,
)
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget

NOW = utc_now()
OLD, YOUNG = NOW - timedelta(days=5), NOW - timedelta(hours=1)
FLOOR = RetentionSettings(outbox_min_age=timedelta(days=3), batch_rows=2, pause_seconds=0)


async def outbox(target: DatabaseTarget, times: list) -> tuple[Database, EventLog, OutboxPruner]:
    metadata = MetaData()
    events, _sequencer, _cursors = define_outbox_tables(metadata)
    consumers, _marks = define_retention_tables(metadata)
    database = Database.connect(target.url, target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    async with database.transaction() as connection:
        await event_log.append(
            connection, [NewEvent("test.happened", {"n": i}, occurred_at=t) for i, t in enumerate(times)]
        )
    positions = ConsumerPositions(database, consumers)
    return database, event_log, OutboxPruner(database, events, positions, FLOOR, "test", clock=lambda: NOW)


async def kept(database: Database, event_log: EventLog) -> list[int]:
    async with database.read() as connection:
        table = event_log.events_table
        return [
            row[0] for row in await connection.execute(select(table.c.sequence).order_by(table.c.sequence))
        ]


async def test_only_the_leading_run_of_old_events_goes(database_target: DatabaseTarget) -> None:
    database, event_log, pruner = await outbox(database_target, [OLD, OLD, OLD, YOUNG, OLD, OLD])
    try:
        deleted = await pruner.prune()  # batches of 2: (1, 2), then 3 alone before the young 4
        remaining = await kept(database, event_log)
        with pytest.raises(FailedPrecondition) as refused:
            await event_log.admit(1)
        await event_log.admit(3)  # the events after 3 are all there
    finally:
        await database.dispose()

    assert deleted == 3
    assert remaining == [4, 5, 6]
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.reason == "EVENTS_PRUNED"


async def test_the_newest_event_always_stays(database_target: DatabaseTarget) -> None:
    database, event_log, pruner = await outbox(database_target, [OLD, OLD, OLD])
    try:
        deleted = await pruner.prune()
        remaining = await kept(database, event_log)
    finally:
        await database.dispose()

    assert (deleted, remaining) == (2, [3])


async def test_a_consumer_of_some_types_holds_back_only_up_to_its_next_event(
    database_target: DatabaseTarget,
) -> None:
    database, event_log, pruner = await outbox(database_target, [OLD] * 8)
    async with database.transaction() as connection:  # event 9 is the only one the consumer takes
        await event_log.append(connection, [NewEvent("device.revoked", {"n": 9}, occurred_at=OLD)])
        await event_log.append(connection, [NewEvent("test.happened", {"n": 10}, occurred_at=OLD)])
    await pruner.positions.record("scheduler/devices", 2, now=NOW, event_types=["device.revoked"])
    wide = OutboxPruner(database, pruner.events, pruner.positions, FLOOR, "test", clock=lambda: NOW)
    try:
        deleted = await wide.prune()
        remaining = await kept(database, event_log)
        # It resumes where it was: what was pruned after 2 held none of its events.
        await event_log.admit(2, "scheduler/devices", ["device.revoked"])
        for consumer, types in (("", ["device.revoked"]), ("scheduler/devices", ["thread.moved"])):
            with pytest.raises(FailedPrecondition):
                await event_log.admit(2, consumer, types)
        await pruner.positions.record("scheduler/devices", 9, now=NOW, event_types=["device.revoked"])
        later = await wide.prune()  # nothing of its types after 9: only the newest row stays
        remaining_later = await kept(database, event_log)
    finally:
        await database.dispose()

    assert (deleted, remaining) == (8, [9, 10])
    assert (later, remaining_later) == (1, [10])


async def test_concurrent_reports_of_a_new_consumer_leave_one_row(database_target: DatabaseTarget) -> None:
    database, _event_log, pruner = await outbox(database_target, [OLD])
    names = [f"scheduler/new-{k}" for k in range(10)]
    try:
        for name in names:  # eight reports at once of a consumer not recorded yet, ten times
            await asyncio.gather(*(pruner.positions.record(name, n, now=NOW) for n in range(1, 9)))
        recorded = await pruner.positions.all()
    finally:
        await database.dispose()

    assert [(p.consumer, p.reported_at) for p in recorded] == [(name, NOW) for name in names]
    assert all(p.last_sequence in range(1, 9) for p in recorded)
