"""Composition root of the conversations service: database, outbox, handlers, upstream consumers
(context_budget, and the scheduler when enabled), the gRPC servicer and the server host.

Configuration (besides services/shared/config.py):

| variable | default | meaning |
|---|---|---|
| BOSS_CONVERSATIONS_FOLLOW_SCHEDULER | true | follow the scheduler's events (handoff, strategy, chat tasks) |
| BOSS_DEFAULT_OWNER_ID | local | owner of threads registered without one and of auto-imported threads |
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.conversations.v1 import conversations_pb2_grpc

from services.conversations.adapters.tables import event_cursors, metadata
from services.conversations.chat.handlers import TASK_STATUS_CHANGED
from services.conversations.domain.model import SCHEDULER_HANDOFF_EVENTS
from services.conversations.service import STRATEGY_UPDATED_EVENT, ConversationsHandlers
from services.conversations.servicer import SERVICE_NAME, ConversationsServicer
from services.shared import config
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.db import Database
from services.shared.event_stream import EventConsumer, StreamOpener
from services.shared.grpc_server import ServiceHost
from services.shared.migrations import upgrade_database
from services.shared.outbox import EventLog
from services.shared.paging import PageTokenCodec
from services.shared.telemetry import configure_telemetry, instrument_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SCHEMA = "conversations"
CONTEXT_BUDGET_STREAM = "context_budget"
SCHEDULER_STREAM = "scheduler"
# The context_budget event types the projection applies (ConversationsHandlers.apply_budget_events).
CONTEXT_BUDGET_TYPES = ["thread.context.updated"]
# The scheduler event types the service applies (ConversationsHandlers.apply_scheduler_events): the
# handoff events, the strategy summary and chat tasks' status changes. `thread.schedule.updated`,
# the bulk of the stream, is left at the source.
SCHEDULER_TYPES = [*SCHEDULER_HANDOFF_EVENTS, STRATEGY_UPDATED_EVENT, TASK_STATUS_CHANGED]


async def migrate(url: str, schema: str = SCHEMA) -> None:
    """Applies the service's migrations (blocking work runs in a thread)."""
    await asyncio.to_thread(upgrade_database, url, schema, MIGRATIONS_DIR)


def follow_scheduler_enabled() -> bool:
    """Whether to follow the scheduler's stream (BOSS_CONVERSATIONS_FOLLOW_SCHEDULER, default true)."""
    return (os.environ.get("BOSS_CONVERSATIONS_FOLLOW_SCHEDULER") or "true").lower() in {"1", "true", "yes"}


def default_owner_id() -> str:
    """BOSS_DEFAULT_OWNER_ID, default "local"."""
    return os.environ.get("BOSS_DEFAULT_OWNER_ID") or "local"


def context_budget_opener(address: str, token: str) -> StreamOpener:
    """Opens context_budget's WatchEvents after a sequence, on one channel kept for the process.

    Asks only for the types the projection applies (CONTEXT_BUDGET_TYPES): context_budget also
    publishes `thread.context.level_changed` and `thread.context.alert_changed`, about as many
    again under load, which the projection would only skip; filtering them at the source halves
    the stream's work on both sides. The cursor then advances over applied types only, which
    loses nothing: the skipped types are skipped again after a reconnect."""
    channel = grpc.aio.insecure_channel(address)
    stub = context_budget_pb2_grpc.ContextBudgetServiceStub(channel)

    async def open_stream(after: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        call = stub.WatchEvents(
            context_budget_pb2.WatchEventsRequest(after_sequence=after, types=CONTEXT_BUDGET_TYPES),
            metadata=bearer_metadata(token),
        )
        async for response in call:
            yield response.events

    return open_stream


def scheduler_opener(address: str, token: str) -> StreamOpener:
    """Opens the scheduler's WatchEvents after a sequence for the SCHEDULER_TYPES (imported lazily:
    optional contract). As for context_budget's stream, the cursor then advances over those types
    only, which loses nothing."""
    from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)

    async def open_stream(after: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        call = stub.WatchEvents(
            scheduler_pb2.WatchEventsRequest(after_sequence=after, types=SCHEDULER_TYPES),
            metadata=bearer_metadata(token),
        )
        async for response in call:
            yield response.events

    return open_stream


@dataclass
class ConversationsApp:
    """A wired conversations service: everything a process (or a test) runs."""

    database: Database
    event_log: EventLog
    handlers: ConversationsHandlers
    servicer: ConversationsServicer
    consumers: list[EventConsumer] = field(default_factory=list)

    def host(self, listen: str) -> ServiceHost:
        """The gRPC host with the sequencer and consumers as background tasks."""
        background: list[Callable[[], Awaitable[None]]] = [self.event_log.run_notifier]
        background += [consumer.run for consumer in self.consumers]
        return ServiceHost(
            name="conversations",
            listen=listen,
            register=lambda server: conversations_pb2_grpc.add_ConversationsServiceServicer_to_server(
                self.servicer, server
            ),
            service_names=[SERVICE_NAME],
            background=background,
            on_draining=[self.event_log.end_followers],
            on_stop=[self.database.dispose],
            readiness_check=self.database.ping,
        )


def build_app(
    database: Database,
    authority: TokenAuthority,
    *,
    context_budget_stream: StreamOpener | None = None,
    scheduler_stream: StreamOpener | None = None,
    owner_id: str = "local",
    page_tokens: PageTokenCodec | None = None,
) -> ConversationsApp:
    """Wires the service on an open (migrated) database. Streams left None are not followed;
    `page_tokens` signs page tokens (see ConversationsHandlers)."""
    event_log = EventLog(database, metadata)
    handlers = ConversationsHandlers(database, event_log, default_owner_id=owner_id, page_tokens=page_tokens)
    consumers: list[EventConsumer] = []
    if context_budget_stream is not None:
        consumers.append(
            EventConsumer(
                stream_name=CONTEXT_BUDGET_STREAM,
                database=database,
                cursors=event_cursors,
                open_stream=context_budget_stream,
                handle=handlers.apply_budget_events,
                event_log=event_log,
            )
        )
    if scheduler_stream is not None:
        consumers.append(
            EventConsumer(
                stream_name=SCHEDULER_STREAM,
                database=database,
                cursors=event_cursors,
                open_stream=scheduler_stream,
                handle=handlers.apply_scheduler_events,
                event_log=event_log,
            )
        )
    servicer = ConversationsServicer(handlers, event_log, authority)
    return ConversationsApp(database, event_log, handlers, servicer, consumers)


async def serve() -> None:
    """Runs the service with settings from the environment until SIGTERM."""
    configure_telemetry("conversations")
    settings = config.ServiceSettings.from_environment("conversations")
    if settings.migrate_on_start:
        await migrate(settings.database_url)
    database = Database.connect(settings.database_url, SCHEMA)
    instrument_engine(database.writer)
    authority = TokenAuthority(settings.auth_secret)
    token = authority.issue_service("conversations")
    scheduler_stream = None
    if follow_scheduler_enabled():
        scheduler_stream = scheduler_opener(config.service_address("scheduler"), token)
    app = build_app(
        database,
        authority,
        context_budget_stream=context_budget_opener(config.service_address("context_budget"), token),
        scheduler_stream=scheduler_stream,
        owner_id=default_owner_id(),
        page_tokens=PageTokenCodec(settings.auth_secret, "conversations"),
    )
    await app.host(settings.listen).run()
