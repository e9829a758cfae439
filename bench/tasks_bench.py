"""Task benchmark (issue 12 "Performance"): enqueue -> claim latency, and draining 1,000 tasks.

Processes, all on this machine: one or two real schedulers (`python -m services.scheduler serve`,
PostgreSQL database `bench_tasks`, created when missing, schema `scheduler` **dropped first**,
`BOSS_MIGRATE_ON_START=true`), a stand-in process serving conversations' `WatchEvents` (the
`task.requested` envelopes this benchmark publishes, as conversations would after committing a
user message) and an empty context_budget stream, this process as the latency phases' agent (raw
ClaimTask / StartTask / FinishTask calls, so each claim is timed on its own), and, for each drain,
a process of its own running 10 real local agents (`worker.local_agent.agent_loop.LocalAgent`, as
on separate devices: one per node, each with its own gRPC channel and worker token).

Phases:

1. `enqueue_to_claim`: an agent waits in `ClaimTask(wait_seconds=10)` on the scheduler that
   consumes conversations' stream; the benchmark publishes one `task.requested` for its node. The
   claim returning is timed from (a) the task's `created_at`, the database time at which the
   scheduler's enqueue transaction began (so it includes that transaction and its commit), and
   (b) the publish on the stand-in (also the stream hop into the scheduler). The agent then starts
   and finishes the task and waits again; 300 samples (`--quick` 60). Target: p50 <= 10 ms,
   p99 <= 50 ms.
2. `enqueue_to_claim_other_process`: the same with the agent waiting on a second scheduler
   process that does not consume conversations' stream (its stand-in stream is empty), so only
   LISTEN/NOTIFY can wake it: the enqueue commits in the first process.
3. `drain_1000_one_process`: the agents' process starts 10 local agents (nodes 0-9) and makes one
   `ClaimTask(wait_seconds=0)` per node (the node's presence, as an agent already polling would
   have recorded); then 1,000 tasks are queued (10 nodes x 10 threads x 10 tasks, each thread's
   tasks in order); then the agents run (`LocalAgent.run`, `--slots` claim slots each, default 10:
   one per thread with queued work on the node, the most turns the scheduler lets one node run at
   once; the product default is 2), each slot claim -> start -> no-op turn replying at once ->
   finish (completed), all on the first scheduler; timed from the agents' start to the last
   accepted finish (the agent's own "finished: completed" log line). Verified: every task's turn
   ran exactly once and every task was finished exactly once (the agents' own counts), no warning
   or error logged by the agents, every row completed with attempt 1, each thread's tasks ran one
   after the other in order, and 4 `task.status_changed` events per task; also recorded: how many
   transactions published them. Target: >= 500 tasks/s.
4. `drain_1000_one_process_default_slots`: the same with the product default of 2 slots per agent.
5. `drain_1000_two_replicas`: the same as 3 with the agents spread over both scheduler processes
   (the production overlay runs two replicas), for comparison.

Waits (up to 30 s) for an idle machine first and records what it saw; records per phase the cores
kept busy by each scheduler, the agents' process (`agents`; in the latency phases this process,
`bench`), the stand-in, PostgreSQL, the whole machine, and `cores_other`, what nobody of ours
used (other programs, and the kernel's loopback work), and `cores_steal` (CPU the hypervisor gave
to other guests): compare runs only where both are near 0. And `python_speed_reference_ms`: this
machine's speed drifted by 1.5x between runs. Results: bench/output/tasks.json; service logs and
the agents' warnings: bench/output/logs/.

Run: `PYTHONPATH=.:gen .venv/bin/python -m bench.tasks_bench [--quick] [--drain-only] [--slots N]
[--database-url URL] [--profile]` (`--profile`: the first scheduler runs under cProfile, its
profile in bench/output/profile/tasks_scheduler.prof; its numbers then include the profiler's
overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import logging
import multiprocessing
import os
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import psycopg
from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.ingest_bench import (
    CLOCK_TICKS,
    ServiceProcess,
    free_port,
    libpq_url,
    machine_cpu_seconds,
    percentiles_ms,
    postgres_cpu_seconds,
    process_cpu_seconds,
    python_speed_reference,
    start_service,
    wait_for_quiet,
)
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.time import to_timestamp, utc_now
from worker.local_agent.agent_loop import CHANNEL_OPTIONS as AGENT_CHANNEL_OPTIONS
from worker.local_agent.agent_loop import DEFAULT_MAX_CONCURRENT_TASKS, LocalAgent
from worker.local_agent.outcomes import TurnOutcome

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "bench" / "output" / "tasks.json"
LOGS = ROOT / "bench" / "output" / "logs"
PROFILES = ROOT / "bench" / "output" / "profile"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_tasks"
SERVICE_NAME = "boss.scheduler.v1.SchedulerService"
SECRET = "bench-secret-for-the-task-benchmark-0123456789"
TARGET_P50_MS = 10.0
TARGET_P99_MS = 50.0
TARGET_TASKS_PER_SECOND = 500.0
DRAIN_NODES = 10
DRAIN_THREADS_PER_NODE = 10
DRAIN_TASKS_PER_THREAD = 10
DRAIN_SLOTS = DRAIN_THREADS_PER_NODE
"""Claim slots per local agent in the drain: one per thread with queued work on its node, the most
turns the scheduler lets one node run at once (one active task per thread); more would only wait."""
AGENT_LOGGER = "worker.local_agent.agent_loop"
AGENT_FINISHED_LINE = "task %s finished: completed in %.1f s"
"""The local agent's log line for a finish the scheduler accepted as completed."""


# --------------------------------------------------------------------------------------------
# The conversations stand-in (its own process)


class ConversationsStream(conversations_pb2_grpc.ConversationsServiceServicer):
    """Serves a growing list of envelopes on WatchEvents in runs of up to 500."""

    def __init__(self) -> None:
        self.events: list[events_pb2.EventEnvelope] = []
        self._grown = asyncio.Event()

    def publish(self, envelopes: list[events_pb2.EventEnvelope]) -> None:
        self.events.extend(envelopes)
        self._grown.set()

    async def WatchEvents(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cursor = request.after_sequence
        while True:
            if cursor < len(self.events):
                run = self.events[cursor : cursor + 500]
                yield conversations_pb2.WatchEventsResponse(events=run)
                cursor += len(run)
                continue
            self._grown.clear()
            await self._grown.wait()


class SilentBudgetStream(context_budget_pb2_grpc.ContextBudgetServiceServicer):
    """context_budget's WatchEvents with nothing to say (the schedulers follow it)."""

    async def WatchEvents(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await asyncio.Event().wait()
        yield context_budget_pb2.WatchEventsResponse()


def serve_stand_in(control: Connection) -> None:
    """Entry point of the stand-in process: serves conversations' stream (the published events)
    and context_budget's (silent) on one port, an empty conversations stream on a second; sends
    both ports back over `control`, then appends every list of serialized envelopes received;
    None stops it."""

    async def serve() -> None:
        stream, empty = ConversationsStream(), ConversationsStream()
        servers = []
        ports = []
        for servicer in (stream, empty):
            server = grpc.aio.server()
            conversations_pb2_grpc.add_ConversationsServiceServicer_to_server(servicer, server)
            context_budget_pb2_grpc.add_ContextBudgetServiceServicer_to_server(SilentBudgetStream(), server)
            ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            servers.append(server)
        control.send(ports)
        loop = asyncio.get_running_loop()
        while (message := await loop.run_in_executor(None, control.recv)) is not None:
            stream.publish([events_pb2.EventEnvelope.FromString(raw) for raw in message])
        for server in servers:
            await server.stop(0)

    asyncio.run(serve())


class StandIn:
    """The parent's handle on the stand-in process."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._control, child = context.Pipe()
        self._process = context.Process(target=serve_stand_in, args=(child,), daemon=True)
        self._process.start()
        self.port, self.empty_port = self._control.recv()
        self.pid = int(self._process.pid or 0)
        self._sequence = 0

    def publish(self, payloads: list[dict[str, Any]]) -> float:
        """Publishes `task.requested` events; returns the perf_counter instant of the send."""
        envelopes = []
        for payload in payloads:
            self._sequence += 1
            envelopes.append(
                events_pb2.EventEnvelope(
                    sequence=self._sequence,
                    type="task.requested",
                    occurred_at=to_timestamp(utc_now()),
                    thread_id=payload["target_thread_id"],
                    project_id=payload["project_id"],
                    node_id=payload["device_id"],
                    payload_json=json.dumps(payload),
                ).SerializeToString()
            )
        sent = time.perf_counter()
        self._control.send(envelopes)
        return sent

    def stop(self) -> None:
        self._control.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


BENCH_OWNER = "bench-owner"
"""The owner of the benchmark's tasks (its agents' worker tokens act for it)."""


def task_request(task_id: str, thread: str, node: str) -> dict[str, Any]:
    """A `task.requested` payload as conversations publishes it."""
    return {
        "owner_id": BENCH_OWNER,
        "task_id": task_id,
        "task_type": "conversation_reply",
        "project_id": f"project-{thread}",
        "target_project_id": f"project-{thread}",
        "target_thread_id": thread,
        "device_id": node,
        "codex_folder_ref": "/home/dev/repo",
        "codex_thread_ref": f"0199-{thread}",
        "request_message_id": f"message-{task_id}",
        "instruction_text": "run the tests and tell me what failed",
        "retry_of_task_id": "",
        "dispatch_plan_id": "",
    }


# --------------------------------------------------------------------------------------------
# Database and processes


def prepare_database(url: str) -> None:
    """Creates the benchmark database when missing and drops its `scheduler` schema."""
    server, _, name = libpq_url(url).rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            connection.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(libpq_url(url), autocommit=True) as connection:
        connection.execute('DROP SCHEMA IF EXISTS "scheduler" CASCADE')


def start_scheduler(
    name: str, url: str, conversations_port: int, budget_port: int, profile_dir: Path | None = None
) -> tuple[ServiceProcess, str]:
    """Starts one scheduler process (under cProfile when `profile_dir` is given); returns it and
    its address."""
    LOGS.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'gen'}",
        "BOSS_SCHEDULER_DATABASE_URL": url,
        "BOSS_SCHEDULER_LISTEN": address,
        "BOSS_AUTH_SECRET": SECRET,
        "BOSS_MIGRATE_ON_START": "true",
        "BOSS_CONTEXT_BUDGET_ADDRESS": f"127.0.0.1:{budget_port}",
        "BOSS_CONVERSATIONS_ADDRESS": f"127.0.0.1:{conversations_port}",
        "BOSS_DATA_DIR": str(ROOT / "bench" / "output" / "data"),
    }
    return start_service(name, "services.scheduler", env, LOGS, profile_dir), address


async def wait_serving(service: ServiceProcess, address: str, timeout: float = 90.0) -> None:
    """Waits until the scheduler's gRPC health check answers SERVING."""
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


async def wait_until_queued(url: str, prefix: str, count: int, timeout: float = 60.0) -> None:
    """Waits until `count` tasks whose id starts with `prefix` are stored."""
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True) as connection:
        while time.monotonic() < deadline:
            cursor = await connection.execute(
                "SELECT count(*) FROM scheduler.tasks WHERE task_id LIKE %s", (f"{prefix}%",)
            )
            row = await cursor.fetchone()
            if row is not None and row[0] >= count:
                return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{count} {prefix} tasks not stored after {timeout:.0f} s")


# --------------------------------------------------------------------------------------------
# Agents


class Agent:
    """The latency phases' agent: raw task calls on one channel with one worker token for its node
    (the drains run the real local agent instead: `run_agents`)."""

    def __init__(self, address: str, authority: TokenAuthority, node: str) -> None:
        self.node, self.worker = node, f"worker-{node}"
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.metadata = bearer_metadata(authority.issue_worker(self.worker, node, owner_id=BENCH_OWNER))
        self.started: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()

    async def claim(self, wait: float) -> pb.ClaimTaskResponse:
        request = pb.ClaimTaskRequest(worker_id=self.worker, node_id=self.node, wait_seconds=wait)
        return await self.stub.ClaimTask(request, metadata=self.metadata)

    async def run(self, task: pb.Task, lease_id: str) -> None:
        """Starts and finishes `task` (completed; the run itself is a no-op)."""
        await self.stub.StartTask(
            pb.StartTaskRequest(
                worker_id=self.worker, node_id=self.node, task_id=task.task_id, lease_id=lease_id
            ),
            metadata=self.metadata,
        )
        self.started[task.task_id] += 1
        await self.stub.FinishTask(
            pb.FinishTaskRequest(
                worker_id=self.worker,
                node_id=self.node,
                task_id=task.task_id,
                lease_id=lease_id,
                status=pb.TASK_STATUS_COMPLETED,
                reply_text="done: nothing to change",
            ),
            metadata=self.metadata,
        )
        self.finished[task.task_id] += 1

    async def close(self) -> None:
        await self.channel.close()


# --------------------------------------------------------------------------------------------
# The drain's local agents (their own process)


@dataclass(frozen=True)
class DrainPlan:
    """What the agents' process runs: `nodes` real local agents, agent i on `addresses[i % n]`, each
    with `slots` claim slots, until `tasks` tasks finished (or no task finished for `stall_seconds`);
    their warnings and errors go to `log_path`."""

    addresses: tuple[str, ...]
    secret: str
    prefix: str
    nodes: int
    tasks: int
    slots: int
    log_path: str
    stall_seconds: float = 10.0


class FinishedTasks(logging.Handler):
    """Reads the local agents' own log records: the tasks each finished (the agent logs one line per
    finish the scheduler accepted), the instant of the last, and how many warnings and errors were
    logged (a lease lost, a call refused or retried, a run that raised)."""

    def __init__(self, expected: int) -> None:
        super().__init__(logging.INFO)
        self.expected = expected
        self.finished: Counter[str] = Counter()
        self.problems = 0
        self.last_at = 0.0
        self.all_finished = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.problems += 1
        elif record.msg == AGENT_FINISHED_LINE and record.args:
            self.finished[str(record.args[0])] += 1  # type: ignore[index]
            self.last_at = time.perf_counter()
            if self.finished.total() >= self.expected:
                self.all_finished.set()


def serve_agents(plan: DrainPlan, control: Connection) -> None:
    """Entry point of the agents' process (a device fleet on one machine): see `run_agents`."""
    asyncio.run(run_agents(plan, control))


async def run_agents(plan: DrainPlan, control: Connection) -> None:
    """Builds one `LocalAgent` per node (its own channel, options as the worker's, and its own
    worker token, fixed as a device's configured token is; a no-op turn that replies at once),
    makes one `ClaimTask(wait_seconds=0)` per node (its presence, so its tasks are queued as for a
    device online), sends "present", waits for "go", runs the agents until every task finished,
    sends {"seconds", "complete"} at once, stops the agents (as on SIGTERM) and sends
    {"started", "finished", "problems"}."""
    counter = FinishedTasks(plan.tasks)
    agent_log = logging.getLogger(AGENT_LOGGER)
    agent_log.setLevel(logging.INFO)
    agent_log.addHandler(counter)
    problems_file = logging.FileHandler(plan.log_path)
    problems_file.setLevel(logging.WARNING)
    problems_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(problems_file)
    started_turns: Counter[str] = Counter()

    async def no_op_turn(task: pb.Task, cancel: asyncio.Event) -> TurnOutcome:
        started_turns[task.task_id] += 1
        return TurnOutcome.replied("done: nothing to change")

    authority = TokenAuthority(plan.secret)
    channels, agents = [], []
    for node in range(plan.nodes):
        node_id = f"{plan.prefix}-node-{node}"
        worker_id = f"worker-{node_id}"
        token = authority.issue_worker(worker_id, node_id, owner_id=BENCH_OWNER)
        address = plan.addresses[node % len(plan.addresses)]
        channel = grpc.aio.insecure_channel(address, options=AGENT_CHANNEL_OPTIONS)
        channels.append(channel)
        await scheduler_pb2_grpc.SchedulerServiceStub(channel).ClaimTask(
            pb.ClaimTaskRequest(worker_id=worker_id, node_id=node_id, wait_seconds=0),
            metadata=bearer_metadata(token),
        )
        agents.append(
            LocalAgent(
                scheduler_address=address,
                token=functools.partial(str, token),
                worker_id=worker_id,
                node_id=node_id,
                run_turn=no_op_turn,
                max_concurrent_tasks=plan.slots,
                channel=channel,
            )
        )
    loop = asyncio.get_running_loop()
    control.send("present")
    await loop.run_in_executor(None, control.recv)
    stop = asyncio.Event()
    started = time.perf_counter()
    runs = [asyncio.create_task(agent.run(stop)) for agent in agents]
    seen = -1
    while not counter.all_finished.is_set() and counter.finished.total() > seen:
        seen = counter.finished.total()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(counter.all_finished.wait(), plan.stall_seconds)
    complete = counter.all_finished.is_set()
    control.send(
        {"seconds": (counter.last_at if complete else time.perf_counter()) - started, "complete": complete}
    )
    stop.set()
    await asyncio.wait_for(asyncio.gather(*runs), 30)
    for channel in channels:
        await channel.close()
    control.send(
        {"started": dict(started_turns), "finished": dict(counter.finished), "problems": counter.problems}
    )


class AgentsProcess:
    """The parent's handle on the agents' process."""

    def __init__(self, plan: DrainPlan) -> None:
        context = multiprocessing.get_context("spawn")
        self._control, child = context.Pipe()
        self._process = context.Process(target=serve_agents, args=(plan, child), daemon=True)
        self._process.start()
        self.pid = int(self._process.pid or 0)

    def _receive(self, timeout: float) -> Any:
        if not self._control.poll(timeout):
            raise RuntimeError(f"the agents' process did not answer within {timeout:.0f} s")
        return self._control.recv()

    def wait_present(self) -> None:
        """Waits until every agent made its first claim (its node is present)."""
        if self._receive(60.0) != "present":
            raise RuntimeError("the agents' process did not report its nodes present")

    def go(self) -> None:
        """Starts the agents."""
        self._control.send("go")

    def wait_done(self) -> dict[str, Any]:
        """{"seconds": from the agents' start to the last finish, "complete": all finished}."""
        return dict(self._receive(300.0))

    def report(self) -> dict[str, Any]:
        """{"started": {task_id: turns run}, "finished": {task_id: finishes}, "problems": count}."""
        return dict(self._receive(60.0))

    def stop(self) -> None:
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, of every postgres process, and of the whole
    machine (`machine`), with the perf_counter instant of the sample (`at`)."""
    return {
        **{name: process_cpu_seconds(pid) for name, pid in pids.items()},
        "postgres": postgres_cpu_seconds(),
        "machine": machine_cpu_seconds()[0],
        "steal": steal_cpu_seconds(),
        "at": time.perf_counter(),
    }


def steal_cpu_seconds() -> float:
    """CPU seconds the hypervisor gave to other guests while this machine wanted to run (the
    `steal` column of /proc/stat): time no process of this machine sees as its own."""
    values = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return int(values[7]) / CLOCK_TICKS if len(values) > 7 else 0.0


def _cores(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Cores each party kept busy between two samples, the whole machine's, `cores_other` (what
    nobody of ours used: other programs, and the kernel's loopback work) and `cores_steal` (taken
    by the hypervisor)."""
    seconds = max(after["at"] - before["at"], 1e-9)
    cores = {
        f"cores_{name}": round((after[name] - value) / seconds, 2)
        for name, value in before.items()
        if name != "at"
    }
    ours = sum(value for name, value in cores.items() if name not in {"cores_machine", "cores_steal"})
    cores["cores_other"] = round(max(0.0, cores["cores_machine"] - ours), 2)
    return cores


async def bench_latency(
    stand_in: StandIn, agent: Agent, samples: int, label: str, pids: dict[str, int]
) -> dict[str, Any]:
    """Phases 1 and 2: `samples` enqueues, each while the agent's claim is waiting."""
    from_created: list[float] = []
    from_publish: list[float] = []
    cpu_before = _cpu(pids)
    for index in range(samples):
        waiting = asyncio.create_task(agent.claim(10.0))
        await asyncio.sleep(0.02)
        if waiting.done():
            raise RuntimeError(f"{label}: the claim answered before any enqueue: {waiting.result()}")
        task_id = f"{label}-{index:04d}"
        published = stand_in.publish([task_request(task_id, f"{label}-thread-{index:04d}", agent.node)])
        response = await waiting
        arrived, wall = time.perf_counter(), time.time()
        if response.task.task_id != task_id:
            raise RuntimeError(f"{label}: expected {task_id}, claimed {response.task.task_id or 'nothing'}")
        created = response.task.created_at.seconds + response.task.created_at.nanos / 1e9
        from_created.append(wall - created)
        from_publish.append(arrived - published)
        await agent.run(response.task, response.lease_id)
    created_ms = percentiles_ms(from_created)
    return {
        "samples": samples,
        "from_enqueue_transaction_start": created_ms,
        "from_publish_on_conversations_stream": percentiles_ms(from_publish),
        "target_p50_ms": TARGET_P50_MS,
        "target_p99_ms": TARGET_P99_MS,
        "met": created_ms["p50_ms"] <= TARGET_P50_MS and created_ms["p99_ms"] <= TARGET_P99_MS,
        **_cores(cpu_before, _cpu(pids)),
    }


async def bench_drain(
    stand_in: StandIn,
    addresses: list[str],
    url: str,
    pids: dict[str, int],
    prefix: str,
    slots: int,
) -> dict[str, Any]:
    """Phases 3-5: 1,000 queued tasks drained by 10 real local agents (`LocalAgent`, `slots` claim
    slots each, a no-op turn) in their own process, agent i on the scheduler at address i mod n
    (as a Service spreads connections over replicas)."""
    payloads = [
        task_request(
            f"{prefix}-{node}-{thread}-{position}",
            f"{prefix}-thread-{node}-{thread}",
            f"{prefix}-node-{node}",
        )
        for position in range(DRAIN_TASKS_PER_THREAD)
        for node in range(DRAIN_NODES)
        for thread in range(DRAIN_THREADS_PER_NODE)
    ]
    plan = DrainPlan(
        addresses=tuple(addresses),
        secret=SECRET,
        prefix=prefix,
        nodes=DRAIN_NODES,
        tasks=len(payloads),
        slots=slots,
        log_path=str(LOGS / f"tasks_agents_{prefix}.log"),
    )
    agents = AgentsProcess(plan)
    try:
        agents.wait_present()
        stand_in.publish(payloads)
        await wait_until_queued(url, f"{prefix}-", len(payloads))
        watched = {**pids, "agents": agents.pid}
        cpu_before = _cpu(watched)
        agents.go()
        done = await asyncio.get_running_loop().run_in_executor(None, agents.wait_done)
        cpu_after = _cpu(watched)
        report = await asyncio.get_running_loop().run_in_executor(None, agents.report)
    finally:
        agents.stop()
    seconds = float(done["seconds"])
    verification = await verify_drain(
        url, prefix, {p["task_id"] for p in payloads}, Counter(report["started"]), Counter(report["finished"])
    )
    verification["agent_warnings_and_errors"] = report["problems"]
    verification["ok"] = verification["ok"] and not report["problems"] and done["complete"]
    rate = len(payloads) / seconds
    return {
        "tasks": len(payloads),
        "agents": DRAIN_NODES,
        "max_concurrent_tasks": slots,
        "scheduler_processes": len(addresses),
        "complete": done["complete"],
        "seconds": round(seconds, 3),
        "tasks_per_second": round(rate, 1),
        "target_tasks_per_second": TARGET_TASKS_PER_SECOND,
        "met": rate >= TARGET_TASKS_PER_SECOND and verification["ok"],
        "verification": verification,
        **_cores(cpu_before, cpu_after),
    }


async def verify_drain(
    url: str, prefix: str, task_ids: set[str], started: Counter[str], finished: Counter[str]
) -> dict[str, Any]:
    """Every task ran exactly once, completed with attempt 1, in order within its thread, with its
    four status events."""
    async with await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True) as connection:
        cursor = await connection.execute(
            "SELECT task_id, target_thread_id, status, attempt, started_at, finished_at FROM scheduler.tasks "
            "WHERE task_id LIKE %s ORDER BY id",
            (f"{prefix}-%",),
        )
        rows = await cursor.fetchall()
        events = await connection.execute(
            "SELECT count(*), count(DISTINCT xmin::text) FROM scheduler.outbox_events "
            "WHERE event_type = 'task.status_changed' AND payload_json LIKE %s",
            (f'%"task_id":"{prefix}-%',),
        )
        event_row = await events.fetchone()
    by_thread: dict[str, list[tuple[Any, Any]]] = {}
    for _task_id, thread, _status, _attempt, started_at, finished_at in rows:
        by_thread.setdefault(thread, []).append((started_at, finished_at))
    in_order = all(
        later[0] >= earlier[1] for runs in by_thread.values() for earlier, later in itertools.pairwise(runs)
    )
    checks = {
        "rows": len(rows),
        "completed_with_attempt_1": sum(1 for row in rows if row[2] == "completed" and row[3] == 1),
        "started_exactly_once": sum(1 for task_id in task_ids if started[task_id] == 1),
        "finished_exactly_once": sum(1 for task_id in task_ids if finished[task_id] == 1),
        "unexpected_tasks_run": len(set(started) - task_ids),
        "threads_in_order": in_order,
        "status_events": event_row[0] if event_row else 0,
        "transactions_publishing_them": event_row[1] if event_row else 0,
    }
    expected = len(task_ids)
    checks["ok"] = (
        checks["rows"] == expected
        and checks["completed_with_attempt_1"] == expected
        and checks["started_exactly_once"] == expected
        and checks["finished_exactly_once"] == expected
        and checks["unexpected_tasks_run"] == 0
        and in_order
        and checks["status_events"] == 4 * expected
    )
    return checks


async def run(url: str, samples: int, profile: bool = False, slots: int = DRAIN_SLOTS) -> dict[str, Any]:
    """Every phase against fresh scheduler processes (the first under cProfile with `profile`), the
    drains' agents with `slots` claim slots each (and once with the product default)."""
    background = await wait_for_quiet(30.0)
    prepare_database(url)
    stand_in = StandIn()
    authority = TokenAuthority(SECRET)
    profile_dir = PROFILES if profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    first, first_address = start_scheduler("tasks_scheduler", url, stand_in.port, stand_in.port, profile_dir)
    services = [first]
    try:
        await wait_serving(first, first_address)
        second, second_address = start_scheduler("tasks_scheduler_2", url, stand_in.empty_port, stand_in.port)
        services.append(second)
        await wait_serving(second, second_address)
        pids = {
            "scheduler": first.pid,
            "scheduler_2": second.pid,
            "bench": os.getpid(),
            "stand_in": stand_in.pid,
        }
        latency: dict[str, Any] = {}
        if samples:
            agent = Agent(first_address, authority, "latency-node")
            latency["enqueue_to_claim"] = await bench_latency(stand_in, agent, samples, "same", pids)
            await agent.close()
            agent = Agent(second_address, authority, "notify-node")
            latency["enqueue_to_claim_other_process"] = await bench_latency(
                stand_in, agent, samples, "other", pids
            )
            await agent.close()
        one = await bench_drain(stand_in, [first_address], url, pids, "drain1", slots)
        default = await bench_drain(
            stand_in, [first_address], url, pids, "drain1d", DEFAULT_MAX_CONCURRENT_TASKS
        )
        two = await bench_drain(stand_in, [first_address, second_address], url, pids, "drain2", slots)
    finally:
        for service in services:
            service.stop()
        stand_in.stop()
    return {
        "database": url.split("@")[-1],
        "background_busy_cores_before_run": background,
        "python_speed_reference_ms": python_speed_reference(),
        **latency,
        "drain_1000_one_process": one,
        "drain_1000_one_process_default_slots": default,
        "drain_1000_two_replicas": two,
    }


def main(argv: list[str] | None = None) -> int:
    """Runs the phases, prints and writes bench/output/tasks.json. 0 when the enqueue -> claim and
    the one-process drain targets were met and the drain verified; 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m bench.tasks_bench")
    parser.add_argument("--quick", action="store_true", help="60 latency samples instead of 300")
    parser.add_argument(
        "--database-url", default=os.environ.get("BOSS_BENCH_TASKS_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument(
        "--profile", action="store_true", help="the first scheduler under cProfile (bench/output/profile/)"
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=DRAIN_SLOTS,
        help=f"claim slots per local agent in the drains (default {DRAIN_SLOTS}; one drain also runs "
        f"with the product default, {DEFAULT_MAX_CONCURRENT_TASKS})",
    )
    parser.add_argument(
        "--drain-only", action="store_true", help="skip the enqueue -> claim phases (a drain's figures alone)"
    )
    arguments = parser.parse_args(argv)
    samples = 0 if arguments.drain_only else 60 if arguments.quick else 300
    results = asyncio.run(run(arguments.database_url, samples, arguments.profile, arguments.slots))
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    phases = (
        ("drain_1000_one_process",)
        if arguments.drain_only
        else ("enqueue_to_claim", "drain_1000_one_process")
    )
    met = all(results[phase]["met"] for phase in phases)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
