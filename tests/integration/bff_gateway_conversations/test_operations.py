"""The gateway's `/metrics` over HTTP with real SSE clients connected to a running conversations
stack: the open SSE streams while they are open and after, and the conversations consumer's
position once a budget event went through; and the documented resync of an SSE client whose
Last-Event-ID was pruned by retention."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from services.conversations.adapters.tables import outbox_events
from services.shared.metrics import live_samplers
from services.shared.retention import OutboxPruner, RetentionSettings
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.conversations.stack import Stack, budget_payload, running_stack
from tests.metrics_support import metric_value


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack) as running:
        yield running


async def scrape(gateway: RunningGateway) -> str:
    # Gateway apps of other tests in this process (one still serving, or kept by reference cycles)
    # would show their samplers' readings under the same `service="gateway"` label: a deployed
    # process runs one gateway, so only this test's is kept.
    for sampler in live_samplers("gateway"):
        if sampler is not gateway.app.state.metrics_sampler:
            sampler.close()
    response = await gateway.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def test_metrics_count_sse_clients_and_show_the_consumer(gateway: RunningGateway, stack: Stack) -> None:
    readers: list[SseReader] = []  # kept: a reader dropped would close its stream
    async with contextlib.AsyncExitStack() as streams:
        for owner in ("local", "other-owner"):
            response = await streams.enter_async_context(
                gateway.http.stream("GET", f"/api/v1/events?access_token={gateway.token(owner)}")
            )
            readers.append(SseReader(response))
            assert (await readers[-1].next_event()).event == "stream.opened"
        while_open = await scrape(gateway)
        await stack.budget.publish("thread.context.updated", budget_payload("th-9", 64.0, "safe"))
        await stack.settle()
        sequence = stack.budget.event_log.last_sequence
        for sampler in live_samplers("conversations"):  # every 15 s by itself
            await sampler.sample()
        settled = await scrape(gateway)
    for _ in range(100):  # the hub forgets a subscriber once its response has ended
        if gateway.app.state.event_hub.subscriber_count == 0:
            break
        await asyncio.sleep(0.02)
    after = await scrape(gateway)

    assert metric_value(while_open, "boss_gateway_sse_clients", service="gateway") == 2
    assert metric_value(after, "boss_gateway_sse_clients", service="gateway") == 0
    consumer = {"service": "conversations", "consumer": "context_budget"}
    assert metric_value(settled, "boss_event_consumer_position", **consumer) == sequence
    assert metric_value(settled, "boss_event_consumer_pending", **consumer) == 0


async def test_metrics_need_no_token_and_are_not_in_the_api_document(gateway: RunningGateway) -> None:
    document = (await gateway.http.get("/openapi.json")).json()

    assert (await gateway.http.get("/metrics")).status_code == 200
    assert "/metrics" not in document["paths"]


async def test_a_client_resuming_from_a_pruned_position_is_told_to_resync(
    gateway: RunningGateway, stack: Stack
) -> None:
    for version in (1, 2, 3, 4):
        await stack.budget.publish(
            "thread.context.updated", budget_payload("th-9", 60.0 - version, "safe", version=version)
        )
    await stack.settle()
    head = stack.app.event_log.last_sequence
    assert head >= 4
    positions = stack.app.event_log.consumer_positions
    assert positions is not None
    settings = RetentionSettings(outbox_min_age=timedelta(0), pause_seconds=0)
    pruner = OutboxPruner(stack.app.database, outbox_events, positions, settings, "conversations")
    assert await pruner.prune() == head - 1  # no named consumer: all but the newest row

    headers = {**gateway.headers(), "Last-Event-ID": "1"}
    async with gateway.http.stream("GET", "/api/v1/events", headers=headers) as response:
        first = await SseReader(response).next_event()

    assert first.event == "stream.resync"
    assert first.data == {"reason": "history_pruned", "last_event_id": 1, "head_sequence": head}
    assert first.id == str(head)
