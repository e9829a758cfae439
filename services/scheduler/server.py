"""Composition root of the scheduler: database, outbox, handlers, the consumers of context_budget's
and conversations' streams, the sweepers and the gRPC host.

Background tasks: the outbox sequencer, the `EventConsumer` following context_budget's
`WatchEvents` (durable cursor `context_budget` in `event_cursors`, service token from
`config.auth_secret()`; after each committed batch it marks the changed projects for the strategy
publisher), the `StrategyPublisher` (project.context_strategy.updated), a sweeper expiring
handoff packages every 30 s, and for tasks: the `EventConsumer` following conversations'
`WatchEvents` (only `task.requested` and `task.cancel_requested`, cursor `conversations`), the
task sweeper (every BOSS_SCHEDULER_TASK_SWEEP_SECONDS, 1 s) and, on PostgreSQL, the LISTEN
connection that wakes this process's waiting claims for enqueues committed by other scheduler
processes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2_grpc

from boss_common.channels import open_channel
from services.scheduler.adapters import tables
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.metrics import task_queue_probe
from services.scheduler.service import BUDGET_EVENT, SchedulerHandlers
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.tasks.handlers import CONVERSATIONS_EVENT_TYPES, TaskHandlers
from services.scheduler.tasks.model import TaskSettings
from services.scheduler.tasks.servicer import TaskServicer
from services.scheduler.tasks.wakeups import PostgresTaskListener, TaskWakeups, notify_channel
from services.shared import config
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.db import Database, wait_for_database
from services.shared.devices import (
    DEVICE_EVENTS_STREAM,
    DeviceRevocations,
    RevocationStore,
    device_events_opener,
)
from services.shared.event_stream import EventConsumer, StreamOpener
from services.shared.grpc_server import ServiceHost
from services.shared.metrics import GaugeSampler, consumer_probe, event_log_probe
from services.shared.migrations import upgrade_database
from services.shared.outbox import EventLog
from services.shared.retention import OutboxPruner, RetentionLoop, RetentionSettings, outbox_probe
from services.shared.telemetry import configure_telemetry, instrument_engine

SERVICE = "scheduler"
SERVICE_NAME = "boss.scheduler.v1.SchedulerService"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
EXPIRY_SWEEP_SECONDS = 30.0


def settings_from_environment() -> SchedulerSettings:
    """Scheduler rules from the environment (seconds): BOSS_SCHEDULER_COMPACTION_HORIZON_SECONDS
    (600), BOSS_SCHEDULER_HANDOFF_TTL_SECONDS (86400), BOSS_SCHEDULER_IDLE_AFTER_SECONDS (120),
    BOSS_SCHEDULER_REDELIVER_AFTER_SECONDS (30)."""

    def seconds(name: str, default: float) -> timedelta:
        return timedelta(seconds=float(os.environ.get(f"BOSS_SCHEDULER_{name}_SECONDS") or default))

    return SchedulerSettings(
        compaction_horizon=seconds("COMPACTION_HORIZON", 600),
        handoff_ttl=seconds("HANDOFF_TTL", 86_400),
        idle_after=seconds("IDLE_AFTER", 120),
        redeliver_after=seconds("REDELIVER_AFTER", 30),
    )


def task_settings_from_environment() -> TaskSettings:
    """Task rules from the environment (seconds): BOSS_SCHEDULER_TASK_CLAIM_LEASE_SECONDS (30),
    BOSS_SCHEDULER_TASK_RUN_LEASE_SECONDS (30), BOSS_SCHEDULER_DEVICE_PRESENCE_SECONDS (90),
    BOSS_SCHEDULER_TASK_QUEUE_EXPIRY_SECONDS (900), BOSS_SCHEDULER_TASK_SWEEP_SECONDS (1)."""

    def seconds(name: str, default: float) -> timedelta:
        return timedelta(seconds=float(os.environ.get(f"BOSS_SCHEDULER_{name}_SECONDS") or default))

    return TaskSettings(
        claim_lease=seconds("TASK_CLAIM_LEASE", 30),
        run_lease=seconds("TASK_RUN_LEASE", 30),
        presence_window=seconds("DEVICE_PRESENCE", 90),
        queue_expiry=seconds("TASK_QUEUE_EXPIRY", 900),
        sweep_interval=seconds("TASK_SWEEP", 1),
    )


async def migrate(url: str, schema: str = SERVICE) -> None:
    """Applies the scheduler's migrations (in `schema`, default `scheduler`, on PostgreSQL)."""
    await asyncio.to_thread(upgrade_database, url, schema, MIGRATIONS_DIR)


def budget_stream_opener(address: str, token: str) -> StreamOpener:
    """A StreamOpener for EventConsumer: context_budget's WatchEvents after a sequence, only
    `thread.context.updated` (the other budget events carry nothing the scheduler needs)."""

    async def open_stream(after_sequence: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        async with open_channel(address) as channel:
            stub = context_budget_pb2_grpc.ContextBudgetServiceStub(channel)
            call = stub.WatchEvents(
                context_budget_pb2.WatchEventsRequest(
                    after_sequence=after_sequence, types=[BUDGET_EVENT], consumer=f"{SERVICE}/context_budget"
                ),
                metadata=bearer_metadata(token),
            )
            async for response in call:
                yield response.events

    return open_stream


def conversations_stream_opener(address: str, token: str) -> StreamOpener:
    """A StreamOpener for EventConsumer: conversations' WatchEvents after a sequence, only
    `task.requested` and `task.cancel_requested` (every owner's: a service token)."""

    async def open_stream(after_sequence: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        async with open_channel(address) as channel:
            stub = conversations_pb2_grpc.ConversationsServiceStub(channel)
            call = stub.WatchEvents(
                conversations_pb2.WatchEventsRequest(
                    after_sequence=after_sequence,
                    types=CONVERSATIONS_EVENT_TYPES,
                    consumer=f"{SERVICE}/conversations",
                ),
                metadata=bearer_metadata(token),
            )
            async for response in call:
                yield response.events

    return open_stream


@dataclass
class SchedulerApp:
    """A wired scheduler: everything a process (or a test) runs. `task_consumer` follows
    conversations' stream (None when built without its address); `task_listener` is the LISTEN
    connection (PostgreSQL only)."""

    database: Database
    event_log: EventLog
    handlers: SchedulerHandlers
    consumer: EventConsumer
    host: ServiceHost
    tasks: TaskHandlers
    task_consumer: EventConsumer | None = None
    task_listener: PostgresTaskListener | None = None


def expiry_sweeper(handlers: SchedulerHandlers) -> Callable[[], Awaitable[None]]:
    """A background loop expiring stale handoff packages every EXPIRY_SWEEP_SECONDS."""

    async def sweep_forever() -> None:
        while True:
            await handlers.expire_packages()
            await asyncio.sleep(EXPIRY_SWEEP_SECONDS)

    return sweep_forever


def build(
    *,
    database_url: str,
    listen: str,
    auth_secret: str,
    context_budget_address: str,
    settings: SchedulerSettings | None = None,
    schema: str = SERVICE,
    conversations_address: str | None = None,
    task_settings: TaskSettings | None = None,
    retention: RetentionSettings | None = None,
    tls: config.ServerTls | None = None,
) -> SchedulerApp:
    """Wires the scheduler (nothing starts until `host.run()` / `host.start()`). Tasks are created
    from conversations' stream only when `conversations_address` is given (serve() always gives
    it); `task_settings` default to the environment's (`task_settings_from_environment`);
    `retention` prunes the outbox behind its consumers (None: never; `serve` passes the
    environment's settings, services/shared/retention.py); `tls` is the certificate to serve TLS
    with (None: plaintext; `serve` passes BOSS_TLS_CERT_FILE / BOSS_TLS_KEY_FILE's)."""
    database = Database.connect(database_url, schema)
    event_log = EventLog(database, tables.metadata)
    handlers = SchedulerHandlers(database, event_log, settings or settings_from_environment())
    revocations = DeviceRevocations()
    revocation_store = RevocationStore(tables.revoked_devices, revocations, database.dialect)
    handlers.revocation_store = revocation_store
    authority = TokenAuthority(auth_secret, revocations)
    consumer = EventConsumer(
        stream_name="context_budget",
        database=database,
        cursors=tables.event_cursors,
        open_stream=budget_stream_opener(context_budget_address, authority.issue_service(SERVICE)),
        handle=handlers.apply_budget_events,
        event_log=event_log,
        after_commit=handlers.budget_batch_committed,
    )
    handlers.upcoming = consumer.upcoming
    wakeups = TaskWakeups()
    channel = notify_channel(database.schema)
    tasks = TaskHandlers(
        database, event_log, task_settings or task_settings_from_environment(), wakeups, channel
    )
    background = [
        event_log.run_notifier,
        consumer.run,
        handlers.strategies.run,
        expiry_sweeper(handlers),
        tasks.run_sweeper,
    ]
    task_consumer = None
    if conversations_address is not None:
        task_consumer = EventConsumer(
            stream_name="conversations",
            database=database,
            cursors=tables.event_cursors,
            open_stream=conversations_stream_opener(conversations_address, authority.issue_service(SERVICE)),
            handle=tasks.apply_task_requests,
            event_log=event_log,
            after_commit=tasks.requests_committed,
        )
        background.append(task_consumer.run)
        device_events = EventConsumer(
            stream_name=DEVICE_EVENTS_STREAM,
            database=database,
            cursors=tables.event_cursors,
            open_stream=device_events_opener(
                conversations_address, authority.issue_service(SERVICE), f"{SERVICE}/{DEVICE_EVENTS_STREAM}"
            ),
            handle=handlers.apply_device_events,
            after_commit=handlers.device_events_committed,
        )
        background.append(device_events.run)
    consumers = [consumer] if task_consumer is None else [consumer, task_consumer, device_events]
    probes = [
        event_log_probe(event_log),
        outbox_probe(database, tables.outbox_events),
        task_queue_probe(database),
        *map(consumer_probe, consumers),
    ]
    background.append(GaugeSampler(SERVICE, probes).run)
    if retention is not None:
        assert event_log.consumer_positions is not None
        pruner = OutboxPruner(
            database, tables.outbox_events, event_log.consumer_positions, retention, SERVICE
        )
        background.append(RetentionLoop(SERVICE, retention, [("outbox", pruner.prune)]).run)
    task_listener = None
    if database.dialect == "postgresql":
        task_listener = PostgresTaskListener(database_url, channel, wakeups)
        background.append(task_listener.run)
    servicer = SchedulerServicer(handlers, authority, TaskServicer(tasks, authority))

    async def load_revocations() -> None:
        await revocation_store.load(database)

    host = ServiceHost(
        name=SERVICE,
        listen=listen,
        register=lambda server: scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server),
        service_names=[SERVICE_NAME],
        background=background,
        on_start=[load_revocations],
        on_draining=[event_log.end_followers],
        on_stop=[database.dispose],
        readiness_check=database.ping,
        authority=authority,
        tls=tls,
    )
    return SchedulerApp(database, event_log, handlers, consumer, host, tasks, task_consumer, task_listener)


async def serve() -> None:
    """Runs the scheduler from the environment until SIGTERM/SIGINT."""
    configure_telemetry(SERVICE)
    service = config.ServiceSettings.from_environment(SERVICE)
    await wait_for_database(service.database_url, SERVICE)
    if service.migrate_on_start:
        await migrate(service.database_url)
    app = build(
        database_url=service.database_url,
        listen=service.listen,
        auth_secret=service.auth_secret,
        context_budget_address=config.service_address("context_budget"),
        conversations_address=config.service_address("conversations"),
        retention=RetentionSettings.from_environment(),
        tls=service.tls,
    )
    instrument_engine(app.database.writer)
    await app.event_log.ensure_sequencer_row()
    await app.host.run()
