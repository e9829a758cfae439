"""Helpers for the worker runtime integration tests: the REAL context_budget service
(services/context_budget/server.py) in-process on SQLite, restartable on the same port, and the
worker's agent and reporter running against it.

The worker is a client of the service, not a storage component, so these tests use the embedded
SQLite default only; the service's own tests cover PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from sqlalchemy import select

from services.context_budget.adapters.tables import thread_context_snapshots
from services.context_budget.server import ContextBudgetService, build_service
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.config import ServerTls, ServiceSettings
from worker.agent import WorkerAgent
from worker.codex_sessions.follower import RolloutFollower
from worker.reporter import StreamReporter
from worker.settings import WorkerSettings

SECRET = "worker-runtime-integration-secret-0123456789"
WORKER_ID = "worker-test-01"
NODE_ID = "node-test-01"


class ContextBudgetHarness:
    """One context_budget service on a SQLite file that can be stopped and started on the same port;
    with `tls` it serves TLS (then read it back with `stored_snapshot_ids`: `thread_context` speaks
    plaintext)."""

    def __init__(self, database_url: str, tls: ServerTls | None = None) -> None:
        self._database_url = database_url
        self._tls = tls
        self.authority = TokenAuthority(SECRET)
        self.port = 0
        self.service: ContextBudgetService | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.service is not None

    async def start(self) -> None:
        """Start the service (on the port it had before, once it had one)."""
        settings = ServiceSettings(
            service="context_budget",
            database_url=self._database_url,
            listen=f"127.0.0.1:{self.port}",
            migrate_on_start=True,
            auth_secret=SECRET,
            tls=self._tls,
        )
        service = build_service(settings)
        self.port = await service.start()
        self.service = service

    async def stop(self, grace: float = 0.2) -> None:
        if self.service is not None:
            service, self.service = self.service, None
            await service.stop(grace=grace)

    def worker_token(self, worker_id: str = WORKER_ID, node_id: str = NODE_ID) -> str:
        """A worker token for owner-1, the owner whose client token reads the threads back."""
        return self.authority.issue_worker(worker_id, node_id, owner_id="owner-1")

    async def stored_snapshot_ids(self) -> set[str]:
        """Every snapshot id in the service's history table (server side)."""
        assert self.service is not None
        async with self.service.database.read() as connection:
            rows = await connection.execute(select(thread_context_snapshots.c.snapshot_id))
            return {row.snapshot_id for row in rows}

    async def thread_context(self, thread_id: str) -> pb.ThreadContext | None:
        """The thread's current budget from GetThreadContext (None when it never reported)."""
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = pb_grpc.ContextBudgetServiceStub(channel)
            try:
                response = await stub.GetThreadContext(
                    pb.GetThreadContextRequest(thread_id=thread_id),
                    metadata=bearer_metadata(self.authority.issue_client("owner-1")),
                )
            except grpc.aio.AioRpcError as error:
                if error.code() is grpc.StatusCode.NOT_FOUND:
                    return None
                raise
        return response.thread_context


class RecordingReporter(StreamReporter):
    """A StreamReporter that remembers the id of every snapshot handed to it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.submitted_ids: set[str] = set()

    def submit(self, snapshots: Iterable[pb.ThreadContextSnapshot]) -> int:
        snapshots = list(snapshots)
        self.submitted_ids.update(snapshot.snapshot_id for snapshot in snapshots)
        return super().submit(snapshots)


def worker_settings(codex_home: Path, harness: ContextBudgetHarness, **overrides: object) -> WorkerSettings:
    """Settings of a fast-polling test worker reporting to `harness`."""
    values: dict[str, object] = {
        "codex_home": codex_home,
        "worker_id": WORKER_ID,
        "node_id": NODE_ID,
        "context_budget_address": harness.address,
        "token": harness.worker_token(),
        "poll_interval_s": 0.05,
        "git_refresh_s": 0.2,
        "once_timeout_s": 10.0,
    }
    values.update(overrides)
    return WorkerSettings(**values)  # type: ignore[arg-type]


@dataclass
class RunningAgent:
    """A WorkerAgent looping in a task, with its reporter."""

    agent: WorkerAgent
    reporter: RecordingReporter
    stop: asyncio.Event
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_agent(settings: WorkerSettings) -> AsyncIterator[RunningAgent]:
    """Run a WorkerAgent (real follower, real reporter) until the block exits."""
    reporter = RecordingReporter(settings.context_budget_address, settings.token)
    reporter.start()
    agent = WorkerAgent(settings, RolloutFollower(settings.codex_home, rediscover_interval_s=0.1), reporter)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield RunningAgent(agent, reporter, stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await reporter.close()


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout: float = 15.0, what: str = ""
) -> None:
    """Evaluate `check()` (awaiting it when it is a coroutine) every 50 ms until it is True; fail
    after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        await asyncio.sleep(0.05)
