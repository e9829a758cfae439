"""The worker's local agent against the REAL scheduler over real gRPC, on SQLite and PostgreSQL.

Tasks come the way they do in production: `task.requested` events on a conversations stand-in's
`WatchEvents` stream, consumed by the scheduler's own consumer. The agent runs the real claim loop
(`worker.local_agent.agent_loop.LocalAgent`) with a stub turn runner in place of Codex (the Codex
runner has its own tests; one test at the end of test_local_agent_codex.py runs both together).
Leases are short here (about a second) so that heartbeats, lease expiry and the sweeper are
exercised within a test's few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc
from sqlalchemy import update

from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.tasks.model import TaskSettings
from services.scheduler.tasks.tables import tasks as tasks_table
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.harness import SECRET, BudgetStreamStandIn, start_upstream
from tests.integration.scheduler.tasks_harness import ConversationsStreamStandIn, task_request
from tests.integration.worker_runtime.support import eventually
from worker.agent import run_worker
from worker.local_agent.agent_loop import LocalAgent
from worker.local_agent.outcomes import TurnOutcome
from worker.settings import LocalAgentSettings, WorkerSettings

WORKER = "worker-a"
NODE = "node-a"
FAST = TaskSettings(
    claim_lease=timedelta(seconds=3),
    run_lease=timedelta(seconds=2),
    sweep_interval=timedelta(seconds=0.1),
)
"""Short leases, but not so short that a loaded machine (the scheduler runs in the test's own event
loop) delays a heartbeat past one: 0.9 s leases failed runs on a machine with a load of 6 on 2 cores."""
"""Short leases: the agent heartbeats every 0.3 s, the sweeper looks every 0.1 s."""
TEST_CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)
"""The test's own connection to the scheduler shares no reconnect state with the agent's."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SchedulerUnderTest:
    """A real scheduler (restartable on its port) following a conversations stand-in."""

    target: DatabaseTarget
    task_settings: TaskSettings
    conversations: ConversationsStreamStandIn
    conversations_port: int
    budget_port: int
    port: int
    authority: TokenAuthority = field(default_factory=lambda: TokenAuthority(SECRET))
    app: scheduler_server.SchedulerApp | None = None
    server: grpc.aio.Server | None = None
    background: list[asyncio.Future[None]] = field(default_factory=list)
    channel: grpc.aio.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Builds and starts the scheduler on `port`."""
        app = scheduler_server.build(
            database_url=self.target.url,
            listen=self.address,
            auth_secret=SECRET,
            context_budget_address=f"127.0.0.1:{self.budget_port}",
            conversations_address=f"127.0.0.1:{self.conversations_port}",
            settings=SchedulerSettings(redeliver_after=timedelta(hours=1)),
            task_settings=self.task_settings,
            schema=self.target.schema or "scheduler",
        )
        await app.event_log.ensure_sequencer_row()
        self.server, _health, _port = await app.host.start()
        self.background = [asyncio.ensure_future(factory()) for factory in app.host.background]
        if app.task_listener is not None:
            await asyncio.wait_for(app.task_listener.listening.wait(), 10)
        self.app = app
        self.channel = grpc.aio.insecure_channel(self.address, options=TEST_CHANNEL_OPTIONS)

    async def stop(self) -> None:
        """Stops the server, its background loops and its database connections."""
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
        for task in self.background:
            task.cancel()
        for task in self.background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.background = []
        if self.app is not None:
            await self.app.database.dispose()
            self.app = None

    def token(self, worker_id: str = WORKER, node_id: str = NODE) -> str:
        """A worker token of owner-1, the owner of the tasks `task_request` makes."""
        return self.authority.issue_worker(worker_id, node_id, owner_id="owner-1")

    async def request(
        self, task_id: str, text: str, *, thread: str = "thread-1", node: str = NODE, **fields: str
    ) -> None:
        """Publishes a `task.requested` (more payload `fields` as given) and waits until the
        scheduler created the task."""
        payload = task_request(task_id, thread=thread, node=node, text=text, **fields)
        sequence = await self.conversations.publish(payload)
        assert self.app is not None and self.app.task_consumer is not None
        await self.app.task_consumer.wait_for(sequence)

    async def get(self, task_id: str) -> pb.Task:
        """The task as GetTask answers a service token."""
        assert self.channel is not None
        stub = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        metadata = bearer_metadata(self.authority.issue_service("test"))
        return (await stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=metadata)).task

    async def statuses(self, task_id: str) -> list[str]:
        """The statuses of the task's committed `task.status_changed` events, in order."""
        assert self.app is not None
        stored = await self.app.event_log.read_after(0, types=["task.status_changed"])
        return [event.payload["status"] for event in stored if event.payload["task_id"] == task_id]

    async def is_terminal(self, task_id: str) -> bool:
        return (await self.get(task_id)).status >= pb.TASK_STATUS_COMPLETED

    async def expire_lease(self, task_id: str) -> None:
        """Sets the task's lease to have run out (as when its agent stopped answering)."""
        assert self.app is not None
        async with self.app.database.transaction() as connection:
            await connection.execute(
                update(tasks_table)
                .where(tasks_table.c.task_id == task_id)
                .values(lease_expires_at=utc_now() - timedelta(seconds=5))
            )


@contextlib.asynccontextmanager
async def scheduler_for(
    target: DatabaseTarget, task_settings: TaskSettings = FAST, *, started: bool = True
) -> AsyncIterator[SchedulerUnderTest]:
    """A migrated scheduler on a free port (started unless `started` is False) with its stand-ins."""
    conversations = ConversationsStreamStandIn()
    conversations_server = grpc.aio.server()
    conversations_pb2_grpc.add_ConversationsServiceServicer_to_server(conversations, conversations_server)
    conversations_port = conversations_server.add_insecure_port("127.0.0.1:0")
    await conversations_server.start()
    budget_server, budget_port = await start_upstream(BudgetStreamStandIn())
    await scheduler_server.migrate(target.url, target.schema or "scheduler")
    scheduler = SchedulerUnderTest(
        target, task_settings, conversations, conversations_port, budget_port, free_port()
    )
    if started:
        await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()
        await conversations_server.stop(0)
        await budget_server.stop(0)


class StubTurns:
    """A turn runner standing in for Codex: replies "reply to: <text>" with session "session-<task>".

    A message listed in `gates` waits until its gate is set (or the run is cancelled); a cancelled
    run answers failure `interrupted`. Records every run's start, end and whether it saw its cancel.
    """

    def __init__(self, *gated: str, hold_s: float = 0.0) -> None:
        self.gates = {text: asyncio.Event() for text in gated}
        self.hold_s = hold_s
        self.log: list[str] = []
        self.cancelled: list[str] = []

    def release(self, text: str) -> None:
        self.gates[text].set()

    async def __call__(self, task: pb.Task, cancel: asyncio.Event) -> TurnOutcome:
        self.log.append(f"start {task.task_id}")
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(cancel.wait())]
        if task.instruction_text in self.gates:
            waits.append(asyncio.ensure_future(self.gates[task.instruction_text].wait()))
        elif self.hold_s:
            waits.append(asyncio.ensure_future(asyncio.sleep(self.hold_s)))
        if len(waits) > 1:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waits:
            waiter.cancel()
        self.log.append(f"end {task.task_id}")
        if cancel.is_set():
            self.cancelled.append(task.task_id)
            return TurnOutcome.failed("interrupted", "stopped by its cancel", f"session-{task.task_id}")
        return TurnOutcome.replied(f"reply to: {task.instruction_text}", f"session-{task.task_id}")

    @property
    def started(self) -> list[str]:
        return [entry.removeprefix("start ") for entry in self.log if entry.startswith("start ")]


@dataclass
class AgentRun:
    agent: LocalAgent
    stop: asyncio.Event
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_agent(
    scheduler: SchedulerUnderTest,
    turns: StubTurns,
    *,
    node_id: str = NODE,
    worker_id: str = WORKER,
    slots: int = 2,
    cancel_grace_s: float = 5.0,
    on_stopped: Callable[[], Awaitable[None]] | None = None,
    prepare_turn: Callable[[pb.Task], None] | None = None,
) -> AsyncIterator[AgentRun]:
    """A LocalAgent claiming from `scheduler` until the block ends (then stopped, as on SIGTERM)."""
    agent = LocalAgent(
        scheduler_address=scheduler.address,
        token=lambda: scheduler.token(worker_id, node_id),
        worker_id=worker_id,
        node_id=node_id,
        run_turn=turns,
        max_concurrent_tasks=slots,
        claim_wait_s=5.0,
        cancel_grace_s=cancel_grace_s,
        on_stopped=on_stopped,
        prepare_turn=prepare_turn,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield AgentRun(agent, stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_task_is_claimed_started_heartbeated_and_finished_once(
    database_target: DatabaseTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.local_agent.agent_loop")
    turns = StubTurns("hello")
    async with scheduler_for(database_target) as scheduler, running_agent(scheduler, turns):
        await scheduler.request("task-1", "hello")
        await eventually(lambda: turns.started == ["task-1"], what="the turn to start")
        first = await scheduler.get("task-1")
        await eventually(
            lambda: _heartbeat_moved(scheduler, "task-1", first), what="a heartbeat to renew the lease"
        )
        turns.release("hello")
        await eventually(lambda: scheduler.is_terminal("task-1"), what="the task to finish")
        done = await scheduler.get("task-1")
        statuses = await scheduler.statuses("task-1")

    assert (done.status, done.reply_text, done.codex_session_id) == (
        pb.TASK_STATUS_COMPLETED,
        "reply to: hello",
        "session-task-1",
    )
    assert (done.attempt, done.worker_id, done.failure_kind) == (1, WORKER, pb.FAILURE_KIND_UNSPECIFIED)
    assert first.status == pb.TASK_STATUS_RUNNING
    assert _without_repeats(statuses) == ["queued", "claimed", "running", "completed"]
    assert statuses.count("completed") == 1
    assert turns.log == ["start task-1", "end task-1"]
    lines = [record.getMessage() for record in caplog.records if "task-1" in record.getMessage()]
    assert lines[0] == "task task-1 claimed: thread thread-1, attempt 1"
    assert lines[1].startswith("task task-1 started: thread 0199-thread-1 in /home/dev/repo (lease ")
    assert lines[2].startswith("task task-1 finished: completed in ")


async def _heartbeat_moved(scheduler: SchedulerUnderTest, task_id: str, first: pb.Task) -> bool:
    now = await scheduler.get(task_id)
    return (
        now.HasField("heartbeat_at")
        and now.lease_expires_at.ToDatetime() > first.lease_expires_at.ToDatetime()
    )


def _without_repeats(statuses: list[str]) -> list[str]:
    """The statuses with consecutive repeats (a queued task's detail updates) folded."""
    return [status for index, status in enumerate(statuses) if index == 0 or statuses[index - 1] != status]


async def test_a_turn_running_many_leases_long_keeps_its_lease_by_heartbeating(
    database_target: DatabaseTarget,
) -> None:
    turns = StubTurns(hold_s=6.5)
    async with scheduler_for(database_target) as scheduler, running_agent(scheduler, turns):
        await scheduler.request("task-long", "take your time")
        await eventually(lambda: scheduler.is_terminal("task-long"), what="the long task to finish")
        done = await scheduler.get("task-long")

    assert (done.status, done.reply_text, done.attempt) == (
        pb.TASK_STATUS_COMPLETED,
        "reply to: take your time",
        1,
    )
    run_s = (done.finished_at.ToDatetime() - done.started_at.ToDatetime()).total_seconds()
    assert run_s > 3 * FAST.run_lease.total_seconds()
    assert turns.cancelled == []


async def test_a_heartbeat_refused_as_lease_lost_cancels_the_run_and_does_not_finish(
    database_target: DatabaseTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.local_agent.agent_loop")
    turns = StubTurns("never released")
    async with scheduler_for(database_target) as scheduler, running_agent(scheduler, turns):
        await scheduler.request("task-lost", "never released")
        await eventually(lambda: turns.started == ["task-lost"], what="the turn to start")
        await scheduler.expire_lease("task-lost")
        await eventually(lambda: turns.cancelled == ["task-lost"], what="the run to be cancelled")
        await eventually(
            lambda: any("run stopped, this agent lost its lease" in r.getMessage() for r in caplog.records),
            what="the agent to give the task up",
        )
        lost = await scheduler.get("task-lost")
        statuses = await scheduler.statuses("task-lost")

    assert (lost.status, lost.failure_kind) == (pb.TASK_STATUS_FAILED, pb.FAILURE_KIND_DEVICE_LOST)
    assert lost.status_detail.startswith(f"the device {NODE} stopped answering at ")
    assert statuses[-2:] == ["running", "failed"]
    refused = [r.getMessage() for r in caplog.records if "heartbeat refused" in r.getMessage()]
    assert refused and refused[0].startswith("task task-lost: heartbeat refused, this agent no longer holds")
    assert not any("task task-lost finished" in r.getMessage() for r in caplog.records)


async def test_stopping_the_agent_finishes_its_running_turn_as_interrupted(
    database_target: DatabaseTarget,
) -> None:
    turns = StubTurns("blocks until stopped")
    async with scheduler_for(database_target) as scheduler:
        async with running_agent(scheduler, turns) as run:
            await scheduler.request("task-stop", "blocks until stopped")
            await eventually(lambda: turns.started == ["task-stop"], what="the turn to start")
            run.stop.set()
            await asyncio.wait_for(run.task, 15)
            assert run.agent.running == set()
        stopped = await scheduler.get("task-stop")

    assert (stopped.status, stopped.failure_kind, stopped.status_detail, stopped.codex_session_id) == (
        pb.TASK_STATUS_FAILED,
        pb.FAILURE_KIND_INTERRUPTED,
        f"the worker on {NODE} was stopped while running this message",
        "session-task-stop",
    )
    assert turns.cancelled == ["task-stop"]


async def test_on_stopped_is_awaited_once_the_interrupted_turn_is_finished(
    database_target: DatabaseTarget,
) -> None:
    turns = StubTurns("blocks until stopped")
    seen_when_stopped: list[tuple[int, bool]] = []
    async with scheduler_for(database_target) as scheduler:

        async def on_stopped() -> None:
            task = await scheduler.get("task-stop")
            seen_when_stopped.append((task.failure_kind, run.task.done()))

        async with running_agent(scheduler, turns, on_stopped=on_stopped) as run:
            await scheduler.request("task-stop", "blocks until stopped")
            await eventually(lambda: turns.started == ["task-stop"], what="the turn to start")
            assert seen_when_stopped == []
            run.stop.set()
            await asyncio.wait_for(run.task, 15)

    assert seen_when_stopped == [(pb.FAILURE_KIND_INTERRUPTED, False)]


async def test_prepare_turn_sees_each_claimed_task_before_its_turn_runs_and_runs_nothing(
    database_target: DatabaseTarget,
) -> None:
    turns = StubTurns("held")
    prepared: list[tuple[str, int, list[str]]] = []
    statuses_seen: list[str] = []

    def prepare(task: pb.Task) -> None:
        prepared.append((task.task_id, task.status, list(turns.log)))

    async with scheduler_for(database_target) as scheduler:
        async with running_agent(scheduler, turns, prepare_turn=prepare):
            await scheduler.request("task-prepared", "held")
            await eventually(lambda: turns.started == ["task-prepared"], what="the turn to start")
            statuses_seen = _without_repeats(await scheduler.statuses("task-prepared"))
            turns.release("held")
            await eventually(lambda: scheduler.is_terminal("task-prepared"), what="the task to finish")
        done = await scheduler.get("task-prepared")

    # Claimed and started in one call (ClaimTask start): prepared before any turn ran.
    assert prepared == [("task-prepared", pb.TASK_STATUS_RUNNING, [])]
    assert statuses_seen == ["queued", "claimed", "running"]
    assert done.status == pb.TASK_STATUS_COMPLETED


async def test_a_prepare_turn_that_raises_is_logged_and_the_turn_still_runs(
    database_target: DatabaseTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="worker.local_agent.agent_loop")
    turns = StubTurns()

    def prepare(task: pb.Task) -> None:
        raise RuntimeError("no preparation today")

    async with scheduler_for(database_target) as scheduler:
        async with running_agent(scheduler, turns, prepare_turn=prepare):
            await scheduler.request("task-unprepared", "hello")
            await eventually(lambda: scheduler.is_terminal("task-unprepared"), what="the task to finish")
        done = await scheduler.get("task-unprepared")

    assert (done.status, done.reply_text) == (pb.TASK_STATUS_COMPLETED, "reply to: hello")
    assert [record.getMessage() for record in caplog.records] == [
        "task task-unprepared: preparing its turn failed; the turn gets ready by itself"
    ]


async def test_two_tasks_of_one_thread_run_one_after_the_other(database_target: DatabaseTarget) -> None:
    turns = StubTurns("first")
    async with scheduler_for(database_target) as scheduler, running_agent(scheduler, turns, slots=2):
        await scheduler.request("task-a", "first")
        await scheduler.request("task-b", "second")
        await eventually(lambda: turns.started == ["task-a"], what="the first turn to start")
        waiting = await scheduler.get("task-b")
        turns.release("first")
        await eventually(lambda: scheduler.is_terminal("task-b"), what="the second task to finish")
        first, second = await scheduler.get("task-a"), await scheduler.get("task-b")

    assert waiting.status == pb.TASK_STATUS_QUEUED
    assert turns.log == ["start task-a", "end task-a", "start task-b", "end task-b"]
    assert (first.reply_text, second.reply_text) == ("reply to: first", "reply to: second")
    assert second.started_at.ToDatetime() >= first.finished_at.ToDatetime()


async def test_two_threads_run_at_once_on_two_slots(database_target: DatabaseTarget) -> None:
    turns = StubTurns("on thread 1", "on thread 2")
    async with scheduler_for(database_target) as scheduler, running_agent(scheduler, turns, slots=2):
        await scheduler.request("task-1", "on thread 1", thread="thread-1")
        await scheduler.request("task-2", "on thread 2", thread="thread-2")
        await eventually(lambda: sorted(turns.started) == ["task-1", "task-2"], what="both turns to start")
        turns.release("on thread 1")
        turns.release("on thread 2")
        await eventually(lambda: scheduler.is_terminal("task-2"), what="the second task to finish")
        await eventually(lambda: scheduler.is_terminal("task-1"), what="the first task to finish")

    assert turns.log[:2] in (["start task-1", "start task-2"], ["start task-2", "start task-1"])


async def test_the_agent_claims_only_its_own_nodes_tasks(database_target: DatabaseTarget) -> None:
    turns_a, turns_b = StubTurns(), StubTurns()
    async with scheduler_for(database_target) as scheduler:
        async with running_agent(scheduler, turns_a, node_id=NODE):
            await scheduler.request("task-b", "for node b", thread="thread-b", node="node-b")
            await scheduler.request("task-a", "for node a", thread="thread-a", node=NODE)
            await eventually(lambda: scheduler.is_terminal("task-a"), what="node a's task to finish")
            other = await scheduler.get("task-b")
        async with running_agent(scheduler, turns_b, node_id="node-b", worker_id="worker-b"):
            await eventually(lambda: scheduler.is_terminal("task-b"), what="node b's task to finish")
            finished_b = await scheduler.get("task-b")

    assert turns_a.started == ["task-a"]
    assert (other.status, other.attempt) == (pb.TASK_STATUS_QUEUED, 0)
    assert turns_b.started == ["task-b"]
    assert (finished_b.status, finished_b.worker_id) == (pb.TASK_STATUS_COMPLETED, "worker-b")


async def test_an_unreachable_scheduler_is_logged_once_and_claims_resume_when_it_answers(
    database_target: DatabaseTarget, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.local_agent.agent_loop")
    turns = StubTurns()
    async with (
        scheduler_for(database_target, started=False) as scheduler,
        running_agent(scheduler, turns, slots=2),
    ):
        await eventually(
            lambda: sum("unreachable" in r.getMessage() for r in caplog.records) >= 1,
            what="the outage to be logged",
        )
        await asyncio.sleep(1.0)
        await scheduler.start()
        await scheduler.request("task-late", "are you there")
        await eventually(lambda: scheduler.is_terminal("task-late"), what="the task to finish")
        done = await scheduler.get("task-late")

    messages = [record.getMessage() for record in caplog.records]
    assert done.reply_text == "reply to: are you there"
    assert sum("unreachable" in message for message in messages) == 1
    assert sum("answers again" in message for message in messages) == 1


async def test_a_finish_is_retried_until_a_restarted_scheduler_takes_it(
    database_target: DatabaseTarget,
) -> None:
    slow_leases = TaskSettings(run_lease=timedelta(seconds=8), sweep_interval=timedelta(seconds=0.1))
    turns = StubTurns("finish me")
    async with scheduler_for(database_target, slow_leases) as scheduler, running_agent(scheduler, turns):
        await scheduler.request("task-retry", "finish me")
        await eventually(lambda: turns.started == ["task-retry"], what="the turn to start")
        await scheduler.stop()
        turns.release("finish me")
        await eventually(lambda: turns.log[-1] == "end task-retry", what="the turn to end")
        await asyncio.sleep(0.5)
        await scheduler.start()
        await eventually(lambda: scheduler.is_terminal("task-retry"), what="the retried finish")
        done = await scheduler.get("task-retry")

    assert (done.status, done.reply_text, done.attempt) == (
        pb.TASK_STATUS_COMPLETED,
        "reply to: finish me",
        1,
    )


async def test_the_worker_process_runs_its_local_agent_and_stops_it_gracefully(
    database_target: DatabaseTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    codex_home = tmp_path / "codex-home"
    (codex_home / "sessions").mkdir(parents=True)
    turns = StubTurns("wait for the stop")
    async with scheduler_for(database_target) as scheduler:
        monkeypatch.setenv("BOSS_SCHEDULER_ADDRESS", scheduler.address)
        monkeypatch.setenv("BOSS_CONVERSATIONS_ADDRESS", f"127.0.0.1:{free_port()}")
        monkeypatch.setenv("BOSS_DATA_DIR", str(tmp_path / "data"))
        settings = WorkerSettings(
            codex_home=codex_home,
            worker_id=WORKER,
            node_id=NODE,
            context_budget_address=f"127.0.0.1:{free_port()}",
            token=scheduler.token(),
            poll_interval_s=0.05,
            local_agent=LocalAgentSettings(scheduler_address=scheduler.address, max_concurrent_tasks=1),
        )
        stop = asyncio.Event()
        worker = asyncio.create_task(run_worker(settings, stop, run_turn=turns))
        await scheduler.request("task-w", "wait for the stop")
        await eventually(lambda: turns.started == ["task-w"], what="the worker's agent to run the task")
        stop.set()
        code = await asyncio.wait_for(worker, 30)
        stopped = await scheduler.get("task-w")

    assert code == 0
    assert (stopped.status, stopped.failure_kind, stopped.status_detail) == (
        pb.TASK_STATUS_FAILED,
        pb.FAILURE_KIND_INTERRUPTED,
        f"the worker on {NODE} was stopped while running this message",
    )
