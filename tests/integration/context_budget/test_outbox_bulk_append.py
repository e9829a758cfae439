"""The outbox's bulk append (binary COPY on PostgreSQL), which every ingest batch relies on: events
come back complete and in order on both backends, and a rolled-back append leaves nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import MetaData

from services.shared.db import Database
from services.shared.outbox import COPY_THRESHOLD, EventLog, NewEvent, define_outbox_tables
from tests.conftest import DatabaseTarget


async def _event_log(target: DatabaseTarget) -> tuple[Database, EventLog]:
    metadata = MetaData()
    define_outbox_tables(metadata)
    database = Database.connect(target.url, target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    return database, event_log


async def test_a_bulk_append_stores_every_event_in_order(database_target: DatabaseTarget) -> None:
    database, event_log = await _event_log(database_target)
    base = datetime(2026, 3, 25, 8, 0, tzinfo=UTC)
    count = COPY_THRESHOLD * 3
    events = [
        NewEvent(
            "thread.context.updated",
            {"n": n, "text": 'ünïcode "quoted"\n', "pct": n / 3, "none": None},
            thread_id=f"t-{n}",
            project_id="p",
            node_id="node",
            occurred_at=base + timedelta(microseconds=n),
        )
        for n in range(count)
    ]
    try:
        async with database.transaction() as connection:
            appended = await event_log.append(connection, events)
        assert [event.sequence for event in appended] == list(range(1, count + 1))
        assert await event_log.refresh() == count
        stored = await event_log.read_after(0, limit=count)
    finally:
        await database.dispose()
    assert [event.sequence for event in stored] == list(range(1, count + 1))
    assert [event.payload for event in stored] == [event.payload for event in events]
    assert [(e.type, e.thread_id, e.project_id, e.node_id) for e in stored] == [
        ("thread.context.updated", f"t-{n}", "p", "node") for n in range(count)
    ]
    assert [event.occurred_at for event in stored] == [event.occurred_at for event in events]


async def test_a_rolled_back_bulk_append_leaves_nothing(database_target: DatabaseTarget) -> None:
    database, event_log = await _event_log(database_target)
    events = [NewEvent("x.happened", {"n": n}) for n in range(COPY_THRESHOLD)]
    try:
        with pytest.raises(RuntimeError):
            async with database.transaction() as connection:
                await event_log.append(connection, events)
                raise RuntimeError("later failure in the same transaction")
        assert await event_log.refresh() == 0
        assert await event_log.read_after(0) == []
    finally:
        await database.dispose()
