"""Test harness for tasks: a real scheduler (migrated database, gRPC on 127.0.0.1:0, both consumers,
the sweeper, the LISTEN connection on PostgreSQL) following a conversations stand-in that serves
`task.requested` envelopes over real gRPC `WatchEvents`, and a budget stand-in that serves none."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from boss.common.v1 import events_pb2
from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc

from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.tasks.model import TaskSettings
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.time import to_timestamp
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.harness import SECRET, BudgetStreamStandIn, start_upstream

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
QUIET = TaskSettings(sweep_interval=timedelta(hours=1))
"""Default task settings of the tests: the background sweeper sweeps once at start, then tests
sweep when they mean to (`app.tasks.sweep()`)."""


class ConversationsStreamStandIn(conversations_pb2_grpc.ConversationsServiceServicer):
    """Serves WatchEvents from `events` (sequence = position + 1), then waits for more; records the
    types each stream asked for."""

    def __init__(self) -> None:
        self.events: list[events_pb2.EventEnvelope] = []
        self.requested_types: list[list[str]] = []
        self._grown = asyncio.Condition()

    async def publish(self, payload: dict[str, Any], event_type: str = "task.requested") -> int:
        """Appends one event; returns its sequence."""
        return await self.publish_together((payload, event_type))

    async def publish_together(self, *events: tuple[dict[str, Any], str]) -> int:
        """Appends (payload, type) events at once, so a stream waiting for more reads them in one
        batch; returns the last one's sequence."""
        for payload, event_type in events:
            self.events.append(
                events_pb2.EventEnvelope(
                    sequence=len(self.events) + 1,
                    type=event_type,
                    occurred_at=to_timestamp(START),
                    thread_id=str(payload.get("target_thread_id", "")),
                    project_id=str(payload.get("project_id", "")),
                    node_id=str(payload.get("device_id", "")),
                    payload_json=json.dumps(payload),
                )
            )
        async with self._grown:
            self._grown.notify_all()
        return len(self.events)

    async def WatchEvents(
        self, request: conversations_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[conversations_pb2.WatchEventsResponse]:
        self.requested_types.append(list(request.types))
        cursor = request.after_sequence
        while True:
            if cursor < len(self.events):
                run = self.events[cursor : cursor + 500]
                yield conversations_pb2.WatchEventsResponse(events=run)
                cursor += len(run)
                continue
            async with self._grown:
                await self._grown.wait_for(lambda position=cursor: len(self.events) > position)


def task_request(
    task_id: str,
    *,
    thread: str = "thread-1",
    node: str = "n1",
    owner: str = "owner-1",
    text: str = "please run the tests",
    **overrides: Any,
) -> dict[str, Any]:
    """A `task.requested` payload as conversations publishes it."""
    payload = {
        "owner_id": owner,
        "task_id": task_id,
        "task_type": "conversation_reply",
        "project_id": f"project-{thread}",
        "target_project_id": f"project-{thread}",
        "target_thread_id": thread,
        "device_id": node,
        "codex_folder_ref": "/home/dev/repo",
        "codex_thread_ref": f"0199-{thread}",
        "request_message_id": f"message-{task_id}",
        "instruction_text": text,
        "retry_of_task_id": "",
        "dispatch_plan_id": "",
    }
    payload.update(overrides)
    return payload


def cancel_request(task_id: str, owner: str = "owner-1") -> dict[str, Any]:
    """A `task.cancel_requested` payload as conversations publishes it."""
    return {"owner_id": owner, "task_id": task_id, "requested_at": "2026-12-01T09:00:05Z"}


@dataclass
class TaskScheduler:
    """A running scheduler, its stand-ins and helpers to drive it like a local agent."""

    app: scheduler_server.SchedulerApp
    conversations: ConversationsStreamStandIn
    authority: TokenAuthority
    channel: grpc.aio.Channel
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    budget_port: int = 0

    @property
    def stub(self) -> scheduler_pb2_grpc.SchedulerServiceStub:
        return scheduler_pb2_grpc.SchedulerServiceStub(self.channel)

    def worker(
        self, worker_id: str = "w1", node_id: str = "n1", owner_id: str = "owner-1"
    ) -> tuple[tuple[str, str], ...]:
        """Metadata of a worker token of `owner_id` (the owner of the tasks `task_request` makes)."""
        return bearer_metadata(self.authority.issue_worker(worker_id, node_id, owner_id=owner_id))

    def service(self) -> tuple[tuple[str, str], ...]:
        """Metadata of a service token."""
        return bearer_metadata(self.authority.issue_service("conversations"))

    def client(self, owner_id: str = "owner-1") -> tuple[tuple[str, str], ...]:
        """Metadata of a client token."""
        return bearer_metadata(self.authority.issue_client(owner_id))

    async def enqueue(self, payload: dict[str, Any], event_type: str = "task.requested") -> None:
        """Publishes one conversations event and waits until the scheduler applied it."""
        sequence = await self.conversations.publish(payload, event_type)
        assert self.app.task_consumer is not None
        await self.app.task_consumer.wait_for(sequence)

    async def enqueue_together(self, *events: tuple[dict[str, Any], str]) -> None:
        """Publishes (payload, type) events in one batch and waits until the scheduler applied them."""
        sequence = await self.conversations.publish_together(*events)
        assert self.app.task_consumer is not None
        await self.app.task_consumer.wait_for(sequence)

    async def cancel(self, task_id: str, owner: str = "owner-1") -> None:
        """Publishes the owner's `task.cancel_requested` and waits until the scheduler applied it."""
        await self.enqueue(cancel_request(task_id, owner), "task.cancel_requested")

    async def claim(
        self, worker_id: str = "w1", node_id: str = "n1", wait: float = 0, start: bool = False
    ) -> pb.ClaimTaskResponse:
        """ClaimTask with the worker's own token (`start`: claim and start in one call)."""
        return await self.stub.ClaimTask(
            pb.ClaimTaskRequest(worker_id=worker_id, node_id=node_id, wait_seconds=wait, start=start),
            metadata=self.worker(worker_id, node_id),
        )

    async def start(self, task_id: str, lease_id: str, worker_id: str = "w1", node_id: str = "n1") -> pb.Task:
        """StartTask; the task as answered."""
        response = await self.stub.StartTask(
            pb.StartTaskRequest(worker_id=worker_id, node_id=node_id, task_id=task_id, lease_id=lease_id),
            metadata=self.worker(worker_id, node_id),
        )
        return response.task

    async def heartbeat(
        self, task_id: str, lease_id: str, worker_id: str = "w1", node_id: str = "n1"
    ) -> pb.Task:
        """HeartbeatTask; the task as answered."""
        response = await self.stub.HeartbeatTask(
            pb.HeartbeatTaskRequest(worker_id=worker_id, node_id=node_id, task_id=task_id, lease_id=lease_id),
            metadata=self.worker(worker_id, node_id),
        )
        return response.task

    async def finish(
        self,
        task_id: str,
        lease_id: str,
        status: int = pb.TASK_STATUS_COMPLETED,
        reply_text: str = "",
        worker_id: str = "w1",
        node_id: str = "n1",
        **fields: Any,
    ) -> pb.Task:
        """FinishTask; the task as answered."""
        response = await self.stub.FinishTask(
            pb.FinishTaskRequest(
                worker_id=worker_id,
                node_id=node_id,
                task_id=task_id,
                lease_id=lease_id,
                status=status,
                reply_text=reply_text,
                **fields,
            ),
            metadata=self.worker(worker_id, node_id),
        )
        return response.task

    async def get(self, task_id: str) -> pb.Task:
        """GetTask with a service token."""
        return (await self.stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=self.service())).task

    async def status_events(self, task_id: str | None = None) -> list[dict[str, Any]]:
        """The payloads of every committed `task.status_changed` (of `task_id` when given)."""
        stored = await self.app.event_log.read_after(0, types=["task.status_changed"])
        return [e.payload for e in stored if task_id is None or e.payload["task_id"] == task_id]


async def start_scheduler(
    target: DatabaseTarget,
    conversations_port: int | None,
    budget_port: int,
    task_settings: TaskSettings,
) -> tuple[scheduler_server.SchedulerApp, grpc.aio.Server, int, list[asyncio.Task[None]]]:
    """Builds and starts one scheduler (following conversations when its port is given); returns
    the app, its server, its port and its background tasks."""
    app = scheduler_server.build(
        database_url=target.url,
        listen="127.0.0.1:0",
        auth_secret=SECRET,
        context_budget_address=f"127.0.0.1:{budget_port}",
        conversations_address=None if conversations_port is None else f"127.0.0.1:{conversations_port}",
        settings=SchedulerSettings(redeliver_after=timedelta(hours=1)),
        task_settings=task_settings,
        schema=target.schema or "scheduler",
    )
    await app.event_log.ensure_sequencer_row()
    server, _health, port = await app.host.start()
    tasks = [asyncio.create_task(factory()) for factory in app.host.background]
    if app.task_listener is not None:
        await asyncio.wait_for(app.task_listener.listening.wait(), 10)
    return app, server, port, tasks


async def stop_scheduler(
    app: scheduler_server.SchedulerApp, server: grpc.aio.Server, tasks: list[asyncio.Task[None]]
) -> None:
    """Stops what `start_scheduler` started."""
    await server.stop(0)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await app.database.dispose()


@contextlib.asynccontextmanager
async def running_task_scheduler(
    target: DatabaseTarget, task_settings: TaskSettings = QUIET
) -> AsyncIterator[TaskScheduler]:
    """A migrated, started scheduler following a conversations stand-in."""
    conversations = ConversationsStreamStandIn()
    conversations_server = grpc.aio.server()
    conversations_pb2_grpc.add_ConversationsServiceServicer_to_server(conversations, conversations_server)
    conversations_port = conversations_server.add_insecure_port("127.0.0.1:0")
    await conversations_server.start()
    budget_server, budget_port = await start_upstream(BudgetStreamStandIn())
    await scheduler_server.migrate(target.url, target.schema or "scheduler")
    app, server, port, tasks = await start_scheduler(target, conversations_port, budget_port, task_settings)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    running = TaskScheduler(app, conversations, TokenAuthority(SECRET), channel, tasks, budget_port)
    try:
        yield running
    finally:
        await channel.close()
        await stop_scheduler(app, server, tasks)
        await conversations_server.stop(0)
        await budget_server.stop(0)
