"""A consumer's metrics while its handler is held up and after: the events received and not yet
committed, the age of the oldest of them, its position and whether it follows its stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from boss.common.v1 import events_pb2
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection

from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.metrics import GaugeSampler, consumer_probe
from services.shared.outbox import NewEvent, StoredEvent, define_outbox_tables
from services.shared.time import to_timestamp, utc_now
from tests.conftest import DatabaseTarget
from tests.metrics_support import metric_value, scrape

AGE = timedelta(minutes=2)


async def test_pending_events_and_lag_while_the_handler_is_held(database_target: DatabaseTarget) -> None:
    occurred_at = utc_now() - AGE
    envelopes = [
        events_pb2.EventEnvelope(
            sequence=sequence, type="test.happened", occurred_at=to_timestamp(occurred_at), payload_json="{}"
        )
        for sequence in (1, 2, 3)
    ]

    async def open_stream(after_sequence: int) -> AsyncIterator[list[events_pb2.EventEnvelope]]:
        yield [envelope for envelope in envelopes if envelope.sequence > after_sequence]
        await asyncio.Event().wait()  # a live stream with nothing more to say

    release = asyncio.Event()
    entered = asyncio.Event()

    async def handle(_connection: AsyncConnection, _events: list[StoredEvent]) -> list[NewEvent]:
        entered.set()
        await release.wait()
        return []

    metadata = MetaData()
    _events, _sequencer, cursors = define_outbox_tables(metadata)
    database = Database.connect(database_target.url, database_target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    consumer = EventConsumer(
        stream_name="upstream-x", database=database, cursors=cursors, open_stream=open_stream, handle=handle
    )
    sampler = GaugeSampler("metrics-test", [consumer_probe(consumer)], interval_seconds=3600)
    following = asyncio.create_task(consumer.run())
    try:
        await asyncio.wait_for(entered.wait(), 10)
        held = await scrape("metrics-test")
        release.set()
        await consumer.wait_for(3)
        done = await scrape("metrics-test")
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        sampler.close()
        await database.dispose()

    labels = {"service": "metrics-test", "consumer": "upstream-x"}
    assert metric_value(held, "boss_event_consumer_pending", **labels) == 3
    lag = metric_value(held, "boss_event_consumer_lag_seconds", **labels)
    assert lag is not None and AGE.total_seconds() <= lag < AGE.total_seconds() + 60
    assert metric_value(held, "boss_event_consumer_position", **labels) == 0
    assert metric_value(held, "boss_event_consumer_up", **labels) == 1
    assert metric_value(done, "boss_event_consumer_pending", **labels) == 0
    assert metric_value(done, "boss_event_consumer_lag_seconds", **labels) == 0
    assert metric_value(done, "boss_event_consumer_position", **labels) == 3


async def test_a_consumer_whose_upstream_is_down_is_not_up(database_target: DatabaseTarget) -> None:
    async def open_stream(_after_sequence: int) -> AsyncIterator[list[events_pb2.EventEnvelope]]:
        raise ConnectionError("upstream unreachable")
        yield []  # an async generator, as a real opener is

    metadata = MetaData()
    _events, _sequencer, cursors = define_outbox_tables(metadata)
    database = Database.connect(database_target.url, database_target.schema or "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)

    async def handle(_connection: AsyncConnection, _events: list[StoredEvent]) -> list[NewEvent]:
        return []

    consumer = EventConsumer(
        stream_name="upstream-down",
        database=database,
        cursors=cursors,
        open_stream=open_stream,
        handle=handle,
    )
    sampler = GaugeSampler("metrics-test-down", [consumer_probe(consumer)], interval_seconds=3600)
    following = asyncio.create_task(consumer.run())
    try:
        for _ in range(200):
            if not consumer.following:
                break
            await asyncio.sleep(0.01)
        exposition = await scrape("metrics-test-down")
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        sampler.close()
        await database.dispose()

    assert metric_value(exposition, "boss_event_consumer_up", consumer="upstream-down") == 0
