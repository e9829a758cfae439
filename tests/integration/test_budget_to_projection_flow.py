"""context_budget -> scheduler -> conversations, all real, in one process, on SQLite and PostgreSQL.

The three services run on 127.0.0.1:0 with their own databases (a SQLite file each, or a PostgreSQL
schema each), wired as in production: the scheduler follows context_budget's WatchEvents, and
conversations follows both context_budget's and the scheduler's. A worker (a worker token) registers
a single-device thread with conversations, reports it over ReportThreadContext going safe -> watch
-> urgent -> critical with the project id RegisterThread answered (as ThreadContextSnapshot.project_id
says: the Boss project once the thread is placed), takes prepare_handoff from its command stream and
uploads the package. Checked on conversations' read API and its event stream (the one the gateway's
SSE endpoint serves): the home ring follows every report; the scheduler's `thread.handoff.required`
puts the thread in `threads_requiring_handoff`; `master_context_strategy_summary` is the scheduler's
summary for the project and names the thread; the upload's `thread.handoff.ready` reaches the stream
and fills the checklist with the package's details, leaving the item the worker did not report
undone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as cb_pb
from boss.context_budget.v1 import context_budget_pb2_grpc as cb_grpc
from boss.conversations.v1 import conversations_pb2 as conv_pb
from boss.conversations.v1 import conversations_pb2_grpc as conv_grpc
from boss.scheduler.v1 import scheduler_pb2 as sched_pb
from boss.scheduler.v1 import scheduler_pb2_grpc as sched_grpc
from sqlalchemy import create_engine, text

from services.context_budget.server import ContextBudgetService, build_service
from services.conversations import server as conversations_server
from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import SchedulerSettings
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.config import ServiceSettings
from services.shared.db import Database
from services.shared.migrations import sync_url
from services.shared.time import to_timestamp, utc_now
from tests.conftest import DatabaseTarget

SECRET = "budget-to-projection-flow-secret-0123456789"
WORKER_ID, NODE_ID = "worker-flow", "node-flow"
WAIT_SECONDS = 8.0
T = TypeVar("T")


@dataclass
class Flow:
    """The three running services and the stubs a worker and a client use."""

    budget: cb_grpc.ContextBudgetServiceStub
    scheduler: sched_grpc.SchedulerServiceStub
    conversations: conv_grpc.ConversationsServiceStub
    authority: TokenAuthority
    started: datetime = field(default_factory=lambda: utc_now() - timedelta(minutes=2))
    stream: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    commands: list[sched_pb.WorkerCommand] = field(default_factory=list)

    def worker(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.authority.issue_worker(WORKER_ID, NODE_ID))

    def client(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.authority.issue_client("local"))

    def service(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.authority.issue_service("flow-test"))

    async def register(self, thread_id: str) -> str:
        """Registers a thread as its worker would; returns its single_device project id."""
        registered = await self.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(
                thread_id=thread_id,
                node_id=NODE_ID,
                worker_id=WORKER_ID,
                codex_folder="/home/dev/parser",
                title="Parser cleanup",
            ),
            metadata=self.worker(),
        )
        assert registered.created and registered.project_id.startswith("proj-")
        return registered.project_id

    async def report(
        self, thread_id: str, project_id: str, version: int, pct: float
    ) -> cb_pb.ThreadContextAck:
        """One snapshot over ReportThreadContext, captured `version` * 5 s after `started`."""
        snapshot = cb_pb.ThreadContextSnapshot(
            project_id=project_id,
            thread_id=thread_id,
            node_id=NODE_ID,
            worker_id=WORKER_ID,
            source_kind=cb_pb.SOURCE_KIND_WORKER_ESTIMATOR,
            context_budget_remaining_pct=pct,
            snapshot_version=version,
            captured_at=to_timestamp(self.started + timedelta(seconds=5 * version)),
            last_total_tokens=40_000 * version,
            codex_folder="/home/dev/parser",
        )
        response = await self.budget.ReportThreadContext(
            cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=self.worker()
        )
        return response.ack

    async def home_row(self, project_id: str) -> conv_pb.Conversation:
        rows = (
            await self.conversations.ListConversations(
                conv_pb.ListConversationsRequest(), metadata=self.client()
            )
        ).conversations
        return next(row for row in rows if row.project_id == project_id)

    async def detail(self, project_id: str) -> conv_pb.ProjectDetail:
        return (
            await self.conversations.GetProject(
                conv_pb.GetProjectRequest(project_id=project_id), metadata=self.client()
            )
        ).project

    async def page(self, thread_id: str) -> conv_pb.ThreadContextBudget:
        return (
            await self.conversations.GetThreadContextBudget(
                conv_pb.GetThreadContextBudgetRequest(thread_id=thread_id), metadata=self.client()
            )
        ).thread_context_budget


def service_databases(target: DatabaseTarget, tmp_path: Path) -> dict[str, tuple[str, str]]:
    """(url, schema) per service: a SQLite file each, or a PostgreSQL schema each (the test's own
    schema name with the service as suffix; created by the migrations, dropped by the test)."""
    names = ("context_budget", "scheduler", "conversations")
    if target.backend == "sqlite":
        return {name: (f"sqlite+aiosqlite:///{tmp_path / f'{name}.sqlite3'}", name) for name in names}
    return {name: (target.url, f"{target.schema}_{name}") for name in names}


def drop_schemas(url: str, schemas: list[str]) -> None:
    """Drops the services' PostgreSQL schemas (the conftest fixture drops only its own)."""
    engine = create_engine(sync_url(url))
    try:
        with engine.begin() as connection:
            for schema in schemas:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        engine.dispose()


def start_tasks(factories: list[Callable[[], Awaitable[None]]]) -> list[asyncio.Future[None]]:
    """Runs a host's background loops (sequencer / notifier, consumers, sweeper)."""
    return [asyncio.ensure_future(factory()) for factory in factories]


async def stop_tasks(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancels tasks and waits for them to end."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


@contextlib.asynccontextmanager
async def running_flow(target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Flow]:
    """Starts context_budget, the scheduler and conversations wired to each other; stops them."""
    databases = service_databases(target, tmp_path)
    authority = TokenAuthority(SECRET)
    tasks: list[asyncio.Future[Any]] = []
    servers: list[grpc.aio.Server] = []
    channels: list[grpc.aio.Channel] = []
    budget: ContextBudgetService | None = None
    conversations_db: Database | None = None
    scheduler_app: scheduler_server.SchedulerApp | None = None
    try:
        url, schema = databases["context_budget"]
        budget = build_service(
            ServiceSettings("context_budget", url, "127.0.0.1:0", True, SECRET), schema=schema
        )
        await budget.start()

        url, schema = databases["scheduler"]
        await scheduler_server.migrate(url, schema)
        scheduler_app = scheduler_server.build(
            database_url=url,
            listen="127.0.0.1:0",
            auth_secret=SECRET,
            context_budget_address=budget.address,
            settings=SchedulerSettings(),
            schema=schema,
        )
        await scheduler_app.event_log.ensure_sequencer_row()
        server, _health, scheduler_port = await scheduler_app.host.start()
        servers.append(server)
        tasks += start_tasks(list(scheduler_app.host.background))
        scheduler_address = f"127.0.0.1:{scheduler_port}"

        url, schema = databases["conversations"]
        await conversations_server.migrate(url, schema)
        conversations_db = Database.connect(url, schema)
        token = authority.issue_service("conversations")
        app = conversations_server.build_app(
            conversations_db,
            authority,
            context_budget_stream=conversations_server.context_budget_opener(budget.address, token),
            scheduler_stream=conversations_server.scheduler_opener(scheduler_address, token),
        )
        await app.event_log.ensure_sequencer_row()
        host = app.host("127.0.0.1:0")
        server, _health, conversations_port = await host.start()
        servers.append(server)
        tasks += start_tasks(list(host.background))

        channels = [
            grpc.aio.insecure_channel(address)
            for address in (budget.address, scheduler_address, f"127.0.0.1:{conversations_port}")
        ]
        flow = Flow(
            cb_grpc.ContextBudgetServiceStub(channels[0]),
            sched_grpc.SchedulerServiceStub(channels[1]),
            conv_grpc.ConversationsServiceStub(channels[2]),
            authority,
        )
        tasks.append(asyncio.ensure_future(collect_stream(flow)))
        tasks.append(asyncio.ensure_future(collect_commands(flow)))
        yield flow
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


async def collect_stream(flow: Flow) -> None:
    """Follows conversations' WatchEvents as the local owner (what the gateway turns into SSE)."""
    call = flow.conversations.WatchEvents(
        conv_pb.WatchEventsRequest(after_sequence=0), metadata=flow.client()
    )
    async for response in call:
        for event in response.events:
            flow.stream.append((event.type, json.loads(event.payload_json)))


async def collect_commands(flow: Flow) -> None:
    """The worker's command stream from the scheduler."""
    call = flow.scheduler.StreamWorkerCommands(
        sched_pb.StreamWorkerCommandsRequest(worker_id=WORKER_ID, node_id=NODE_ID), metadata=flow.worker()
    )
    async for response in call:
        flow.commands.append(response.command)


async def eventually(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str) -> T:
    """Polls `probe` until `check` holds for its value (at most WAIT_SECONDS); returns that value."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        value = await probe()
        if check(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {value!r}")
        await asyncio.sleep(0.05)


async def collected(values: list[T]) -> list[T]:
    """A copy of what a collector has gathered so far (a probe for `eventually`)."""
    return list(values)


@pytest.fixture
async def flow(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Flow]:
    async with running_flow(database_target, tmp_path) as running:
        yield running


LEVELS = {
    "safe": cb_pb.CONTEXT_BUDGET_LEVEL_SAFE,
    "watch": cb_pb.CONTEXT_BUDGET_LEVEL_WATCH,
    "urgent": cb_pb.CONTEXT_BUDGET_LEVEL_URGENT,
    "critical": cb_pb.CONTEXT_BUDGET_LEVEL_CRITICAL,
}


async def test_reports_drive_the_ring_the_handoff_and_the_strategy_through_all_three(flow: Flow) -> None:
    thread_id = f"th-{uuid.uuid4().hex[:10]}"
    project_id = await flow.register(thread_id)

    async def scheduler_summary() -> str:
        ranked = await flow.scheduler.RankThreads(
            sched_pb.RankThreadsRequest(project_id=project_id), metadata=flow.service()
        )
        return ranked.strategy_summary

    async def step(version: int, pct: float, level: str, shown: int) -> str:
        """Reports one reading and checks what conversations shows; returns the scheduler's summary."""
        ack = await flow.report(thread_id, project_id, version, pct)
        assert ack.accepted and ack.context_budget_level == LEVELS[level]

        row = await eventually(
            lambda: flow.home_row(project_id),
            lambda r: r.context_budget_indicator.percent == shown,
            f"the {level} ring",
        )
        assert row.context_budget_indicator == conv_pb.ContextBudgetIndicator(
            visible=True, style="ring_percent", percent=shown, level=level
        )
        assert row.context_budget_source_node_id == NODE_ID

        expected_summary = await eventually(
            scheduler_summary,
            lambda text: f"1 thread: 1 {level}." in text,
            f"the scheduler at {level}",
        )
        assert thread_id in expected_summary
        # The projection shows the scheduler's words with the thread named by its title.
        shown_detail = await eventually(
            lambda: flow.detail(project_id),
            lambda d: (
                d.master_context_strategy_summary == expected_summary.replace(thread_id, "Parser cleanup")
            ),
            f"the scheduler's {level} strategy summary in the project detail",
        )
        assert shown_detail.active_thread_contexts[0].percent == shown
        if level in ("safe", "watch"):
            assert list(shown_detail.threads_requiring_handoff) == []
            assert (await flow.page(thread_id)).handoff_status == "none"

        if level == "urgent":
            assert expected_summary.startswith("1 thread: 1 urgent.")
            urgent = await eventually(
                lambda: flow.detail(project_id),
                lambda d: list(d.threads_requiring_handoff) == [thread_id],
                "handoff required at urgent",
            )
            assert urgent.next_compaction_risk_thread_id == thread_id
            urgent_page = await flow.page(thread_id)
            assert urgent_page.handoff_status == "required"
            assert urgent_page.handoff_reason == (
                "context budget urgent (31.5 % left): wrap up before Codex compacts"
            )
            relayed = await eventually(
                lambda: collected(flow.stream),
                lambda events: any(t == "thread.handoff.required" for t, _ in events),
                "thread.handoff.required on conversations' event stream",
            )
            required = [p for t, p in relayed if t == "thread.handoff.required"]
            assert required[-1]["thread_id"] == thread_id and required[-1]["handoff_status"] == "required"
            assert required[-1]["project_ids"] == [project_id]
            assert required[-1]["to_thread_id"].startswith("relay-")
        return expected_summary

    readings = [(72.4, "safe", 72), (48.9, "watch", 48), (31.5, "urgent", 31), (12.2, "critical", 12)]
    summaries = [await step(version, *reading) for version, reading in enumerate(readings, start=1)]
    assert f"Every thread has room; keep stage summaries fresh. New work goes to {thread_id}." in summaries[0]
    assert f"Send {thread_id} less long context" in summaries[1]
    assert f"{thread_id} finishes its current subtask; relay thread pre-created." in summaries[2]
    assert f"Wrap up and hand off {thread_id} first" in summaries[3]
    critical_page = await flow.page(thread_id)
    assert critical_page.handoff_status == "required"
    assert critical_page.handoff_reason.startswith("context budget critical (12.2 % left)")

    commands = await eventually(
        lambda: collected(flow.commands),
        lambda found: sum(c.command_type == sched_pb.COMMAND_TYPE_PREPARE_HANDOFF for c in found) == 2,
        "prepare_handoff at urgent and again at critical",
    )
    prepare = [c for c in commands if c.command_type == sched_pb.COMMAND_TYPE_PREPARE_HANDOFF][-1]
    assert prepare.thread_id == thread_id
    assert prepare.handoff_package_id == critical_page.handoff_package_id
    reported = (
        "files_touched",
        "patches",
        "last_key_command",
        "last_test_run",
        "open_questions",
        "next_actions",
    )
    uploaded = await flow.scheduler.UploadHandoffPackage(
        sched_pb.UploadHandoffPackageRequest(
            worker_id=WORKER_ID,
            node_id=NODE_ID,
            command_id=prepare.command_id,
            handoff_package=sched_pb.HandoffPackage(
                handoff_package_id=prepare.handoff_package_id,
                summary_text="Parser strips input; one test left to add.",
                critical_files=["parser.py"],
                suggested_next_actions=["Add a test for trailing tabs"],
                checklist=[
                    sched_pb.ChecklistItem(
                        item=item, status=sched_pb.CHECKLIST_ITEM_STATUS_DONE, detail="found"
                    )
                    for item in reported
                ],
            ),
        ),
        metadata=flow.worker(),
    )
    assert uploaded.handoff_package.package_status == sched_pb.PACKAGE_STATUS_READY

    stream = await eventually(
        lambda: collected(flow.stream),
        lambda events: any(t == "thread.handoff.ready" for t, _ in events),
        "thread.handoff.ready on conversations' event stream",
    )
    ready = [p for t, p in stream if t == "thread.handoff.ready"]
    assert (ready[0]["thread_id"], ready[0]["handoff_package_id"], ready[0]["handoff_status"]) == (
        thread_id,
        prepare.handoff_package_id,
        "ready",
    )
    assert ready[0]["project_ids"] == [project_id] and ready[0]["owner_id"] == "local"
    ready_page = await flow.page(thread_id)
    assert (ready_page.handoff_status, ready_page.handoff_package_id) == ("ready", prepare.handoff_package_id)
    assert [(item.key, item.done) for item in ready_page.wrap_up_checklist if not item.done] == [
        ("evidence_links", False)
    ]
    scheduled = await flow.scheduler.GetThreadSchedule(
        sched_pb.GetThreadScheduleRequest(thread_id=thread_id), metadata=flow.service()
    )
    package_checklist = scheduled.thread_schedule.current_package.checklist
    assert [(item.key, item.detail) for item in ready_page.wrap_up_checklist] == [
        (entry.item, entry.detail) for entry in package_checklist
    ]  # the projection shows the package's own words, as the scheduler does
    assert ready_page.wrap_up_checklist[0].detail == "found"
    assert ready_page.wrap_up_checklist[-1].detail == "not reported by the worker"
    critical_and_ready = await flow.detail(project_id)
    assert list(critical_and_ready.threads_requiring_handoff) == []

    rings = [
        (p["context_budget_indicator"]["percent"], p["context_budget_indicator"]["level"])
        for t, p in stream
        if t == "conversation.context_indicator.updated" and p["thread_id"] == thread_id
    ]
    assert [ring for ring, _repeats in itertools.groupby(rings)] == [
        (72, "safe"),
        (48, "watch"),
        (31, "urgent"),
        (12, "critical"),
    ]


async def test_without_a_reported_project_the_handoff_still_flows_and_the_summary_is_local(
    flow: Flow,
) -> None:
    """A worker that reports no project_id (the scheduler then keys the thread to no project and
    publishes no strategy for it): the handoff still reaches the project, whose summary is the
    conversations context's own CB-7 wording, naming the thread by its title."""
    thread_id = f"th-{uuid.uuid4().hex[:10]}"
    project_id = await flow.register(thread_id)
    for version, pct in enumerate((48.9, 31.5), start=1):
        assert (await flow.report(thread_id, "", version, pct)).accepted

    detail = await eventually(
        lambda: flow.detail(project_id),
        lambda d: (
            list(d.threads_requiring_handoff) == [thread_id] and d.active_thread_contexts[0].percent == 31
        ),
        "the urgent reading and the handoff required at urgent",
    )
    assert (detail.active_thread_contexts[0].percent, detail.active_thread_contexts[0].level) == (
        31,
        "urgent",
    )
    assert detail.master_context_strategy_summary == (
        "Urgent: Parser cleanup (31%): finish the current atomic subtask first and pre-create the "
        "relay thread."
    )
    schedule = await flow.scheduler.GetThreadSchedule(
        sched_pb.GetThreadScheduleRequest(thread_id=thread_id), metadata=flow.service()
    )
    assert schedule.thread_schedule.project_id == ""
