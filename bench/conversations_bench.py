"""Conversations benchmark (ARCHITECTURE.md "Performance budgets"; issue 4 "Performance").

What it does, in one run (about a minute on a 2-core machine):

1. Uses its own PostgreSQL database (`bench_conversations`, created when missing) and drops the
   schemas `context_budget` and `conversations` (CASCADE) there, so every run starts empty; then
   starts `python -m services.context_budget serve`, `python -m services.conversations serve` and
   `python -m services.bff_gateway serve` as separate processes on free 127.0.0.1 ports.
2. Seeds 1,000 single_device projects: registers 1,000 threads with conversations (RegisterThread,
   worker token) and reports one budget for each through the gateway's REST ingest, then waits until
   every home-list ring is visible.
3. `list`: `GET /api/v1/conversations` (default page of 50, and page_size=200) sequentially over
   one keep-alive connection; latency p50/p99. Target p99 <= 20 ms.
4. `sse_N` for N in (1, 100, 1000) SSE clients on the one gateway process: each round reports one
   snapshot through `POST /api/v1/workers/{worker_id}/thread-context` (worker -> gateway ->
   context_budget -> conversations -> gateway SSE hub -> client) and measures, per client, the time
   from just before the POST to the arrival of the matching `conversation.context_indicator.updated`
   event. Rounds are spaced 100 ms apart. The gateway's VmRSS is read with all N clients connected.
   Target (at 1,000 snapshots/s background, not reproduced here): p50 <= 20 ms, p99 <= 100 ms.

Results: a table on stdout and bench/output/conversations.json. Run:

    PYTHONPATH=.:gen .venv/bin/python -m bench.conversations_bench [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from sqlalchemy import create_engine, text

from bench.ingest_bench import machine_cpu_seconds, wait_for_quiet
from services.shared.auth import TokenAuthority, bearer_metadata

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "bench" / "output"
DEFAULT_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_conversations"
SECRET = "bench-conversations-secret-0123456789abcdef"
PROJECTS = 1_000
WORKER, NODE = "worker-bench", "node-bench"


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


async def seed(base_url: str, conversations_address: str, authority: TokenAuthority) -> None:
    """1,000 registered threads, each with one reported budget, all rings visible."""
    worker = authority.issue_worker(WORKER, NODE)
    async with grpc.aio.insecure_channel(conversations_address) as channel:
        stub = pb_grpc.ConversationsServiceStub(channel)
        for index in range(PROJECTS):
            await stub.RegisterThread(
                pb.RegisterThreadRequest(
                    thread_id=f"bench-{index:04d}",
                    node_id=NODE,
                    worker_id=WORKER,
                    title=f"Bench project {index}",
                ),
                metadata=bearer_metadata(worker),
            )
    headers = {"Authorization": f"Bearer {worker}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        queue = list(range(PROJECTS))

        async def post_some() -> None:
            while queue:
                index = queue.pop()
                response = await http.post(
                    f"/api/v1/workers/{WORKER}/thread-context",
                    json=snapshot(f"bench-{index:04d}", 20 + index % 80),
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
            text_line = line.decode().rstrip("\r\n")
            if text_line.startswith("event: "):
                event = text_line[7:]
            elif text_line.startswith("data: ") and event == "stream.opened":
                self.ready.set()
            elif text_line.startswith("data: ") and event == "conversation.context_indicator.updated":
                data = json.loads(text_line[6:])
                key = f"{data['thread_id']}:{data['context_budget_indicator']['percent']}"
                self.arrivals.setdefault(key, time.perf_counter())

    async def close(self) -> None:
        """Disconnects."""
        if self._task is not None:
            self._task.cancel()
        if self._writer is not None:
            self._writer.close()


class HopProbe:
    """Follows context_budget's and conversations' WatchEvents with a service token and records when
    the first event of each thread arrives on each, so a report's latency splits into hops."""

    def __init__(self, ports: dict[str, int], authority: TokenAuthority) -> None:
        self.metadata = bearer_metadata(authority.issue_service("bench"))
        self.ports = ports
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
                after_sequence=0, types=["thread.context.updated"]
            )
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                self.arrivals["context_budget"].setdefault(response.event.thread_id, time.perf_counter())

    async def _follow_conversations(self) -> None:
        address = f"127.0.0.1:{self.ports['CONVERSATIONS']}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.ConversationsServiceStub(channel)
            listed = await stub.ListEvents(pb.ListEventsRequest(page_size=1), metadata=self.metadata)
            head = listed.head_sequence
            request = pb.WatchEventsRequest(after_sequence=head)
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                if response.event.type == "conversation.context_indicator.updated":
                    thread_id = json.loads(response.event.payload_json).get("thread_id", "")
                    self.arrivals["conversations"].setdefault(thread_id, time.perf_counter())

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


async def bench_sse(
    base_url: str,
    port: int,
    authority: TokenAuthority,
    clients: int,
    rounds: int,
    gateway_pid: int,
    probe: HopProbe | None = None,
) -> dict[str, Any]:
    """Delivery latency of a worker report to `clients` SSE clients (ms), and the gateway's RSS. With
    a `probe`, also the cumulative time from the POST to each hop: the REST ack (committed in
    context_budget), the event on context_budget's WatchEvents, the event on conversations'
    WatchEvents, and the first SSE client."""
    token = authority.issue_client("local")
    sse = [RawSseClient(port, token) for _ in range(clients)]
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.start() for c in sse[start : start + 100]))
    await asyncio.wait_for(asyncio.gather(*(c.ready.wait() for c in sse)), 60)
    rss = rss_mb(gateway_pid)
    worker = {"Authorization": f"Bearer {authority.issue_worker(WORKER, NODE)}"}
    latencies: list[float] = []
    hops: dict[str, list[float]] = {"rest_ack": [], "context_budget_stream": [], "conversations_stream": []}
    missing = 0
    async with httpx.AsyncClient(base_url=base_url, headers=worker, timeout=10) as http:
        for round_index in range(rounds):
            thread_id = f"bench-{round_index % PROJECTS:04d}"
            percent = 1 + (round_index * 7 + clients) % 98
            key = f"{thread_id}:{percent}"
            if probe is not None:
                probe.forget(thread_id)
            sent = time.perf_counter()
            (
                await http.post(
                    f"/api/v1/workers/{WORKER}/thread-context", json=snapshot(thread_id, percent + 0.5)
                )
            ).raise_for_status()
            hops["rest_ack"].append((time.perf_counter() - sent) * 1000)
            deadline = time.perf_counter() + 5
            while time.perf_counter() < deadline and not all(key in c.arrivals for c in sse):
                await asyncio.sleep(0.002)
            for client in sse:
                if key in client.arrivals:
                    latencies.append((client.arrivals[key] - sent) * 1000)
                else:
                    missing += 1
            if probe is not None:
                for stream in ("context_budget", "conversations"):
                    arrived = probe.arrivals[stream].get(thread_id)
                    if arrived is not None:
                        hops[f"{stream}_stream"].append((arrived - sent) * 1000)
            await asyncio.sleep(0.1)
    await asyncio.gather(*(c.close() for c in sse))
    return {
        "clients": clients,
        "rounds": rounds,
        "deliveries": len(latencies),
        "missing": missing,
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "gateway_rss_mb": round(rss, 1),
        **({"cumulative_hops": hop_summary(hops)} if probe is not None else {}),
    }


def busy_cores_since(before: tuple[float, float]) -> float:
    """Cores the whole machine (this benchmark, its services, PostgreSQL and anything else) kept busy
    since `before` (a machine_cpu_seconds() reading)."""
    after = machine_cpu_seconds()
    return round((after[0] - before[0]) / max(after[1] - before[1], 1e-9) * (os.cpu_count() or 1), 2)


async def run(postgres: str, list_requests: int, rounds: int, quiet_wait: float) -> dict[str, Any]:
    """Runs every phase; returns the results."""
    background = await wait_for_quiet(quiet_wait)
    data_dir = OUTPUT / "conversations-run"
    data_dir.mkdir(parents=True, exist_ok=True)
    processes, ports = start_services(postgres, data_dir)
    base_url = f"http://127.0.0.1:{ports['GATEWAY']}"
    authority = TokenAuthority(SECRET)
    try:
        await wait_ready(base_url)
        for name in ("CONTEXT_BUDGET", "CONVERSATIONS"):
            await wait_grpc_ready(f"127.0.0.1:{ports[name]}")
        started = time.perf_counter()
        await seed(base_url, f"127.0.0.1:{ports['CONVERSATIONS']}", authority)
        results: dict[str, Any] = {
            "background_busy_cores_before_run": background,
            "seed_seconds": round(time.perf_counter() - started, 1),
        }
        results["list"] = await bench_list(base_url, authority.issue_client("local"), list_requests)
        results["gateway_rss_idle_mb"] = round(rss_mb(processes["gateway"].pid), 1)
        probe = HopProbe(ports, authority)
        await probe.start()
        try:
            for clients in (1, 100, 1000):
                before = machine_cpu_seconds()
                results[f"sse_{clients}"] = await bench_sse(
                    base_url,
                    ports["GATEWAY"],
                    authority,
                    clients,
                    rounds,
                    processes["gateway"].pid,
                    probe if clients == 1 else None,
                )
                results[f"sse_{clients}"]["machine_busy_cores"] = busy_cores_since(before)
        finally:
            await probe.stop()
        return results
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark, prints the table, writes bench/output/conversations.json."""
    parser = argparse.ArgumentParser(prog="python -m bench.conversations_bench", description=__doc__)
    parser.add_argument("--postgres", default=os.environ.get("BOSS_BENCH_POSTGRES_URL", DEFAULT_POSTGRES))
    parser.add_argument("--list-requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait up to this long for an idle machine before starting (default 30)",
    )
    arguments = parser.parse_args(argv)
    results = asyncio.run(
        run(arguments.postgres, arguments.list_requests, arguments.rounds, arguments.quiet_wait)
    )
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "conversations.json").write_text(json.dumps(results, indent=2) + "\n")
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
