"""Test harness: a real scheduler (migrated database, gRPC server on 127.0.0.1:0, consumer, sequencer)
following an upstream context_budget stand-in that serves `WatchEvents` over real gRPC from an
in-memory list of budget events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2_grpc

from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import SchedulerSettings
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.errors import THREAD_NOT_FOUND, NotFound, grpc_status_of
from services.shared.time import isoformat_utc, to_timestamp
from tests.conftest import DatabaseTarget

SECRET = "test-secret-for-the-scheduler-0123456789"
START = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


class BudgetStreamStandIn(context_budget_pb2_grpc.ContextBudgetServiceServicer):
    """Serves WatchEvents from `events` (sequence = position + 1), then waits for more."""

    def __init__(self) -> None:
        self.events: list[events_pb2.EventEnvelope] = []
        self.opened_after: list[int] = []
        self._grown = asyncio.Condition()

    async def publish(self, payload: dict[str, Any]) -> int:
        """Appends one `thread.context.updated` event; returns its sequence."""
        sequence = len(self.events) + 1
        self.events.append(
            events_pb2.EventEnvelope(
                sequence=sequence,
                type="thread.context.updated",
                occurred_at=to_timestamp(START),
                thread_id=payload["thread_id"],
                project_id=payload.get("project_id", ""),
                node_id=payload.get("node_id", ""),
                payload_json=json.dumps(payload),
            )
        )
        async with self._grown:
            self._grown.notify_all()
        return sequence

    async def GetThreadContext(
        self, request: context_budget_pb2.GetThreadContextRequest, context: grpc.aio.ServicerContext
    ) -> context_budget_pb2.GetThreadContextResponse:
        """The latest published reading of a thread (for the gateway's context-budget route)."""
        for envelope in reversed(self.events):
            if envelope.thread_id == request.thread_id:
                payload = json.loads(envelope.payload_json)
                snapshot = context_budget_pb2.ThreadContextSnapshot(
                    thread_id=payload["thread_id"],
                    project_id=payload["project_id"],
                    node_id=payload["node_id"],
                    worker_id=payload["worker_id"],
                    source_kind=context_budget_pb2.SOURCE_KIND_WORKER_ESTIMATOR,
                    context_budget_remaining_pct=payload["context_budget_remaining_pct"],
                    captured_at=to_timestamp(START),
                    compaction_count=payload["compaction_count"],
                )
                thread_context = context_budget_pb2.ThreadContext(
                    snapshot=snapshot,
                    updated_at=to_timestamp(START),
                    context_budget_level=context_budget_pb2.CONTEXT_BUDGET_LEVEL_URGENT,
                )
                return context_budget_pb2.GetThreadContextResponse(thread_context=thread_context)
        unknown = NotFound(f"thread {request.thread_id} never reported", reason=THREAD_NOT_FOUND)
        await context.abort_with_status(grpc_status_of(unknown))
        raise AssertionError("unreachable")

    async def WatchEvents(
        self, request: context_budget_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[context_budget_pb2.WatchEventsResponse]:
        self.opened_after.append(request.after_sequence)
        cursor = request.after_sequence
        while True:
            if cursor < len(self.events):
                run = self.events[cursor : cursor + 500]
                yield context_budget_pb2.WatchEventsResponse(events=run)
                cursor += len(run)
                continue
            async with self._grown:
                await self._grown.wait_for(lambda position=cursor: len(self.events) > position)


def budget_payload(
    version: int,
    level: str,
    pct: float,
    *,
    thread_id: str = "t1",
    project_id: str = "p1",
    node_id: str = "n1",
    worker_id: str = "w1",
    compactions: int = 0,
    expected_in: timedelta | None = None,
    must_finish_reason: str = "",
) -> dict[str, Any]:
    """A `thread.context.updated` payload as context_budget publishes it."""
    captured = START + timedelta(seconds=30 * version)
    return {
        "thread_id": thread_id,
        "project_id": project_id,
        "task_id": "",
        "node_id": node_id,
        "worker_id": worker_id,
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": pct,
        "context_budget_level": level,
        "previous_level": None,
        "compaction_expected_at": isoformat_utc(captured + expected_in) if expected_in else None,
        "must_finish_before_compaction": bool(must_finish_reason),
        "must_finish_reason": must_finish_reason,
        "estimated_remaining_turns": None,
        "estimated_remaining_large_messages": None,
        "last_compaction_at": None,
        "compaction_count": compactions,
        "snapshot_version": version,
        "captured_at": isoformat_utc(captured),
        "updated_at": isoformat_utc(captured),
        "last_total_tokens": 1000 * version,
        "codex_folder": "/home/dev/repo",
    }


@dataclass
class Running:
    """A running scheduler and its upstream stand-in."""

    app: scheduler_server.SchedulerApp
    upstream: BudgetStreamStandIn
    port: int
    authority: TokenAuthority
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    servers: list[grpc.aio.Server] = field(default_factory=list)
    channel: grpc.aio.Channel | None = None
    upstream_address: str = ""

    @property
    def stub(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        assert self.channel is not None
        return scheduler_pb2_grpc.SchedulerServiceStub(self.channel)

    def client(self) -> tuple[tuple[str, str], ...]:
        """Metadata of a service token (reads and admin)."""
        return bearer_metadata(self.authority.issue_service("test"))

    def worker(self, worker_id: str = "w1", node_id: str = "n1") -> tuple[tuple[str, str], ...]:
        """Metadata of a worker token."""
        return bearer_metadata(self.authority.issue_worker(worker_id, node_id))

    async def publish(self, payload: dict[str, Any]) -> None:
        """Publishes one budget event and waits until the scheduler applied it and sequenced its events."""
        sequence = await self.upstream.publish(payload)
        await self.app.consumer.wait_for(sequence)
        await self.app.event_log.refresh()


async def start_upstream(upstream: BudgetStreamStandIn) -> tuple[grpc.aio.Server, int]:
    """Serves the stand-in on 127.0.0.1:0."""
    server = grpc.aio.server()
    context_budget_pb2_grpc.add_ContextBudgetServiceServicer_to_server(upstream, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@contextlib.asynccontextmanager
async def running_scheduler(
    target: DatabaseTarget,
    upstream: BudgetStreamStandIn | None = None,
    upstream_port: int | None = None,
    settings: SchedulerSettings | None = None,
) -> AsyncIterator[Running]:
    """A migrated, started scheduler following `upstream` (a new stand-in when None)."""
    servers: list[grpc.aio.Server] = []
    if upstream is None:
        upstream = BudgetStreamStandIn()
        upstream_server, upstream_port = await start_upstream(upstream)
        servers.append(upstream_server)
    await scheduler_server.migrate(target.url, target.schema or "scheduler")
    app = scheduler_server.build(
        database_url=target.url,
        listen="127.0.0.1:0",
        auth_secret=SECRET,
        context_budget_address=f"127.0.0.1:{upstream_port}",
        settings=settings or SchedulerSettings(redeliver_after=timedelta(hours=1)),
        schema=target.schema or "scheduler",
    )
    await app.event_log.ensure_sequencer_row()
    server, _health, port = await app.host.start()
    tasks = [asyncio.create_task(factory()) for factory in app.host.background]
    running = Running(app, upstream, port, TokenAuthority(SECRET), tasks, [*servers, server])
    running.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    running.upstream_address = f"127.0.0.1:{upstream_port}"
    try:
        yield running
    finally:
        await running.channel.close()
        await server.stop(0)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for extra in servers:
            await extra.stop(0)
        await app.database.dispose()
