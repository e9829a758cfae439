"""A service process's life on PostgreSQL under a steady load of its acknowledged writes:
context_budget with workers' reports, conversations with people's messages, the gateway with
people's messages sent through it, and the scheduler with the reports it follows from a running
context_budget.

1. Started before its database exists, it waits, saying why on every try, and serves once the
   database is there.
2. SIGTERM under load: its health goes NOT_SERVING, in-flight calls are answered, the process
   exits 0 within the grace period, and the senders carry on with the restarted process.
3. SIGKILL under load, then a restart.

Every write the service acknowledged (answered OK) is stored, exactly once. A report that failed
(UNAVAILABLE while it was down) is the reporter's to send again, as the worker's unacked buffer
does; a message that failed is sent again with the same client_message_id, as the console does,
and is then stored once. The counts are printed (pytest -s).

The gateway keeps no state: what it acknowledged (201, or 200 for a repeat) is stored in
conversations, exactly once, and its SSE streams end at SIGTERM (the client reconnects) instead of
holding the shutdown. The scheduler acknowledges nothing to the load: what it must not lose is the
stream it follows. After its SIGTERM and SIGKILL it resumes context_budget's stream where its
committed cursor says, so it ends on the very last reading of every thread and on the stream's
last event; a ClaimTask long-poll open at its SIGTERM is answered, not cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from boss.conversations.v1 import conversations_pb2 as conversations_pb
from boss.conversations.v1 import conversations_pb2_grpc as conversations_grpc
from boss.scheduler.v1 import scheduler_pb2 as sched_pb
from boss.scheduler.v1 import scheduler_pb2_grpc as sched_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import create_engine, text

from services.bff_gateway.server import GRACE_SECONDS as GATEWAY_GRACE_SECONDS
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.grpc_server import GRACE_SECONDS
from tests.conftest import POSTGRES_URL, REPOSITORY_ROOT
from tests.e2e.test_console_browser import free_port
from tests.integration.context_budget.support import NODE_ID, WORKER_ID, snapshot

pytestmark = pytest.mark.postgres

SECRET = "lifecycle-test-secret-0123456789abcdef"
SENDERS = 4
"""Concurrent senders, each for its own thread."""
OWNER = "owner-lifecycle"


@dataclass
class Database:
    """A PostgreSQL database of this test alone (created when asked, dropped at the end)."""

    name: str
    admin_url: str = POSTGRES_URL

    @property
    def url(self) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + self.name

    def _admin(self, statement: str) -> None:
        engine = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(statement))
        finally:
            engine.dispose()

    def create(self) -> None:
        self._admin(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def rows(self, query: str) -> list[tuple[str, str]]:
        """The rows of `query`, each value as text."""
        engine = create_engine(self.url)
        try:
            with engine.connect() as connection:
                return [(str(row[0]), str(row[1])) for row in connection.execute(text(query))]
        finally:
            engine.dispose()


@pytest.fixture
def database() -> Iterator[Database]:
    chosen = Database(f"lifecycle_{uuid.uuid4().hex[:12]}")
    try:
        yield chosen
    finally:
        chosen.drop()


@dataclass
class ServiceProcess:
    """A service as a process (`name`: context_budget or conversations); `start` again after it
    ended reuses the port and database."""

    name: str
    database_url: str
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    peers: dict[str, str] = field(default_factory=dict)
    """Addresses of the peers it follows or calls, by name; a peer not named gets a port nobody
    listens on."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("BOSS_")}
        environment.update(
            {
                "BOSS_DATA_DIR": str(self.log_path.parent / "var"),
                "BOSS_AUTH_SECRET": SECRET,
                "BOSS_DATABASE_URL": self.database_url,
                LISTEN_VARIABLES.get(self.name, f"BOSS_{self.name.upper()}_LISTEN"): self.address,
                # Nothing there: the service follows its peers' streams, retrying, and serves meanwhile.
                **{
                    f"BOSS_{peer.upper()}_ADDRESS": self.peers.get(peer) or f"127.0.0.1:{free_port()}"
                    for peer in PEERS[self.name]
                },
                "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
            }
        )
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}", "serve"],
                cwd=REPOSITORY_ROOT,
                env=environment,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, number: int) -> None:
        assert self.process is not None
        self.process.send_signal(number)

    async def ended(self, timeout: float) -> int:
        """The exit code once the process ended (fails after `timeout` seconds)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} still running after {timeout} s:\n{self.log()[-3000:]}")
            await asyncio.sleep(0.05)
        return self.process.returncode

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


async def serving(address: str, timeout: float = 60) -> None:
    """Waits until the whole server answers SERVING."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"no service serving at {address} after {timeout} s")
            await asyncio.sleep(0.1)


EXPECTED_FAILURES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
"""How a write fails while the service is down or stopping: never anything else."""
STOPPING_FAILURES = (grpc.StatusCode.CANCELLED,)
"""Also while it stops: gRPC cancels the calls it received but had not handed to a handler yet
(gRPC issue 41785; never handled, so the sender repeats them as it does after UNAVAILABLE)."""
PEERS = {
    "context_budget": ["conversations"],
    "conversations": ["context_budget", "scheduler"],
    "scheduler": ["context_budget", "conversations"],
    "bff_gateway": ["context_budget", "conversations", "scheduler"],
}
LISTEN_VARIABLES = {"bff_gateway": "BOSS_GATEWAY_LISTEN"}


@dataclass
class Load:
    """Senders writing one thing after another to `address`, each for its own thread, counting
    what was acknowledged (`acked`: (thread id, key)) and what failed."""

    address: str
    acked: set[tuple[str, str]] = field(default_factory=set)
    failed: int = 0
    unexpected: list[str] = field(default_factory=list)
    phase: str = "started"
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            await self.prepare(channel)
            await asyncio.gather(*(self._send(channel, f"thread-{n}") for n in range(SENDERS)))

    async def prepare(self, channel: grpc.aio.Channel) -> None:
        """What must exist before the first write (nothing by default)."""

    async def write(self, channel: grpc.aio.Channel, thread_id: str, key: str) -> None:
        """One acknowledged write keyed `key` (raises AioRpcError when not acknowledged)."""
        raise NotImplementedError

    async def _send(self, channel: grpc.aio.Channel, thread_id: str) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            key = str(number)
            while not self._stop.is_set():
                try:
                    await self.write(channel, thread_id, key)
                except grpc.aio.AioRpcError as error:
                    expected = EXPECTED_FAILURES + (STOPPING_FAILURES if self.phase == "SIGTERM" else ())
                    if error.code() not in expected:
                        self.unexpected.append(
                            f"{self.phase}: {thread_id} {key}: {error.code()} {error.details()}"
                        )
                    self.failed += 1
                    await asyncio.sleep(0.05)
                    if self.repeats_failed_writes:
                        continue
                else:
                    self.acked.add((thread_id, key))
                break

    repeats_failed_writes = False

    def stop(self) -> None:
        self._stop.set()


class ReportLoad(Load):
    """Workers' reports to context_budget (snapshot_version = the key); a failed one is skipped,
    the next reading supersedes it."""

    async def write(self, channel: grpc.aio.Channel, thread_id: str, key: str) -> None:
        token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID, owner_id=OWNER)
        version = int(key)
        await pb_grpc.ContextBudgetServiceStub(channel).ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=snapshot(thread_id, 90.0 - version % 80, version=version)),
            metadata=bearer_metadata(token),
            timeout=5,
        )

    @staticmethod
    def stored(database: Database) -> list[tuple[str, str]]:
        return database.rows(
            "SELECT thread_id, snapshot_version FROM context_budget.thread_context_snapshots"
        )


class MessageLoad(Load):
    """People's messages to conversations, one thread's project each (client_message_id = the
    thread and the key); a failed one is sent again with the same client_message_id."""

    repeats_failed_writes = True

    async def prepare(self, channel: grpc.aio.Channel) -> None:
        token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID, owner_id=OWNER)
        stub = conversations_grpc.ConversationsServiceStub(channel)
        self.projects: dict[str, str] = {}
        for n in range(SENDERS):
            registered = await stub.RegisterThread(
                conversations_pb.RegisterThreadRequest(
                    thread_id=f"thread-{n}",
                    node_id=NODE_ID,
                    worker_id=WORKER_ID,
                    codex_folder=f"/home/dev/repo-{n}",
                    codex_thread_ref=f"0199-thread-{n}",
                ),
                metadata=bearer_metadata(token),
                timeout=10,
            )
            self.projects[f"thread-{n}"] = registered.project_id

    async def write(self, channel: grpc.aio.Channel, thread_id: str, key: str) -> None:
        token = TokenAuthority(SECRET).issue_client(OWNER)
        await conversations_grpc.ConversationsServiceStub(channel).PostMessage(
            conversations_pb.PostMessageRequest(
                project_id=self.projects[thread_id],
                text=f"message {key}",
                client_message_id=f"{thread_id}.{key}",
            ),
            metadata=bearer_metadata(token),
            timeout=5,
        )

    @staticmethod
    def stored(database: Database) -> list[tuple[str, str]]:
        rows = database.rows(
            "SELECT client_message_id, message_id FROM conversations.messages WHERE author_kind = 'user'"
        )
        return [tuple(client_message_id.split(".", 1)) for client_message_id, _ in rows]  # type: ignore[misc]


LOADS: dict[str, type[ReportLoad] | type[MessageLoad]] = {
    "context_budget": ReportLoad,
    "conversations": MessageLoad,
}


async def watch_health(address: str, seen: list[int]) -> None:
    """Records every status the server's health Watch sends until the stream ends."""
    async with grpc.aio.insecure_channel(address) as channel:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        try:
            async for answer in stream:
                seen.append(answer.status)
                if answer.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    return  # seen; ending the watch lets the shutdown go on at once
        except grpc.aio.AioRpcError:
            return


async def grow(load: Load, seconds: float) -> int:
    """Lets the load run `seconds` and returns how many acks came meanwhile (fails on none)."""
    before = len(load.acked)
    await asyncio.sleep(seconds)
    gained = len(load.acked) - before
    assert load.unexpected == []
    assert gained > 0, "no write was acknowledged"
    return gained


@pytest.mark.parametrize("name", ["context_budget", "conversations"])
async def test_waits_for_its_database_and_loses_no_acked_write_through_sigterm_and_sigkill(
    name: str, database: Database, tmp_path: Path
) -> None:
    service = ServiceProcess(name, database.url, tmp_path / f"{name}.log")
    try:
        # 1. No database yet: the service waits and says why.
        service.start()
        deadline = time.monotonic() + 60
        while "waiting for its database" not in service.log():
            assert service.process is not None and service.process.poll() is None, service.log()[-3000:]
            assert time.monotonic() < deadline, service.log()[-3000:]
            await asyncio.sleep(0.1)
        line = next(line for line in service.log().splitlines() if "waiting for its database" in line)
        assert database.name in line and "next try in" in line
        database.create()
        await serving(service.address)
        assert "its database at" in service.log() and "answers; starting" in service.log()

        load = LOADS[name](service.address)
        reporters = asyncio.ensure_future(load.run())
        await grow(load, 1.5)

        # 2. SIGTERM under load: NOT_SERVING, a clean exit within the grace period.
        seen: list[int] = []
        watcher = asyncio.ensure_future(watch_health(service.address, seen))
        await asyncio.sleep(0.2)
        load.phase = "SIGTERM"
        service.signal(signal.SIGTERM)
        assert await service.ended(GRACE_SECONDS + 15) == 0, service.log()[-3000:]
        load.phase = "stopped"
        await asyncio.wait_for(watcher, 5)
        assert health_pb2.HealthCheckResponse.NOT_SERVING in seen
        assert f"{name} stopped" in service.log()
        acked_before_restart = len(load.acked)

        service.start()
        await serving(service.address)
        load.phase = "restarted"
        await grow(load, 1.5)

        # 3. SIGKILL under load, then a restart.
        load.phase = "SIGKILL"
        service.signal(signal.SIGKILL)
        assert await service.ended(10) == -signal.SIGKILL
        service.start()
        await serving(service.address)
        load.phase = "restarted again"
        await grow(load, 1.5)
        load.stop()
        await asyncio.wait_for(reporters, 30)
        service.signal(signal.SIGTERM)
        assert await service.ended(GRACE_SECONDS + 15) == 0
    finally:
        service.stop()

    stored = LOADS[name].stored(database)
    assert len(stored) == len(set(stored)), "a write was stored twice"
    lost = load.acked - set(stored)
    print(
        f"\n{name}: acknowledged {len(load.acked)} writes ({acked_before_restart} before the SIGTERM), "
        f"stored {len(stored)}, failed and not acknowledged {load.failed}, lost {len(lost)}"
    )
    assert lost == set(), f"acknowledged but not stored: {sorted(lost)[:10]}"
    assert load.unexpected == []
    log = service.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:4000]


class GatewayMessageLoad(MessageLoad):
    """People's messages sent through the gateway (HTTP) to conversations, one thread's project
    each; a send that failed (the gateway down or stopping) is sent again with the same
    client_message_id, as the console does."""

    def __init__(self, gateway_url: str, conversations_address: str) -> None:
        super().__init__(conversations_address)
        self.gateway_url = gateway_url

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            await self.prepare(channel)
        token = TokenAuthority(SECRET).issue_client(OWNER)
        async with httpx.AsyncClient(
            base_url=self.gateway_url, headers={"Authorization": f"Bearer {token}"}, timeout=5
        ) as self.http:
            await asyncio.gather(*(self._send(channel, f"thread-{n}") for n in range(SENDERS)))

    async def write(self, channel: grpc.aio.Channel, thread_id: str, key: str) -> None:
        try:
            answer = await self.http.post(
                f"/api/v1/projects/{self.projects[thread_id]}/messages",
                json={"text": f"message {key}", "client_message_id": f"{thread_id}.{key}"},
            )
        except httpx.TransportError as error:  # down or stopping: not acknowledged
            raise _NotAcknowledged(grpc.StatusCode.UNAVAILABLE, str(error)) from error
        if answer.status_code in (200, 201):
            return
        # 503 with Retry-After while a backend is away; anything else is unexpected.
        code = grpc.StatusCode.UNAVAILABLE if answer.status_code == 503 else grpc.StatusCode.UNKNOWN
        raise _NotAcknowledged(code, f"HTTP {answer.status_code}: {answer.text[:300]}")


class _NotAcknowledged(grpc.aio.AioRpcError):
    """An HTTP send that was not acknowledged, in the form the load counts failures in."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


async def follow_sse_until_it_ends(gateway_url: str, connected: asyncio.Event) -> str:
    """Follows the gateway's event stream until the server ends it; returns how it ended."""
    token = TokenAuthority(SECRET).issue_client(OWNER)
    async with (
        httpx.AsyncClient(base_url=gateway_url, timeout=httpx.Timeout(5, read=60)) as http,
        http.stream("GET", "/api/v1/events", headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        assert response.status_code == 200
        connected.set()
        try:
            async for _line in response.aiter_lines():
                pass
        except httpx.RemoteProtocolError as error:
            return f"cut: {error}"
    return "ended"


async def gateway_ready(url: str, timeout: float = 60) -> None:
    """Waits until the gateway's /readyz answers 200 (its backends answer)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=1) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get("/readyz")).status_code == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"the gateway at {url} was not ready after {timeout} s")
            await asyncio.sleep(0.1)


async def test_the_gateway_loses_no_acked_send_through_sigterm_and_sigkill(
    database: Database, tmp_path: Path
) -> None:
    database.create()
    context_budget = ServiceProcess("context_budget", database.url, tmp_path / "context_budget.log")
    conversations = ServiceProcess(
        "conversations",
        database.url,
        tmp_path / "conversations.log",
        peers={"context_budget": context_budget.address},
    )
    gateway = ServiceProcess(
        "bff_gateway",
        database.url,
        tmp_path / "gateway.log",
        peers={"conversations": conversations.address, "context_budget": context_budget.address},
    )
    gateway_url = f"http://{gateway.address}"
    try:
        context_budget.start()
        conversations.start()
        await serving(context_budget.address)
        await serving(conversations.address)
        gateway.start()
        await gateway_ready(gateway_url)
        load = GatewayMessageLoad(gateway_url, conversations.address)
        senders = asyncio.ensure_future(load.run())
        await grow(load, 1.5)

        # SIGTERM under load with an SSE client following: its stream ends, the process exits 0.
        connected = asyncio.Event()
        follower = asyncio.ensure_future(follow_sse_until_it_ends(gateway_url, connected))
        await asyncio.wait_for(connected.wait(), 10)
        load.phase = "SIGTERM"
        gateway.signal(signal.SIGTERM)
        assert await gateway.ended(GATEWAY_GRACE_SECONDS + 10) == 0, gateway.log()[-3000:]
        assert await asyncio.wait_for(follower, 5) == "ended"
        load.phase = "stopped"
        acked_before_restart = len(load.acked)

        gateway.start()
        await gateway_ready(gateway_url)
        load.phase = "restarted"
        await grow(load, 1.5)

        load.phase = "SIGKILL"
        gateway.signal(signal.SIGKILL)
        assert await gateway.ended(10) == -signal.SIGKILL
        gateway.start()
        await gateway_ready(gateway_url)
        load.phase = "restarted again"
        await grow(load, 1.5)
        load.stop()
        await asyncio.wait_for(senders, 30)
        gateway.signal(signal.SIGTERM)
        assert await gateway.ended(GATEWAY_GRACE_SECONDS + 10) == 0
    finally:
        gateway.stop()
        conversations.stop()
        context_budget.stop()

    stored = MessageLoad.stored(database)
    assert len(stored) == len(set(stored)), "a message was stored twice"
    lost = load.acked - set(stored)
    print(
        f"\ngateway: acknowledged {len(load.acked)} sends ({acked_before_restart} before the SIGTERM), "
        f"stored {len(stored)}, failed and sent again {load.failed}, lost {len(lost)}"
    )
    assert lost == set(), f"acknowledged but not stored: {sorted(lost)[:10]}"
    assert load.unexpected == []
    for log in (gateway.log(), conversations.log()):
        assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:4000]


async def claim_through_shutdown(address: str, opened: asyncio.Event) -> str:
    """A worker's ClaimTask long-poll (no task will come) open across the scheduler's SIGTERM;
    returns how it was answered."""
    token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID, owner_id=OWNER)
    async with grpc.aio.insecure_channel(address) as channel:
        call = sched_grpc.SchedulerServiceStub(channel).ClaimTask(
            sched_pb.ClaimTaskRequest(worker_id=WORKER_ID, node_id=NODE_ID, wait_seconds=60, start=True),
            metadata=bearer_metadata(token),
            timeout=90,
        )
        await asyncio.sleep(0.5)  # a unary call shows nothing until answered: give it time to arrive
        assert not call.done(), "the claim was answered before the SIGTERM"
        opened.set()
        try:
            answer = await call
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return "no task" if not answer.HasField("task") else f"task {answer.task.task_id}"


def latest_versions(stored: list[tuple[str, str]]) -> dict[str, str]:
    """The highest snapshot_version stored per thread, as text, from (thread id, version) rows."""
    latest: dict[str, int] = {}
    for thread_id, version in stored:
        latest[thread_id] = max(int(version), latest.get(thread_id, 0))
    return {thread_id: str(version) for thread_id, version in latest.items()}


def scheduler_progress(database: Database) -> tuple[dict[str, str], str, str]:
    """(the scheduler's snapshot_version per thread, its cursor on context_budget's stream,
    context_budget's last sequence), as text."""
    versions = dict(database.rows("SELECT thread_id, snapshot_version FROM scheduler.scheduled_threads"))
    [(_, cursor)] = database.rows(
        "SELECT stream_name, last_sequence FROM scheduler.event_cursors WHERE stream_name = 'context_budget'"
    )
    [(_, head)] = database.rows("SELECT 'head', last_sequence FROM context_budget.outbox_sequencer")
    return versions, cursor, head


async def test_the_scheduler_resumes_its_stream_through_sigterm_and_sigkill(
    database: Database, tmp_path: Path
) -> None:
    context_budget = ServiceProcess("context_budget", database.url, tmp_path / "context_budget.log")
    scheduler = ServiceProcess(
        "scheduler",
        database.url,
        tmp_path / "scheduler.log",
        peers={"context_budget": context_budget.address},
    )
    try:
        # No database yet: the scheduler waits and says why.
        scheduler.start()
        deadline = time.monotonic() + 60
        while "waiting for its database" not in scheduler.log():
            assert scheduler.process is not None and scheduler.process.poll() is None, scheduler.log()[-3000:]
            assert time.monotonic() < deadline, scheduler.log()[-3000:]
            await asyncio.sleep(0.1)
        database.create()
        context_budget.start()
        await serving(context_budget.address)
        await serving(scheduler.address)
        load = ReportLoad(context_budget.address)
        reporters = asyncio.ensure_future(load.run())
        await grow(load, 1.5)

        # SIGTERM under load, a worker's claim waiting: NOT_SERVING, the claim answered, exit 0.
        seen: list[int] = []
        watcher = asyncio.ensure_future(watch_health(scheduler.address, seen))
        opened = asyncio.Event()
        claim = asyncio.ensure_future(claim_through_shutdown(scheduler.address, opened))
        await asyncio.wait_for(opened.wait(), 10)
        await asyncio.sleep(0.2)
        scheduler.signal(signal.SIGTERM)
        assert await scheduler.ended(GRACE_SECONDS + 15) == 0, scheduler.log()[-3000:]
        await asyncio.wait_for(watcher, 5)
        assert health_pb2.HealthCheckResponse.NOT_SERVING in seen
        claimed = await asyncio.wait_for(claim, 5)
        assert claimed in ("no task", "UNAVAILABLE", "CANCELLED"), claimed
        await grow(load, 1.0)  # context_budget takes reports while the scheduler is down

        scheduler.start()
        await serving(scheduler.address)
        await grow(load, 1.5)
        scheduler.signal(signal.SIGKILL)
        assert await scheduler.ended(10) == -signal.SIGKILL
        await grow(load, 1.0)
        scheduler.start()
        await serving(scheduler.address)
        await grow(load, 1.5)
        load.stop()
        await asyncio.wait_for(reporters, 30)

        # It catches up to the very last reading of every thread and to the stream's last event.
        stored = ReportLoad.stored(database)
        latest = latest_versions(stored)
        deadline = time.monotonic() + 30
        while (progress := scheduler_progress(database)) and (
            progress[0] != latest or progress[1] != progress[2]
        ):
            assert time.monotonic() < deadline, f"the scheduler stopped at {progress}; latest {latest}"
            await asyncio.sleep(0.2)
        scheduler.signal(signal.SIGTERM)
        assert await scheduler.ended(GRACE_SECONDS + 15) == 0
    finally:
        scheduler.stop()
        context_budget.stop()

    assert len(latest) == SENDERS
    print(f"\nscheduler: followed {len(stored)} readings of {len(latest)} threads to the stream's end")
    assert load.unexpected == []
    for log in (scheduler.log(), context_budget.log()):
        assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:4000]
