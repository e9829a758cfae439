"""The three gRPC services wired as in production, for the trust-boundary tests: context_budget,
the scheduler and conversations on 127.0.0.1 ports picked up front (each follows the others'
streams: the scheduler context_budget's and conversations', conversations context_budget's and the
scheduler's, context_budget conversations' device events), each on its own SQLite file or
PostgreSQL schema. All three listen before any background task starts: a gRPC channel that dials
a port nobody listens on yet backs off for seconds, and other channels of the process share that
back-off."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from boss.context_budget.v1 import context_budget_pb2_grpc as cb_grpc
from boss.conversations.v1 import conversations_pb2 as conv_pb
from boss.conversations.v1 import conversations_pb2_grpc as conv_grpc
from boss.scheduler.v1 import scheduler_pb2_grpc as sched_grpc

from services.context_budget.server import ContextBudgetService, build_service
from services.conversations import server as conversations_server
from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import SchedulerSettings
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.config import ServiceSettings
from services.shared.db import Database
from tests.conftest import DatabaseTarget
from tests.integration.test_budget_to_projection_flow import (
    drop_schemas,
    service_databases,
    start_tasks,
    stop_tasks,
)

SECRET = "trust-boundaries-test-secret-0123456789abcdef"
WAIT_SECONDS = 10.0
T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class TrustStack:
    """The running services, stubs on them and the authority that signs test tokens."""

    budget: cb_grpc.ContextBudgetServiceStub
    scheduler: sched_grpc.SchedulerServiceStub
    conversations: conv_grpc.ConversationsServiceStub
    authority: TokenAuthority
    budget_service: ContextBudgetService
    scheduler_app: scheduler_server.SchedulerApp
    conversations_app: conversations_server.ConversationsApp
    addresses: dict[str, str] = field(default_factory=dict)
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    def service(self) -> tuple[tuple[str, str], ...]:
        """Metadata of a service token."""
        return bearer_metadata(self.authority.issue_service("trust-test"))

    def client(self, owner_id: str) -> tuple[tuple[str, str], ...]:
        """Metadata of a client token of `owner_id`."""
        return bearer_metadata(self.authority.issue_client(owner_id))

    async def enroll(self, owner_id: str, node_id: str, worker_id: str) -> conv_pb.EnrollDeviceResponse:
        """Enrolls a device of `owner_id` by pairing code (the code asked for with a service
        token); returns the device and its credential."""
        code = await self.conversations.CreatePairingCode(
            conv_pb.CreatePairingCodeRequest(owner_id=owner_id), metadata=self.service()
        )
        return await self.conversations.EnrollDevice(
            conv_pb.EnrollDeviceRequest(
                pairing_code=code.pairing_code, node_id=node_id, worker_id=worker_id, device_name=node_id
            )
        )


async def eventually(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str) -> T:
    """Polls `probe` until `check` holds for its value (at most WAIT_SECONDS); returns that value.
    A probe that raises grpc.aio.AioRpcError counts as not yet."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    value: Any = None
    while True:
        try:
            value = await probe()
            if check(value):
                return value
        except grpc.aio.AioRpcError as error:
            value = error
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {value!r}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running_trust_stack(target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[TrustStack]:
    """Starts the three services wired to each other; stops them and drops their schemas."""
    databases = service_databases(target, tmp_path)
    authority = TokenAuthority(SECRET)
    token = authority.issue_service("trust-test-wiring")
    addresses = {
        name: f"127.0.0.1:{free_port()}" for name in ("context_budget", "scheduler", "conversations")
    }
    tasks: list[asyncio.Future[Any]] = []
    servers: list[grpc.aio.Server] = []
    channels: list[grpc.aio.Channel] = []
    budget: ContextBudgetService | None = None
    conversations_db: Database | None = None
    scheduler_app: scheduler_server.SchedulerApp | None = None
    try:
        url, schema = databases["conversations"]
        await conversations_server.migrate(url, schema)
        conversations_db = Database.connect(url, schema)
        app = conversations_server.build_app(
            conversations_db,
            TokenAuthority(SECRET),
            context_budget_stream=conversations_server.context_budget_opener(
                addresses["context_budget"], token
            ),
            scheduler_stream=conversations_server.scheduler_opener(addresses["scheduler"], token),
        )
        await app.event_log.ensure_sequencer_row()
        host = app.host(addresses["conversations"])
        server, _health, _port = await host.start()
        servers.append(server)

        url, schema = databases["context_budget"]
        budget = build_service(
            ServiceSettings("context_budget", url, addresses["context_budget"], True, SECRET),
            schema=schema,
            conversations_address=addresses["conversations"],
        )
        await budget.start(background=False)

        url, schema = databases["scheduler"]
        await scheduler_server.migrate(url, schema)
        scheduler_app = scheduler_server.build(
            database_url=url,
            listen=addresses["scheduler"],
            auth_secret=SECRET,
            context_budget_address=addresses["context_budget"],
            conversations_address=addresses["conversations"],
            settings=SchedulerSettings(),
            schema=schema,
        )
        await scheduler_app.event_log.ensure_sequencer_row()
        server, _health, _port = await scheduler_app.host.start()
        servers.append(server)
        tasks += start_tasks([*host.background, *scheduler_app.host.background])
        budget.start_background()

        channels = [
            grpc.aio.insecure_channel(addresses[name])
            for name in ("context_budget", "scheduler", "conversations")
        ]
        yield TrustStack(
            cb_grpc.ContextBudgetServiceStub(channels[0]),
            sched_grpc.SchedulerServiceStub(channels[1]),
            conv_grpc.ConversationsServiceStub(channels[2]),
            authority,
            budget,
            scheduler_app,
            app,
            addresses,
            channels,
        )
    finally:
        await stop_tasks(tasks)
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop(0)
        if scheduler_app is not None:
            await scheduler_app.database.dispose()
        if conversations_db is not None:
            await conversations_db.dispose()
        if budget is not None:
            await budget.stop(grace=0.2)
        if target.backend == "postgresql":
            await asyncio.to_thread(drop_schemas, target.url, [schema for _url, schema in databases.values()])
