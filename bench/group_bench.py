"""Group chat benchmark (issue 13 "Performance"): a group of 10 threads from confirm to summary.

Processes, all on this machine and all real: context_budget, scheduler, conversations and the
gateway (PostgreSQL database `bench_group`, created when missing, its three service schemas
**dropped first**), Boss's built-in demo model (`python -m demo_model serve --turn-tokens 0`: no
turn compacts) serving both Codex and the master agent (`BOSS_MASTER_BACKEND=openai_api`), and one
worker whose local agent runs the real Codex CLI with `--max-concurrent-tasks` turns at a time
(default 2, the product default). Ten real Codex threads are created first (`codex exec` in folders of a
temporary directory, outside any git repository, removed afterwards); the worker registers them and
reports their budgets; they form one group.

Each round (`--rounds`, default 3; the first is a warm-up, not measured): a message into the group
(its plan drafted by the master model: 10 targets), then, timed from just before the confirm's POST
to the arrival of the master agent's summary at an SSE client of the gateway:

- `total_s`: confirm -> summary at the client;
- `codex_s`: the time at least one Codex turn of the round was running (the union of the worker's
  "codex run ... ended ... in S s" intervals), which includes Codex's own calls to the model;
- `summary_s`: the last thread's result at the client -> the summary at the client (Boss's commit
  of the last result, its summary pending, the background's model call for the summary, its
  commit and the SSE hop);
- `boss_s` = total_s - codex_s: Boss's own share (scheduling, claims, starts, finishes, the results'
  and the summary's commits and events, and the summary's model call).

Verified each round: 10 dispatch_execution tasks, every thread's reply is the demo model's exact
reply to its drafted instruction, the summary names 10 of 10 threads answered. Waits (up to 30 s)
for an idle machine first and records what it saw, and `python_speed_reference_ms`. Results:
bench/output/group.json; logs: bench/output/logs/group_*.log.

Run: `PYTHONPATH=.:gen .venv/bin/python -m bench.group_bench [--rounds 3] [--slots 2]
[--database-url URL]`. Exit codes: 0 complete and verified, 1 verification failed, 2 the run broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.chat_bench import environment_for, log_instant, prepare_database, wait_grpc
from bench.ingest_bench import (
    ServiceProcess,
    free_port,
    python_speed_reference,
    start_service,
    wait_for_quiet,
    wait_http_ready,
)
from demo_model import reply_text, write_codex_home
from demo_model.codex_home import demo_model_environment
from services.shared.auth import TokenAuthority
from worker.local_agent.codex_exec import CodexRunSettings, create_codex_thread
from worker.local_agent.codex_install import find_codex_binary

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "bench" / "output" / "group.json"
LOGS = ROOT / "bench" / "output" / "logs"
WORK = ROOT / "bench" / "output" / "group"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_group"
SECRET = "bench-secret-for-the-chat-benchmark-0123456789ab"
OWNER = "local"
THREADS = 10
SERVICES = ("context_budget", "scheduler", "conversations")
WORKER_LOG = LOGS / "group_worker.log"
ROUND_TIMEOUT_S = 180.0
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")
CODEX_ENDED = re.compile(r"^codex run for thread (\S+) ended \w+ \(exit [-\d]+\) in ([\d.]+) s")


@dataclass
class Stack:
    """The running processes, addresses, Codex home and binary, and the group's threads."""

    environment: dict[str, str]
    addresses: dict[str, str]
    codex_bin: Path
    codex_home: Path
    workspaces: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        return f"http://{self.addresses['gateway']}"

    def stop(self) -> None:
        for process in self.processes:
            if process.process.poll() is None:
                process.process.terminate()
        for process in self.processes:
            process.stop()
        shutil.rmtree(self.workspaces, ignore_errors=True)


def spawn(name: str, command: list[str], environment: dict[str, str], log_path: Path) -> ServiceProcess:
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ServiceProcess(name, process, log_path, None)


async def start_stack(url: str, slots: int) -> Stack:
    """The demo model, ten Codex threads, the services and the worker (module docstring)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    addresses = {name: f"127.0.0.1:{free_port()}" for name in (*SERVICES, "gateway", "demo_model")}
    environment = environment_for(url, addresses, "INFO") | {
        "BOSS_DATA_DIR": str(WORK / "data"),
        "BOSS_MASTER_BACKEND": "openai_api",
        "BOSS_MASTER_OPENAI_BASE_URL": f"http://{addresses['demo_model']}/v1",
        "BOSS_MASTER_MODEL": "boss-demo-model",
    }
    # The threads' folders lie outside any git repository: inside this one, every thread would
    # report this repository's uncommitted changes and be must-finish (never a dispatch target).
    workspaces = Path(tempfile.mkdtemp(prefix="boss-group-bench-"))
    stack = Stack(environment, addresses, find_codex_binary(), WORK / "codex-home", workspaces)
    try:
        host, _, port = addresses["demo_model"].rpartition(":")
        model = spawn(
            "group_demo_model",
            [
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
            ],
            environment,
            LOGS / "group_demo_model.log",
        )
        stack.processes.append(model)
        await wait_http_ready(model, f"http://{addresses['demo_model']}")
        write_codex_home(stack.codex_home, f"http://{addresses['demo_model']}/v1")
        settings = CodexRunSettings(
            codex_bin=stack.codex_bin, codex_home=stack.codex_home, extra_env=demo_model_environment()
        )
        for index in range(THREADS):
            folder = stack.workspaces / f"repository-{index:02d}"
            folder.mkdir(parents=True)
            stack.sessions.append(await create_codex_thread(folder, "start", settings))
        for name in SERVICES:
            stack.processes.append(
                start_service(f"group_{name}", f"services.{name}", environment, LOGS, None)
            )
        for process, name in zip(stack.processes[1:], SERVICES, strict=True):
            await wait_grpc(process, addresses[name])
        gateway = start_service("group_gateway", "services.bff_gateway", environment, LOGS, None)
        stack.processes.append(gateway)
        await wait_http_ready(gateway, stack.gateway)
        worker = [
            *(sys.executable, "-m", "worker", "run", "--codex-home", str(stack.codex_home)),
            *("--worker-id", "worker-group-bench", "--node-id", "node-group-bench"),
            *("--codex-bin", str(stack.codex_bin), "--max-concurrent-tasks", str(slots)),
        ]
        token = TokenAuthority(SECRET).issue_worker("worker-group-bench", "node-group-bench")
        stack.processes.append(
            spawn(
                "group_worker",
                worker,
                {**environment, "BOSS_LOG_LEVEL": "DEBUG", "BOSS_WORKER_TOKEN": token},
                WORKER_LOG,
            )
        )
    except BaseException:
        stack.stop()
        raise
    return stack


class SummaryWatcher:
    """An SSE client of the gateway recording when each message of the group arrives."""

    def __init__(self, gateway: str, token: str, group: str) -> None:
        self.arrivals: list[tuple[float, dict[str, Any]]] = []
        self.opened = asyncio.Event()
        self._gateway, self._token, self._group = gateway, token, group
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
                    message = json.loads(line[6:])["message"]
                    if message["projectId"] == self._group:
                        self.arrivals.append((time.time(), message))

    async def wait_for(
        self, matches: Any, after: float, timeout: float = ROUND_TIMEOUT_S
    ) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            for arrived, message in self.arrivals:
                if arrived >= after and matches(message):
                    return arrived, message
            if time.monotonic() > deadline:
                raise RuntimeError("the summary did not arrive in time")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task


async def ready_group(http: httpx.AsyncClient, stack: Stack, timeout: float = 120.0) -> str:
    """The group of the ten threads once each is registered with its Codex references and budget."""
    deadline = time.monotonic() + timeout
    while True:
        pages = [await http.get(f"/api/v1/threads/{session}/context-summary") for session in stack.sessions]
        ready = [
            p
            for p in pages
            if p.status_code == 200 and p.json()["codex_thread_ref"] and p.json()["context"]["reported"]
        ]
        if len(ready) == THREADS:
            break
        for process in stack.processes:
            process.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ready)} of {THREADS} threads registered and reported")
        await asyncio.sleep(0.5)
    created = await http.post(
        "/api/v1/projects", json={"project_title": "Bench group", "thread_ids": stack.sessions}
    )
    created.raise_for_status()
    return str(created.json()["project_id"])


def codex_intervals(
    log_text: str, sessions: set[str], since: float, until: float
) -> list[tuple[float, float]]:
    """(start, end) epoch seconds of the worker's Codex runs on `sessions` that ended in the window."""
    intervals = []
    for line in log_text.splitlines():
        match = LOG_LINE.match(line)
        ended = CODEX_ENDED.match(match.group(2)) if match else None
        if match is None or ended is None or ended.group(1) not in sessions:
            continue
        end = log_instant(match.group(1))
        if since <= end <= until:
            intervals.append((end - float(ended.group(2)), end))
    return intervals


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


async def one_round(
    http: httpx.AsyncClient, watcher: SummaryWatcher, stack: Stack, group: str, index: int
) -> dict[str, Any]:
    """One message -> plan -> confirm -> summary; its timings and checks."""
    sent = await http.post(
        f"/api/v1/projects/{group}/messages",
        json={"text": f"round {index}: run the checks", "client_message_id": f"g-{uuid.uuid4().hex}"},
    )
    sent.raise_for_status()
    plan = sent.json()["dispatchPlan"]
    instructions = {target["threadId"]: target["instruction"] for target in plan["targets"]}
    started = time.time()
    confirmed = await http.post(f"/api/v1/dispatch-plans/{plan['planId']}/confirm")
    confirmed.raise_for_status()
    tasks = {task["taskId"] for task in confirmed.json()["tasks"]}
    summary_at, summary = await watcher.wait_for(
        lambda m: m["authorKind"] == "master" and "summarising" in m["text"], started
    )
    results = [(at, m) for at, m in watcher.arrivals if m["taskId"] in tasks and m["authorKind"] != "user"]
    last_result_at = max(at for at, _m in results)
    await asyncio.sleep(0.3)  # the worker's last log lines
    intervals = codex_intervals(
        WORKER_LOG.read_text(errors="replace"), set(stack.sessions), started, summary_at + 1
    )
    codex = union_seconds(intervals)
    total = summary_at - started
    ok = (
        len(plan["targets"]) == THREADS
        and len(tasks) == THREADS
        and len(results) == THREADS
        and all(
            m["authorKind"] == "thread" and m["text"] == reply_text(instructions[m["threadId"]])
            for _a, m in results
        )
        and f"{THREADS} of {THREADS} threads answered" in summary["text"]
        and len(intervals) == THREADS
    )
    return {
        "total_s": round(total, 3),
        "codex_s": round(codex, 3),
        "boss_s": round(total - codex, 3),
        "summary_s": round(summary_at - last_result_at, 3),
        "targets": len(plan["targets"]),
        "left_out": sorted({left["reason"] for left in plan["leftOut"]})[:3],
        "codex_runs": len(intervals),
        "codex_run_s_mean": round(statistics.mean(end - start for start, end in intervals), 3)
        if intervals
        else None,
        "verified": ok,
    }


async def run(url: str, rounds: int, slots: int) -> dict[str, Any]:
    busy = await wait_for_quiet(30.0)
    prepare_database(url)
    stack = await start_stack(url, slots)
    token = TokenAuthority(SECRET).issue_client(OWNER)
    try:
        async with httpx.AsyncClient(
            base_url=stack.gateway, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as http:
            group = await ready_group(http, stack)
            watcher = SummaryWatcher(stack.gateway, token, group)
            await watcher.start()
            try:
                measured = [await one_round(http, watcher, stack, group, index) for index in range(rounds)]
            finally:
                await watcher.close()
    finally:
        stack.stop()
    kept = measured[1:] or measured

    def median(name: str) -> float:
        return round(statistics.median(entry[name] for entry in kept), 3)

    return {
        "threads": THREADS,
        "slots": slots,
        "rounds_measured": len(kept),
        "total_s_median": median("total_s"),
        "codex_s_median": median("codex_s"),
        "boss_s_median": median("boss_s"),
        "summary_s_median": median("summary_s"),
        "rounds": measured,
        "verified": all(entry["verified"] for entry in measured),
        "python_speed_reference_ms": round(python_speed_reference(), 1),
        "background_busy_cores_before_run": busy,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints it, writes bench/output/group.json."""
    parser = argparse.ArgumentParser(prog="python -m bench.group_bench")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the first is a warm-up)")
    parser.add_argument("--slots", type=int, default=2, help="the worker's --max-concurrent-tasks")
    parser.add_argument(
        "--database-url", default=os.environ.get("BOSS_BENCH_GROUP_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--quick", action="store_true", help="two rounds")
    arguments = parser.parse_args(argv)
    try:
        results = asyncio.run(
            run(arguments.database_url, 2 if arguments.quick else max(2, arguments.rounds), arguments.slots)
        )
    except Exception as error:
        print(f"group_bench: the run broke: {error}", file=sys.stderr)
        return 2
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(results, indent=2) + "\n")
    for name, value in results.items():
        print(f"{name:34} {value}")
    return 0 if results["verified"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
