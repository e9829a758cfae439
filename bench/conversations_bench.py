"""Conversations benchmark (ARCHITECTURE.md "Performance budgets"; issue 4 "Performance").

What it does, in one run (about two minutes on a 2-core machine):

1. Uses its own PostgreSQL database (`bench_conversations`, created when missing) and drops the
   schemas `context_budget` and `conversations` (CASCADE) there, so every run starts empty; then
   starts `python -m services.context_budget serve`, `python -m services.conversations serve` and
   `python -m services.bff_gateway serve` as separate processes on free 127.0.0.1 ports.
2. Seeds 1,000 single_device projects of owner `local`: registers 1,000 threads with conversations
   (RegisterThread, worker token) and reports one budget for each through the gateway's REST
   ingest, then waits until every home-list ring is visible. Registers 1,000 more threads for the
   background load, owned by another owner (`bench-background`, worker `worker-background`).
3. `list`: `GET /api/v1/conversations` (default page of 50, and page_size=200) sequentially over
   one keep-alive connection; latency p50/p99. Target p99 <= 20 ms.
4. Report -> SSE, the way a worker reports: the probe holds one `StreamThreadContext` call to
   context_budget (worker token, as worker/reporter.py does) and each round writes one message
   with one snapshot of a `local` thread; the latency is from just before the write to the arrival
   of the matching `conversation.context_indicator.updated` event at each SSE client of the
   gateway (worker -> context_budget -> conversations -> gateway SSE hub -> client). Client 0 is an
   httpx streaming client; the others (for 1,000 clients in one process) are raw asyncio
   connections. Rounds are spaced `--interval` apart. The gateway's VmRSS is read with all clients
   connected. Phases:
   - `grpc_idle_1`: 1 client, no background load.
   - `grpc_idle_1_hops` (only when named in `--phases`): the hop probe without background load.
   - with the background load running (a separate process, `load` below): `grpc_bg_1` (1 client),
     `grpc_bg_1000` (1,000 clients), and `grpc_bg_1_hops` (1 client with the hop probe: stream
     ack, event on context_budget's WatchEvents, event on conversations' WatchEvents, SSE; the
     probe follows context_budget's stream, which ships every background `thread.context.updated`
     to this process as well, so it loads the machine more than the phases without it).
   - `rest_bg_1`: the same through `POST /api/v1/workers/{worker_id}/thread-context` (the
     gateway's REST ingest), for comparison with earlier results.
   Target (issue 4, at 1,000 snapshots/s background): p50 <= 20 ms, p99 <= 100 ms.
5. Background load: `python -m bench.conversations_bench load ...` in its own process holds one
   `StreamThreadContext` call and sends `--background-rate` snapshots/s (default 1,000) in messages
   of `--background-batch` snapshots (default 10, i.e. 100 messages/s: a worker sends what is due
   together), open loop on a fixed schedule, round-robin over the 1,000 background threads with a
   new reading each time. `--background-shape drift` (default) moves each thread's percent the way
   a working Codex thread's budget moves: down by 0.1-0.6 points per reading, back up to ~90 after
   a compaction once it falls under 5 (a level change on ~1 reading in 40). `churn` (the shape of
   the runs before 2026-11-30 03:00) jumps 10 points per reading, so most readings change level and
   open or resolve alerts: a worst case for context_budget's event count. The background owner is
   not the SSE clients' owner, so the clients do not receive its events (each would otherwise get
   ~2,000 events/s); every service still does all of its work (context_budget stores and
   publishes, conversations projects and publishes, the gateway hub receives every event). The load
   generator reports its achieved rate and ack latency.

Results: a table on stdout and bench/output/conversations.json. Run:

    PYTHONPATH=.:gen .venv/bin/python -m bench.conversations_bench [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import create_engine, text

from bench import handler_harness
from bench.ingest_bench import (
    machine_cpu_seconds,
    process_cpu_seconds,
    python_speed_reference,
    wait_for_quiet,
)
from services.shared.auth import TokenAuthority, bearer_metadata

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "bench" / "output"
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_conversations"
SECRET = "bench-conversations-secret-0123456789abcdef"
PROJECTS = 1_000
WORKER, NODE = "worker-bench", "node-bench"
BACKGROUND_WORKER, BACKGROUND_NODE = "worker-background", "node-background"
BACKGROUND_OWNER, BACKGROUND_PREFIX = "bench-background", "background-"
BACKGROUND_SHAPES = ("drift", "churn")
BACKGROUND_PHASES = ("grpc_bg_1", "grpc_bg_1000", "grpc_bg_1_hops", "rest_bg_1")
OPTIONAL_PHASES = ("grpc_idle_1_hops",)


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (milliseconds in, milliseconds out)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def rss_mb(pid: int) -> float:
    """VmRSS of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ensure_database(url: str) -> None:
    """Creates the benchmark's own database when missing, so a run never meets other work's schemas."""
    server, _, name = url.rpartition("/")
    engine = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        exists = connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if exists is None:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


def start_services(
    postgres: str, data_dir: Path
) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, int]]:
    """Starts context_budget, conversations and the gateway; returns the processes and ports."""
    ensure_database(postgres)
    engine = create_engine(postgres)
    with engine.begin() as connection:
        for schema in ("context_budget", "conversations"):
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()
    ports = {name: free_port() for name in ("CONTEXT_BUDGET", "CONVERSATIONS", "GATEWAY", "SCHEDULER")}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOSS_")}
    environment.update(
        {
            "BOSS_DATA_DIR": str(data_dir),
            "BOSS_AUTH_SECRET": SECRET,
            "BOSS_DATABASE_URL": postgres,
            "BOSS_CONVERSATIONS_FOLLOW_SCHEDULER": "false",
            "BOSS_LOG_LEVEL": "WARNING",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}",
        }
    )
    for name, port in ports.items():
        environment[f"BOSS_{name}_LISTEN"] = environment[f"BOSS_{name}_ADDRESS"] = f"127.0.0.1:{port}"
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", module, "serve"],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=open(data_dir / f"{name}.log", "wb"),  # noqa: SIM115
        )
        for name, module in (
            ("context_budget", "services.context_budget"),
            ("conversations", "services.conversations"),
            ("gateway", "services.bff_gateway"),
        )
    }
    return processes, ports


async def wait_ready(base_url: str) -> None:
    """Waits until the gateway answers /readyz."""
    async with httpx.AsyncClient(timeout=1) as http:
        for _ in range(300):
            try:
                if (await http.get(base_url + "/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("gateway not ready after 30 s")


async def wait_grpc_ready(address: str, timeout: float = 60.0) -> None:
    """Waits until a gRPC server accepts connections at `address` (it may still be migrating)."""
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout)


def snapshot(thread_id: str, pct: float) -> dict[str, Any]:
    """A REST ingest body (CB-10)."""
    return {
        "node_id": NODE,
        "worker_id": WORKER,
        "thread_id": thread_id,
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": pct,
        "must_finish_before_compaction": False,
        "compaction_count": 0,
        "captured_at": datetime.now(UTC).isoformat(),
    }


# The whole percent each seeded thread's ring shows now (what the seed and the probe reported).
_SHOWN_PERCENT: dict[str, int] = {}


def probe_percent(thread_id: str, wanted: int) -> int:
    """`wanted` (1-98), or the next whole percent when the thread's ring shows `wanted` already: the
    projection publishes an indicator event only when the ring changes, and every probe report must
    produce one."""
    percent = wanted if _SHOWN_PERCENT.get(thread_id) != wanted else wanted % 98 + 1
    _SHOWN_PERCENT[thread_id] = percent
    return percent


async def seed(base_url: str, conversations_address: str, authority: TokenAuthority) -> None:
    """1,000 registered threads, each with one reported budget, all rings visible."""
    worker = authority.issue_worker(WORKER, NODE)
    await register_threads(conversations_address, worker, "bench-", NODE, WORKER, "", "Bench project")
    headers = {"Authorization": f"Bearer {worker}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        queue = list(range(PROJECTS))

        async def post_some() -> None:
            while queue:
                index = queue.pop()
                response = await http.post(
                    f"/api/v1/workers/{WORKER}/thread-context",
                    json=snapshot(f"bench-{index:04d}", probe_percent(f"bench-{index:04d}", 20 + index % 80)),
                )
                response.raise_for_status()

        await asyncio.gather(*(post_some() for _ in range(8)))
    client = {"Authorization": f"Bearer {authority.issue_client('local')}"}
    async with httpx.AsyncClient(base_url=base_url, headers=client, timeout=10) as http:
        for _ in range(300):
            visible, token = 0, ""
            while True:
                page = (
                    await http.get("/api/v1/conversations", params={"page_size": 200, "page_token": token})
                ).json()
                visible += sum(r["context_budget_indicator"]["visible"] for r in page["conversations"])
                token = page["next_page_token"]
                if not token:
                    break
            if visible >= PROJECTS:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError("rings did not all become visible")


async def bench_list(base_url: str, token: str, requests: int) -> dict[str, Any]:
    """Sequential GET /api/v1/conversations latencies (ms) for the default page and page_size=200."""
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as http:
        for label, params in (("page_50", {}), ("page_200", {"page_size": 200})):
            for _ in range(50):
                await http.get("/api/v1/conversations", params=params)
            samples = []
            for _ in range(requests):
                started = time.perf_counter()
                response = await http.get("/api/v1/conversations", params=params)
                samples.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200
            results[label] = {
                "requests": requests,
                "p50_ms": round(statistics.median(samples), 2),
                "p99_ms": round(percentile(samples, 0.99), 2),
                "max_ms": round(max(samples), 2),
            }
    return results


class RawSseClient:
    """A minimal SSE client on a raw asyncio connection (light enough for 1,000 in one process)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.arrivals: dict[str, float] = {}
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def start(self) -> None:
        """Connects; `ready` is set when the stream.opened event arrived."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer = writer
        writer.write(
            f"GET /api/v1/events?access_token={self.token} HTTP/1.1\r\nHost: bench\r\n"
            "Accept: text/event-stream\r\n\r\n".encode()
        )
        await writer.drain()
        self._task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        event = ""
        while True:
            line = await reader.readline()
            if not line:
                return
            event = self.on_line(line.decode().rstrip("\r\n"), event)

    def on_line(self, text_line: str, event: str) -> str:
        """Handles one SSE line; returns the current event type."""
        if text_line.startswith("event: "):
            return text_line[7:]
        if text_line.startswith("data: ") and event == "stream.opened":
            self.ready.set()
        elif text_line.startswith("data: ") and event == "conversation.context_indicator.updated":
            data = json.loads(text_line[6:])
            key = f"{data['thread_id']}:{data['context_budget_indicator']['percent']}"
            self.arrivals.setdefault(key, time.perf_counter())
        return event

    async def close(self) -> None:
        """Disconnects."""
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()


class HttpxSseClient(RawSseClient):
    """The same client on httpx's streaming response (what an application would use)."""

    def __init__(self, port: int, token: str) -> None:
        super().__init__(port, token)
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        """Connects; `ready` is set when the stream.opened event arrived."""
        self._http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=None)
        self._task = asyncio.create_task(self._read_httpx(self._http))

    async def _read_httpx(self, http: httpx.AsyncClient) -> None:
        event = ""
        async with http.stream(
            "GET",
            "/api/v1/events",
            params={"access_token": self.token},
            headers={"Accept": "text/event-stream"},
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                event = self.on_line(line, event)

    async def close(self) -> None:
        """Disconnects."""
        await super().close()
        if self._http is not None:
            await self._http.aclose()


class HopProbe:
    """Follows context_budget's and conversations' WatchEvents with a service token and records when
    the first event of each probe thread arrives on each, so a report's latency splits into hops.
    Filters on the server side (event type, and owner `local` on conversations) so the background
    load's events are not shipped to this process."""

    def __init__(self, ports: dict[str, int], authority: TokenAuthority, budget_head: int) -> None:
        self.metadata = bearer_metadata(authority.issue_service("bench"))
        self.ports = ports
        self.budget_head = budget_head
        self.arrivals: dict[str, dict[str, float]] = {"context_budget": {}, "conversations": {}}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Opens both streams at their current heads."""
        self._tasks = [
            asyncio.create_task(self._follow_budget()),
            asyncio.create_task(self._follow_conversations()),
        ]
        await asyncio.sleep(0.5)

    async def _follow_budget(self) -> None:
        address = f"127.0.0.1:{self.ports['CONTEXT_BUDGET']}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = context_budget_pb2_grpc.ContextBudgetServiceStub(channel)
            request = context_budget_pb2.WatchEventsRequest(
                after_sequence=self.budget_head, types=["thread.context.updated"]
            )
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                arrived = time.perf_counter()
                for event in response.events:
                    if event.thread_id.startswith("bench-"):
                        self.arrivals["context_budget"].setdefault(event.thread_id, arrived)

    async def _follow_conversations(self) -> None:
        address = f"127.0.0.1:{self.ports['CONVERSATIONS']}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.ConversationsServiceStub(channel)
            request = pb.WatchEventsRequest(
                from_head=True, owner_id="local", types=["conversation.context_indicator.updated"]
            )
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                arrived = time.perf_counter()
                for event in response.events:
                    self.arrivals["conversations"].setdefault(event.thread_id, arrived)

    def forget(self, thread_id: str) -> None:
        """Clears the thread's arrivals before a new report."""
        for arrivals in self.arrivals.values():
            arrivals.pop(thread_id, None)

    async def stop(self) -> None:
        """Closes both streams."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def hop_summary(hops: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p50 / p99 per hop (ms)."""
    return {
        name: {"p50_ms": round(statistics.median(values), 2), "p99_ms": round(percentile(values, 0.99), 2)}
        for name, values in hops.items()
        if values
    }


def grpc_snapshot(
    thread_id: str, pct: float, node_id: str = NODE, worker_id: str = WORKER, version: int = 0
) -> context_budget_pb2.ThreadContextSnapshot:
    """A StreamThreadContext snapshot (CB-10), captured now."""
    captured = Timestamp()
    captured.GetCurrentTime()
    return context_budget_pb2.ThreadContextSnapshot(
        thread_id=thread_id,
        node_id=node_id,
        worker_id=worker_id,
        source_kind=context_budget_pb2.SOURCE_KIND_WORKER_ESTIMATOR,
        context_budget_remaining_pct=pct,
        snapshot_version=version,
        captured_at=captured,
    )


class StreamReporter:
    """One worker's `StreamThreadContext` call: `send` writes one message, `acked` resolves when its
    response (after the commit in context_budget) arrives."""

    def __init__(self, address: str, token: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._call = context_budget_pb2_grpc.ContextBudgetServiceStub(self._channel).StreamThreadContext(
            metadata=bearer_metadata(token)
        )
        self._pending: dict[int, tuple[asyncio.Future[float], float]] = {}
        self._next = 0
        self._reader = asyncio.create_task(self._read())
        self.rejected = 0

    async def _read(self) -> None:
        async for response in self._call:
            waiting = self._pending.pop(response.batch_id, None)
            self.rejected += sum(1 for ack in response.acks if not ack.accepted)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result((time.perf_counter() - waiting[1]) * 1000)

    async def send(
        self, snapshots: list[context_budget_pb2.ThreadContextSnapshot], sent: float
    ) -> asyncio.Future[float]:
        """Writes one message; the future gives the ack latency (ms) measured from `sent`."""
        self._next += 1
        acked: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = (acked, sent)
        await self._call.write(
            context_budget_pb2.StreamThreadContextRequest(batch_id=self._next, snapshots=snapshots)
        )
        return acked

    async def close(self) -> None:
        """Ends the call."""
        self._call.cancel()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._channel.close()


async def bench_sse(
    base_url: str,
    ports: dict[str, int],
    authority: TokenAuthority,
    clients: int,
    rounds: int,
    interval: float,
    gateway_pid: int,
    transport: str,
    probe: HopProbe | None = None,
) -> dict[str, Any]:
    """Delivery latency of a worker report to `clients` SSE clients (ms), and the gateway's RSS.

    `transport` "grpc": each report is one StreamThreadContext message on a held call (as a worker
    sends it); "rest": one POST to the gateway's REST ingest. With a `probe`, also the cumulative
    time from the send to each hop: the ack (committed in context_budget), the event on
    context_budget's WatchEvents, the event on conversations' WatchEvents (applied and committed
    there), and the SSE clients."""
    token = authority.issue_client("local")
    sse: list[RawSseClient] = [HttpxSseClient(ports["GATEWAY"], token)]
    sse += [RawSseClient(ports["GATEWAY"], token) for _ in range(clients - 1)]
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.start() for c in sse[start : start + 100]))
    await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in sse)), 60)
    rss = rss_mb(gateway_pid)
    worker_token = authority.issue_worker(WORKER, NODE)
    latencies: list[float] = []
    first_client: list[float] = []
    hops: dict[str, list[float]] = {"ack": [], "context_budget_stream": [], "conversations_stream": []}
    missing = 0
    missed_in_a_row = 0
    reporter = (
        StreamReporter(f"127.0.0.1:{ports['CONTEXT_BUDGET']}", worker_token) if transport == "grpc" else None
    )
    http = httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {worker_token}"}, timeout=10
    )
    try:
        for round_index in range(rounds):
            thread_id = f"bench-{round_index % PROJECTS:04d}"
            percent = probe_percent(
                thread_id, 1 + (round_index * 7 + clients + (3 if transport == "rest" else 0)) % 98
            )
            key = f"{thread_id}:{percent}"
            if probe is not None:
                probe.forget(thread_id)
            if reporter is not None:
                message = [grpc_snapshot(thread_id, percent + 0.5)]
                sent = time.perf_counter()
                acked = await reporter.send(message, sent)
                hops["ack"].append(await asyncio.wait_for(acked, 10))
            else:
                body = snapshot(thread_id, percent + 0.5)
                sent = time.perf_counter()
                (await http.post(f"/api/v1/workers/{WORKER}/thread-context", json=body)).raise_for_status()
                hops["ack"].append((time.perf_counter() - sent) * 1000)
            deadline = time.perf_counter() + 5
            while time.perf_counter() < deadline and not all(key in c.arrivals for c in sse):
                await asyncio.sleep(0.001)
            missed_in_a_row = 0 if key in sse[0].arrivals else missed_in_a_row + 1
            if missed_in_a_row >= 5:
                missing += len(sse)
                break
            for index, client in enumerate(sse):
                if key in client.arrivals:
                    latencies.append((client.arrivals[key] - sent) * 1000)
                    if index == 0:
                        first_client.append(latencies[-1])
                else:
                    missing += 1
            if probe is not None:
                for stream in ("context_budget", "conversations"):
                    arrived = probe.arrivals[stream].get(thread_id)
                    if arrived is not None:
                        hops[f"{stream}_stream"].append((arrived - sent) * 1000)
            await asyncio.sleep(interval)
    finally:
        await http.aclose()
        if reporter is not None:
            await reporter.close()
        await asyncio.gather(*(c.close() for c in sse))
    if probe is not None:
        hops["sse_client"] = first_client
    if not latencies:
        return {
            "transport": transport,
            "clients": clients,
            "rounds": round_index + 1,
            "missing": missing,
            "gave_up": "5 reports in a row not delivered within 5 s",
            "gateway_rss_mb": round(rss, 1),
        }
    return {
        "transport": transport,
        "clients": clients,
        "rounds": round_index + 1,
        **({"gave_up": "5 reports in a row not delivered within 5 s"} if missed_in_a_row >= 5 else {}),
        "deliveries": len(latencies),
        "missing": missing,
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "httpx_client_p50_ms": round(statistics.median(first_client), 2),
        "httpx_client_p99_ms": round(percentile(first_client, 0.99), 2),
        "gateway_rss_mb": round(rss, 1),
        "ack": hop_summary({"ack": hops["ack"]})["ack"],
        **({"cumulative_hops": hop_summary(hops)} if probe is not None else {}),
    }


class ProcessCores:
    """Cores each named process kept busy between `start()` and `read()` (CPU s / wall s)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._before: tuple[float, dict[str, float]] = (0.0, {})

    def start(self) -> None:
        """Takes the starting reading."""
        self._before = (time.perf_counter(), {n: process_cpu_seconds(p) for n, p in self.pids.items()})

    def read(self) -> dict[str, float]:
        """Cores per process since `start()`."""
        wall = max(time.perf_counter() - self._before[0], 1e-9)
        return {
            name: round((process_cpu_seconds(pid) - self._before[1][name]) / wall, 2)
            for name, pid in self.pids.items()
        }


def busy_cores_since(before: tuple[float, float]) -> float:
    """Cores the whole machine (this benchmark, its services, PostgreSQL and anything else) kept busy
    since `before` (a machine_cpu_seconds() reading)."""
    after = machine_cpu_seconds()
    return round((after[0] - before[0]) / max(after[1] - before[1], 1e-9) * (os.cpu_count() or 1), 2)


# ---------------------------------------------------------------------------------------------------
# Background load generator (its own process: `python -m bench.conversations_bench load ...`).


def background_percent(shape: str, reading: int, previous: float | None) -> float:
    """The next percent of a background thread (module docstring, point 5): `reading` counts every
    snapshot sent so far, `previous` is the thread's last percent (None before its first)."""
    if shape == "churn":
        return 5 + reading * 0.37 % 90
    if previous is None:
        return 20 + reading * 7 % 75
    following = previous - (0.1 + reading * 0.13 % 0.5)
    return 90.0 if following < 5 else following


async def generate_load(
    address: str, token: str, rate: float, batch: int, threads: int, output: Path, shape: str = "drift"
) -> None:
    """Sends `rate` snapshots/s in messages of `batch` on one StreamThreadContext call, open loop on
    a fixed schedule, until SIGTERM; then writes its statistics (JSON) to `output`. `shape`: how
    each thread's percent moves (`background_percent`)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    reporter = StreamReporter(address, token)
    acks: list[asyncio.Future[float]] = []
    period = batch / rate
    started = time.perf_counter()
    sent_messages = 0
    behind_max = 0.0
    version = 0
    percents: dict[int, float] = {}
    while not stop.is_set():
        due = started + sent_messages * period
        now = time.perf_counter()
        if due > now:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), due - now)
            continue
        behind_max = max(behind_max, now - due)
        version += 1
        snapshots = []
        for i in range(batch):
            reading = sent_messages * batch + i
            thread = reading % threads
            percents[thread] = background_percent(shape, reading, percents.get(thread))
            snapshots.append(
                grpc_snapshot(
                    f"{BACKGROUND_PREFIX}{thread:04d}",
                    percents[thread],
                    node_id=BACKGROUND_NODE,
                    worker_id=BACKGROUND_WORKER,
                    version=version,
                )
            )
        acks.append(await reporter.send(snapshots, due))
        sent_messages += 1
    elapsed = time.perf_counter() - started
    done = [a.result() for a in acks if a.done() and not a.cancelled()]
    await reporter.close()
    stats = {
        "shape": shape,
        "offered_snapshots_per_second": rate,
        "snapshots_per_message": batch,
        "seconds": round(elapsed, 1),
        "messages_sent": sent_messages,
        "sent_snapshots_per_second": round(sent_messages * batch / elapsed, 1),
        "messages_acked": len(done),
        "rejected_snapshots": reporter.rejected,
        "schedule_lag_max_ms": round(behind_max * 1000, 1),
        "ack_p50_ms": round(statistics.median(done), 2) if done else None,
        "ack_p99_ms": round(percentile(done, 0.99), 2) if done else None,
    }
    output.write_text(json.dumps(stats, indent=2) + "\n")


class BackgroundLoad:
    """Runs the load generator process for the phases that need it."""

    def __init__(
        self, ports: dict[str, int], authority: TokenAuthority, rate: float, batch: int, shape: str
    ) -> None:
        self.output = OUTPUT / "conversations-run" / "background.json"
        self.output.unlink(missing_ok=True)
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.conversations_bench",
                "load",
                "--address",
                f"127.0.0.1:{ports['CONTEXT_BUDGET']}",
                "--token",
                authority.issue_worker(BACKGROUND_WORKER, BACKGROUND_NODE, owner_id=BACKGROUND_OWNER),
                "--rate",
                str(rate),
                "--batch",
                str(batch),
                "--threads",
                str(PROJECTS),
                "--output",
                str(self.output),
                "--shape",
                shape,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}"},
        )

    @property
    def pid(self) -> int:
        """The generator's process id."""
        return self._process.pid

    def stop(self) -> dict[str, Any]:
        """Stops the generator; returns its statistics."""
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return {"error": "load generator did not stop"}
        return dict(json.loads(self.output.read_text())) if self.output.exists() else {"error": "no output"}


async def register_background(conversations_address: str, authority: TokenAuthority) -> None:
    """Registers the background load's threads for owner BACKGROUND_OWNER."""
    worker = authority.issue_worker(BACKGROUND_WORKER, BACKGROUND_NODE, owner_id=BACKGROUND_OWNER)
    await register_threads(
        conversations_address,
        worker,
        BACKGROUND_PREFIX,
        BACKGROUND_NODE,
        BACKGROUND_WORKER,
        BACKGROUND_OWNER,
        "Background",
    )


async def register_threads(
    conversations_address: str, token: str, prefix: str, node: str, worker: str, owner: str, title: str
) -> None:
    """Registers PROJECTS threads `<prefix>0000`... with conversations as `worker` on `node` (owner
    `owner`, or the installation's default when empty), each titled `<title> <index>`."""
    async with grpc.aio.insecure_channel(conversations_address) as channel:
        stub = pb_grpc.ConversationsServiceStub(channel)
        for index in range(PROJECTS):
            await stub.RegisterThread(
                pb.RegisterThreadRequest(
                    thread_id=f"{prefix}{index:04d}",
                    node_id=node,
                    worker_id=worker,
                    owner_id=owner,
                    title=f"{title} {index}",
                ),
                metadata=bearer_metadata(token),
            )


def projection_lag(postgres: str) -> int:
    """Events context_budget has committed that conversations has not applied yet (read from both
    schemas of the benchmark database): the projection's backlog."""
    engine = create_engine(postgres)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    text(
                        "SELECT (SELECT last_sequence FROM context_budget.outbox_sequencer WHERE id = 1)"
                        " - COALESCE((SELECT last_sequence FROM conversations.event_cursors"
                        " WHERE stream_name = 'context_budget'), 0)"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def budget_head(postgres: str) -> int:
    """context_budget's committed outbox head (where the hop probe starts following it)."""
    engine = create_engine(postgres)
    try:
        with engine.connect() as connection:
            query = "SELECT last_sequence FROM context_budget.outbox_sequencer WHERE id = 1"
            return int(connection.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def save(results: dict[str, Any]) -> None:
    """Writes the results so far to bench/output/conversations.json."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "conversations.json").write_text(json.dumps(results, indent=2) + "\n")


async def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """Runs every phase; returns the results (also written after each phase). SIGTERM stops the
    run and its processes."""
    current = asyncio.current_task()
    assert current is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, current.cancel)
    background = await wait_for_quiet(arguments.quiet_wait)
    data_dir = OUTPUT / "conversations-run"
    data_dir.mkdir(parents=True, exist_ok=True)
    processes, ports = start_services(arguments.postgres, data_dir)
    base_url = f"http://127.0.0.1:{ports['GATEWAY']}"
    authority = TokenAuthority(SECRET)
    load: BackgroundLoad | None = None
    try:
        await wait_ready(base_url)
        for name in ("CONTEXT_BUDGET", "CONVERSATIONS"):
            await wait_grpc_ready(f"127.0.0.1:{ports[name]}")
        started = time.perf_counter()
        await seed(base_url, f"127.0.0.1:{ports['CONVERSATIONS']}", authority)
        await register_background(f"127.0.0.1:{ports['CONVERSATIONS']}", authority)
        handler_harness.analyze(arguments.postgres)
        results: dict[str, Any] = {
            "background_busy_cores_before_run": background,
            "python_speed_reference_ms": python_speed_reference(),
            "load_average_at_start": os.getloadavg()[0],
            "seed_seconds": round(time.perf_counter() - started, 1),
        }
        results["list"] = await bench_list(base_url, authority.issue_client("local"), arguments.list_requests)
        results["gateway_rss_idle_mb"] = round(rss_mb(processes["gateway"].pid), 1)
        gateway_pid = processes["gateway"].pid
        common = {"rounds": arguments.rounds, "interval": arguments.interval, "gateway_pid": gateway_pid}
        before = machine_cpu_seconds()
        results["grpc_idle_1"] = await bench_sse(base_url, ports, authority, 1, transport="grpc", **common)
        results["grpc_idle_1"]["machine_busy_cores"] = busy_cores_since(before)
        save(results)
        if "grpc_idle_1_hops" in arguments.phases:
            probe = HopProbe(ports, authority, budget_head(arguments.postgres))
            await probe.start()
            try:
                before = machine_cpu_seconds()
                results["grpc_idle_1_hops"] = await bench_sse(
                    base_url, ports, authority, 1, transport="grpc", probe=probe, **common
                )
                results["grpc_idle_1_hops"]["machine_busy_cores"] = busy_cores_since(before)
                save(results)
            finally:
                await probe.stop()
        load = BackgroundLoad(
            ports,
            authority,
            arguments.background_rate,
            arguments.background_batch,
            arguments.background_shape,
        )
        await asyncio.sleep(3)
        results["projection_lag_events_after_3s"] = projection_lag(arguments.postgres)
        pids = {name: process.pid for name, process in processes.items()}
        cores = ProcessCores({**pids, "load_generator": load.pid, "benchmark": os.getpid()})
        for name, clients, transport in (("grpc_bg_1", 1, "grpc"), ("grpc_bg_1000", 1000, "grpc")):
            if name not in arguments.phases:
                continue
            before = machine_cpu_seconds()
            cores.start()
            results[name] = await bench_sse(
                base_url, ports, authority, clients, transport=transport, **common
            )
            results[name]["machine_busy_cores"] = busy_cores_since(before)
            results[name]["process_cores"] = cores.read()
            results[name]["projection_lag_events_at_end"] = projection_lag(arguments.postgres)
            save(results)
        if "grpc_bg_1_hops" in arguments.phases:
            probe = HopProbe(ports, authority, budget_head(arguments.postgres))
            await probe.start()
            try:
                before = machine_cpu_seconds()
                cores.start()
                results["grpc_bg_1_hops"] = await bench_sse(
                    base_url, ports, authority, 1, transport="grpc", probe=probe, **common
                )
                results["grpc_bg_1_hops"]["machine_busy_cores"] = busy_cores_since(before)
                results["grpc_bg_1_hops"]["process_cores"] = cores.read()
                results["grpc_bg_1_hops"]["projection_lag_events_at_end"] = projection_lag(arguments.postgres)
                save(results)
            finally:
                await probe.stop()
        if "rest_bg_1" in arguments.phases:
            before = machine_cpu_seconds()
            cores.start()
            results["rest_bg_1"] = await bench_sse(base_url, ports, authority, 1, transport="rest", **common)
            results["rest_bg_1"]["machine_busy_cores"] = busy_cores_since(before)
            results["rest_bg_1"]["process_cores"] = cores.read()
            results["rest_bg_1"]["projection_lag_events_at_end"] = projection_lag(arguments.postgres)
            save(results)
        results["background_load"] = load.stop()
        load = None
        results["load_average_at_end"] = os.getloadavg()[0]
        return results
    finally:
        if load is not None:
            load.stop()
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints the results, writes bench/output/conversations.json; or, with
    `load` as first argument, runs the background load generator."""
    arguments_list = list(sys.argv[1:] if argv is None else argv)
    if arguments_list[:1] == ["load"]:
        loader = argparse.ArgumentParser(prog="python -m bench.conversations_bench load")
        loader.add_argument("--address", required=True)
        loader.add_argument("--token", required=True)
        loader.add_argument("--rate", type=float, required=True)
        loader.add_argument("--batch", type=int, required=True)
        loader.add_argument("--threads", type=int, required=True)
        loader.add_argument("--output", type=Path, required=True)
        loader.add_argument("--shape", choices=BACKGROUND_SHAPES, default="drift")
        options = loader.parse_args(arguments_list[1:])
        asyncio.run(
            generate_load(
                options.address,
                options.token,
                options.rate,
                options.batch,
                options.threads,
                options.output,
                options.shape,
            )
        )
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.conversations_bench", description=__doc__)
    parser.add_argument("--postgres", default=os.environ.get("BOSS_BENCH_POSTGRES_URL", DEFAULT_POSTGRES))
    parser.add_argument("--list-requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=200, help="reports per SSE phase (default 200)")
    parser.add_argument(
        "--interval", type=float, default=0.05, metavar="SECONDS", help="pause between reports (default 0.05)"
    )
    parser.add_argument(
        "--background-rate", type=float, default=1000.0, help="background snapshots/s (default 1000)"
    )
    parser.add_argument(
        "--background-batch", type=int, default=10, help="background snapshots per message (default 10)"
    )
    parser.add_argument(
        "--phases",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(BACKGROUND_PHASES),
        help=(
            f"background phases to run, comma-separated (default all: {','.join(BACKGROUND_PHASES)}); "
            f"also {','.join(OPTIONAL_PHASES)} (the hop probe without background; off by default)"
        ),
    )
    parser.add_argument(
        "--background-shape",
        choices=BACKGROUND_SHAPES,
        default="drift",
        help="how background percents move: drift (default, like a working thread) or churn (worst case)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait up to this long for an idle machine before starting (default 30)",
    )
    arguments = parser.parse_args(arguments_list)
    results = asyncio.run(run(arguments))
    save(results)
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
