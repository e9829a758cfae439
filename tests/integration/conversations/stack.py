"""A running conversations service for tests: migrated database (SQLite or PostgreSQL), the real gRPC
server on 127.0.0.1:0, its sequencer, and consumers fed by real upstream outboxes (a context_budget
and a scheduler stand-in: an `EventLog` on its own SQLite file, streamed through `watch_events`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
from boss.conversations.v1 import conversations_pb2_grpc
from sqlalchemy import MetaData

from services.conversations.groups.presence import DevicePresenceSource
from services.conversations.groups.settings import DispatchSettings
from services.conversations.master.settings import MasterSettings
from services.conversations.server import ConversationsApp, build_app, migrate
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.db import Database
from services.shared.event_stream import watch_events
from services.shared.outbox import EventLog, NewEvent, define_outbox_tables
from tests.conftest import DatabaseTarget

SECRET = "test-secret-0123456789abcdef-0123456789abcdef"
T0 = datetime(2026, 3, 25, 1, 0, tzinfo=UTC)


@dataclass
class Upstream:
    """An outbox standing in for another context's event stream."""

    database: Database
    event_log: EventLog

    async def publish(self, event_type: str, payload: dict[str, Any]) -> None:
        """Commits one event and lets the sequencer number it."""
        async with self.database.transaction() as connection:
            await self.event_log.append(
                connection, [NewEvent(event_type, payload, thread_id=str(payload.get("thread_id", "")))]
            )
        self.event_log.kick()


async def open_upstream(path: Path) -> Upstream:
    """A fresh upstream outbox on a SQLite file."""
    metadata = MetaData()
    define_outbox_tables(metadata)
    database = Database.connect(f"sqlite+aiosqlite:///{path}", "unused")
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    return Upstream(database, event_log)


def budget_payload(
    thread_id: str,
    pct: float,
    level: str,
    *,
    node_id: str = "node-a",
    version: int = 1,
    captured_at: datetime | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A `thread.context.updated` payload as context_budget publishes it."""
    captured = captured_at or T0 + timedelta(seconds=version)
    return {
        "thread_id": thread_id,
        "project_id": "",
        "task_id": "",
        "node_id": node_id,
        "worker_id": "worker-a",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": pct,
        "context_budget_level": level,
        "previous_level": "",
        "compaction_expected_at": None,
        "must_finish_before_compaction": False,
        "must_finish_reason": "",
        "estimated_remaining_turns": None,
        "estimated_remaining_large_messages": None,
        "last_compaction_at": None,
        "compaction_count": 0,
        "snapshot_version": version,
        "captured_at": captured.isoformat(),
        "updated_at": (captured + timedelta(milliseconds=5)).isoformat(),
        "codex_folder": "/home/dev/north-line",
        "master_actions": [],
        **extra,
    }


@dataclass
class Stack:
    """Everything a test talks to."""

    app: ConversationsApp
    stub: conversations_pb2_grpc.ConversationsServiceStub
    authority: TokenAuthority
    budget: Upstream
    scheduler: Upstream
    address: str

    def client(self, owner_id: str = "local") -> tuple[tuple[str, str], ...]:
        """Call metadata of a client token for `owner_id`."""
        return bearer_metadata(self.authority.issue_client(owner_id))

    def worker(self, worker_id: str = "worker-a", node_id: str = "node-a") -> tuple[tuple[str, str], ...]:
        """Call metadata of a worker token."""
        return bearer_metadata(self.authority.issue_worker(worker_id, node_id))

    def service(self) -> tuple[tuple[str, str], ...]:
        """Call metadata of a service token."""
        return bearer_metadata(self.authority.issue_service("test"))

    async def settle(self) -> None:
        """Waits until both consumers applied everything published so far and the outbox is sequenced."""
        for upstream, consumer in zip((self.budget, self.scheduler), self.app.consumers, strict=True):
            await upstream.event_log.refresh()
            head = upstream.event_log.last_sequence
            if head:
                await consumer.wait_for(head, timeout=10)
        await self.app.event_log.refresh()


@contextlib.asynccontextmanager
async def running_stack(
    target: DatabaseTarget,
    tmp_path: Path,
    master: MasterSettings | None = None,
    dispatch: DispatchSettings | None = None,
    device_presence: DevicePresenceSource | None = None,
) -> AsyncIterator[Stack]:
    """Starts the service on `target` with upstream stand-ins (and the master agent configured by
    `master`, default no backend; group chat plans by `dispatch`, devices' presence from
    `device_presence`, default unknown); stops everything afterwards."""
    await migrate(target.url, target.schema or "conversations")
    database = Database.connect(target.url, target.schema or "conversations")
    authority = TokenAuthority(SECRET)
    budget = await open_upstream(tmp_path / "budget.sqlite3")
    scheduler = await open_upstream(tmp_path / "scheduler.sqlite3")
    app = build_app(
        database,
        authority,
        context_budget_stream=lambda after: watch_events(budget.event_log, after),
        scheduler_stream=lambda after: watch_events(scheduler.event_log, after),
        master=master,
        dispatch=dispatch,
        device_presence=device_presence,
    )
    await app.event_log.ensure_sequencer_row()
    host = app.host("127.0.0.1:0")
    server, _health, port = await host.start()
    tasks = [asyncio.create_task(factory()) for factory in host.background]
    tasks += [
        asyncio.create_task(budget.event_log.run_notifier()),
        asyncio.create_task(scheduler.event_log.run_notifier()),
    ]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Stack(
            app,
            conversations_pb2_grpc.ConversationsServiceStub(channel),
            authority,
            budget,
            scheduler,
            f"127.0.0.1:{port}",
        )
    finally:
        await channel.close()
        await server.stop(0)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for cleanup in host.on_stop:  # the master model's client, then the database
            await cleanup()
        await budget.database.dispose()
        await scheduler.database.dispose()
