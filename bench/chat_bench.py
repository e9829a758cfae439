"""Chat-turn benchmark (issue 12 "Performance"): Boss's own cost on a chat turn.

Budget: (send -> the reply's event at an SSE client) minus (a bare `codex exec resume` of the same
turn), measured side by side in one run: p50 <= 50 ms.

Processes, all on this machine and all real: context_budget, scheduler, conversations and the
gateway (`python -m services.<name> serve`, PostgreSQL database `bench_chat`, created when missing,
its schemas `context_budget`, `scheduler` and `conversations` **dropped first**), Boss's built-in
demo model (`python -m demo_model serve --turn-tokens 0`: its usage does not grow with the turns, so
no turn of the run compacts; a compaction would add a model round trip to whichever turn met it),
and a worker (`python -m worker run`) whose local agent runs the real Codex CLI. One real Codex
thread is created first (`codex exec` in bench/output/chat/workspace, Codex home
bench/output/chat/codex-home written for the demo model); the worker registers it.

Then `--turns` pairs (default 30) on that thread, one turn after the other, `--interval` seconds
apart (default 0.5), the order within a pair alternating (bare first, then Boss first, ...):

- **bare**: the benchmark itself runs `codex exec resume` exactly as the local agent does (the same
  binary, arguments, Codex home, environment and working folder; the message on stdin, then stdin
  closed) and times it from just before the spawn to the process's exit;
- **boss**: `POST /api/v1/projects/{id}/messages` through the gateway, timed from just before the
  request to the arrival of the reply's `conversation.message.created` at an httpx SSE client of
  the gateway (`GET /api/v1/events`, connected before the first turn).

Boss's own cost of pair i = boss_i - bare_i. Reported: p50 / p90 / max of bare, boss and the
difference (and p50(boss) - p50(bare)). Verified: every reply is the demo model's exact reply to
its message (Boss's and the bare run's alike), and every bare run exits 0.

Where the time goes (per Boss turn, wall-clock instants relative to the send): the POST's answer;
`task.requested` and the reply's `conversation.message.created` on conversations' `WatchEvents`,
and each `task.status_changed` (queued, claimed, running, completed) on the scheduler's, followed
by this process with a service token; the worker's log lines "task started" (after StartTask
answered) and "codex run ... ended" (with the runner's own duration of the run); the SSE arrival.

Two warm-up pairs are not measured. Waits (up to `--quiet-wait` s, default 30) for an idle machine
first and records what it saw, and `python_speed_reference_ms`. Results: bench/output/chat.json;
logs: bench/output/logs/chat_*.log.

Run: `PYTHONPATH=.:gen .venv/bin/python -m bench.chat_bench [--turns 30] [--quick] [--profile]
[--database-url URL]`. The database defaults to `BOSS_BENCH_CHAT_DATABASE_URL`, else the local
server's `bench_chat`. `--profile` runs the four services under cProfile (reports in
bench/output/profile/chat_*.txt, results in bench/output/chat_profile.json: the profiler's overhead
is in them). Exit codes: 0 run complete and verified (the budget may still be missed: see the
table; `--strict` makes a miss exit 1), 1 verification failed, 2 the run broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

from bench.ingest_bench import (
    ServiceProcess,
    free_port,
    libpq_url,
    machine_cpu_seconds,
    machine_info,
    percentiles_ms,
    postgres_cpu_seconds,
    process_cpu_seconds,
    python_speed_reference,
    start_service,
    wait_for_quiet,
    wait_http_ready,
    write_profile_reports,
)
from demo_model import reply_text, write_codex_home
from demo_model.codex_home import demo_model_environment
from services.local_stack import grpc_healthy
from services.shared.auth import TokenAuthority, bearer_metadata
from worker.local_agent.codex_exec import CodexRunSettings, create_codex_thread, resume_command
from worker.local_agent.codex_install import find_codex_binary

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "bench" / "output" / "chat.json"
PROFILE_OUTPUT = ROOT / "bench" / "output" / "chat_profile.json"
LOGS = ROOT / "bench" / "output" / "logs"
PROFILES = ROOT / "bench" / "output" / "profile"
WORK = ROOT / "bench" / "output" / "chat"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_chat"
SECRET = "bench-secret-for-the-chat-benchmark-0123456789ab"
OWNER = "local"
WORKER_ID = "worker-chat-bench"
NODE_ID = "node-chat-bench"
SCHEMAS = ("context_budget", "scheduler", "conversations")
TARGET_P50_MS = 50.0
WARMUP_PAIRS = 2
TURN_TIMEOUT_S = 60.0
WORKER_LOG = LOGS / "chat_worker.log"
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")
STARTED_LINE = re.compile(r"^task (\S+) started: ")
SPAWNED_LINE = re.compile(r"^started codex pid \d+ for thread ")
HELPERS_LINE = re.compile(r"^stopping \d+ process group\(s\) left behind")
LEFTOVERS_LINE = re.compile(r"^codex run for thread \S+: leftovers stopped ([\d.]+) s after its result")
CODEX_ENDED_LINE = re.compile(r"^codex run for thread \S+ ended \w+ \(exit [-\d]+\) in ([\d.]+) s")
PR_SET_CHILD_SUBREAPER = 36
"""prctl option (Linux): orphaned descendants are re-parented to this process instead of init."""
HOPS = (
    "posted",
    "requested",
    "queued",
    "claimed",
    "running",
    "agent_started",
    "codex_spawned",
    "codex_ended",
    "completed",
    "reply_committed",
    "sse",
)
"""The instants of a Boss turn, in the order they happen (see the module docstring)."""


# --------------------------------------------------------------------------------------------
# The stack


def prepare_database(url: str) -> None:
    """Creates the benchmark database when missing and drops the three services' schemas in it."""
    server, _, name = libpq_url(url).rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            connection.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        for schema in SCHEMAS:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@dataclass
class Stack:
    """The running processes, their addresses, and the Codex home, binary and thread."""

    environment: dict[str, str]
    addresses: dict[str, str]
    codex_bin: Path
    codex_home: Path
    workspace: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    session_id: str = ""
    project_id: str = ""
    bare_leftovers: int = 0

    @property
    def gateway(self) -> str:
        return f"http://{self.addresses['gateway']}"

    def stop(self) -> None:
        """SIGINT to every process at once (they follow each other's streams), then waits."""
        for process in self.processes:
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGINT)
        for process in self.processes:
            process.stop()


def environment_for(url: str, addresses: dict[str, str], log_level: str) -> dict[str, str]:
    """The environment every process of the stack gets (no BOSS_ variable of the caller's)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("BOSS_")}
    environment.update(
        {
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}",
            "BOSS_DATA_DIR": str(WORK / "data"),
            "BOSS_AUTH_SECRET": SECRET,
            "BOSS_DATABASE_URL": url,
            "BOSS_MIGRATE_ON_START": "true",
            "BOSS_LOG_LEVEL": log_level,
            **demo_model_environment(),
        }
    )
    for name in (*SCHEMAS, "gateway"):
        variable = f"BOSS_{name.upper()}"
        environment[f"{variable}_LISTEN"] = environment[f"{variable}_ADDRESS"] = addresses[name]
    return environment


async def wait_grpc(process: ServiceProcess, address: str, timeout: float = 90.0) -> None:
    """Waits until the server at `address` answers its health check SERVING."""
    deadline = time.monotonic() + timeout
    while not await grpc_healthy(address):
        process.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} not serving after {timeout:.0f} s:\n{process.log_tail()}")
        await asyncio.sleep(0.2)


async def start_stack(url: str, log_level: str, profile_dir: Path | None = None) -> Stack:
    """Starts the demo model, creates the Codex thread, starts the services (under cProfile into
    `profile_dir` when given) and the worker, and waits until the thread's project can be chatted
    with."""
    LOGS.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    addresses = {name: f"127.0.0.1:{free_port()}" for name in (*SCHEMAS, "gateway", "demo_model")}
    environment = environment_for(url, addresses, log_level)
    stack = Stack(environment, addresses, find_codex_binary(), WORK / "codex-home", WORK / "workspace")
    try:
        host, _, port = addresses["demo_model"].rpartition(":")
        model = start_model(environment, host, port)
        stack.processes.append(model)
        await wait_http_ready(model, f"http://{addresses['demo_model']}")
        write_codex_home(stack.codex_home, f"http://{addresses['demo_model']}/v1")
        stack.workspace.mkdir()
        stack.session_id = await create_codex_thread(stack.workspace, "start", run_settings(stack))
        for name in SCHEMAS:
            stack.processes.append(
                start_service(f"chat_{name}", f"services.{name}", environment, LOGS, profile_dir)
            )
        for process, name in zip(stack.processes[1:], SCHEMAS, strict=True):
            await wait_grpc(process, addresses[name])
        gateway = start_service("chat_gateway", "services.bff_gateway", environment, LOGS, profile_dir)
        stack.processes.append(gateway)
        await wait_http_ready(gateway, stack.gateway)
        stack.processes.append(start_worker(stack))
        stack.project_id = await chat_project(stack)
    except BaseException:
        stack.stop()
        raise
    return stack


def start_model(environment: dict[str, str], host: str, port: str) -> ServiceProcess:
    """`python -m demo_model serve` with usage that does not grow per turn (no compactions)."""
    log_path = LOGS / "chat_demo_model.log"
    command = [
        sys.executable,
        "-m",
        "demo_model",
        "serve",
        "--host",
        host,
        "--port",
        port,
        "--turn-tokens",
        "0",
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServiceProcess("chat_demo_model", process, log_path, None)


def start_worker(stack: Stack) -> ServiceProcess:
    """`python -m worker run` on the benchmark's Codex home and binary, logging at DEBUG (the hop
    split reads its lines; DEBUG adds the Codex runner's "started codex pid" line)."""
    command = [
        sys.executable,
        "-m",
        "worker",
        "run",
        "--codex-home",
        str(stack.codex_home),
        "--worker-id",
        WORKER_ID,
        "--node-id",
        NODE_ID,
        "--codex-bin",
        str(stack.codex_bin),
    ]
    token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID)  # the worker signs none itself
    environment = {**stack.environment, "BOSS_LOG_LEVEL": "DEBUG", "BOSS_WORKER_TOKEN": token}
    with WORKER_LOG.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServiceProcess("chat_worker", process, WORKER_LOG, None)


def run_settings(stack: Stack) -> CodexRunSettings:
    """How the local agent runs Codex (worker/local_agent/codex_turns.py: the worker's default
    sandbox, approvals never prompting), with the demo model's key."""
    return CodexRunSettings(
        codex_bin=stack.codex_bin, codex_home=stack.codex_home, extra_env=demo_model_environment()
    )


async def chat_project(stack: Stack, timeout: float = 60.0) -> str:
    """The project of the benchmark's thread, once the worker registered it with its Codex refs."""
    headers = {"Authorization": f"Bearer {TokenAuthority(SECRET).issue_client(OWNER)}"}
    deadline = time.monotonic() + timeout
    seen = "nothing"
    async with httpx.AsyncClient(base_url=stack.gateway, headers=headers, timeout=5) as http:
        while time.monotonic() < deadline:
            for process in stack.processes:
                process.check_alive()
            page = await http.get(f"/api/v1/threads/{stack.session_id}/context-summary")
            seen = f"thread page {page.status_code}: {page.text[:300]}"
            if page.status_code == 200 and page.json()["codex_thread_ref"] and page.json()["codex_folder"]:
                rows = await http.get("/api/v1/conversations", params={"page_size": 200})
                seen = f"home list {rows.status_code}: {rows.text[:300]}"
                for row in rows.json()["conversations"] if rows.status_code == 200 else []:
                    if row["context_budget_thread_id"] == stack.session_id:
                        return str(row["project_id"])
            await asyncio.sleep(0.2)
    raise RuntimeError(
        f"the worker did not register thread {stack.session_id} within {timeout:.0f} s (last: {seen})"
    )


# --------------------------------------------------------------------------------------------
# What is observed


class SseClient:
    """An httpx SSE client of the gateway recording when each reply's message event arrives."""

    def __init__(self, gateway: str, token: str) -> None:
        self.replies: dict[str, tuple[float, dict[str, Any]]] = {}
        self.opened = asyncio.Event()
        self._gateway = gateway
        self._token = token
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.opened.wait(), 10)

    async def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "text/event-stream"}
        async with (
            httpx.AsyncClient(base_url=self._gateway, timeout=httpx.Timeout(5, read=None)) as http,
            http.stream("GET", "/api/v1/events", headers=headers) as response,
        ):
            response.raise_for_status()
            self.opened.set()
            event = ""
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "conversation.message.created":
                    arrived = time.time()
                    message = json.loads(line[6:])["message"]
                    if message["authorKind"] != "user" and message["taskId"]:
                        self.replies.setdefault(message["taskId"], (arrived, message))

    async def wait_reply(self, task_id: str, timeout: float = TURN_TIMEOUT_S) -> tuple[float, dict[str, Any]]:
        """(arrival, message) of the message ending `task_id`."""
        deadline = time.monotonic() + timeout
        while task_id not in self.replies:
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError("the SSE stream ended")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no reply event for task {task_id} within {timeout:.0f} s")
            await asyncio.sleep(0.001)
        return self.replies[task_id]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task


class HopProbe:
    """Follows conversations' and the scheduler's WatchEvents with a service token and records the
    wall-clock arrival of each chat task's events: on conversations `task.requested` and the reply's
    `conversation.message.created` (owner `local` only), on the scheduler every
    `task.status_changed` by status."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self.metadata = bearer_metadata(TokenAuthority(SECRET).issue_service("bench"))
        self.addresses = addresses
        self.arrivals: dict[str, dict[str, float]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Opens both streams (conversations at its head, the scheduler from its start)."""
        self._tasks = [asyncio.create_task(self._conversations()), asyncio.create_task(self._scheduler())]
        await asyncio.sleep(0.5)

    def _record(self, task_id: str, hop: str, arrived: float) -> None:
        self.arrivals.setdefault(task_id, {}).setdefault(hop, arrived)

    async def _conversations(self) -> None:
        async with grpc.aio.insecure_channel(self.addresses["conversations"]) as channel:
            stub = conversations_pb2_grpc.ConversationsServiceStub(channel)
            request = conversations_pb2.WatchEventsRequest(
                from_head=True, owner_id=OWNER, types=["task.requested", "conversation.message.created"]
            )
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                arrived = time.time()
                for event in response.events:
                    payload = json.loads(event.payload_json)
                    if event.type == "task.requested":
                        self._record(payload["task_id"], "requested", arrived)
                    elif payload["message"]["author_kind"] != "user" and payload["message"]["task_id"]:
                        self._record(payload["message"]["task_id"], "reply_committed", arrived)

    async def _scheduler(self) -> None:
        async with grpc.aio.insecure_channel(self.addresses["scheduler"]) as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            request = scheduler_pb2.WatchEventsRequest(types=["task.status_changed"])
            async for response in stub.WatchEvents(request, metadata=self.metadata):
                arrived = time.time()
                for event in response.events:
                    payload = json.loads(event.payload_json)
                    self._record(payload["task_id"], payload["status"], arrived)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class WorkerRun:
    """What the worker's log says of one task (epoch seconds, millisecond resolution): when its
    agent had started it (StartTask answered), when the runner had spawned Codex, when it began
    stopping the process groups Codex left behind (None when there were none), when it returned,
    its own duration of the run (seconds, 10 ms resolution), and how long after returning it had
    stopped what Codex left running and released the thread (seconds; the runner does that after
    the turn's result, holding the thread's lock)."""

    started_at: float
    codex_spawned_at: float | None = None
    helpers_stopping_at: float | None = None
    codex_ended_at: float | None = None
    codex_seconds: float | None = None
    leftovers_seconds: float | None = None


def log_instant(stamp: str) -> float:
    """Epoch seconds of a log line's `asctime` (local time, milliseconds)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def worker_runs(log_text: str) -> dict[str, WorkerRun]:
    """Per task id, its lines in the worker's log (turns run one at a time here, so a "codex run
    ended" line belongs to the task started before it)."""
    runs: dict[str, WorkerRun] = {}
    current: WorkerRun | None = None
    for line in log_text.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        instant, message = log_instant(match.group(1)), match.group(2)
        if started := STARTED_LINE.match(message):
            current = runs[started.group(1)] = WorkerRun(instant)
        elif current is None:
            continue
        elif SPAWNED_LINE.match(message):
            current.codex_spawned_at = instant
        elif HELPERS_LINE.match(message):
            current.helpers_stopping_at = instant
        elif ended := CODEX_ENDED_LINE.match(message):
            current.codex_ended_at = instant
            current.codex_seconds = float(ended.group(1))
        elif leftovers := LEFTOVERS_LINE.match(message):
            current.leftovers_seconds = float(leftovers.group(1))
    return runs


# --------------------------------------------------------------------------------------------
# The turns


@dataclass
class BossTurn:
    """One chat turn through Boss: its task, when it was sent and when each hop was seen."""

    task_id: str
    sent_at: float
    seconds: float
    reply_ok: bool
    instants: dict[str, float] = field(default_factory=dict)
    runner_seconds: float | None = None
    leftovers_seconds: float | None = None


def become_subreaper() -> bool:
    """Makes this process the reaper of its orphaned descendants (Linux), so that what a bare
    Codex run leaves behind comes back to it; False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """The child processes of `pid`, zombies included (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def stop_leftovers(keep: set[int]) -> int:
    """SIGKILLs every child of this process outside `keep` together with its process group (what
    a bare Codex run left behind: Codex's helpers outlive it, e.g. its shell snapshot, and this
    process adopted them as their subreaper), reaps them, and repeats while new orphans arrive.
    Returns how many it stopped. Runs between turns, never inside a timed one, so that each turn
    starts on the same machine whichever kind came before (the local agent stops its runs'
    helpers itself, inside its turns)."""
    own_group = os.getpgid(0)
    stopped = 0
    for _ in range(20):
        leftovers = [pid for pid in children_of(os.getpid()) if pid not in keep]
        if not leftovers:
            break
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(pid)
                if group != own_group:
                    os.killpg(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        for pid in leftovers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        stopped += len(leftovers)
    return stopped


async def bare_turn(stack: Stack, message: str) -> tuple[float, bool]:
    """One `codex exec resume` of the thread, as the local agent starts it; returns (seconds from
    just before the spawn to the exit, whether it exited 0 with the demo model's exact reply).
    What it leaves behind is stopped afterwards (stop_leftovers), outside the timing."""
    settings = run_settings(stack)
    argv = resume_command(stack.codex_bin, stack.session_id, settings)
    environment = {**os.environ, **settings.extra_env, "CODEX_HOME": str(stack.codex_home)}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=stack.workspace,
        env=environment,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert process.stdin is not None
    process.stdin.write(message.encode())
    process.stdin.close()
    output, _ = await asyncio.wait_for(process.communicate(), TURN_TIMEOUT_S)
    seconds = time.perf_counter() - started
    stack.bare_leftovers += stop_leftovers({process.process.pid for process in stack.processes})
    replies = [
        event["item"]["text"]
        for event in map(json.loads, output.decode().splitlines())
        if event.get("type") == "item.completed" and event["item"].get("type") == "agent_message"
    ]
    return seconds, process.returncode == 0 and replies[-1:] == [reply_text(message)]


async def boss_turn(http: httpx.AsyncClient, sse: SseClient, stack: Stack, message: str) -> BossTurn:
    """One message through the gateway, until its reply's event reached the SSE client."""
    sent_at = time.time()
    started = time.perf_counter()
    response = await http.post(
        f"/api/v1/projects/{stack.project_id}/messages",
        json={"text": message, "client_message_id": f"bench-{uuid.uuid4().hex}"},
    )
    posted = time.time()
    if response.status_code != 201:
        raise RuntimeError(f"send answered {response.status_code}: {response.text}")
    task_id = response.json()["task"]["taskId"]
    arrived, reply = await sse.wait_reply(task_id)
    seconds = time.perf_counter() - started
    ok = reply["authorKind"] == "thread" and reply["text"] == reply_text(message)
    return BossTurn(task_id, sent_at, seconds, ok, {"posted": posted, "sse": arrived})


@dataclass
class Measured:
    """Every measured pair: bare seconds, Boss turns."""

    bare: list[float] = field(default_factory=list)
    boss: list[BossTurn] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    cpu_ms_per_pair: dict[str, float] = field(default_factory=dict)
    machine_busy_cores: float = 0.0


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU seconds so far of each process of the stack (its own threads: the worker's figure
    leaves out the Codex runs it started), of PostgreSQL, of this process (the bare runs' Codex
    included, as its reaped children) and of the whole machine (busy, total)."""
    figures = {
        process.name.removeprefix("chat_"): process_cpu_seconds(process.pid) for process in stack.processes
    }
    figures["postgres"] = postgres_cpu_seconds()
    usage = os.times()
    figures["benchmark"] = usage.user + usage.system
    figures["bare_codex_runs"] = usage.children_user + usage.children_system
    figures["machine_busy"], figures["machine_total"] = machine_cpu_seconds()
    return figures


async def run_pairs(stack: Stack, pairs: int, interval: float) -> Measured:
    """WARMUP_PAIRS pairs, then `pairs` measured ones, alternating which of a pair goes first."""
    measured = Measured()
    token = TokenAuthority(SECRET).issue_client(OWNER)
    sse = SseClient(stack.gateway, token)
    probe = HopProbe(stack.addresses)
    await sse.start()
    await probe.start()
    headers = {"Authorization": f"Bearer {token}"}
    try:
        async with httpx.AsyncClient(base_url=stack.gateway, headers=headers, timeout=30) as http:
            for index in range(WARMUP_PAIRS + pairs):
                if index == WARMUP_PAIRS:
                    cpu_before = cpu_seconds(stack)
                order = ("bare", "boss") if index % 2 == 0 else ("boss", "bare")
                results: dict[str, Any] = {}
                for kind in order:
                    message = f"bench turn {index} ({kind})"
                    if kind == "bare":
                        results[kind] = await bare_turn(stack, message)
                    else:
                        results[kind] = await boss_turn(http, sse, stack, message)
                    await asyncio.sleep(interval)
                if index < WARMUP_PAIRS:
                    continue
                bare_seconds, bare_ok = results["bare"]
                turn: BossTurn = results["boss"]
                measured.bare.append(bare_seconds)
                measured.boss.append(turn)
                if not bare_ok:
                    measured.failures.append(f"pair {index}: the bare run did not end with the demo reply")
                if not turn.reply_ok:
                    measured.failures.append(f"pair {index}: task {turn.task_id} did not reply as expected")
        cpu_after = cpu_seconds(stack)
    finally:
        await probe.stop()
        await sse.close()
    used = {name: cpu_after[name] - cpu_before[name] for name in cpu_after}
    cores = os.cpu_count() or 1
    measured.machine_busy_cores = round(used.pop("machine_busy") / used.pop("machine_total") * cores, 2)
    measured.cpu_ms_per_pair = {name: round(seconds / pairs * 1e3, 1) for name, seconds in used.items()}
    runs = worker_runs(WORKER_LOG.read_text(errors="replace"))
    for turn in measured.boss:
        turn.instants.update(probe.arrivals.get(turn.task_id, {}))
        run = runs.get(turn.task_id)
        if run is None:
            continue
        turn.instants["agent_started"] = run.started_at
        for name, instant in (
            ("codex_spawned", run.codex_spawned_at),
            ("helpers_stopping", run.helpers_stopping_at),
            ("codex_ended", run.codex_ended_at),
        ):
            if instant is not None:
                turn.instants[name] = instant
        if run.codex_seconds is not None:
            turn.runner_seconds = run.codex_seconds
        turn.leftovers_seconds = run.leftovers_seconds
    return measured


# --------------------------------------------------------------------------------------------
# The report


def hop_split(turns: list[BossTurn], bare: list[float]) -> dict[str, Any]:
    """Percentiles (ms) of each instant after the send (cumulative) and of each step between
    consecutive instants, over the turns that have every instant; and the worker's side against
    the paired bare run: the runner's own duration, spawn -> runner returned beyond the bare run
    (what the runner adds while and after Codex runs), how long after returning the runner had
    stopped what Codex left running (off the turn's path: it holds the thread meanwhile; in how
    many turns Codex left process groups behind), and running -> completed beyond the bare run."""
    complete = [turn for turn in turns if all(hop in turn.instants for hop in HOPS)]
    cumulative = {
        hop: percentiles_ms([turn.instants[hop] - turn.sent_at for turn in complete]) for hop in HOPS
    }
    steps = {
        f"{earlier}->{later}": percentiles_ms(
            [turn.instants[later] - turn.instants[earlier] for turn in complete]
        )
        for earlier, later in itertools.pairwise(HOPS)
    }
    pairs = [(turn, seconds) for turn, seconds in zip(turns, bare, strict=True) if turn in complete]
    with_helpers = [turn for turn in complete if "helpers_stopping" in turn.instants]
    worker = {
        "runner_duration": percentiles_ms([turn.runner_seconds or 0.0 for turn in complete]),
        "spawned_to_runner_returned_minus_bare": percentiles_ms(
            [
                turn.instants["codex_ended"] - turn.instants["codex_spawned"] - seconds
                for turn, seconds in pairs
            ]
        ),
        "runner_returned_to_leftovers_stopped": percentiles_ms(
            [turn.leftovers_seconds for turn in complete if turn.leftovers_seconds is not None]
        ),
        "turns_with_helpers_left_behind": len(with_helpers),
        "running_to_completed_minus_bare": percentiles_ms(
            [turn.instants["completed"] - turn.instants["running"] - seconds for turn, seconds in pairs]
        ),
    }
    return {"turns_with_every_hop": len(complete), "cumulative": cumulative, "steps": steps, "worker": worker}


def summarise(measured: Measured) -> dict[str, Any]:
    """The bare, Boss and difference distributions, the verdict and the hop split."""
    boss = [turn.seconds for turn in measured.boss]
    difference = [turn.seconds - seconds for turn, seconds in zip(measured.boss, measured.bare, strict=True)]
    overhead = percentiles_ms(difference)
    return {
        "pairs": len(boss),
        "bare_codex_exec_resume": percentiles_ms(measured.bare),
        "boss_send_to_sse_reply": percentiles_ms(boss),
        "boss_own_cost": overhead,
        "p50_boss_minus_p50_bare_ms": round(
            percentiles_ms(boss)["p50_ms"] - percentiles_ms(measured.bare)["p50_ms"], 2
        ),
        "target_p50_ms": TARGET_P50_MS,
        "met": overhead["p50_ms"] <= TARGET_P50_MS,
        "verification_failures": measured.failures,
        "hops": hop_split(measured.boss, measured.bare),
        "cpu_ms_per_pair": measured.cpu_ms_per_pair,
        "machine_busy_cores": measured.machine_busy_cores,
    }


def format_table(summary: dict[str, Any]) -> str:
    """The distributions and the hop split as text."""
    lines = [f"{'ms':<40} {'p50':>8} {'p90':>8} {'max':>8}"]
    for key, label in (
        ("bare_codex_exec_resume", "bare codex exec resume"),
        ("boss_send_to_sse_reply", "Boss: send -> reply at SSE"),
        ("boss_own_cost", "Boss's own cost (pair difference)"),
    ):
        row = summary[key]
        lines.append(f"{label:<40} {row['p50_ms']:>8.1f} {row['p90_ms']:>8.1f} {row['max_ms']:>8.1f}")
    verdict = "PASS" if summary["met"] else "FAIL"
    lines.append(f"budget: p50 of Boss's own cost <= {TARGET_P50_MS:.0f} ms: {verdict}")
    hops = summary["hops"]
    lines.append(f"\nwhere the time goes (p50 ms, {hops['turns_with_every_hop']} turns)")
    for hop, row in hops["cumulative"].items():
        lines.append(f"  {'send -> ' + hop:<40} {row.get('p50_ms', float('nan')):>8.1f}")
    for step, row in hops["steps"].items():
        lines.append(f"  {step:<40} {row.get('p50_ms', float('nan')):>8.1f}")
    for name, row in hops["worker"].items():
        if isinstance(row, dict):
            lines.append(f"  {name:<40} {row.get('p50_ms', float('nan')):>8.1f}")
        else:
            lines.append(f"  {name:<40} {row:>8}")
    cpu = ", ".join(f"{name} {ms:.0f}" for name, ms in summary["cpu_ms_per_pair"].items())
    lines.append(f"\nCPU ms per pair (one bare run + one Boss turn): {cpu}")
    lines.append(f"machine busy cores while measuring: {summary['machine_busy_cores']}")
    return "\n".join(lines)


async def run(
    url: str, pairs: int, interval: float, quiet_wait: float, log_level: str, profile: bool = False
) -> dict[str, Any]:
    """Starts the stack, runs the pairs, stops the stack; returns the JSON report. With `profile`
    the four services run under cProfile (bench/output/profile/chat_*.prof and .txt)."""
    background = await wait_for_quiet(quiet_wait)
    subreaper = become_subreaper()
    prepare_database(url)
    profile_dir = PROFILES if profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    stack = await start_stack(url, log_level, profile_dir)
    try:
        measured = await run_pairs(stack, pairs, interval)
    finally:
        stack.stop()
    reports = write_profile_reports(stack.processes, profile_dir) if profile_dir is not None else []
    return {
        "benchmark": "chat_turn",
        "database": url.split("@")[-1],
        "machine": machine_info(),
        "background_busy_cores_before_run": background,
        "python_speed_reference_ms": python_speed_reference(),
        "codex_bin": str(stack.codex_bin),
        "interval_s": interval,
        "service_log_level": log_level,
        "bare_leftovers_stopped": stack.bare_leftovers if subreaper else None,
        "profiled": profile,
        "profile_reports": reports,
        **summarise(measured),
        "raw": {
            "bare_s": measured.bare,
            "boss": [
                {
                    "task_id": turn.task_id,
                    "seconds": turn.seconds,
                    "instants": turn.instants,
                    "sent_at": turn.sent_at,
                }
                for turn in measured.boss
            ],
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints the table and writes bench/output/chat.json (see the module
    docstring for the exit codes)."""
    parser = argparse.ArgumentParser(prog="python -m bench.chat_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="measured pairs (default 30)")
    parser.add_argument("--quick", action="store_true", help="8 pairs: checks the harness")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between turns (default 0.5)")
    parser.add_argument("--quiet-wait", type=float, default=30.0, help="seconds to wait for an idle machine")
    parser.add_argument(
        "--log-level", default="WARNING", help="BOSS_LOG_LEVEL of the services (default WARNING)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when the budget is missed")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="the services under cProfile (bench/output/profile/chat_*; results in chat_profile.json, "
        "the profiler's overhead included)",
    )
    parser.add_argument("--database-url", default=os.environ.get("BOSS_BENCH_CHAT_DATABASE_URL", DEFAULT_URL))
    arguments = parser.parse_args(argv)
    pairs = 8 if arguments.quick else arguments.turns
    if pairs < 1:
        parser.error(f"--turns must be at least 1, got {pairs}")
    try:
        results = asyncio.run(
            run(
                arguments.database_url,
                pairs,
                arguments.interval,
                arguments.quiet_wait,
                arguments.log_level,
                arguments.profile,
            )
        )
    except (RuntimeError, OSError, TimeoutError) as error:
        sys.stderr.write(f"chat benchmark broke: {error}\n")
        return 2
    output = PROFILE_OUTPUT if arguments.profile else OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(format_table(results))
    print(f"\nresults: {output.relative_to(ROOT)}; logs: {LOGS.relative_to(ROOT)}/chat_*.log")
    if results["verification_failures"]:
        sys.stderr.write("verification failed:\n  " + "\n  ".join(results["verification_failures"]) + "\n")
        return 1
    return 1 if arguments.strict and not results["met"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
