"""The trust-boundary table of docs/architecture.md, walked on real gRPC (SQLite and PostgreSQL).

The table says, for every RPC of context_budget, the scheduler and conversations, who may call it.
This module reads it from the document and calls every RPC as six callers: a client of owner A, a
client of owner B, the worker of A's device (enrolled by pairing code), the worker of B's device, a
service and no token. Every call aims at owner A's data (A's threads, projects, package, commands,
alerts, task, plan and devices); a worker names its own worker and node. What each caller gets is
classified:

- sees: the call succeeded and answered A's data;
- ok: it succeeded (a write, or data that is nobody's);
- authorized: it passed every trust check and the resource's state refused it (e.g. consuming a
  package consumed already);
- hidden: NOT_FOUND, or a success without A's data (a list without A's items, a stream of the
  caller's own commands);
- refused: PERMISSION_DENIED; unauthenticated: UNAUTHENTICATED.

and compared with the table: A's callers and the service, where allowed, must see / change A's data;
B's callers must get hidden or refused, never authorized or A's data; refused cells must be refused.
An RPC of the protos without a row, or a row without an RPC, fails the walk.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as cb_pb
from boss.conversations.v1 import conversations_pb2 as conv_pb
from boss.scheduler.v1 import scheduler_pb2 as sched_pb

from services.conversations.domain.model import master_project_id
from services.shared.auth import bearer_metadata
from services.shared.time import to_timestamp, utc_now
from tests.conftest import REPOSITORY_ROOT, DatabaseTarget
from tests.integration.trust_stack import TrustStack, eventually, running_trust_stack

OWNER_A, WORKER_A, NODE_A = "owner-a", "worker-a", "node-a"
OWNER_B, WORKER_B, NODE_B = "owner-b", "worker-b", "node-b"
STARTED = utc_now() - timedelta(minutes=10)

SEES, OK, AUTHORIZED, HIDDEN, REFUSED, UNAUTHENTICATED = (
    "sees",
    "ok",
    "authorized",
    "hidden",
    "refused",
    "unauthenticated",
)
SERVICES = {
    "context_budget": cb_pb.DESCRIPTOR.services_by_name["ContextBudgetService"],
    "scheduler": sched_pb.DESCRIPTOR.services_by_name["SchedulerService"],
    "conversations": conv_pb.DESCRIPTOR.services_by_name["ConversationsService"],
}


def trust_table() -> list[tuple[str, str, dict[str, str]]]:
    """(service, rpc, {column: cell}) rows of the "Trust boundaries" table, in document order."""
    text = (REPOSITORY_ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Trust boundaries", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] not in SERVICES:
            continue
        service, rpc, client, worker, service_token, no_token = cells
        rows.append(
            (service, rpc, {"client": client, "worker": worker, "service": service_token, "none": no_token})
        )
    return rows


@dataclass(frozen=True)
class Caller:
    """One of the six callers: its table column, whether it is owner B's (foreign to A's data), its
    call metadata and the worker identity it puts in requests."""

    name: str
    column: str
    foreign: bool
    metadata: tuple[tuple[str, str], ...]
    worker_id: str = WORKER_A
    node_id: str = NODE_A


def expected(cell: str, caller: Caller) -> set[str]:
    """What a caller may get for a table cell (module docstring)."""
    if cell == "—":
        return {UNAUTHENTICATED} if caller.column == "none" else {REFUSED}
    if cell == "code":
        return {OK}
    if cell == "any":
        return {OK, SEES}
    assert cell in ("owner", "device", "all"), f"unknown cell {cell!r}"
    if caller.foreign:
        return {HIDDEN, REFUSED}
    return {SEES, OK, AUTHORIZED}


def outcome_of(error: grpc.aio.AioRpcError) -> str:
    """The class of a failed call."""
    code = error.code()
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return UNAUTHENTICATED
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return REFUSED
    if code is grpc.StatusCode.NOT_FOUND:
        return HIDDEN
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        return AUTHORIZED
    return f"unexpected {code.name}: {error.details()}"


async def unary(call: Awaitable[Any], sees: Callable[[Any], bool] | None = None) -> str:
    """Runs a unary call; with `sees`, a success is SEES when `sees(response)` holds, else HIDDEN."""
    try:
        response = await call
    except grpc.aio.AioRpcError as error:
        return outcome_of(error)
    if sees is None:
        return OK
    return SEES if sees(response) else HIDDEN


async def first_response(call: Any, sees: Callable[[Any], bool]) -> str:
    """Reads a server stream's first response (at most 10 s) and cancels the stream."""
    try:
        response = await asyncio.wait_for(call.read(), 10)
    except grpc.aio.AioRpcError as error:
        return outcome_of(error)
    finally:
        call.cancel()
    if response is grpc.aio.EOF:
        return HIDDEN
    return SEES if sees(response) else HIDDEN


def owners_of(envelopes: Any) -> set[str]:
    """The owner_id of each event payload."""
    return {str(json.loads(envelope.payload_json or "{}").get("owner_id") or "") for envelope in envelopes}


@dataclass
class World:
    """Owner A's data the walk aims at (ids found during set-up), and what the walk learns."""

    stack: TrustStack
    project: str = ""
    project2: str = ""
    project3: str = ""
    group: str = ""
    package: str = ""
    command: str = ""
    alert: str = ""
    task: str = ""
    plan: str = ""
    device2: str = ""
    lease: str = ""
    worker_a: tuple[tuple[str, str], ...] = ()
    worker_b: tuple[tuple[str, str], ...] = ()
    versions: dict[str, int] = field(default_factory=dict)

    def snapshot(
        self, thread_id: str, pct: float, caller: Caller, **fields: Any
    ) -> cb_pb.ThreadContextSnapshot:
        """A new reading of `thread_id` from the caller's device (each one newer than the last)."""
        version = self.versions[thread_id] = self.versions.get(thread_id, 0) + 1
        return cb_pb.ThreadContextSnapshot(
            thread_id=thread_id,
            node_id=caller.node_id,
            worker_id=caller.worker_id,
            project_id=fields.pop("project_id", ""),
            source_kind=cb_pb.SOURCE_KIND_WORKER_ESTIMATOR,
            context_budget_remaining_pct=pct,
            snapshot_version=version,
            captured_at=to_timestamp(STARTED + timedelta(seconds=version)),
            last_total_tokens=1_000 * version,
            codex_folder=f"/home/dev/{thread_id}",
            **fields,
        )


class Probes:
    """One probe per RPC: `await probes.<Rpc>(caller)` calls it as `caller`, aimed at A's data."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.s = world.stack

    # --- context_budget -----------------------------------------------------------------------

    async def ReportThreadContext(self, c: Caller) -> str:
        snapshot = self.w.snapshot("ta", 30.0, c, project_id=self.w.project)
        return await unary(
            self.s.budget.ReportThreadContext(
                cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=c.metadata
            ),
            lambda r: r.ack.accepted,
        )

    async def StreamThreadContext(self, c: Caller) -> str:
        call = self.s.budget.StreamThreadContext(metadata=c.metadata)
        snapshot = self.w.snapshot("ta", 30.0, c, project_id=self.w.project)
        try:
            await call.write(cb_pb.StreamThreadContextRequest(batch_id=1, snapshots=[snapshot]))
            response = await asyncio.wait_for(call.read(), 10)
            await call.done_writing()
        except grpc.aio.AioRpcError as error:
            return outcome_of(error)
        finally:
            call.cancel()
        (ack,) = response.acks
        if ack.accepted:
            return OK
        return {7: REFUSED, 5: HIDDEN, 16: UNAUTHENTICATED}.get(ack.error.code, f"ack error {ack.error}")

    async def GetThreadContext(self, c: Caller) -> str:
        return await unary(
            self.s.budget.GetThreadContext(
                cb_pb.GetThreadContextRequest(thread_id="ta"), metadata=c.metadata
            ),
            lambda r: r.thread_context.snapshot.thread_id == "ta",
        )

    async def ListThreadContexts(self, c: Caller) -> str:
        return await unary(
            self.s.budget.ListThreadContexts(cb_pb.ListThreadContextsRequest(), metadata=c.metadata),
            lambda r: "ta" in {context.snapshot.thread_id for context in r.thread_contexts},
        )

    async def GetThresholdPolicy(self, c: Caller) -> str:
        return await unary(
            self.s.budget.GetThresholdPolicy(cb_pb.GetThresholdPolicyRequest(), metadata=c.metadata)
        )

    async def SetThresholdPolicy(self, c: Caller) -> str:
        policy = cb_pb.ThresholdPolicy(
            project_id=self.w.project, safe_min_pct=60, watch_min_pct=40, urgent_min_pct=25
        )
        return await unary(
            self.s.budget.SetThresholdPolicy(
                cb_pb.SetThresholdPolicyRequest(policy=policy), metadata=c.metadata
            )
        )

    async def ListAlerts(self, c: Caller) -> str:
        return await unary(
            self.s.budget.ListAlerts(cb_pb.ListAlertsRequest(), metadata=c.metadata),
            lambda r: self.w.alert in {alert.alert_id for alert in r.alerts},
        )

    async def AcknowledgeAlert(self, c: Caller) -> str:
        return await unary(
            self.s.budget.AcknowledgeAlert(
                cb_pb.AcknowledgeAlertRequest(alert_id=self.w.alert), metadata=c.metadata
            )
        )

    async def ResolveAlert(self, c: Caller) -> str:
        return await unary(
            self.s.budget.ResolveAlert(cb_pb.ResolveAlertRequest(alert_id=self.w.alert), metadata=c.metadata)
        )

    async def context_budget_WatchEvents(self, c: Caller) -> str:
        call = self.s.budget.WatchEvents(cb_pb.WatchEventsRequest(), metadata=c.metadata)
        return await first_response(call, lambda r: OWNER_A in owners_of(r.events))

    # --- scheduler ----------------------------------------------------------------------------

    async def RankThreads(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.RankThreads(sched_pb.RankThreadsRequest(), metadata=c.metadata),
            lambda r: "ta" in {ranked.thread_id for ranked in r.ranked_threads},
        )

    async def ChooseThreadForWork(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.ChooseThreadForWork(
                sched_pb.ChooseThreadForWorkRequest(project_id=self.w.project2), metadata=c.metadata
            ),
            lambda r: r.thread_id == "ta2",
        )

    async def GetThreadSchedule(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.GetThreadSchedule(
                sched_pb.GetThreadScheduleRequest(thread_id="ta"), metadata=c.metadata
            ),
            lambda r: r.thread_schedule.thread_id == "ta",
        )

    async def SetMustFinishBeforeCompaction(self, c: Caller) -> str:
        request = sched_pb.SetMustFinishBeforeCompactionRequest(
            thread_id="ta", must_finish_before_compaction=False
        )
        return await unary(self.s.scheduler.SetMustFinishBeforeCompaction(request, metadata=c.metadata))

    async def SetThreadWorkFacts(self, c: Caller) -> str:
        request = sched_pb.SetThreadWorkFactsRequest(thread_id="ta", task_importance=10)
        return await unary(self.s.scheduler.SetThreadWorkFacts(request, metadata=c.metadata))

    async def GetHandoffPackage(self, c: Caller) -> str:
        request = sched_pb.GetHandoffPackageRequest(handoff_package_id=self.w.package)
        return await unary(
            self.s.scheduler.GetHandoffPackage(request, metadata=c.metadata),
            lambda r: r.handoff_package.from_thread_id == "ta",
        )

    async def ListHandoffPackages(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.ListHandoffPackages(
                sched_pb.ListHandoffPackagesRequest(thread_id="ta"), metadata=c.metadata
            ),
            lambda r: self.w.package in {package.handoff_package_id for package in r.handoff_packages},
        )

    async def UploadHandoffPackage(self, c: Caller) -> str:
        request = sched_pb.UploadHandoffPackageRequest(
            worker_id=c.worker_id,
            node_id=c.node_id,
            command_id=self.w.command,
            handoff_package=sched_pb.HandoffPackage(handoff_package_id=self.w.package, summary_text="done"),
        )
        return await unary(self.s.scheduler.UploadHandoffPackage(request, metadata=c.metadata))

    async def ConsumeHandoffPackage(self, c: Caller) -> str:
        request = sched_pb.ConsumeHandoffPackageRequest(handoff_package_id=self.w.package)
        return await unary(self.s.scheduler.ConsumeHandoffPackage(request, metadata=c.metadata))

    async def StreamWorkerCommands(self, c: Caller) -> str:
        call = self.s.scheduler.StreamWorkerCommands(
            sched_pb.StreamWorkerCommandsRequest(worker_id=c.worker_id, node_id=c.node_id),
            metadata=c.metadata,
        )
        return await first_response(call, lambda r: r.command.thread_id in {"ta", "ta2", "ta3"})

    async def AckWorkerCommand(self, c: Caller) -> str:
        request = sched_pb.AckWorkerCommandRequest(
            worker_id=c.worker_id,
            node_id=c.node_id,
            command_id=self.w.command,
            outcome=sched_pb.COMMAND_OUTCOME_DONE,
        )
        return await unary(self.s.scheduler.AckWorkerCommand(request, metadata=c.metadata))

    async def ListHandoffAlerts(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.ListHandoffAlerts(sched_pb.ListHandoffAlertsRequest(), metadata=c.metadata),
            lambda r: "ta3" in {alert.thread_id for alert in r.alerts},
        )

    async def ClaimTask(self, c: Caller) -> str:
        request = sched_pb.ClaimTaskRequest(worker_id=c.worker_id, node_id=c.node_id, wait_seconds=0)
        try:
            response = await self.s.scheduler.ClaimTask(request, metadata=c.metadata)
        except grpc.aio.AioRpcError as error:
            return outcome_of(error)
        if response.task.task_id == self.w.task:
            self.w.lease = response.lease_id
            return SEES
        return HIDDEN

    def _fenced(self, c: Caller) -> dict[str, str]:
        return {
            "worker_id": c.worker_id,
            "node_id": c.node_id,
            "task_id": self.w.task,
            "lease_id": self.w.lease,
        }

    async def StartTask(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.StartTask(sched_pb.StartTaskRequest(**self._fenced(c)), metadata=c.metadata)
        )

    async def HeartbeatTask(self, c: Caller) -> str:
        request = sched_pb.HeartbeatTaskRequest(**self._fenced(c))
        return await unary(self.s.scheduler.HeartbeatTask(request, metadata=c.metadata))

    async def FinishTask(self, c: Caller) -> str:
        request = sched_pb.FinishTaskRequest(
            **self._fenced(c),
            status=sched_pb.TASK_STATUS_FAILED,
            failure_kind=sched_pb.FAILURE_KIND_MODEL_ERROR,
            status_detail="the model is down",
        )
        return await unary(self.s.scheduler.FinishTask(request, metadata=c.metadata))

    async def GetTask(self, c: Caller) -> str:
        return await unary(
            self.s.scheduler.GetTask(sched_pb.GetTaskRequest(task_id=self.w.task), metadata=c.metadata),
            lambda r: r.task.owner_id == OWNER_A,
        )

    async def ListDevicePresence(self, c: Caller) -> str:
        request = sched_pb.ListDevicePresenceRequest(owner_id=OWNER_A, node_ids=[NODE_A])
        return await unary(self.s.scheduler.ListDevicePresence(request, metadata=c.metadata))

    async def scheduler_WatchEvents(self, c: Caller) -> str:
        call = self.s.scheduler.WatchEvents(sched_pb.WatchEventsRequest(), metadata=c.metadata)
        return await first_response(call, lambda r: OWNER_A in owners_of(r.events))

    # --- conversations ------------------------------------------------------------------------

    async def RegisterThread(self, c: Caller) -> str:
        request = conv_pb.RegisterThreadRequest(
            thread_id="ta",
            node_id=c.node_id,
            worker_id=c.worker_id,
            codex_folder="/home/dev/ta",
            codex_thread_ref="0199-ta",
            owner_id=OWNER_A if c.column == "service" else "",
        )
        return await unary(
            self.s.conversations.RegisterThread(request, metadata=c.metadata),
            lambda r: r.thread.owner_id == OWNER_A,
        )

    async def ArchiveThread(self, c: Caller) -> str:
        request = conv_pb.ArchiveThreadRequest(thread_id="ta3", owner_id=OWNER_A)
        return await unary(
            self.s.conversations.ArchiveThread(request, metadata=c.metadata),
            lambda r: r.thread.owner_id == OWNER_A,
        )

    async def ListConversations(self, c: Caller) -> str:
        request = conv_pb.ListConversationsRequest(owner_id=OWNER_A)
        return await unary(
            self.s.conversations.ListConversations(request, metadata=c.metadata),
            lambda r: self.w.project in {row.project_id for row in r.conversations},
        )

    async def GetProject(self, c: Caller) -> str:
        request = conv_pb.GetProjectRequest(project_id=self.w.project, owner_id=OWNER_A)
        return await unary(
            self.s.conversations.GetProject(request, metadata=c.metadata),
            lambda r: r.project.conversation.project_id == self.w.project,
        )

    async def GetThreadContextBudget(self, c: Caller) -> str:
        request = conv_pb.GetThreadContextBudgetRequest(thread_id="ta", owner_id=OWNER_A)
        return await unary(
            self.s.conversations.GetThreadContextBudget(request, metadata=c.metadata),
            lambda r: r.thread_context_budget.thread.owner_id == OWNER_A,
        )

    async def SetConversationPinned(self, c: Caller) -> str:
        request = conv_pb.SetConversationPinnedRequest(
            project_id=self.w.project, pinned=True, owner_id=OWNER_A
        )
        return await unary(self.s.conversations.SetConversationPinned(request, metadata=c.metadata))

    async def RenameProject(self, c: Caller) -> str:
        request = conv_pb.RenameProjectRequest(
            project_id=self.w.project, title=f"renamed by {c.name}", owner_id=OWNER_A
        )
        return await unary(self.s.conversations.RenameProject(request, metadata=c.metadata))

    async def CreateGroupProject(self, c: Caller) -> str:
        request = conv_pb.CreateGroupProjectRequest(title="pair", thread_ids=["ta", "ta2"], owner_id=OWNER_A)
        return await unary(self.s.conversations.CreateGroupProject(request, metadata=c.metadata))

    async def AddMessage(self, c: Caller) -> str:
        request = conv_pb.AddMessageRequest(
            project_id=self.w.project, author_kind="user", text=f"note from {c.name}", owner_id=OWNER_A
        )
        return await unary(self.s.conversations.AddMessage(request, metadata=c.metadata))

    async def PostMessage(self, c: Caller) -> str:
        request = conv_pb.PostMessageRequest(
            project_id=self.w.project,
            text=f"hello from {c.name}",
            client_message_id=f"m-{uuid.uuid4().hex[:8]}",
            owner_id=OWNER_A,
        )
        return await unary(self.s.conversations.PostMessage(request, metadata=c.metadata))

    async def ListMessages(self, c: Caller) -> str:
        request = conv_pb.ListMessagesRequest(project_id=self.w.project, owner_id=OWNER_A)
        return await unary(
            self.s.conversations.ListMessages(request, metadata=c.metadata), lambda r: len(r.messages) > 0
        )

    async def GetChatTask(self, c: Caller) -> str:
        request = conv_pb.GetChatTaskRequest(task_id=self.w.task, owner_id=OWNER_A)
        return await unary(
            self.s.conversations.GetChatTask(request, metadata=c.metadata),
            lambda r: r.task.task_id == self.w.task,
        )

    async def RetryChatTask(self, c: Caller) -> str:
        request = conv_pb.RetryChatTaskRequest(task_id=self.w.task, owner_id=OWNER_A)
        return await unary(self.s.conversations.RetryChatTask(request, metadata=c.metadata))

    async def CancelChatTask(self, c: Caller) -> str:
        request = conv_pb.CancelChatTaskRequest(task_id=self.w.task, owner_id=OWNER_A)
        return await unary(self.s.conversations.CancelChatTask(request, metadata=c.metadata))

    async def GetDispatchPlan(self, c: Caller) -> str:
        request = conv_pb.GetDispatchPlanRequest(plan_id=self.w.plan, owner_id=OWNER_A)
        return await unary(
            self.s.conversations.GetDispatchPlan(request, metadata=c.metadata),
            lambda r: r.dispatch_plan.plan_id == self.w.plan,
        )

    async def ConfirmDispatchPlan(self, c: Caller) -> str:
        request = conv_pb.ConfirmDispatchPlanRequest(plan_id=self.w.plan, owner_id=OWNER_A)
        return await unary(self.s.conversations.ConfirmDispatchPlan(request, metadata=c.metadata))

    async def RejectDispatchPlan(self, c: Caller) -> str:
        request = conv_pb.RejectDispatchPlanRequest(plan_id=self.w.plan, owner_id=OWNER_A)
        return await unary(self.s.conversations.RejectDispatchPlan(request, metadata=c.metadata))

    async def ListEvents(self, c: Caller) -> str:
        request = conv_pb.ListEventsRequest(owner_id=OWNER_A, page_size=1_000)
        return await unary(
            self.s.conversations.ListEvents(request, metadata=c.metadata),
            lambda r: OWNER_A in owners_of(r.events),
        )

    async def conversations_WatchEvents(self, c: Caller) -> str:
        call = self.s.conversations.WatchEvents(
            conv_pb.WatchEventsRequest(owner_id=OWNER_A), metadata=c.metadata
        )
        return await first_response(call, lambda r: OWNER_A in owners_of(r.events))

    async def MoveThread(self, c: Caller) -> str:
        request = conv_pb.MoveThreadRequest(
            thread_id="ta2", node_id="node-a2", worker_id="worker-a2", owner_id=OWNER_A
        )
        return await unary(
            self.s.conversations.MoveThread(request, metadata=c.metadata),
            lambda r: r.thread.node_id == "node-a2",
        )

    async def CreatePairingCode(self, c: Caller) -> str:
        request = conv_pb.CreatePairingCodeRequest(owner_id=OWNER_A)
        try:
            code = await self.s.conversations.CreatePairingCode(request, metadata=c.metadata)
        except grpc.aio.AioRpcError as error:
            return outcome_of(error)
        enrolled = await self.s.conversations.EnrollDevice(
            conv_pb.EnrollDeviceRequest(
                pairing_code=code.pairing_code, node_id=f"node-{uuid.uuid4().hex[:6]}", worker_id="w"
            )
        )
        return SEES if enrolled.device.owner_id == OWNER_A else HIDDEN

    async def EnrollDevice(self, c: Caller) -> str:
        code = await self.s.conversations.CreatePairingCode(
            conv_pb.CreatePairingCodeRequest(owner_id=OWNER_A), metadata=self.s.service()
        )
        request = conv_pb.EnrollDeviceRequest(
            pairing_code=code.pairing_code, node_id=f"node-{uuid.uuid4().hex[:6]}", worker_id="worker-x"
        )
        return await unary(self.s.conversations.EnrollDevice(request, metadata=c.metadata))

    async def ListDevices(self, c: Caller) -> str:
        return await unary(
            self.s.conversations.ListDevices(
                conv_pb.ListDevicesRequest(owner_id=OWNER_A), metadata=c.metadata
            ),
            lambda r: self.w.device2 in {device.device_id for device in r.devices},
        )

    async def RevokeDevice(self, c: Caller) -> str:
        request = conv_pb.RevokeDeviceRequest(device_id=self.w.device2, owner_id=OWNER_A)
        return await unary(
            self.s.conversations.RevokeDevice(request, metadata=c.metadata),
            lambda r: r.device.device_id == self.w.device2,
        )


async def set_up(stack: TrustStack) -> World:
    """Owner A's data, and some of owner B's (so B's lists and streams are not empty)."""
    world = World(stack)
    enrolled = await stack.enroll(OWNER_A, NODE_A, WORKER_A)
    world.worker_a = bearer_metadata(enrolled.worker_token)
    world.worker_b = bearer_metadata(stack.authority.issue_worker(WORKER_B, NODE_B, owner_id=OWNER_B))
    world.device2 = (await stack.enroll(OWNER_A, "node-a2", "worker-a2")).device.device_id
    a = Caller("worker A", "worker", False, world.worker_a)
    b = Caller("worker B", "worker", True, world.worker_b, WORKER_B, NODE_B)

    async def register(caller: Caller, thread_id: str) -> str:
        registered = await stack.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(
                thread_id=thread_id,
                node_id=caller.node_id,
                worker_id=caller.worker_id,
                codex_folder=f"/home/dev/{thread_id}",
                codex_thread_ref=f"0199-{thread_id}",
            ),
            metadata=caller.metadata,
        )
        return registered.project_id

    async def report(caller: Caller, thread_id: str, pct: float, project_id: str, **fields: Any) -> None:
        snapshot = world.snapshot(thread_id, pct, caller, project_id=project_id, **fields)
        ack = (
            await stack.budget.ReportThreadContext(
                cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=caller.metadata
            )
        ).ack
        assert ack.accepted, ack

    world.project = await register(a, "ta")
    world.project2 = await register(a, "ta2")
    world.project3 = await register(a, "ta3")
    project_b = await register(b, "tb")
    await report(a, "ta", 30.0, world.project)
    await report(a, "ta2", 80.0, world.project2)
    await report(a, "ta3", 80.0, world.project3)
    await report(b, "tb", 30.0, project_b)
    await report(a, "ta3", 80.0, world.project3, compaction_count=1)

    schedule = await eventually(
        lambda: stack.scheduler.GetThreadSchedule(
            sched_pb.GetThreadScheduleRequest(thread_id="ta"), metadata=stack.service()
        ),
        lambda r: r.thread_schedule.HasField("current_package"),
        "A's handoff package",
    )
    world.package = schedule.thread_schedule.current_package.handoff_package_id
    for caller in (a, b):
        call = stack.scheduler.StreamWorkerCommands(
            sched_pb.StreamWorkerCommandsRequest(worker_id=caller.worker_id, node_id=caller.node_id),
            metadata=caller.metadata,
        )
        first = await asyncio.wait_for(call.read(), 10)
        call.cancel()
        if caller is a:
            world.command = first.command.command_id
    alerts = await eventually(
        lambda: stack.budget.ListAlerts(cb_pb.ListAlertsRequest(thread_id="ta"), metadata=stack.service()),
        lambda r: len(r.alerts) > 0,
        "A's budget alert",
    )
    world.alert = alerts.alerts[0].alert_id
    await eventually(
        lambda: stack.scheduler.ListHandoffAlerts(
            sched_pb.ListHandoffAlertsRequest(thread_id="ta3"), metadata=stack.service()
        ),
        lambda r: len(r.alerts) > 0,
        "A's handoff_missing alert",
    )
    client_a = stack.client(OWNER_A)
    await eventually(
        lambda: stack.conversations.GetThreadContextBudget(
            conv_pb.GetThreadContextBudgetRequest(thread_id="ta2"), metadata=client_a
        ),
        lambda r: r.thread_context_budget.context.reported,
        "A's second thread's budget in conversations",
    )
    sent = await stack.conversations.PostMessage(
        conv_pb.PostMessageRequest(project_id=world.project, text="run the tests", client_message_id="first"),
        metadata=client_a,
    )
    world.task = sent.task.task_id
    await eventually(
        lambda: stack.scheduler.GetTask(
            sched_pb.GetTaskRequest(task_id=world.task), metadata=stack.service()
        ),
        lambda r: r.task.status == sched_pb.TASK_STATUS_QUEUED,
        "A's task queued at the scheduler",
    )
    group = await stack.conversations.CreateGroupProject(
        conv_pb.CreateGroupProjectRequest(title="A's pair", thread_ids=["ta", "ta2"]), metadata=client_a
    )
    world.group = group.project.conversation.project_id
    planned = await stack.conversations.PostMessage(
        conv_pb.PostMessageRequest(
            project_id=world.group, text="both of you: update docs", client_message_id="g1"
        ),
        metadata=client_a,
    )
    world.plan = planned.dispatch_plan.plan_id
    assert world.plan, planned
    return world


@pytest.fixture
async def walked_stack(
    database_target: DatabaseTarget, tmp_path: Path
) -> AsyncIterator[tuple[TrustStack, World]]:
    async with running_trust_stack(database_target, tmp_path) as stack:
        yield stack, await set_up(stack)


def callers(stack: TrustStack, world: World) -> list[Caller]:
    """The six callers, B's first: they meet A's data as set up, before A's own calls change it."""
    return [
        Caller("no token", "none", True, ()),
        Caller("client B", "client", True, stack.client(OWNER_B)),
        Caller("worker B", "worker", True, world.worker_b, WORKER_B, NODE_B),
        Caller("client A", "client", False, stack.client(OWNER_A)),
        Caller("worker A", "worker", False, world.worker_a),
        Caller("service", "service", False, stack.service()),
    ]


async def test_every_rpc_answers_each_caller_as_the_trust_table_says(
    walked_stack: tuple[TrustStack, World],
) -> None:
    stack, world = walked_stack
    table = trust_table()
    listed = {(service, rpc) for service, rpc, _cells in table}
    defined = {(name, method.name) for name, descriptor in SERVICES.items() for method in descriptor.methods}
    assert sorted(defined - listed) == [], "RPCs without a row in the trust table"
    assert sorted(listed - defined) == [], "rows of the trust table without an RPC"
    assert len(table) == len(listed), "an RPC listed twice"

    probes = Probes(world)
    mismatches = []
    outcomes: dict[str, int] = {}
    for service, rpc, cells in table:
        probe = getattr(probes, f"{service}_{rpc}", None) or getattr(probes, rpc)
        for caller in callers(stack, world):
            got = await probe(caller)
            outcomes[got] = outcomes.get(got, 0) + 1
            allowed = expected(cells[caller.column], caller)
            if got not in allowed:
                mismatches.append(
                    f"{service}.{rpc} as {caller.name}: got {got}, table allows {sorted(allowed)}"
                )
    assert mismatches == []
    # Every kind of answer occurred: the walk saw A's data, hid it, refused and changed things.
    assert sum(outcomes.values()) == 6 * len(table)
    assert set(outcomes) == {SEES, OK, AUTHORIZED, HIDDEN, REFUSED, UNAUTHENTICATED}, outcomes


async def test_a_device_of_another_owner_with_the_same_names_gets_none_of_a_s_work(
    walked_stack: tuple[TrustStack, World],
) -> None:
    """Host names repeat across owners: B's machine may also be "node-a" running "worker-a"."""
    stack, world = walked_stack
    twin = Caller(
        "twin",
        "worker",
        True,
        bearer_metadata(stack.authority.issue_worker(WORKER_A, NODE_A, owner_id=OWNER_B)),
    )
    probes = Probes(world)
    assert await probes.ReportThreadContext(twin) == REFUSED
    assert await probes.RegisterThread(twin) == REFUSED
    assert await probes.ClaimTask(twin) == HIDDEN
    assert await probes.GetTask(twin) == HIDDEN
    assert await probes.AckWorkerCommand(twin) == HIDDEN
    assert await probes.UploadHandoffPackage(twin) == HIDDEN
    assert await probes.ConsumeHandoffPackage(twin) == HIDDEN
    # A's own device still gets its task and its commands.
    a = Caller("worker A", "worker", False, world.worker_a)
    assert await probes.ClaimTask(a) == SEES
    assert await probes.StreamWorkerCommands(a) == SEES


async def test_a_device_of_another_owner_cannot_write_into_a_s_project_strategies(
    walked_stack: tuple[TrustStack, World],
) -> None:
    """A worker names the project of its reading itself: B's device naming A's single-device, group
    and master project ids puts neither its threads nor its words into A's strategy summaries."""
    stack, world = walked_stack
    b = Caller("worker B", "worker", True, world.worker_b, WORKER_B, NODE_B)
    a = Caller("worker A", "worker", False, world.worker_a)
    targets = {"tb1": world.project, "tb2": world.group, "tb3": master_project_id(OWNER_A)}

    async def report(caller: Caller, thread_id: str, project_id: str, pct: float, reason: str) -> None:
        snapshot = world.snapshot(
            thread_id,
            pct,
            caller,
            project_id=project_id,
            must_finish_before_compaction=True,
            must_finish_reason=reason,
        )
        ack = (
            await stack.budget.ReportThreadContext(
                cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=caller.metadata
            )
        ).ack
        assert ack.accepted, ack

    client_a = stack.client(OWNER_A)

    async def summary_of(project_id: str) -> str:
        response = await stack.conversations.GetProject(
            conv_pb.GetProjectRequest(project_id=project_id), metadata=client_a
        )
        return str(response.project.master_context_strategy_summary)

    # A's fence thread goes critical first: a reading at a new level sets the stored summary aside
    # (`_set_aside_stale_summaries`), so the fence below stays at that level.
    await report(a, "ta2", world.project2, 3.0, "A-BEFORE")
    await eventually(
        lambda: stack.conversations.GetThreadContextBudget(
            conv_pb.GetThreadContextBudgetRequest(thread_id="ta2"), metadata=client_a
        ),
        lambda r: r.thread_context_budget.context.level == "critical",
        "A's thread critical in conversations",
    )
    for thread_id, project_id in targets.items():
        await stack.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(
                thread_id=thread_id, node_id=NODE_B, worker_id=WORKER_B, codex_folder=f"/home/dev/{thread_id}"
            ),
            metadata=b.metadata,
        )
        await report(b, thread_id, project_id, 3.0, "MALLORY-REASON")
    # A later reading of A's own thread on its own project: once its summary reaches A's project,
    # every summary the scheduler made of B's readings before it has been applied too.
    await report(a, "ta2", world.project2, 2.5, "A-FENCE")
    await eventually(lambda: summary_of(world.project2), lambda text: "A-FENCE" in text, "A's own summary")
    for project_id in (world.project, world.group, "master-agent"):
        summary = await summary_of(project_id)
        assert "MALLORY-REASON" not in summary, (project_id, summary)
        assert not [thread_id for thread_id in targets if thread_id in summary], (project_id, summary)
