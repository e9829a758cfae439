"""context_budget's metrics after real traffic: readings applied by level, threads by current level,
the outbox head and open WatchEvents streams, read from the Prometheus exposition."""

from __future__ import annotations

import asyncio

from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.context_budget.server import ContextBudgetService
from services.shared.metrics import configure_metrics
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import auth, report, snapshot
from tests.metrics_support import metric_value, scrape

WATCH_EVENTS = "/boss.context_budget.v1.ContextBudgetService/WatchEvents"


def readings(exposition: str, level: str) -> float:
    return metric_value(exposition, "boss_context_budget_readings_total", level=level) or 0.0


async def test_readings_and_threads_by_level_after_reports(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    configure_metrics()
    before = await scrape("context_budget")

    await report(stub, tokens.worker, snapshot("thread-a", 20.0, version=1))  # critical
    await report(stub, tokens.worker, snapshot("thread-a", 30.0, version=2))  # urgent, same thread
    await report(stub, tokens.worker, snapshot("thread-b", 90.0, version=1))  # safe
    await report(stub, tokens.worker, snapshot("thread-b", 90.0, version=1))  # duplicate: not applied
    after = await scrape("context_budget")

    assert readings(after, "critical") - readings(before, "critical") == 1
    assert readings(after, "urgent") - readings(before, "urgent") == 1
    assert readings(after, "safe") - readings(before, "safe") == 1
    assert readings(after, "watch") - readings(before, "watch") == 0
    threads = {
        level: metric_value(after, "boss_context_budget_threads", level=level, service="context_budget")
        for level in ("safe", "watch", "urgent", "critical")
    }
    assert threads == {"safe": 1.0, "watch": 0.0, "urgent": 1.0, "critical": 0.0}
    head = metric_value(after, "boss_outbox_head_sequence", service="context_budget")
    assert head == service.event_log.last_sequence
    assert head is not None and head >= 3  # each applied reading published thread.context.updated


async def test_open_watch_streams_are_counted_while_open(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    configure_metrics()
    await report(stub, tokens.worker, snapshot("thread-a", 80.0))
    baseline = metric_value(await scrape(), "boss_grpc_streams_open", method=WATCH_EVENTS) or 0.0

    call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), metadata=auth(tokens.admin))
    first = await asyncio.wait_for(call.read(), 10)
    assert first.events
    while_open = metric_value(await scrape(), "boss_grpc_streams_open", method=WATCH_EVENTS)
    call.cancel()

    assert while_open == baseline + 1
    for _ in range(100):  # the server notices the cancel within a few event-loop turns
        if metric_value(await scrape(), "boss_grpc_streams_open", method=WATCH_EVENTS) == baseline:
            break
        await asyncio.sleep(0.02)
    assert metric_value(await scrape(), "boss_grpc_streams_open", method=WATCH_EVENTS) == baseline
