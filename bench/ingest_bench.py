"""Ingest benchmark of the context budget (ARCHITECTURE.md "Performance budgets", SPEC CB-10).

What it does, in one run (bounded in count and in time; about two minutes on a 2-core machine):

1. Drops the PostgreSQL schema `context_budget` (CASCADE), so every run starts from an empty database,
   then starts `python -m services.context_budget serve` and `python -m services.bff_gateway serve`
   as separate processes on free 127.0.0.1 ports (migrations applied at start).
2. Warm-up: one snapshot for each of the N (10,000) benchmark threads, so the phases below measure
   steady-state updates of existing threads, not first inserts.
3. Phases (each stops at its time limit or its snapshot count, whichever comes first):

   - `stream_batched`: 8 streams x 250 snapshots per message, up to 4 messages in flight per
     stream. Target >= 10,000 snapshots/s acked.
   - `stream_single`: 8 streams x 1 snapshot per message, up to 4 in flight per stream. Target
     >= 2,500 snapshots/s.
   - `stream_paced`: open loop at 2,000 snapshots/s over 8 streams; each stream sends what is due
     every 5 ms. Target: ack p99 <= 50 ms.
   - `rest`: gateway `POST /api/v1/workers/{worker_id}/thread-context`, 8 keep-alive httpx clients
     x 2 requests in flight. Target: stream_batched / rest >= 5.
   - `rss_50k`: one snapshot each for 50,000 threads (batched stream), then VmRSS of
     context_budget. Target <= 200 MB.

4. Verifies durability: rows in `context_budget.thread_context_snapshots` equal the snapshots acked
   as accepted and not duplicate, and `thread_contexts` holds one row per thread reported.
5. Prints a table and writes bench/output/ingest.json.

Latency is measured per snapshot: in the paced phase from the instant the snapshot was *due* (open
loop, so a slow server cannot hide its queueing: no coordinated omission) and from the instant its
message was written, to the instant its ack was read. CPU is sampled from /proc for the service, the
gateway, this load generator and every PostgreSQL process, so the report shows who used the 2 cores.

The load generator encodes snapshots itself (constant fields of each thread serialized once, the
changing fields per report, concatenated: protobuf allows it) and writes raw bytes on the stream, so
it spends as little of the shared CPU as a real client could.

`--profile` launches context_budget and the gateway under `python -m cProfile`, runs shorter phases
and writes the top functions to bench/output/profile/*.txt (numbers of that run are slower by the
profiler's overhead and are not the benchmark's).

Run: `make bench` or `PYTHONPATH=.:gen .venv/bin/python -m bench.ingest_bench [--quick] [--profile]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import pstats
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
from boss.context_budget.v1 import context_budget_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.shared.auth import TokenAuthority

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_DIR = ROOT / "bench" / "output"
DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SCHEMA = "context_budget"
STREAM_METHOD = "/boss.context_budget.v1.ContextBudgetService/StreamThreadContext"
SERVICE_NAME = "boss.context_budget.v1.ContextBudgetService"
TOTAL_DEADLINE_SECONDS = 290.0
QUIET_CORES = 0.15

TARGET_BATCHED_PER_SECOND = 10_000.0
TARGET_SINGLE_PER_SECOND = 2_500.0
TARGET_P99_MS = 50.0
TARGET_STREAM_OVER_REST = 5.0
TARGET_RSS_MB = 200.0

Snapshot = context_budget_pb2.ThreadContextSnapshot
StreamResponse = context_budget_pb2.StreamThreadContextResponse
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class BenchConfig:
    """Sizes and limits of one run. Durations in seconds, rates in snapshots per second."""

    database_url: str = DEFAULT_DATABASE_URL
    workers: int = 8
    threads: int = 10_000
    rss_threads: int = 50_000
    batch_size: int = 250
    in_flight_per_stream: int = 4
    batched_seconds: float = 10.0
    batched_max_snapshots: int = 300_000
    single_seconds: float = 8.0
    single_max_snapshots: int = 60_000
    paced_rate: float = 2_000.0
    paced_seconds: float = 10.0
    paced_tick_seconds: float = 0.005
    rest_clients: int = 8
    rest_in_flight_per_client: int = 2
    rest_seconds: float = 8.0
    rest_max_snapshots: int = 40_000
    quiet_wait_seconds: float = 30.0
    profile: bool = False

    @classmethod
    def quick(cls, database_url: str) -> BenchConfig:
        """A small run (seconds) to check the harness end to end."""
        return cls(
            database_url=database_url,
            threads=800,
            rss_threads=2_000,
            batched_seconds=2.0,
            single_seconds=2.0,
            paced_rate=500.0,
            paced_seconds=2.0,
            rest_seconds=2.0,
        )


# --------------------------------------------------------------------------------------------
# Machine, versions, CPU and memory from /proc


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, memory and OS of this machine."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
    }


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of a process and of all its live descendants (a service that forks workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += process_cpu_seconds(pid)
        stack.extend(children.get(pid, ()))
    return total


def postgres_cpu_seconds() -> float:
    """CPU seconds of every process named postgres (server, backends, WAL writer, checkpointer).
    A backend that exits between two samples takes its CPU with it (the service pools connections,
    so its backends live through the run)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
        except OSError:
            continue
        total += process_cpu_seconds(int(entry.name))
    return total


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    values = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(values[:8])
    idle = values[3] + values[4]
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of a process in MB (10^6 bytes), from /proc/<pid>/status."""
    result: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmRSS", "VmHWM"}:
            result[key] = round(int(value.split()[0]) * 1024 / 1e6, 1)
    return result


PARTIES = ("server", "gateway", "loadgen", "postgres")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds consumed so far by each party, at wall time `at` (perf_counter seconds)."""

    at: float
    server: float
    gateway: float
    loadgen: float
    postgres: float
    machine_busy: float
    machine_total: float
    database: tuple[int, int, int, int] = (0, 0, 0, 0)


class CpuMeter:
    """Samples the CPU of the service, the gateway, this process and PostgreSQL."""

    def __init__(self, server_pid: int, gateway_pid: int | None, database_url: str | None = None) -> None:
        self.server_pid = server_pid
        self.gateway_pid = gateway_pid
        self._database = (
            psycopg.connect(libpq_url(database_url), autocommit=True) if database_url is not None else None
        )

    def close(self) -> None:
        """Closes the statistics connection."""
        if self._database is not None:
            self._database.close()

    def database_counters(self) -> tuple[int, int, int, int]:
        """(commits, rows inserted, rows updated) of the database from pg_stat_database, and the WAL
        position in bytes. The statistics reach pg_stat_database up to about a second late, so per
        phase they are approximate; the WAL position is exact."""
        if self._database is None:
            return (0, 0, 0, 0)
        row = self._database.execute(
            "SELECT xact_commit, tup_inserted, tup_updated, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint "
            "FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return (int(row[0]), int(row[1]), int(row[2]), int(row[3])) if row else (0, 0, 0, 0)

    def sample(self) -> CpuSample:
        busy, total = machine_cpu_seconds()
        database = self.database_counters()
        return CpuSample(
            database=database,
            at=time.perf_counter(),
            server=tree_cpu_seconds(self.server_pid),
            gateway=tree_cpu_seconds(self.gateway_pid) if self.gateway_pid else 0.0,
            loadgen=process_cpu_seconds(os.getpid()),
            postgres=postgres_cpu_seconds(),
            machine_busy=busy,
            machine_total=total,
        )

    @staticmethod
    def usage(before: CpuSample, after: CpuSample, snapshots: int, messages: int) -> dict[str, float]:
        """Cores used by each party over the interval (1.0 = one core busy), the machine's busy
        percentage, and CPU microseconds per acked snapshot and per stream message or request."""
        wall = max(after.at - before.at, 1e-9)
        result: dict[str, float] = {}
        for party in PARTIES:
            spent = getattr(after, party) - getattr(before, party)
            result[f"{party}_cores"] = round(spent / wall, 2)
            if snapshots:
                result[f"{party}_us_per_snapshot"] = round(spent / snapshots * 1e6, 1)
            if messages:
                result[f"{party}_us_per_message"] = round(spent / messages * 1e6, 1)
        total = after.machine_total - before.machine_total
        busy = after.machine_busy - before.machine_busy
        result["machine_busy_pct"] = round(100.0 * busy / total, 1) if total else 0.0
        ours = sum(getattr(after, party) - getattr(before, party) for party in PARTIES)
        # Busy CPU not spent by the parties above: other programs on the machine (and the kernel's
        # softirq work for loopback traffic, which /proc accounts to no process).
        result["other_cores"] = round(max(0.0, busy - ours) / wall, 2)
        commits, inserted, updated, wal = (
            a - b for a, b in zip(after.database, before.database, strict=True)
        )
        if snapshots and after.database != (0, 0, 0, 0):
            result["db_commits_approx"] = commits
            result["db_snapshots_per_commit_approx"] = round(snapshots / commits, 1) if commits else 0.0
            result["db_rows_inserted_per_snapshot_approx"] = round(inserted / snapshots, 2)
            result["db_rows_updated_per_snapshot_approx"] = round(updated / snapshots, 2)
            result["db_wal_bytes_per_snapshot"] = round(wal / snapshots)
        return result


async def busy_cores(seconds: float) -> float:
    """Cores the whole machine kept busy over the next `seconds`."""
    before = machine_cpu_seconds()
    await asyncio.sleep(seconds)
    after = machine_cpu_seconds()
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9) * (os.cpu_count() or 1)


def other_context_budget_processes() -> list[int]:
    """Pids of context_budget services already running (another benchmark or a test run): they
    may use, or drop, the same PostgreSQL schema during this run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if b"services.context_budget" in command and b"serve" in command:
                found.append(int(entry.name))
    return found


def python_speed_reference() -> float:
    """Milliseconds one core of this machine takes for a fixed pure-Python workload (a loop of
    integer additions and JSON round trips of a snapshot-sized dict; the best of three). Recorded
    with every benchmark so that runs on machines of different speed can be compared: the services'
    costs scale with it, and it varied by more than 2x between machines of the same kind."""
    document = {"thread_id": "thread-00001", "context_budget_remaining_pct": 41.5, "level": "watch"}
    document |= {f"field_{index}": index * 1.5 for index in range(20)}
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for value in range(1_000_000):
            total += value
        for _ in range(10_000):
            json.loads(json.dumps(document))
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


async def wait_for_quiet(max_wait: float, threshold: float = QUIET_CORES) -> float:
    """Waits (at most `max_wait` seconds) for a second in which other programs keep fewer than
    `threshold` cores busy and no other context_budget service runs, so nothing shares the 2 cores
    or the schema with the benchmark. Returns the busy cores of the last second measured (recorded
    in the report either way)."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = await busy_cores(1.0)
        quiet = busy < threshold and not other_context_budget_processes()
        if quiet or time.monotonic() >= deadline:
            return round(busy, 2)


# --------------------------------------------------------------------------------------------
# Snapshots


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _level_for(pct: float) -> int:
    """CB-7 default level (what a worker reports as its own level)."""
    if pct >= 60.0:
        return context_budget_pb2.CONTEXT_BUDGET_LEVEL_SAFE
    if pct >= 40.0:
        return context_budget_pb2.CONTEXT_BUDGET_LEVEL_WATCH
    if pct >= 25.0:
        return context_budget_pb2.CONTEXT_BUDGET_LEVEL_URGENT
    return context_budget_pb2.CONTEXT_BUDGET_LEVEL_CRITICAL


LEVEL_NAMES = {1: "safe", 2: "watch", 3: "urgent", 4: "critical"}
MODEL_CONTEXT_WINDOW = 258_400  # 95 % of a 272,000-token window (SPEC D-1: W)
AUTO_COMPACT_LIMIT = 244_800  # L
BATCH_FIELD_TAG = bytes([(2 << 3) | 2])  # StreamThreadContextRequest.snapshots, length-delimited
BATCH_ID_TAG = bytes([(1 << 3) | 0])  # StreamThreadContextRequest.batch_id, varint


def _rfc3339(epoch_seconds: float) -> str:
    whole = int(epoch_seconds)
    micros = int((epoch_seconds - whole) * 1e6)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{micros:06d}Z"


class SnapshotFactory:
    """Realistic readings of many threads, each thread owned by one worker (thread i by worker
    i % workers), with per-thread increasing `snapshot_version` and a budget that slowly falls.

    Contents follow what worker/snapshots.py sends: a stable snapshot_id, project and task, source
    WORKER_ESTIMATOR, the worker's own level, D-1 raw token figures, D-2 estimates, CB-8 flag and
    reason for one thread in five, last compaction for one in three, and the Codex folder.
    """

    def __init__(self, workers: int, threads: int, seed: int = 7) -> None:
        self.workers = workers
        rng = random.Random(seed)
        run = uuid.uuid4().hex[:8]
        self.thread_ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(threads)]
        self.worker_prefix = f"worker-bench-{run}-"
        self.worker_ids = [f"{self.worker_prefix}{w:02d}" for w in range(workers)]
        self.node_ids = [f"node-bench-{w:02d}" for w in range(workers)]
        self.start_pct = [rng.uniform(8.0, 100.0) for _ in range(threads)]
        self.drop_pct = [rng.uniform(0.02, 0.25) for _ in range(threads)]
        self.versions = [0] * threads
        self._base: list[bytes | None] = [None] * threads
        self._scratch = Snapshot()
        self.now = time.time()

    def worker_of(self, index: int) -> int:
        """The worker (0-based) that owns thread `index`."""
        return index % self.workers

    def threads_of(self, worker: int, limit: int) -> list[int]:
        """Indices of the threads of `worker` among the first `limit` threads."""
        return list(range(worker, limit, self.workers))

    def _pct(self, index: int, version: int) -> float:
        return max(1.0, self.start_pct[index] - self.drop_pct[index] * version)

    def _constant_fields(self, index: int) -> bytes:
        worker = self.worker_of(index)
        must_finish = index % 5 == 0
        snapshot = Snapshot(
            project_id=f"proj-{index % 200:03d}",
            task_id=f"task-{index % 997:04d}",
            thread_id=self.thread_ids[index],
            node_id=self.node_ids[worker],
            worker_id=self.worker_ids[worker],
            source_kind=context_budget_pb2.SOURCE_KIND_WORKER_ESTIMATOR,
            must_finish_before_compaction=must_finish,
            compaction_count=index % 4,
            model_context_window=MODEL_CONTEXT_WINDOW,
            auto_compact_token_limit=AUTO_COMPACT_LIMIT,
            must_finish_reason=(
                "uncommitted changes in 3 files: services/api/handlers.py, services/api/models.py, "
                "tests/test_handlers.py"
                if must_finish
                else ""
            ),
            codex_folder=f"/home/dev/src/project-{index % 200:03d}",
        )
        if index % 3 == 0:
            snapshot.last_compaction_at.FromSeconds(int(self.now) - 3_600 - index % 600)
        return snapshot.SerializeToString()

    def encode(self, index: int, captured_at: float) -> bytes:
        """The serialized `ThreadContextSnapshot` of the next reading of thread `index`."""
        base = self._base[index]
        if base is None:
            base = self._base[index] = self._constant_fields(index)
        version = self.versions[index] = self.versions[index] + 1
        pct = self._pct(index, version)
        tokens = int(AUTO_COMPACT_LIMIT * (1.0 - pct / 100.0))
        scratch = self._scratch
        scratch.Clear()
        scratch.snapshot_id = f"{self.thread_ids[index]}-{version:08d}"
        scratch.context_budget_remaining_pct = pct
        scratch.context_budget_level = _level_for(pct)  # type: ignore[assignment]
        seconds = int(captured_at)
        scratch.captured_at.seconds = seconds
        scratch.captured_at.nanos = int((captured_at - seconds) * 1e9)
        scratch.compaction_expected_at.seconds = seconds + int(pct * 90)
        scratch.estimated_remaining_turns = int(pct / 3)
        scratch.estimated_remaining_large_messages = int(pct / 10)
        scratch.snapshot_version = version
        scratch.last_total_tokens = tokens
        scratch.codex_context_left_pct = int(pct)
        return base + scratch.SerializeToString()

    def json_body(self, index: int, captured_at: float) -> dict[str, Any]:
        """The REST body (seed §5.2 fields plus the D-1 raw figures) of the next reading of `index`."""
        worker = self.worker_of(index)
        version = self.versions[index] = self.versions[index] + 1
        pct = self._pct(index, version)
        must_finish = index % 5 == 0
        body: dict[str, Any] = {
            "snapshot_id": f"{self.thread_ids[index]}-{version:08d}",
            "node_id": self.node_ids[worker],
            "worker_id": self.worker_ids[worker],
            "thread_id": self.thread_ids[index],
            "project_id": f"proj-{index % 200:03d}",
            "task_id": f"task-{index % 997:04d}",
            "source_kind": "worker_estimator",
            "context_budget_remaining_pct": round(pct, 3),
            "context_budget_level": LEVEL_NAMES[_level_for(pct)],
            "compaction_expected_at": _rfc3339(captured_at + int(pct * 90)),
            "must_finish_before_compaction": must_finish,
            "estimated_remaining_turns": int(pct / 3),
            "estimated_remaining_large_messages": int(pct / 10),
            "compaction_count": index % 4,
            "snapshot_version": version,
            "captured_at": _rfc3339(captured_at),
            "last_total_tokens": int(AUTO_COMPACT_LIMIT * (1.0 - pct / 100.0)),
            "model_context_window": MODEL_CONTEXT_WINDOW,
            "auto_compact_token_limit": AUTO_COMPACT_LIMIT,
            "codex_context_left_pct": int(pct),
            "codex_folder": f"/home/dev/src/project-{index % 200:03d}",
        }
        if must_finish:
            body["must_finish_reason"] = (
                "uncommitted changes in 3 files: services/api/handlers.py, services/api/models.py, "
                "tests/test_handlers.py"
            )
        if index % 3 == 0:
            body["last_compaction_at"] = _rfc3339(int(self.now) - 3_600 - index % 600)
        return body


def encode_batch(batch_id: int, snapshots: list[bytes]) -> bytes:
    """A serialized `StreamThreadContextRequest` from serialized snapshots."""
    parts = [BATCH_ID_TAG, _varint(batch_id)]
    for snapshot in snapshots:
        parts.append(BATCH_FIELD_TAG)
        parts.append(_varint(len(snapshot)))
        parts.append(snapshot)
    return b"".join(parts)


# --------------------------------------------------------------------------------------------
# Results


def percentiles_ms(samples: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean of latencies given in seconds, in milliseconds."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] * 1e3, 2)

    return {
        "p50_ms": at(0.50),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1e3, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 2),
        "count": len(ordered),
    }


@dataclass
class PhaseResult:
    """What one phase did and measured."""

    name: str
    description: str
    sent: int = 0
    accepted: int = 0
    stored: int = 0
    duplicates: int = 0
    superseded: int = 0
    rejected: int = 0
    messages: int = 0
    seconds: float = 0.0
    per_second: float = 0.0
    latency: dict[str, float] = field(default_factory=dict)
    latency_from_write: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def count_ack(self, accepted: bool, duplicate: bool, superseded: bool, error: str | None) -> None:
        """Adds one ack to the tallies."""
        if accepted:
            self.accepted += 1
            if duplicate:
                self.duplicates += 1
            else:
                self.stored += 1
            if superseded:
                self.superseded += 1
        else:
            self.rejected += 1
            if error and len(self.errors) < 5:
                self.errors.append(error)

    def note_error(self, error: str) -> None:
        """Records a transport or stream error (the first ten)."""
        if len(self.errors) < 10:
            self.errors.append(error)


class Budget:
    """A shared count of snapshots a phase may still send."""

    def __init__(self, count: int) -> None:
        self.left = count

    def take(self, wanted: int) -> int:
        """Up to `wanted` snapshots, 0 when exhausted."""
        granted = min(wanted, self.left)
        self.left -= granted
        return granted


# --------------------------------------------------------------------------------------------
# Service processes


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ServiceProcess:
    """One service started as a child process."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    profile_path: Path | None

    @property
    def pid(self) -> int:
        """Process id (under --profile, the profiler's process runs the service itself)."""
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the service's log."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def check_alive(self) -> None:
        """Raises RuntimeError with the log tail when the process has exited."""
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode}; log tail:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 20.0) -> None:
        """SIGINT (graceful shutdown in both services; uvicorn re-raises the signal afterwards, and
        only SIGINT, as KeyboardInterrupt, lets the profiler write its file), then SIGKILL after
        `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_service(
    name: str, module: str, env: dict[str, str], logs: Path, profile_dir: Path | None
) -> ServiceProcess:
    """Starts `python [-m cProfile -o ...] -m <module> serve` with `env`, logging to logs/<name>.log."""
    log_path = logs / f"{name}.log"
    command = [sys.executable]
    profile_path = None
    if profile_dir is not None:
        profile_path = profile_dir / f"{name}.prof"
        command += ["-m", "cProfile", "-o", str(profile_path)]
    command += ["-m", module, "serve"]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    return ServiceProcess(name, process, log_path, profile_path)


async def wait_grpc_serving(service: ServiceProcess, address: str, timeout: float = 90.0) -> None:
    """Waits until the gRPC health check of the context budget service answers SERVING."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            service.check_alive()
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{service.name} not serving after {timeout:.0f} s; log tail:\n{service.log_tail()}")


async def wait_http_ready(service: ServiceProcess, base_url: str, timeout: float = 60.0) -> None:
    """Waits until the gateway answers 200 on /readyz (falling back to /healthz)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while time.monotonic() < deadline:
            service.check_alive()
            for path in ("/readyz", "/healthz"):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(path)).status_code == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{service.name} not ready after {timeout:.0f} s; log tail:\n{service.log_tail()}")


# --------------------------------------------------------------------------------------------
# PostgreSQL


def libpq_url(url: str) -> str:
    """The libpq form of a SQLAlchemy URL (`postgresql+psycopg://` -> `postgresql://`)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}://{rest}"


def reset_schema(url: str) -> None:
    """DROP SCHEMA context_budget CASCADE: the run starts with no tables and no rows."""
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def postgres_info(url: str) -> dict[str, str]:
    """Server version and the settings that decide what 'durable' means."""
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        version = connection.execute("SHOW server_version").fetchone()
        settings: dict[str, str] = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["fsync", "synchronous_commit", "shared_buffers", "wal_level", "full_page_writes"],),
            ).fetchall()
        )
    return {"server_version": str(version[0]) if version else "unknown", **settings}


def rows_of_run(url: str, worker_prefix: str) -> dict[str, int]:
    """Rows written by this run's workers (worker_id starts with `worker_prefix`) and rows of anyone
    else: another program writing into the same schema during the run would spoil the numbers."""
    pattern = worker_prefix.replace("_", r"\_") + "%"
    counts: dict[str, int] = {}
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        for table in ("thread_context_snapshots", "thread_contexts"):
            row = connection.execute(
                "SELECT count(*) FILTER (WHERE worker_id LIKE %s), "
                f'count(*) FILTER (WHERE worker_id NOT LIKE %s) FROM "{SCHEMA}"."{table}"',
                (pattern, pattern),
            ).fetchone()
            counts[table] = int(row[0]) if row else 0
            counts[f"{table}_foreign"] = int(row[1]) if row else 0
    return counts


def table_counts(url: str) -> dict[str, int]:
    """Row counts of the service's tables (absent tables are left out)."""
    counts: dict[str, int] = {}
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (SCHEMA,)
            ).fetchall()
        ]
        for name in sorted(names):
            row = connection.execute(f'SELECT count(*) FROM "{SCHEMA}"."{name}"').fetchone()
            counts[name] = int(row[0]) if row else 0
    return counts


# --------------------------------------------------------------------------------------------
# Load generation over the gRPC stream


class ThreadCursor:
    """Hands out the threads of each worker: cycling forever, or one pass over them."""

    def __init__(self, factory: SnapshotFactory, limit: int, cycle: bool) -> None:
        self._queues = [factory.threads_of(worker, limit) for worker in range(factory.workers)]
        self._positions = [0] * factory.workers
        self._cycle = cycle

    def take(self, worker: int, count: int) -> list[int]:
        """Up to `count` thread indices of `worker` (fewer at the end of a single pass)."""
        queue = self._queues[worker]
        position = self._positions[worker]
        if not queue:
            return []
        if not self._cycle:
            chosen = queue[position : position + count]
            self._positions[worker] = position + len(chosen)
            return chosen
        chosen = [queue[(position + offset) % len(queue)] for offset in range(count)]
        self._positions[worker] = (position + count) % len(queue)
        return chosen


@dataclass
class StreamContext:
    """What every stream driver shares: the service address, tokens and the snapshot factory."""

    address: str
    tokens: list[str]
    factory: SnapshotFactory

    def open_channel(self) -> grpc.aio.Channel:
        """A channel with its own connection (a worker per channel, as in production)."""
        return grpc.aio.insecure_channel(
            self.address,
            options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ],
        )

    def metadata(self, worker: int) -> tuple[tuple[str, str], ...]:
        """The bearer metadata of `worker`'s token."""
        return (("authorization", f"Bearer {self.tokens[worker]}"),)


def _tally_response(raw: bytes, result: PhaseResult) -> StreamResponse:
    response = StreamResponse.FromString(raw)
    for ack in response.acks:
        error = None
        if ack.HasField("error"):
            error = f"{ack.error.code}: {ack.error.message}"
        result.count_ack(ack.accepted, ack.duplicate, ack.superseded, error)
    return response


async def drive_closed_loop(
    context: StreamContext,
    worker: int,
    cursor: ThreadCursor,
    batch_size: int,
    in_flight: int,
    stop_at: float,
    budget: Budget,
    result: PhaseResult,
    batch_latencies: list[float],
) -> None:
    """One worker's stream: writes batches of `batch_size` while fewer than `in_flight` are
    unacked, until `stop_at` (perf_counter), the budget or its threads run out; then half-closes and
    reads the remaining acks."""
    factory = context.factory
    window = asyncio.Semaphore(in_flight)
    pending: dict[int, tuple[float, int]] = {}
    failed = asyncio.Event()
    async with context.open_channel() as channel:
        call = channel.stream_stream(STREAM_METHOD)(metadata=context.metadata(worker))

        async def read_acks() -> None:
            try:
                while True:
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        return
                    received = time.perf_counter()
                    response = _tally_response(raw, result)
                    sent_at, count = pending.pop(response.batch_id)
                    if len(response.acks) != count:
                        result.note_error(f"batch {response.batch_id}: {len(response.acks)} acks for {count}")
                    batch_latencies.append(received - sent_at)
                    window.release()
            except grpc.aio.AioRpcError as error:
                result.note_error(f"stream of worker {worker}: {error.code().name}: {error.details()}")
                failed.set()
                for _ in range(in_flight):
                    window.release()

        reader = asyncio.create_task(read_acks())
        batch_id = 0
        while not failed.is_set():
            await window.acquire()
            if failed.is_set() or time.perf_counter() >= stop_at:
                break
            wanted = budget.take(batch_size)
            indices = cursor.take(worker, wanted)
            budget.left += wanted - len(indices)
            if not indices:
                break
            now = time.time()
            payload = encode_batch(batch_id, [factory.encode(index, now) for index in indices])
            pending[batch_id] = (time.perf_counter(), len(indices))
            result.sent += len(indices)
            result.messages += 1
            batch_id += 1
            try:
                await call.write(payload)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
                result.note_error(f"write on worker {worker}: {error!r}")
                break
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()
        try:
            await asyncio.wait_for(reader, timeout=60.0)
        except TimeoutError:
            result.note_error(f"worker {worker}: {len(pending)} batches unacked 60 s after the end")
            call.cancel()


async def run_closed_loop_phase(
    context: StreamContext,
    meter: CpuMeter,
    name: str,
    description: str,
    cursor: ThreadCursor,
    batch_size: int,
    in_flight: int,
    seconds: float,
    max_snapshots: int,
) -> PhaseResult:
    """Every worker drives its own stream at once; returns the acked rate and the CPU split."""
    result = PhaseResult(name, description)
    budget = Budget(max_snapshots)
    batch_latencies: list[float] = []
    before = meter.sample()
    stop_at = before.at + seconds
    await asyncio.gather(
        *(
            drive_closed_loop(
                context, worker, cursor, batch_size, in_flight, stop_at, budget, result, batch_latencies
            )
            for worker in range(len(context.tokens))
        )
    )
    after = meter.sample()
    result.seconds = round(after.at - before.at, 3)
    result.per_second = round(result.accepted / result.seconds, 1)
    result.latency = percentiles_ms(batch_latencies)
    result.extra["latency_is_per"] = "message (write -> its acks read)"
    result.cpu = CpuMeter.usage(before, after, result.accepted, result.messages)
    return result


async def drive_paced(
    context: StreamContext,
    worker: int,
    cursor: ThreadCursor,
    rate: float,
    start: float,
    seconds: float,
    tick: float,
    result: PhaseResult,
    due_latencies: list[float],
    write_latencies: list[float],
) -> None:
    """One worker's stream at `rate` snapshots/s, open loop: the k-th snapshot is due at
    start + k / rate whatever the acks do; every `tick` the stream sends all that is due as one
    message. Latencies are taken per snapshot from its due instant and from its message's write."""
    factory = context.factory
    total = int(rate * seconds)
    pending: dict[int, tuple[int, int, float]] = {}
    async with context.open_channel() as channel:
        call = channel.stream_stream(STREAM_METHOD)(metadata=context.metadata(worker))

        async def read_acks() -> None:
            try:
                while True:
                    raw = await call.read()
                    if raw is grpc.aio.EOF:
                        return
                    received = time.perf_counter()
                    response = _tally_response(raw, result)
                    first, count, written = pending.pop(response.batch_id)
                    for k in range(first, first + count):
                        due_latencies.append(received - (start + k / rate))
                        write_latencies.append(received - written)
            except grpc.aio.AioRpcError as error:
                result.note_error(f"paced stream of worker {worker}: {error.code().name}: {error.details()}")

        reader = asyncio.create_task(read_acks())
        sent = 0
        batch_id = 0
        while sent < total and not reader.done():
            now = time.perf_counter()
            # Snapshot k is due at start + k / rate: those with k <= (now - start) * rate are due.
            due = min(total, math.floor((now - start) * rate) + 1) - sent if now >= start else 0
            if due > 0:
                indices = cursor.take(worker, due)
                wall = time.time()
                payload = encode_batch(batch_id, [factory.encode(index, wall) for index in indices])
                written = time.perf_counter()
                pending[batch_id] = (sent, len(indices), written)
                try:
                    await call.write(payload)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
                    result.note_error(f"paced write on worker {worker}: {error!r}")
                    break
                sent += len(indices)
                result.sent += len(indices)
                result.messages += 1
                batch_id += 1
            next_due = start + sent / rate
            await asyncio.sleep(max(tick, next_due - time.perf_counter()))
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()
        try:
            await asyncio.wait_for(reader, timeout=60.0)
        except TimeoutError:
            result.note_error(f"paced worker {worker}: {len(pending)} batches unacked 60 s after the end")
            call.cancel()


async def run_paced_phase(
    context: StreamContext, meter: CpuMeter, cursor: ThreadCursor, rate: float, seconds: float, tick: float
) -> PhaseResult:
    """Open-loop load at `rate` snapshots/s spread over every worker's stream."""
    workers = len(context.tokens)
    result = PhaseResult(
        "stream_paced",
        f"open loop {rate:,.0f} snapshots/s over {workers} streams, what is due sent every "
        f"{tick * 1e3:.0f} ms",
    )
    due_latencies: list[float] = []
    write_latencies: list[float] = []
    before = meter.sample()
    start = before.at + 0.05
    await asyncio.gather(
        *(
            drive_paced(
                context,
                worker,
                cursor,
                rate / workers,
                start,
                seconds,
                tick,
                result,
                due_latencies,
                write_latencies,
            )
            for worker in range(workers)
        )
    )
    after = meter.sample()
    result.seconds = round(after.at - before.at, 3)
    result.per_second = round(result.accepted / seconds, 1)
    result.latency = percentiles_ms(due_latencies)
    result.latency_from_write = percentiles_ms(write_latencies)
    result.extra["latency_is_per"] = "snapshot (due instant -> ack read); latency_from_write: write -> ack"
    result.extra["offered_rate"] = rate
    result.extra["snapshots_per_message"] = round(result.sent / max(result.messages, 1), 2)
    result.cpu = CpuMeter.usage(before, after, result.accepted, result.messages)
    return result


# --------------------------------------------------------------------------------------------
# Load generation over the gateway's REST ingest


async def run_rest_phase(
    base_url: str,
    tokens: list[str],
    factory: SnapshotFactory,
    meter: CpuMeter,
    cursor: ThreadCursor,
    clients: int,
    in_flight_per_client: int,
    seconds: float,
    max_snapshots: int,
) -> PhaseResult:
    """Closed loop through `POST /api/v1/workers/{worker_id}/thread-context`: one keep-alive httpx
    client per worker (its token), `in_flight_per_client` requests each at a time."""
    result = PhaseResult(
        "rest",
        f"gateway REST ingest, {clients} httpx clients x {in_flight_per_client} in flight, keep-alive",
    )
    budget = Budget(max_snapshots)
    latencies: list[float] = []
    statuses: dict[str, int] = {}

    async def request_loop(client: httpx.AsyncClient, worker: int, stop_at: float) -> None:
        worker_id = factory.worker_ids[worker]
        path = f"/api/v1/workers/{worker_id}/thread-context"
        while time.perf_counter() < stop_at and budget.take(1):
            indices = cursor.take(worker, 1)
            if not indices:
                return
            body = factory.json_body(indices[0], time.time())
            result.sent += 1
            result.messages += 1
            started = time.perf_counter()
            try:
                response = await client.post(path, json=body)
            except httpx.HTTPError as error:
                result.note_error(f"POST {path}: {error!r}")
                continue
            latencies.append(time.perf_counter() - started)
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
            if response.status_code == 200:
                answer = response.json()
                result.count_ack(
                    bool(answer.get("accepted")),
                    bool(answer.get("duplicate")),
                    bool(answer.get("superseded")),
                    None if answer.get("accepted") else response.text[:300],
                )
            else:
                result.count_ack(False, False, False, f"HTTP {response.status_code}: {response.text[:300]}")

    http_clients = [
        httpx.AsyncClient(
            base_url=base_url,
            headers={"authorization": f"Bearer {tokens[worker % len(tokens)]}"},
            timeout=30.0,
            limits=httpx.Limits(
                max_connections=in_flight_per_client, max_keepalive_connections=in_flight_per_client
            ),
        )
        for worker in range(clients)
    ]
    try:
        before = meter.sample()
        stop_at = before.at + seconds
        await asyncio.gather(
            *(
                request_loop(client, worker % len(tokens), stop_at)
                for worker, client in enumerate(http_clients)
                for _ in range(in_flight_per_client)
            )
        )
        after = meter.sample()
    finally:
        for client in http_clients:
            await client.aclose()
    result.seconds = round(after.at - before.at, 3)
    result.per_second = round(result.accepted / result.seconds, 1)
    result.latency = percentiles_ms(latencies)
    result.extra["latency_is_per"] = "request (send -> response read)"
    result.extra["http_statuses"] = statuses
    result.cpu = CpuMeter.usage(before, after, result.accepted, result.messages)
    return result


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Verdict:
    """One line of the summary table."""

    metric: str
    value: str
    target: str
    passed: bool | None


def summarise(phases: dict[str, PhaseResult], rss: dict[str, float], config: BenchConfig) -> list[Verdict]:
    """The measured numbers against the ARCHITECTURE.md budgets."""
    verdicts: list[Verdict] = []
    batched = phases.get("stream_batched")
    single = phases.get("stream_single")
    paced = phases.get("stream_paced")
    rest = phases.get("rest")
    if batched:
        verdicts.append(
            Verdict(
                f"gRPC stream, {config.batch_size}/message, {config.workers} streams",
                f"{batched.per_second:,.0f} /s",
                f">= {TARGET_BATCHED_PER_SECOND:,.0f} /s",
                batched.per_second >= TARGET_BATCHED_PER_SECOND and not batched.rejected,
            )
        )
    if single:
        verdicts.append(
            Verdict(
                f"gRPC stream, 1/message, {config.workers} streams",
                f"{single.per_second:,.0f} /s",
                f">= {TARGET_SINGLE_PER_SECOND:,.0f} /s",
                single.per_second >= TARGET_SINGLE_PER_SECOND and not single.rejected,
            )
        )
    if paced and paced.latency:
        rate_ok = paced.accepted >= 0.99 * config.paced_rate * config.paced_seconds
        verdicts.append(
            Verdict(
                f"ack latency at {config.paced_rate:,.0f}/s (due -> ack)",
                f"p50 {paced.latency['p50_ms']:.1f} ms, p99 {paced.latency['p99_ms']:.1f} ms",
                f"p99 <= {TARGET_P99_MS:.0f} ms",
                paced.latency["p99_ms"] <= TARGET_P99_MS and rate_ok,
            )
        )
        if paced.latency_from_write:
            verdicts.append(
                Verdict(
                    "  same, write -> ack",
                    f"p50 {paced.latency_from_write['p50_ms']:.1f} ms, "
                    f"p99 {paced.latency_from_write['p99_ms']:.1f} ms",
                    "(informative)",
                    None,
                )
            )
    if rest:
        verdicts.append(Verdict("gateway REST ingest", f"{rest.per_second:,.0f} /s", "(measured)", None))
        if batched and rest.per_second:
            ratio = batched.per_second / rest.per_second
            verdicts.append(
                Verdict(
                    "gRPC batched stream / REST",
                    f"{ratio:.1f} x",
                    f">= {TARGET_STREAM_OVER_REST:.0f} x",
                    ratio >= TARGET_STREAM_OVER_REST,
                )
            )
        if single and rest.per_second:
            verdicts.append(
                Verdict(
                    "gRPC 1/message stream / REST", f"{single.per_second / rest.per_second:.1f} x", "", None
                )
            )
    if "VmRSS" in rss:
        verdicts.append(
            Verdict(
                f"context_budget RSS, {config.rss_threads:,} threads",
                f"{rss['VmRSS']:.0f} MB (peak {rss.get('VmHWM', 0):.0f} MB)",
                f"<= {TARGET_RSS_MB:.0f} MB",
                rss["VmRSS"] <= TARGET_RSS_MB,
            )
        )
    return verdicts


def format_table(verdicts: list[Verdict], phases: dict[str, PhaseResult]) -> str:
    """The summary and the per-phase CPU split as plain text."""
    lines = []
    width = max(len(verdict.metric) for verdict in verdicts) if verdicts else 10
    lines.append(f"{'metric':<{width}}  {'measured':<34}  {'target':<16}  result")
    lines.append("-" * (width + 64))
    for verdict in verdicts:
        mark = "" if verdict.passed is None else ("PASS" if verdict.passed else "FAIL")
        lines.append(f"{verdict.metric:<{width}}  {verdict.value:<34}  {verdict.target:<16}  {mark}")
    lines.append("")
    lines.append(
        f"{'phase':<15} {'acked':>8} {'msgs':>7} {'secs':>6} {'per s':>8}  "
        f"{'cores: server':>13} {'gateway':>7} {'loadgen':>7} {'postgres':>8} {'other':>6} {'machine%':>8}  "
        f"{'server us/snap':>14} {'us/msg':>8}"
    )
    for phase in phases.values():
        cpu = phase.cpu
        cells = [
            f"{phase.name:<15} {phase.accepted:>8} {phase.messages:>7} {phase.seconds:>6.1f}",
            f"{phase.per_second:>8.0f} ",
            f"{cpu.get('server_cores', 0):>13.2f}",
            f"{cpu.get('gateway_cores', 0):>7.2f}",
            f"{cpu.get('loadgen_cores', 0):>7.2f}",
            f"{cpu.get('postgres_cores', 0):>8.2f}",
            f"{cpu.get('other_cores', 0):>6.2f}",
            f"{cpu.get('machine_busy_pct', 0):>8.1f} ",
            f"{cpu.get('server_us_per_snapshot', 0):>14.1f}",
            f"{cpu.get('server_us_per_message', 0):>8.1f}",
        ]
        lines.append(" ".join(cells))
    lines.append("")
    lines.append(
        f"{'phase':<15} {'commits~':>9} {'snaps/commit~':>13} {'ins/snap~':>9} {'upd/snap~':>9} "
        f"{'WAL B/snap':>10}  {'latency p50 / p99 (ms)':>24}"
    )
    for phase in phases.values():
        cpu = phase.cpu
        latency = phase.latency
        lines.append(
            f"{phase.name:<15} {cpu.get('db_commits_approx', 0):>9.0f} "
            f"{cpu.get('db_snapshots_per_commit_approx', 0):>13.1f} "
            f"{cpu.get('db_rows_inserted_per_snapshot_approx', 0):>9.2f} "
            f"{cpu.get('db_rows_updated_per_snapshot_approx', 0):>9.2f} "
            f"{cpu.get('db_wal_bytes_per_snapshot', 0):>10.0f}  "
            f"{latency.get('p50_ms', 0):>11.1f} / {latency.get('p99_ms', 0):>10.1f}"
        )
    lines.append(
        "(~ = from pg_stat_database, which lags up to ~1 s; latency per message, paced phase per snapshot)"
    )
    return "\n".join(lines)


def write_profile_reports(services: list[ServiceProcess], directory: Path) -> list[str]:
    """Top functions (by own time and by cumulative time) of each profiled service, as text."""
    written = []
    for service in services:
        if service.profile_path is None or not service.profile_path.exists():
            continue
        report = directory / f"{service.name}.txt"
        with report.open("w") as out:
            stats = pstats.Stats(str(service.profile_path), stream=out)
            stats.strip_dirs()
            out.write(f"# {service.name}: top 45 functions by own time (tottime)\n")
            stats.sort_stats("tottime").print_stats(45)
            out.write(f"\n# {service.name}: top 60 functions by cumulative time\n")
            stats.sort_stats("cumulative").print_stats(60)
        written.append(str(report.relative_to(ROOT)))
    return written


async def run(config: BenchConfig) -> dict[str, Any]:
    """Runs every phase once and returns the machine-readable report."""
    begun = time.perf_counter()
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    logs = OUTPUT_DIR / "logs"
    logs.mkdir(exist_ok=True)
    profile_dir = OUTPUT_DIR / "profile" if config.profile else None
    if profile_dir:
        profile_dir.mkdir(exist_ok=True)

    background_cores = await wait_for_quiet(config.quiet_wait_seconds)
    others_at_start = other_context_budget_processes()
    reset_schema(config.database_url)
    secret = "bench-" + uuid.uuid4().hex + uuid.uuid4().hex
    cb_port, gw_port = free_port(), free_port()
    cb_address = f"127.0.0.1:{cb_port}"
    base_env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}",
        "BOSS_DATA_DIR": str(OUTPUT_DIR / "data"),
        "BOSS_AUTH_SECRET": secret,
        "BOSS_CONTEXT_BUDGET_DATABASE_URL": config.database_url,
        "BOSS_CONTEXT_BUDGET_LISTEN": cb_address,
        "BOSS_CONTEXT_BUDGET_ADDRESS": cb_address,
        "BOSS_GATEWAY_LISTEN": f"127.0.0.1:{gw_port}",
        "BOSS_MIGRATE_ON_START": "true",
    }
    base_env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    factory = SnapshotFactory(config.workers, max(config.threads, config.rss_threads))
    authority = TokenAuthority(secret)
    tokens = [
        authority.issue_worker(factory.worker_ids[w], factory.node_ids[w]) for w in range(config.workers)
    ]
    services: list[ServiceProcess] = []
    closers: list[Callable[[], None]] = []
    phases: dict[str, PhaseResult] = {}
    rss: dict[str, float] = {}
    rss_timeline: dict[str, dict[str, float]] = {}
    report: dict[str, Any] = {}
    try:
        context_budget = start_service(
            "context_budget", "services.context_budget", base_env, logs, profile_dir
        )
        services.append(context_budget)
        await wait_grpc_serving(context_budget, cb_address)
        gateway = start_service("bff_gateway", "services.bff_gateway", base_env, logs, profile_dir)
        services.append(gateway)
        await wait_http_ready(gateway, f"http://127.0.0.1:{gw_port}")
        rss_timeline["idle"] = memory_mb(context_budget.pid)

        meter = CpuMeter(context_budget.pid, gateway.pid, config.database_url)
        closers.append(meter.close)
        context = StreamContext(cb_address, tokens, factory)
        working_set = ThreadCursor(factory, config.threads, cycle=True)

        warmup = await run_closed_loop_phase(
            context,
            meter,
            "warmup",
            f"one snapshot for each of {config.threads:,} threads (not a measurement)",
            ThreadCursor(factory, config.threads, cycle=False),
            config.batch_size,
            config.in_flight_per_stream,
            60.0,
            config.threads,
        )
        phases["warmup"] = warmup
        rss_timeline["after_warmup"] = memory_mb(context_budget.pid)
        phases["stream_batched"] = await run_closed_loop_phase(
            context,
            meter,
            "stream_batched",
            f"{config.workers} streams x {config.batch_size} snapshots/message, "
            f"{config.in_flight_per_stream} messages in flight per stream, {config.threads:,} threads",
            working_set,
            config.batch_size,
            config.in_flight_per_stream,
            config.batched_seconds,
            config.batched_max_snapshots,
        )
        phases["stream_single"] = await run_closed_loop_phase(
            context,
            meter,
            "stream_single",
            f"{config.workers} streams x 1 snapshot/message, "
            f"{config.in_flight_per_stream} in flight per stream",
            working_set,
            1,
            config.in_flight_per_stream,
            config.single_seconds,
            config.single_max_snapshots,
        )
        phases["stream_paced"] = await run_paced_phase(
            context, meter, working_set, config.paced_rate, config.paced_seconds, config.paced_tick_seconds
        )
        phases["rest"] = await run_rest_phase(
            f"http://127.0.0.1:{gw_port}",
            tokens,
            factory,
            meter,
            working_set,
            config.rest_clients,
            config.rest_in_flight_per_client,
            config.rest_seconds,
            config.rest_max_snapshots,
        )
        rss_timeline["before_rss_phase"] = memory_mb(context_budget.pid)
        phases["rss_50k"] = await run_closed_loop_phase(
            context,
            meter,
            "rss_50k",
            f"one snapshot each for {config.rss_threads:,} threads (the first {config.threads:,} "
            "already known), batched stream",
            ThreadCursor(factory, config.rss_threads, cycle=False),
            config.batch_size,
            config.in_flight_per_stream,
            90.0,
            config.rss_threads,
        )
        await asyncio.sleep(1.0)
        rss = memory_mb(context_budget.pid)
        rss_timeline["after_rss_phase"] = rss

        counts = table_counts(config.database_url)
        ours = rows_of_run(config.database_url, factory.worker_prefix)
        stored = sum(phase.stored for phase in phases.values())
        threads_reported = max(config.threads, config.rss_threads)
        verification = {
            "acked_stored_snapshots": stored,
            "snapshot_rows": ours["thread_context_snapshots"],
            "threads_reported": threads_reported,
            "thread_rows": ours["thread_contexts"],
            "foreign_rows": ours["thread_context_snapshots_foreign"] + ours["thread_contexts_foreign"],
            "rejected": sum(phase.rejected for phase in phases.values()),
            "duplicates": sum(phase.duplicates for phase in phases.values()),
            "transport_errors": sum(len(phase.errors) for phase in phases.values()),
            "table_counts": counts,
        }
        verification["passed"] = (
            verification["snapshot_rows"] == stored
            and verification["thread_rows"] == threads_reported
            and verification["rejected"] == 0
            and verification["foreign_rows"] == 0
        )
        verdicts = summarise(phases, rss, config)
        report = {
            "benchmark": "context_budget ingest",
            "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, "-m", "bench.ingest_bench", *sys.argv[1:]]),
            "machine": machine_info(),
            "versions": {
                "python": platform.python_version(),
                "grpcio": grpc.__version__,
                "psycopg": psycopg.__version__,
                "httpx": httpx.__version__,
                "postgresql": postgres_info(config.database_url),
            },
            "config": asdict(config),
            "schema_reset": f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE before the run",
            "background_busy_cores_before_run": background_cores,
            "python_speed_reference_ms": python_speed_reference(),
            "other_context_budget_processes_at_start": others_at_start,
            "phases": {name: asdict(phase) for name, phase in phases.items()},
            "rss_mb": rss_timeline,
            "verification": verification,
            "summary": [asdict(verdict) for verdict in verdicts],
            "table": format_table(verdicts, phases),
        }
    finally:
        for close in closers:
            close()
        for service in reversed(services):
            service.stop()
    if profile_dir is not None:
        report["profiles"] = write_profile_reports(services, profile_dir)
    report["wall_seconds"] = round(time.perf_counter() - begun, 1)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BOSS_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, seconds: checks the harness")
    parser.add_argument(
        "--profile", action="store_true", help="run the services under cProfile (shorter phases)"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="wait up to this long for an idle machine before starting (default 30)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a target is missed (default: only on errors)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; prints the table; writes bench/output/ingest.json (ingest_profile.json
    under --profile). Exit 0 when the run completed and the rows in PostgreSQL match the acks, 1
    when verification fails (or, with --strict, a target is missed), 2 when the run broke."""
    args = parse_args(argv)
    config = (
        BenchConfig.quick(args.database_url) if args.quick else BenchConfig(database_url=args.database_url)
    )
    config = dataclasses.replace(config, quiet_wait_seconds=args.quiet_wait)
    if args.profile:
        config = BenchConfig(
            database_url=config.database_url,
            threads=config.threads,
            rss_threads=config.threads,
            batched_seconds=6.0,
            single_seconds=5.0,
            paced_seconds=5.0,
            rest_seconds=5.0,
            quiet_wait_seconds=config.quiet_wait_seconds,
            profile=True,
        )
    try:
        report = asyncio.run(
            asyncio.wait_for(run(config), TOTAL_DEADLINE_SECONDS + config.quiet_wait_seconds)
        )
    except Exception as error:
        sys.stderr.write(f"ingest benchmark failed: {error!r}\n")
        return 2
    name = "ingest_profile.json" if config.profile else ("ingest_quick.json" if args.quick else "ingest.json")
    path = OUTPUT_DIR / name
    path.write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(report["table"] + "\n\n")
    verification = report["verification"]
    outcome = "OK" if verification["passed"] else "MISMATCH"
    sys.stdout.write(
        f"verification: {verification['snapshot_rows']} snapshot rows for "
        f"{verification['acked_stored_snapshots']} acked; {verification['thread_rows']} thread rows for "
        f"{verification['threads_reported']} threads; {verification['foreign_rows']} rows of other "
        f"programs; {verification['rejected']} rejected; "
        f"{verification['transport_errors']} errors: {outcome}\n"
    )
    for phase_name, phase in report["phases"].items():
        for message in phase["errors"]:
            sys.stdout.write(f"  {phase_name}: {message}\n")
    if report.get("profiles"):
        sys.stdout.write("profiles: " + ", ".join(report["profiles"]) + "\n")
    if report["other_context_budget_processes_at_start"]:
        sys.stdout.write(
            f"warning: other context_budget services were running at the start "
            f"(pids {report['other_context_budget_processes_at_start']}); they may share the schema\n"
        )
    if report["background_busy_cores_before_run"] >= QUIET_CORES:
        sys.stdout.write(
            f"warning: {report['background_busy_cores_before_run']} cores were busy before the run "
            "(other programs); see the 'other' column\n"
        )
    sys.stdout.write(f"wall time {report['wall_seconds']} s; results: {path.relative_to(ROOT)}\n")
    if not verification["passed"]:
        return 1
    if args.strict and any(item["passed"] is False for item in report["summary"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
