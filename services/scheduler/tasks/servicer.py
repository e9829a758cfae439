"""The task RPCs of `boss.scheduler.v1.SchedulerService` (ClaimTask, StartTask, HeartbeatTask,
FinishTask, GetTask) and ListDevicePresence; `SchedulerServicer` delegates to `TaskServicer`. Each
method checks the caller's token, calls one handler and converts the task to its wire form. Errors
are BossErrors (rich status through `translate_errors`).

Who may call: ClaimTask, StartTask, HeartbeatTask and FinishTask only with a worker token (scope
tasks:claim) for its own worker_id and node_id (PERMISSION_DENIED otherwise, client and service
tokens included), and only for the tasks of the token's owner. GetTask: service tokens
(scheduler:read) see every task, client tokens their owner's, worker tokens their owner's on their
node; any other task is NOT_FOUND (TASK_NOT_FOUND).
ListDevicePresence: service tokens with scheduler:read only (PERMISSION_DENIED otherwise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import grpc
import jwt
from boss.scheduler.v1 import scheduler_pb2

from services.scheduler.tasks.handlers import TaskHandlers
from services.scheduler.tasks.model import FailureKind, Task, TaskStatus, TaskType
from services.scheduler.tasks.rules import FinishOutcome, check_agent, check_task_id, is_offline
from services.shared.auth import (
    DEFAULT_OWNER_ID,
    SCOPE_SCHEDULER_READ,
    SCOPE_TASKS_CLAIM,
    Principal,
    TokenAuthority,
)
from services.shared.errors import TASK_NOT_FOUND, FieldViolation, InvalidArgument, NotFound, PermissionDenied
from services.shared.grpc_server import translate_errors
from services.shared.time import to_timestamp

STATUSES = {status: scheduler_pb2.TaskStatus.Value(f"TASK_STATUS_{status.name}") for status in TaskStatus}
STATUS_OF = {number: status for status, number in STATUSES.items()}
TYPES = {kind: scheduler_pb2.TaskType.Value(f"TASK_TYPE_{kind.name}") for kind in TaskType}
FAILURE_KINDS = {
    kind: scheduler_pb2.FailureKind.Value(
        f"FAILURE_KIND_{kind.name}" if kind.value else "FAILURE_KIND_UNSPECIFIED"
    )
    for kind in FailureKind
}
FAILURE_KIND_OF = {number: kind for kind, number in FAILURE_KINDS.items()}
MAX_PRESENCE_NODES = 1_000
"""Most node ids one ListDevicePresence asks for."""


def _stamp(value: datetime | None, target: object) -> None:
    """Copies an aware datetime into a Timestamp field (left unset for None)."""
    if value is not None:
        target.CopyFrom(to_timestamp(value))  # type: ignore[attr-defined]


def task_message(task: Task) -> scheduler_pb2.Task:
    """The wire form of a task (without its lease id, which only ClaimTask hands to the holder)."""
    message = scheduler_pb2.Task(
        task_id=task.task_id,
        task_type=TYPES[task.task_type],
        status=STATUSES[task.status],
        owner_id=task.owner_id,
        project_id=task.project_id,
        target_project_id=task.target_project_id,
        target_thread_id=task.target_thread_id,
        device_id=task.device_id,
        codex_folder_ref=task.codex_folder_ref,
        codex_thread_ref=task.codex_thread_ref,
        request_message_id=task.request_message_id,
        instruction_text=task.instruction_text,
        dispatch_plan_id=task.dispatch_plan_id,
        retry_of_task_id=task.retry_of_task_id,
        attempt=task.attempt,
        worker_id=task.worker_id,
        reply_text=task.reply_text,
        failure_kind=FAILURE_KINDS[task.failure_kind],
        status_detail=task.status_detail,
        codex_session_id=task.codex_session_id,
    )
    _stamp(task.created_at, message.created_at)
    _stamp(task.claimed_at, message.claimed_at)
    _stamp(task.started_at, message.started_at)
    _stamp(task.finished_at, message.finished_at)
    _stamp(task.lease_expires_at, message.lease_expires_at)
    _stamp(task.heartbeat_at, message.heartbeat_at)
    _stamp(task.device_last_seen_at, message.device_last_seen_at)
    _stamp(task.updated_at, message.updated_at)
    return message


def outcome_of(request: scheduler_pb2.FinishTaskRequest) -> FinishOutcome:
    """The finish a FinishTaskRequest asks for (validated by the handler). Raises InvalidArgument
    for an enum number this server does not know."""
    status = STATUS_OF.get(request.status)
    kind = FAILURE_KIND_OF.get(request.failure_kind)
    violations = []
    if status is None:
        violations.append(FieldViolation("status", f"unknown status {request.status}"))
    if kind is None:
        violations.append(FieldViolation("failure_kind", f"unknown failure kind {request.failure_kind}"))
    if violations or status is None or kind is None:
        raise InvalidArgument(violations)
    return FinishOutcome(
        status=status,
        reply_text=request.reply_text,
        failure_kind=kind,
        status_detail=request.status_detail,
        codex_session_id=request.codex_session_id,
    )


def can_see(principal: Principal, task: Task) -> bool:
    """Whether `principal` may read `task` (module docstring)."""
    if principal.kind == "service":
        return SCOPE_SCHEDULER_READ in principal.scopes
    if principal.kind == "client":
        return SCOPE_SCHEDULER_READ in principal.scopes and task.owner_id == principal.owner_id
    return (
        principal.kind == "worker"
        and SCOPE_TASKS_CLAIM in principal.scopes
        and task.device_id == principal.node_id
        and task.owner_id == principal.owner_id
    )


class VerifiedTokens:
    """The principals of recently verified tokens, so an agent's claim, start and finish do not
    verify the same signature three times (HS256 verification is a fifth of a task RPC's CPU).

    A token is verified in full the first time, then trusted for at most `ttl` seconds and never
    past its own `exp`. Holds at most `size` tokens (the oldest are dropped first). Errors are those
    of `TokenAuthority.verify_header` (a failed verification is never kept)."""

    def __init__(
        self,
        authority: TokenAuthority,
        ttl: float = 60.0,
        size: int = 4096,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._authority = authority
        self._ttl = ttl
        self._size = size
        self._clock = clock
        self._entries: dict[str, tuple[Principal, float]] = {}

    def verify(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of a gRPC call (its `authorization` metadata)."""
        header = dict(context.invocation_metadata() or ()).get("authorization") or ""
        now = self._clock()
        entry = self._entries.get(header)
        if entry is not None and entry[1] > now:
            self._authority.check_not_revoked(entry[0])  # a revocation counts at once
            return entry[0]
        principal = self._authority.verify_header(header)
        claims = jwt.decode(header.partition(" ")[2].strip(), options={"verify_signature": False})
        if len(self._entries) >= self._size:
            del self._entries[next(iter(self._entries))]
        self._entries[header] = (principal, min(now + self._ttl, float(claims["exp"])))
        return principal


class TaskServicer:
    """The task RPCs over `TaskHandlers` (SchedulerServicer's methods of the same names call these)."""

    def __init__(self, handlers: TaskHandlers, authority: TokenAuthority) -> None:
        self._handlers = handlers
        self._authority = authority
        self._tokens = VerifiedTokens(authority)

    def _agent(self, context: grpc.aio.ServicerContext, worker_id: str, node_id: str) -> Principal:
        """The caller, who must be the worker token of `worker_id` on `node_id` with tasks:claim.
        Raises Unauthenticated, InvalidArgument (`check_agent`) or PermissionDenied
        (WORKER_TOKEN_REQUIRED, SCOPE_MISSING, WORKER_MISMATCH, NODE_MISMATCH)."""
        principal = self._tokens.verify(context)
        check_agent(worker_id, node_id)
        if principal.kind != "worker":
            raise PermissionDenied(
                f"only a node's local agent (a worker token) may do this, not a {principal.kind} token",
                reason="WORKER_TOKEN_REQUIRED",
            )
        principal.require(SCOPE_TASKS_CLAIM)
        principal.require_worker(worker_id, node_id)
        return principal

    @translate_errors
    async def ClaimTask(
        self, request: scheduler_pb2.ClaimTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ClaimTaskResponse:
        """Long poll: the node's next claimed task of the token's owner and its lease id, or no task
        after the wait; with `start` the task answered is running already. A device revoked during
        the wait gets UNAUTHENTICATED (DEVICE_REVOKED) at once (a task it claimed in that instant
        goes back to the queue when its lease ends)."""
        principal = self._agent(context, request.worker_id, request.node_id)
        claim = self._handlers.claim(
            request.worker_id, request.node_id, request.wait_seconds, principal.owner_id, request.start
        )
        revocations = self._authority.revocations
        task = await (revocations.guard(principal, claim) if revocations is not None else claim)
        if task is None:
            return scheduler_pb2.ClaimTaskResponse()
        return scheduler_pb2.ClaimTaskResponse(task=task_message(task), lease_id=task.lease_id)

    @translate_errors
    async def StartTask(
        self, request: scheduler_pb2.StartTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.StartTaskResponse:
        """claimed -> running, fenced by the lease."""
        principal = self._agent(context, request.worker_id, request.node_id)
        task = await self._handlers.start(
            request.worker_id, request.node_id, request.task_id, request.lease_id, principal.owner_id
        )
        return scheduler_pb2.StartTaskResponse(task=task_message(task))

    @translate_errors
    async def HeartbeatTask(
        self, request: scheduler_pb2.HeartbeatTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.HeartbeatTaskResponse:
        """Renews a running task's lease, fenced by the lease."""
        principal = self._agent(context, request.worker_id, request.node_id)
        task = await self._handlers.heartbeat(
            request.worker_id, request.node_id, request.task_id, request.lease_id, principal.owner_id
        )
        return scheduler_pb2.HeartbeatTaskResponse(task=task_message(task))

    @translate_errors
    async def FinishTask(
        self, request: scheduler_pb2.FinishTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.FinishTaskResponse:
        """running -> completed | failed | timed_out, fenced by the lease; idempotent."""
        principal = self._agent(context, request.worker_id, request.node_id)
        task = await self._handlers.finish(
            request.worker_id,
            request.node_id,
            request.task_id,
            request.lease_id,
            outcome_of(request),
            principal.owner_id,
        )
        return scheduler_pb2.FinishTaskResponse(task=task_message(task))

    @translate_errors
    async def GetTask(
        self, request: scheduler_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.GetTaskResponse:
        """One task, for whoever may see it (module docstring)."""
        principal = self._tokens.verify(context)
        principal.require_any((SCOPE_SCHEDULER_READ, SCOPE_TASKS_CLAIM))
        check_task_id(request.task_id)
        task = await self._handlers.get(request.task_id)
        if task is None or not can_see(principal, task):
            raise NotFound(f"task {request.task_id} not found", reason=TASK_NOT_FOUND)
        return scheduler_pb2.GetTaskResponse(task=task_message(task))

    @translate_errors
    async def ListDevicePresence(
        self, request: scheduler_pb2.ListDevicePresenceRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListDevicePresenceResponse:
        """Each asked node of the request's owner (empty: the default owner): its last sign of life
        and whether it is online (seen within the presence window), in the order asked; a node never
        seen is offline with no last_seen_at, whatever another owner's device of that id did."""
        principal = self._tokens.verify(context)
        if principal.kind != "service":
            raise PermissionDenied(
                f"device presence is for services, not a {principal.kind} token",
                reason="SERVICE_TOKEN_REQUIRED",
            )
        principal.require(SCOPE_SCHEDULER_READ)
        node_ids = list(dict.fromkeys(request.node_ids))
        violations = [
            FieldViolation(
                "node_ids", f"holds an id that is empty, over 200 characters or has NUL: {node[:40]!r}"
            )
            for node in node_ids
            if not node or len(node) > 200 or "\x00" in node
        ]
        if len(node_ids) > MAX_PRESENCE_NODES:
            violations.append(FieldViolation("node_ids", f"at most {MAX_PRESENCE_NODES} ids"))
        if violations:
            raise InvalidArgument(violations)
        now, seen = await self._handlers.device_presence(request.owner_id or DEFAULT_OWNER_ID, node_ids)
        window = self._handlers.settings.presence_window
        devices = []
        for node in node_ids:
            device = scheduler_pb2.DevicePresence(
                node_id=node, online=not is_offline(seen.get(node), now, window)
            )
            _stamp(seen.get(node), device.last_seen_at)
            devices.append(device)
        response = scheduler_pb2.ListDevicePresenceResponse(devices=devices)
        response.presence_window.FromTimedelta(window)
        return response
