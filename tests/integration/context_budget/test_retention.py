"""Retention on SQLite and PostgreSQL, through the real service: readings older than the full
history thinned to the latest per thread per hour (and never again scanned), the outbox pruned only
behind every live consumer's committed position and the age floor, and a reader asking for a pruned
position refused with EVENTS_PRUNED instead of a silent gap."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import timedelta

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from grpc_status import rpc_status
from sqlalchemy import func, select

from services.context_budget.adapters.tables import (
    outbox_events,
    retention_marks,
    thread_context_snapshots,
    thread_contexts,
)
from services.context_budget.retention import THINNED_JOB, SnapshotRetention, floor_to_interval
from services.context_budget.server import ContextBudgetService, retention_loop
from services.shared.errors import reason_of
from services.shared.retention import RetentionSettings
from services.shared.time import utc_now
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import auth, report, snapshot

HOUR = timedelta(hours=1)
# Half past the previous hour: every reading of the history is in the past whenever the test runs
# (readings from the future are refused), and none sits on an hour boundary.
NOW = floor_to_interval(utc_now(), HOUR) - timedelta(minutes=30)
SETTINGS = RetentionSettings(
    full_history=timedelta(days=7),
    downsample_interval=HOUR,
    outbox_min_age=timedelta(0),
    batch_rows=50,
    pause_seconds=0,
)


async def report_history(stub: pb_grpc.ContextBudgetServiceStub, token: str) -> None:
    """Two threads, a reading every 20 minutes over the last 9 days (648 readings each)."""
    start = NOW - timedelta(days=9)
    readings = [
        snapshot(
            thread, 90.0 - (step % 60), version=step + 1, captured_at=start + step * timedelta(minutes=20)
        )
        for thread in ("thread-a", "thread-b")
        for step in range(9 * 24 * 3)
    ]
    for first in range(0, len(readings), 50):
        await asyncio.gather(*(report(stub, token, reading) for reading in readings[first : first + 50]))


async def history(service: ContextBudgetService) -> dict[str, list]:
    table = thread_context_snapshots
    async with service.database.read() as connection:
        rows = (await connection.execute(select(table.c.thread_id, table.c.captured_at))).all()
    by_thread: dict[str, list] = defaultdict(list)
    for thread_id, captured_at in rows:
        by_thread[thread_id].append(captured_at)
    return {thread: sorted(times) for thread, times in by_thread.items()}


async def test_old_readings_keep_the_latest_per_thread_per_hour(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    await report_history(stub, tokens.worker)
    before = await history(service)
    async with service.database.read() as connection:
        current_before = (await connection.execute(select(thread_contexts))).all()
    loop = retention_loop(service.database, service.event_log, SETTINGS)
    for _name, job in loop.jobs:  # the readings job with this test's clock
        job.__self__.clock = lambda: NOW  # type: ignore[attr-defined]

    first = await loop.run_once()
    after = await history(service)
    second = await loop.run_once()

    cutoff = floor_to_interval(NOW - SETTINGS.full_history, HOUR)
    for thread in ("thread-a", "thread-b"):
        recent_before = [t for t in before[thread] if t >= cutoff]
        old_before = [t for t in before[thread] if t < cutoff]
        latest_per_hour = sorted(
            {floor_to_interval(t, HOUR): t for t in old_before}.values()  # the last one wins
        )
        assert [t for t in after[thread] if t >= cutoff] == recent_before
        assert [t for t in after[thread] if t < cutoff] == latest_per_hour
        assert len(old_before) > 2 * len(latest_per_hour) > 90  # three readings an hour, 2 days of them
    assert first["readings"] == sum(len(before[t]) - len(after[t]) for t in before) > 0
    assert second["readings"] == 0  # the mark: finished history is not scanned again
    async with service.database.read() as connection:
        assert (await connection.execute(select(thread_contexts))).all() == current_before


async def events_count(service: ContextBudgetService) -> tuple[int, int]:
    async with service.database.read() as connection:
        row = (
            await connection.execute(
                select(func.min(outbox_events.c.sequence), func.max(outbox_events.c.sequence))
            )
        ).one()
    return int(row[0] or 0), int(row[1] or 0)


async def watch(
    stub: pb_grpc.ContextBudgetServiceStub, token: str, after: int, consumer: str = ""
) -> pb.WatchEventsResponse:
    call = stub.WatchEvents(
        pb.WatchEventsRequest(after_sequence=after, consumer=consumer), metadata=auth(token)
    )
    try:
        return await asyncio.wait_for(call.read(), 10)
    finally:
        call.cancel()


async def test_the_outbox_is_pruned_only_behind_every_live_consumer(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for version in range(1, 31):
        await report(stub, tokens.worker, snapshot("thread-a", 90.0 - version, version=version))
    await service.event_log.refresh()
    oldest, head = await events_count(service)
    assert (oldest, head) == (1, service.event_log.last_sequence) and head >= 30
    # Two consumers report their committed positions through WatchEvents, as EventConsumers do.
    await watch(stub, tokens.admin, 20, consumer="scheduler/context_budget")
    await watch(stub, tokens.admin, 12, consumer="conversations/context_budget")
    positions = service.event_log.consumer_positions
    assert positions is not None
    # A third was last heard of long ago: it no longer holds rows back.
    await positions.record("retired/context_budget", 2, now=utc_now() - timedelta(days=30))
    loop = retention_loop(service.database, service.event_log, SETTINGS)

    deleted = (await loop.run_once())["outbox"]

    assert deleted == 12
    assert await events_count(service) == (13, head)
    assert (await watch(stub, tokens.admin, 12)).events[0].sequence == 13
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await watch(stub, tokens.admin, 5, consumer="late/context_budget")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(rpc_status.from_call(refused.value)) == "EVENTS_PRUNED"
    assert "the oldest kept is 13" in (refused.value.details() or "")
    assert (await watch(stub, tokens.admin, 0)).events  # 0 means "everything kept": never refused
    assert (await service.event_log.read_after(0, limit=1))[0].sequence == 13
    recorded = {p.consumer for p in await positions.all()}
    assert "late/context_budget" not in recorded  # refused: not recorded
    assert "retired/context_budget" not in recorded  # forgotten once it expired


async def test_the_age_floor_keeps_young_events_whatever_the_consumers_say(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for version in range(1, 6):
        await report(stub, tokens.worker, snapshot("thread-a", 90.0 - version, version=version))
    await service.event_log.refresh()
    head = service.event_log.last_sequence
    assert service.event_log.consumer_positions is not None
    await service.event_log.consumer_positions.record("scheduler/context_budget", head)
    floor = RetentionSettings(outbox_min_age=timedelta(days=3), pause_seconds=0)

    deleted = (await retention_loop(service.database, service.event_log, floor).run_once())["outbox"]

    assert deleted == 0
    assert await events_count(service) == (1, head)


async def test_concurrent_first_passes_leave_one_mark(service: ContextBudgetService) -> None:
    readings = SnapshotRetention(
        service.database, thread_context_snapshots, retention_marks, SETTINGS, clock=lambda: NOW
    )

    await asyncio.gather(*(readings.thin() for _ in range(8)))  # no mark yet: each pass sets it

    async with service.database.read() as connection:
        marks = (await connection.execute(select(retention_marks))).all()
    assert [tuple(mark) for mark in marks] == [
        (THINNED_JOB, floor_to_interval(NOW - SETTINGS.full_history, HOUR))
    ]
