"""Composition root of the conversations service: database, outbox, handlers, upstream consumers
(context_budget, and the scheduler when enabled), the gRPC servicer and the server host.

Configuration (besides services/shared/config.py):

| variable | default | meaning |
|---|---|---|
| BOSS_CONVERSATIONS_FOLLOW_SCHEDULER | true | follow the scheduler's events (handoff, strategy, chat tasks) |
| BOSS_DEFAULT_OWNER_ID | local | owner of threads registered without one and of auto-imported threads |
| BOSS_MASTER_* | backend none | the master agent's chat: services/conversations/master/settings.py |
| BOSS_DISPATCH_* | see there | group chat plans: services/conversations/groups/settings.py |

Installing the service (`migrate`, and every start of `serve`) creates the master conversation of
the installation's owner (services/conversations/master/installation.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.conversations.v1 import conversations_pb2_grpc

from boss_common.channels import open_channel
from services.conversations.adapters.tables import event_cursors, metadata, outbox_events
from services.conversations.chat.handlers import TASK_STATUS_CHANGED
from services.conversations.domain.model import SCHEDULER_HANDOFF_EVENTS
from services.conversations.groups.background import DispatchBackground
from services.conversations.groups.handlers import GroupHandlers
from services.conversations.groups.presence import DevicePresenceSource, GrpcSchedulerPresence
from services.conversations.groups.settings import DispatchSettings
from services.conversations.master.answers import ring_follows_main_thread
from services.conversations.master.handlers import MasterAgentChat
from services.conversations.master.installation import install_master_conversations
from services.conversations.master.model import MasterModel
from services.conversations.master.openai_model import OpenAIMasterModel
from services.conversations.master.settings import OPENAI_API, MasterSettings, MasterSettingsError
from services.conversations.service import STRATEGY_UPDATED_EVENT, ConversationsHandlers
from services.conversations.servicer import SERVICE_NAME, ConversationsServicer
from services.shared import config
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.db import Database, wait_for_database
from services.shared.event_stream import EventConsumer, StreamOpener
from services.shared.grpc_server import ServiceHost
from services.shared.metrics import GaugeSampler, consumer_probe, event_log_probe
from services.shared.migrations import upgrade_database
from services.shared.outbox import EventLog
from services.shared.paging import PageTokenCodec
from services.shared.retention import OutboxPruner, RetentionLoop, RetentionSettings, outbox_probe
from services.shared.telemetry import configure_telemetry, instrument_engine

log = logging.getLogger(__name__)
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


async def migrate(url: str, schema: str = SCHEMA, owner_id: str | None = None) -> None:
    """Installs the service on its database: applies the migrations (blocking work runs in a
    thread), then creates the master conversation of `owner_id` (default BOSS_DEFAULT_OWNER_ID) and
    of every owner with data but none (installation.install_master_conversations)."""
    await asyncio.to_thread(upgrade_database, url, schema, MIGRATIONS_DIR)
    database = Database.connect(url, schema)
    try:
        await install_master_conversations(database, owner_id or default_owner_id())
    finally:
        await database.dispose()


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
    channel = open_channel(address)
    stub = context_budget_pb2_grpc.ContextBudgetServiceStub(channel)

    async def open_stream(after: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        call = stub.WatchEvents(
            context_budget_pb2.WatchEventsRequest(
                after_sequence=after, types=CONTEXT_BUDGET_TYPES, consumer=f"{SCHEMA}/{CONTEXT_BUDGET_STREAM}"
            ),
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

    channel = open_channel(address)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)

    async def open_stream(after: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        call = stub.WatchEvents(
            scheduler_pb2.WatchEventsRequest(
                after_sequence=after, types=SCHEDULER_TYPES, consumer=f"{SCHEMA}/{SCHEDULER_STREAM}"
            ),
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
    master: MasterAgentChat
    consumers: list[EventConsumer] = field(default_factory=list)
    master_model: MasterModel | None = None
    groups: GroupHandlers | None = None
    # Outbox retention (services/shared/retention.py); None prunes nothing. `serve` sets it.
    retention: RetentionSettings | None = None

    def host(self, listen: str, tls: config.ServerTls | None = None) -> ServiceHost:
        """The gRPC host with the sequencer and consumers as background tasks; `tls` is the
        certificate to serve TLS with (None: plaintext)."""
        background: list[Callable[[], Awaitable[None]]] = [self.event_log.run_notifier]
        background += [consumer.run for consumer in self.consumers]
        probes = [
            event_log_probe(self.event_log),
            outbox_probe(self.database, outbox_events),
            *map(consumer_probe, self.consumers),
        ]
        background.append(GaugeSampler("conversations", probes).run)
        if self.retention is not None and self.event_log.consumer_positions is not None:
            pruner = OutboxPruner(
                self.database, outbox_events, self.event_log.consumer_positions, self.retention, SCHEMA
            )
            background.append(RetentionLoop(SCHEMA, self.retention, [("outbox", pruner.prune)]).run)
        if self.master.runner is not None:
            background.append(self.master.runner.run)
        if self.groups is not None:
            background.append(DispatchBackground(self.groups, self.event_log).run)
        on_stop: list[Callable[[], Awaitable[None]]] = [self.database.dispose]
        if self.groups is not None and isinstance(self.groups.presence, GrpcSchedulerPresence):
            on_stop.insert(0, self.groups.presence.close)
        if isinstance(self.master_model, OpenAIMasterModel):
            on_stop.insert(0, self.master_model.close)
        return ServiceHost(
            name="conversations",
            listen=listen,
            register=lambda server: conversations_pb2_grpc.add_ConversationsServiceServicer_to_server(
                self.servicer, server
            ),
            service_names=[SERVICE_NAME],
            background=background,
            on_start=[self._load_revocations],
            on_draining=[self.event_log.end_followers],
            on_stop=on_stop,
            readiness_check=self.database.ping,
            authority=self.servicer.authority,
            tls=tls,
        )

    async def _load_revocations(self) -> None:
        """Loads the revoked devices before the first call is served."""
        await self.servicer.devices.devices.load_revocations()


def build_app(
    database: Database,
    authority: TokenAuthority,
    *,
    context_budget_stream: StreamOpener | None = None,
    scheduler_stream: StreamOpener | None = None,
    owner_id: str = "local",
    page_tokens: PageTokenCodec | None = None,
    master: MasterSettings | None = None,
    master_model: MasterModel | None = None,
    dispatch: DispatchSettings | None = None,
    device_presence: DevicePresenceSource | None = None,
) -> ConversationsApp:
    """Wires the service on an open (migrated) database. Streams left None are not followed;
    `page_tokens` signs page tokens (see ConversationsHandlers); `master` configures the master
    agent's chat (default: backend none), whose openai_api model is `master_model` or, when None,
    an OpenAIMasterModel of those settings. Group chat (services/conversations/groups) uses
    `dispatch` (default DispatchSettings()), the same model to draft and summarise (none unless
    openai_api), and `device_presence` (None: presence unknown)."""
    settings = master or MasterSettings()
    if settings.backend == OPENAI_API and master_model is None:
        master_model = OpenAIMasterModel.from_settings(settings)
    event_log = EventLog(database, metadata)
    handlers = ConversationsHandlers(
        database,
        event_log,
        default_owner_id=owner_id,
        page_tokens=page_tokens,
        master_ring_follows_main_thread=ring_follows_main_thread(settings.backend),
    )
    master_chat = MasterAgentChat(
        database, event_log, settings, master_model if settings.backend == OPENAI_API else None
    )
    handlers.chat.master = master_chat
    groups = GroupHandlers(
        database,
        event_log,
        dispatch,
        model=master_model if settings.backend == OPENAI_API else None,
        presence=device_presence,
        relay_intake=handlers.take_in_relay_thread,
    )
    handlers.chat.groups = groups
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
    return ConversationsApp(
        database,
        event_log,
        handlers,
        servicer,
        master_chat,
        consumers,
        master_model=master_model,
        groups=groups,
    )


async def serve() -> None:
    """Runs the service with settings from the environment until SIGTERM."""
    configure_telemetry("conversations")
    settings = config.ServiceSettings.from_environment("conversations")
    try:
        master = MasterSettings.from_environment()
    except MasterSettingsError as error:
        raise SystemExit(f"conversations: {error}") from None
    try:
        dispatch = DispatchSettings.from_environment()
    except ValueError as error:
        raise SystemExit(f"conversations: {error}") from None
    await wait_for_database(settings.database_url, SCHEMA)
    if settings.migrate_on_start:
        await migrate(settings.database_url)
    database = Database.connect(settings.database_url, SCHEMA)
    await install_master_conversations(database, default_owner_id(), ring_follows_main_thread(master.backend))
    log.info(
        "master agent backend: %s%s",
        master.backend,
        f" ({master.model} at {master.base_url})" if master.backend == OPENAI_API else "",
    )
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
        master=master,
        dispatch=dispatch,
        device_presence=GrpcSchedulerPresence(config.service_address("scheduler"), token),
    )
    app.retention = RetentionSettings.from_environment()
    await app.host(settings.listen, settings.tls).run()
