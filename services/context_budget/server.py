"""Composition root of the context_budget service: database, outbox, handlers, batcher, servicer, host.

In-process use (tests, the local launcher)::

    settings = ServiceSettings(service="context_budget", database_url=url, listen="127.0.0.1:0",
                               migrate_on_start=True, auth_secret=secret)
    service = build_service(settings)           # or build_service(settings, schema="cb_test_1")
    port = await service.start()                # migrates (if asked), serves, runs the sequencer
    ...                                         # grpc.aio.insecure_channel(service.address)
    await service.stop()

As a process: `python -m services.context_budget serve` (`service.run()`: serves until SIGTERM, with
graceful shutdown) and `python -m services.context_budget migrate`.

With `conversations_address` the service follows the conversations service's device events
(services/shared/devices.py): thread moves and device revocations, stored with their own cursor;
the stored revocations are loaded before the first call is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import grpc
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.context_budget import GRPC_SERVICE_NAME, SERVICE_NAME
from services.context_budget.adapters.repository import SqlAlchemyContextRepository
from services.context_budget.adapters.tables import (
    event_cursors,
    metadata,
    outbox_events,
    retention_marks,
    revoked_devices,
    thread_context_snapshots,
)
from services.context_budget.batcher import IngestBatcher
from services.context_budget.domain.alerts import DEFAULT_COMPACTION_RISK_HORIZON
from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import Snapshot
from services.context_budget.handlers import ContextBudgetHandlers
from services.context_budget.metrics import counting_readings, threads_by_level_probe
from services.context_budget.retention import SnapshotRetention
from services.context_budget.servicer import ContextBudgetServicer
from services.shared.auth import TokenAuthority
from services.shared.config import ServiceSettings
from services.shared.db import Database, wait_for_database
from services.shared.devices import (
    DEVICE_EVENTS_STREAM,
    DeviceRevocations,
    RevocationStore,
    device_events_opener,
)
from services.shared.event_stream import EventConsumer
from services.shared.grpc_server import ServiceHost
from services.shared.metrics import GaugeSampler, consumer_probe, event_log_probe
from services.shared.migrations import upgrade_database
from services.shared.outbox import EventLog
from services.shared.paging import PageTokenCodec
from services.shared.retention import OutboxPruner, RetentionLoop, RetentionSettings, outbox_probe
from services.shared.time import utc_now

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


async def migrate(database_url: str, schema: str = SERVICE_NAME) -> None:
    """Applies the service's Alembic migrations (PostgreSQL: into `schema`). Raises on failure."""
    await asyncio.to_thread(upgrade_database, database_url, schema, MIGRATIONS_DIR)


@dataclass
class ContextBudgetService:
    """A wired context_budget service and its lifecycle (see the module docstring)."""

    settings: ServiceSettings
    schema: str
    database: Database
    event_log: EventLog
    handlers: ContextBudgetHandlers
    batcher: IngestBatcher[Snapshot, IngestOutcome]
    servicer: ContextBudgetServicer
    authority: TokenAuthority
    host: ServiceHost
    device_events: EventConsumer | None = None
    port: int = 0
    _server: grpc.aio.Server | None = field(default=None, repr=False)
    _tasks: list[asyncio.Future[None]] = field(default_factory=list, repr=False)

    @property
    def address(self) -> str:
        """host:port clients dial once started (the bound port replaces a requested port 0)."""
        host = self.settings.listen.rsplit(":", 1)[0]
        if host in {"0.0.0.0", "[::]", ""}:
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    async def migrate(self) -> None:
        """Applies the migrations to this service's database and schema."""
        await migrate(self.settings.database_url, self.schema)

    async def start(self, *, background: bool = True) -> int:
        """Migrates (when settings.migrate_on_start), starts serving and (unless `background` is
        False: then `start_background` does it) the outbox sequencer and the consumer; returns the
        bound port."""
        if self.settings.migrate_on_start:
            await self.migrate()
        await self.event_log.ensure_sequencer_row()
        self._server, _health, self.port = await self.host.start()
        if background:
            self.start_background()
        return self.port

    def start_background(self) -> None:
        """Starts the background tasks (sequencer, consumer of conversations' device events): for
        tests that start several services listening first, so that none dials one not listening
        yet (gRPC would back off from it for seconds)."""
        self._tasks = [asyncio.ensure_future(factory()) for factory in self.host.background]

    async def stop(self, grace: float = 1.0) -> None:
        """Stops serving (in-flight RPCs get `grace` seconds), the background tasks, the batcher
        (queued snapshots are still committed) and the database."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        for cleanup in self.host.on_stop:
            await cleanup()

    async def run(self) -> None:
        """Waits for its database, migrates (when asked) and serves until SIGTERM/SIGINT, then
        shuts down gracefully."""
        await wait_for_database(self.settings.database_url, SERVICE_NAME)
        if self.settings.migrate_on_start:
            await self.migrate()
        await self.host.run()


def retention_loop(database: Database, event_log: EventLog, settings: RetentionSettings) -> RetentionLoop:
    """The service's retention: the reading history thinned (retention.py) and the outbox pruned
    behind its consumers (services/shared/retention.py)."""
    assert event_log.consumer_positions is not None
    readings = SnapshotRetention(database, thread_context_snapshots, retention_marks, settings)
    outbox = OutboxPruner(database, outbox_events, event_log.consumer_positions, settings, SERVICE_NAME)
    return RetentionLoop(SERVICE_NAME, settings, [("readings", readings.thin), ("outbox", outbox.prune)])


def snapshot_conflict_keys(snapshot: Snapshot) -> tuple[str, str]:
    """What two ingest transactions in flight together must not share: the thread (its current row,
    alerts and version order) and the snapshot id (its idempotency check)."""
    return ("thread:" + snapshot.thread_id, "snapshot:" + snapshot.snapshot_id)


def build_service(
    settings: ServiceSettings,
    *,
    schema: str = SERVICE_NAME,
    clock: Callable[[], datetime] = utc_now,
    compaction_risk_horizon: timedelta = DEFAULT_COMPACTION_RISK_HORIZON,
    batch_max_items: int = 2_000,
    batch_max_wait_seconds: float = 0.001,
    batch_max_delay_seconds: float = 0.005,
    batch_max_in_flight: int = 1,
    conversations_address: str | None = None,
    retention: RetentionSettings | None = None,
) -> ContextBudgetService:
    """Wires the service from `settings` (nothing runs until `start()` or `run()`).

    Args:
        settings: database URL, listen address (port 0 picks a free port), migrate flag, auth secret.
        schema: PostgreSQL schema of the tables (tests use a unique one per test); ignored on SQLite.
        clock: the server clock (aware UTC).
        compaction_risk_horizon: compaction_expected_at this close to captured_at opens compaction_risk.
        batch_max_items / batch_max_wait_seconds / batch_max_delay_seconds: group-commit limits
            (batcher.py).
        batch_max_in_flight: ingest transactions at once (batcher.py "Pipelining"; batches in
            flight together never share a thread or snapshot id). Default 1: on the 2-core target
            ingest is CPU-bound in the event loop and 2 gave no measurable gain (bench/RESULTS.md).
            Use more than 1 only on PostgreSQL (SQLite serialises writers anyway).
        conversations_address: where the conversations service is, to follow its device events
            (None: follow none; `serve` always passes it).
        retention: history and outbox retention (services/shared/retention.py, retention.py);
            None runs none (`serve` passes the environment's settings).
    """
    database = Database.connect(settings.database_url, schema)
    event_log = EventLog(database, metadata)
    revocations = DeviceRevocations()
    revocation_store = RevocationStore(revoked_devices, revocations, database.dialect)
    handlers = ContextBudgetHandlers(
        database,
        SqlAlchemyContextRepository(database.dialect),
        event_log,
        clock=clock,
        compaction_risk_horizon=compaction_risk_horizon,
        revocation_store=revocation_store,
    )
    batcher: IngestBatcher[Snapshot, IngestOutcome] = IngestBatcher(
        counting_readings(handlers.ingest),
        max_items=batch_max_items,
        max_wait_seconds=batch_max_wait_seconds,
        max_delay_seconds=batch_max_delay_seconds,
        max_in_flight=batch_max_in_flight,
        conflict_keys=snapshot_conflict_keys,
    )
    authority = TokenAuthority(settings.auth_secret, revocations)
    background: list[Callable[[], Awaitable[None]]] = [event_log.run_notifier]
    device_events = None
    if conversations_address is not None:
        device_events = EventConsumer(
            stream_name=DEVICE_EVENTS_STREAM,
            database=database,
            cursors=event_cursors,
            open_stream=device_events_opener(
                conversations_address,
                authority.issue_service(SERVICE_NAME),
                f"{SERVICE_NAME}/{DEVICE_EVENTS_STREAM}",
            ),
            handle=handlers.apply_conversations_events,
            after_commit=handlers.conversations_batch_committed,
        )
        background.append(device_events.run)
    probes = [
        event_log_probe(event_log),
        outbox_probe(database, outbox_events),
        threads_by_level_probe(database),
    ]
    if device_events is not None:
        probes.append(consumer_probe(device_events))
    background.append(GaugeSampler(SERVICE_NAME, probes).run)
    if retention is not None:
        background.append(retention_loop(database, event_log, retention).run)

    async def load_revocations() -> None:
        await revocation_store.load(database)

    servicer = ContextBudgetServicer(
        handlers, batcher, event_log, authority, PageTokenCodec(settings.auth_secret)
    )

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_ContextBudgetServiceServicer_to_server(servicer, server)

    host = ServiceHost(
        name=SERVICE_NAME,
        listen=settings.listen,
        register=register,
        service_names=[GRPC_SERVICE_NAME],
        background=background,
        on_start=[load_revocations],
        on_draining=[event_log.end_followers, servicer.end_report_streams],
        on_stop=[batcher.close, database.dispose],
        readiness_check=database.ping,
        authority=authority,
        tls=settings.tls,
    )
    return ContextBudgetService(
        settings=settings,
        schema=schema,
        database=database,
        event_log=event_log,
        handlers=handlers,
        batcher=batcher,
        servicer=servicer,
        authority=authority,
        host=host,
        device_events=device_events,
    )
