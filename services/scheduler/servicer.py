"""The gRPC face of the scheduler: `boss.scheduler.v1.SchedulerService`, methods named as in the
proto. Each method checks the caller's token, converts messages to domain values, calls one handler
and converts back. Errors are BossErrors, turned into rich status by `translate_errors` (unary) or
`_abort` (streams).

Who may call (docs/architecture.md, "Trust boundaries"): reads (scheduler:read) take client tokens,
which see only their owner's threads, packages, alerts and rankings (another owner's is NOT_FOUND or
left out, as an unknown one), and service tokens, which see all; SetMustFinishBeforeCompaction and
SetThreadWorkFacts take service tokens (scheduler:admin); UploadHandoffPackage, StreamWorkerCommands
and AckWorkerCommand take the worker token of the named worker and node, for its owner's threads
and commands only; ConsumeHandoffPackage takes a client token (its owner's packages), a worker token
(packages of its owner's threads on its node) or a service token; WatchEvents takes service tokens.
An open command stream of a device its owner revokes ends with UNAUTHENTICATED (DEVICE_REVOKED).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import datetime

import grpc
from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

from services.scheduler.adapters.repository import AlertRow, CommandRow
from services.scheduler.domain.handoff import (
    ChecklistEntry,
    CommandRun,
    HandoffPackage,
    PackageContent,
    TestRun,
)
from services.scheduler.domain.model import Level, ThreadState
from services.scheduler.service import SchedulerHandlers
from services.scheduler.tasks.servicer import TaskServicer
from services.shared.auth import (
    CLIENT,
    HANDOFF_CONSUME_SCOPES,
    SCOPE_EVENTS_READ,
    SCOPE_HANDOFF_WRITE,
    SCOPE_SCHEDULER_ADMIN,
    SCOPE_SCHEDULER_READ,
    SERVICE,
    WORKER,
    Principal,
    TokenAuthority,
)
from services.shared.errors import BossError, grpc_status_of
from services.shared.event_stream import watch_events
from services.shared.grpc_server import translate_errors
from services.shared.time import from_timestamp, to_timestamp

log = logging.getLogger(__name__)

LEVELS = {
    None: scheduler_pb2.BUDGET_LEVEL_UNSPECIFIED,
    Level.SAFE: scheduler_pb2.BUDGET_LEVEL_SAFE,
    Level.WATCH: scheduler_pb2.BUDGET_LEVEL_WATCH,
    Level.URGENT: scheduler_pb2.BUDGET_LEVEL_URGENT,
    Level.CRITICAL: scheduler_pb2.BUDGET_LEVEL_CRITICAL,
}
PACKAGE_STATUSES = {
    "draft": scheduler_pb2.PACKAGE_STATUS_DRAFT,
    "ready": scheduler_pb2.PACKAGE_STATUS_READY,
    "consumed": scheduler_pb2.PACKAGE_STATUS_CONSUMED,
    "expired": scheduler_pb2.PACKAGE_STATUS_EXPIRED,
}
CHECKLIST_STATUSES = {
    "pending": scheduler_pb2.CHECKLIST_ITEM_STATUS_PENDING,
    "done": scheduler_pb2.CHECKLIST_ITEM_STATUS_DONE,
    "missing": scheduler_pb2.CHECKLIST_ITEM_STATUS_MISSING,
}
CHECKLIST_NAMES = {value: name for name, value in CHECKLIST_STATUSES.items()}
COMMAND_TYPES = {
    "prepare_handoff": scheduler_pb2.COMMAND_TYPE_PREPARE_HANDOFF,
    "avoid_large_context_append": scheduler_pb2.COMMAND_TYPE_AVOID_LARGE_CONTEXT_APPEND,
    "finish_current_subtask": scheduler_pb2.COMMAND_TYPE_FINISH_CURRENT_SUBTASK,
    "freeze_context_growth": scheduler_pb2.COMMAND_TYPE_FREEZE_CONTEXT_GROWTH,
}
COMMAND_STATUSES = {
    "pending": scheduler_pb2.COMMAND_STATUS_PENDING,
    "delivered": scheduler_pb2.COMMAND_STATUS_DELIVERED,
    "acked": scheduler_pb2.COMMAND_STATUS_ACKED,
}
OUTCOMES = {scheduler_pb2.COMMAND_OUTCOME_DONE: "done", scheduler_pb2.COMMAND_OUTCOME_FAILED: "failed"}


def _stamp(value: datetime | None, target: object) -> None:
    """Copies an aware datetime into a Timestamp field (left unset for None)."""
    if value is not None:
        target.CopyFrom(to_timestamp(value))  # type: ignore[attr-defined]


def package_message(package: HandoffPackage) -> scheduler_pb2.HandoffPackage:
    """The wire form of a package."""
    content = package.content
    message = scheduler_pb2.HandoffPackage(
        handoff_package_id=package.handoff_package_id,
        project_id=package.project_id,
        task_id=package.task_id,
        from_thread_id=package.from_thread_id,
        to_thread_id=package.to_thread_id,
        package_status=PACKAGE_STATUSES[package.package_status.value],
        summary_text=content.summary_text,
        open_questions=content.open_questions,
        critical_files=content.critical_files,
        critical_artifacts=content.critical_artifacts,
        decision_links=content.decision_links,
        patches_done=content.patches_done,
        patches_not_done=content.patches_not_done,
        suggested_next_actions=content.suggested_next_actions,
        node_id=package.node_id,
        consumed_by_thread_id=package.consumed_by_thread_id,
        checklist=[
            scheduler_pb2.ChecklistItem(item=e.item, status=CHECKLIST_STATUSES[e.status], detail=e.detail)
            for e in content.checklist
        ],
    )
    for run in content.critical_commands:
        record = message.critical_commands.add(command=run.command, output_tail=run.output_tail)
        if run.exit_code is not None:
            record.exit_code = run.exit_code
        _stamp(run.ran_at, record.ran_at)
    for test in content.critical_tests:
        record = message.critical_tests.add(command=test.command, outcome=test.outcome, summary=test.summary)
        _stamp(test.ran_at, record.ran_at)
    _stamp(package.created_at, message.created_at)
    _stamp(package.ready_at, message.ready_at)
    _stamp(package.consumed_at, message.consumed_at)
    _stamp(package.expires_at, message.expires_at)
    return message


def content_of(message: scheduler_pb2.HandoffPackage) -> PackageContent:
    """The uploadable content of a package message (ids, status and times are the server's)."""
    return PackageContent(
        summary_text=message.summary_text,
        open_questions=tuple(message.open_questions),
        critical_files=tuple(message.critical_files),
        critical_commands=tuple(
            CommandRun(
                c.command,
                c.exit_code if c.HasField("exit_code") else None,
                c.output_tail[-2000:],
                from_timestamp(c.ran_at) if c.HasField("ran_at") else None,
            )
            for c in message.critical_commands
        ),
        critical_tests=tuple(
            TestRun(
                t.command,
                t.outcome or "unknown",
                t.summary,
                from_timestamp(t.ran_at) if t.HasField("ran_at") else None,
            )
            for t in message.critical_tests
        ),
        critical_artifacts=tuple(message.critical_artifacts),
        decision_links=tuple(message.decision_links),
        patches_done=tuple(message.patches_done),
        patches_not_done=tuple(message.patches_not_done),
        suggested_next_actions=tuple(message.suggested_next_actions),
        checklist=tuple(
            ChecklistEntry(item.item, CHECKLIST_NAMES.get(item.status, "missing"), item.detail)
            for item in message.checklist
        ),
    )


def schedule_message(state: ThreadState, package: HandoffPackage | None) -> scheduler_pb2.ThreadSchedule:
    """The wire form of a thread's scheduling view."""
    message = scheduler_pb2.ThreadSchedule(
        thread_id=state.thread_id,
        project_id=state.project_id,
        task_id=state.task_id,
        node_id=state.node_id,
        worker_id=state.worker_id,
        context_budget_level=LEVELS[state.level],
        context_budget_remaining_pct=state.remaining_pct,
        must_finish_before_compaction=state.must_finish,
        must_finish_reason=state.must_finish_reason,
        compaction_count=state.compaction_count,
        task_importance=state.task_importance,
        unsolidified_patch=state.has_unsolidified_patch(),
        unsolidified_test_results=state.has_unsolidified_test_results(),
        hardware_test_in_progress=state.has_hardware_test_in_progress(),
        busy=state.busy,
        no_large_context_appends=state.no_large_context_appends,
        finish_current_subtask=state.finish_current_subtask,
        context_growth_frozen=state.context_growth_frozen,
        relay_thread_id=state.relay_thread_id,
    )
    if package is not None:
        message.current_package.CopyFrom(package_message(package))
    _stamp(state.compaction_expected_at, message.compaction_expected_at)
    _stamp(state.last_compaction_at, message.last_compaction_at)
    _stamp(state.prepare_issued_at, message.prepare_handoff_issued_at)
    _stamp(state.captured_at, message.updated_at)
    _stamp(state.last_activity_at, message.last_activity_at)
    return message


def command_message(command: CommandRow) -> scheduler_pb2.WorkerCommand:
    """The wire form of a worker command."""
    message = scheduler_pb2.WorkerCommand(
        command_id=command.command_id,
        command_type=COMMAND_TYPES[command.command_type],
        thread_id=command.thread_id,
        project_id=command.project_id,
        node_id=command.node_id,
        worker_id=command.worker_id,
        handoff_package_id=command.handoff_package_id,
        to_thread_id=command.to_thread_id,
        codex_folder=command.codex_folder,
        reason=command.reason,
        command_status=COMMAND_STATUSES[command.command_status],
        delivery_count=command.delivery_count,
    )
    _stamp(command.issued_at, message.issued_at)
    return message


def alert_message(alert: AlertRow) -> scheduler_pb2.HandoffAlert:
    """The wire form of a handoff_missing alert."""
    message = scheduler_pb2.HandoffAlert(
        alert_id=alert.alert_id,
        thread_id=alert.thread_id,
        project_id=alert.project_id,
        alert_type=alert.alert_type,
        alert_status=alert.alert_status,
        reason=alert.reason,
        compaction_count=alert.compaction_count,
    )
    _stamp(alert.opened_at, message.opened_at)
    _stamp(alert.resolved_at, message.resolved_at)
    return message


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """`boss.scheduler.v1.SchedulerService` over the scheduler's handlers; the task RPCs are
    `TaskServicer`'s (services/scheduler/tasks/servicer.py)."""

    def __init__(self, handlers: SchedulerHandlers, authority: TokenAuthority, tasks: TaskServicer) -> None:
        self._handlers = handlers
        self._authority = authority
        self._tasks = tasks

    def _worker(self, context: grpc.aio.ServicerContext, worker_id: str, node_id: str) -> Principal:
        """The caller: the worker token (handoff:write) of `worker_id` on `node_id`."""
        principal = self._authority.authorize_grpc(context, SCOPE_HANDOFF_WRITE, WORKER)
        principal.require_worker(worker_id, node_id)
        return principal

    def _reader(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of a read: a client or service token with scheduler:read."""
        return self._authority.authorize_grpc(context, SCOPE_SCHEDULER_READ, CLIENT, SERVICE)

    def _admin(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller of a master-agent change: a service token with scheduler:admin."""
        return self._authority.authorize_grpc(context, SCOPE_SCHEDULER_ADMIN, SERVICE)

    @translate_errors
    async def RankThreads(
        self, request: scheduler_pb2.RankThreadsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.RankThreadsResponse:
        """Ranked threads with reasons, and the strategy summary (CB-17); a client token's owner's
        threads only."""
        principal = self._reader(context)
        ranked, summary = await self._handlers.rank(
            request.project_id, max(0, request.limit), principal.owner_scope
        )
        response = scheduler_pb2.RankThreadsResponse(strategy_summary=summary)
        for item in ranked:
            entry = response.ranked_threads.add(
                rank=item.rank,
                thread_id=item.state.thread_id,
                project_id=item.state.project_id,
                context_budget_level=LEVELS[item.state.level],
                context_budget_remaining_pct=item.state.remaining_pct,
                must_finish_before_compaction=item.state.must_finish,
                reasons=item.reasons,
            )
            _stamp(item.state.compaction_expected_at, entry.compaction_expected_at)
        return response

    @translate_errors
    async def ChooseThreadForWork(
        self, request: scheduler_pb2.ChooseThreadForWorkRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ChooseThreadForWorkResponse:
        """The best thread for new work (a client token: among its owner's), or new_thread_needed."""
        principal = self._reader(context)
        choice = await self._handlers.choose_thread(
            request.project_id, frozenset(request.exclude_thread_ids), principal.owner_scope
        )
        return scheduler_pb2.ChooseThreadForWorkResponse(
            thread_id=choice.thread_id, new_thread_needed=choice.new_thread_needed, reason=choice.reason
        )

    @translate_errors
    async def GetThreadSchedule(
        self, request: scheduler_pb2.GetThreadScheduleRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.GetThreadScheduleResponse:
        """One thread's scheduling view (NOT_FOUND for another owner's thread)."""
        principal = self._reader(context)
        state, package = await self._handlers.thread_schedule(request.thread_id, principal.owner_scope)
        return scheduler_pb2.GetThreadScheduleResponse(thread_schedule=schedule_message(state, package))

    @translate_errors
    async def SetMustFinishBeforeCompaction(
        self, request: scheduler_pb2.SetMustFinishBeforeCompactionRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SetMustFinishBeforeCompactionResponse:
        """The master's CB-8 flag (service tokens)."""
        self._admin(context)
        state = await self._handlers.set_must_finish(
            request.thread_id, request.must_finish_before_compaction, request.reason
        )
        return scheduler_pb2.SetMustFinishBeforeCompactionResponse(
            thread_schedule=schedule_message(state, None)
        )

    @translate_errors
    async def SetThreadWorkFacts(
        self, request: scheduler_pb2.SetThreadWorkFactsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SetThreadWorkFactsResponse:
        """The ranking's task facts (service tokens)."""
        self._admin(context)
        state = await self._handlers.set_work_facts(
            request.thread_id,
            request.task_importance,
            request.unsolidified_patch,
            request.unsolidified_test_results,
            request.hardware_test_in_progress,
            request.busy,
        )
        return scheduler_pb2.SetThreadWorkFactsResponse(thread_schedule=schedule_message(state, None))

    @translate_errors
    async def GetHandoffPackage(
        self, request: scheduler_pb2.GetHandoffPackageRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.GetHandoffPackageResponse:
        """One package (NOT_FOUND for a package of another owner's thread)."""
        principal = self._reader(context)
        package = await self._handlers.package(request.handoff_package_id, principal.owner_scope)
        return scheduler_pb2.GetHandoffPackageResponse(handoff_package=package_message(package))

    @translate_errors
    async def ListHandoffPackages(
        self, request: scheduler_pb2.ListHandoffPackagesRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListHandoffPackagesResponse:
        """A thread's packages, newest first (none for another owner's thread)."""
        principal = self._reader(context)
        packages = await self._handlers.packages_of_thread(request.thread_id, principal.owner_scope)
        return scheduler_pb2.ListHandoffPackagesResponse(
            handoff_packages=[package_message(p) for p in packages]
        )

    @translate_errors
    async def UploadHandoffPackage(
        self, request: scheduler_pb2.UploadHandoffPackageRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.UploadHandoffPackageResponse:
        """A worker's package upload (draft|ready -> ready), for its owner's threads only."""
        principal = self._worker(context, request.worker_id, request.node_id)
        package = await self._handlers.upload_package(
            request.worker_id,
            request.node_id,
            request.command_id,
            request.handoff_package.handoff_package_id,
            content_of(request.handoff_package),
            principal.owner_id,
        )
        return scheduler_pb2.UploadHandoffPackageResponse(handoff_package=package_message(package))

    @translate_errors
    async def ConsumeHandoffPackage(
        self, request: scheduler_pb2.ConsumeHandoffPackageRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ConsumeHandoffPackageResponse:
        """ready -> consumed. Needs scheduler:admin (the master), handoff:write (a worker's relay
        thread: packages of its owner's threads on its node) or conversations:write (the user
        through the gateway: its owner's packages). A package the caller may not see is NOT_FOUND
        and left untouched."""
        principal = self._authority.verify_grpc(context)
        principal.require_any(HANDOFF_CONSUME_SCOPES)
        package = await self._handlers.consume_package(
            request.handoff_package_id,
            request.consumed_by_thread_id,
            principal.owner_scope,
            principal.node_id if principal.kind == WORKER else None,
        )
        return scheduler_pb2.ConsumeHandoffPackageResponse(handoff_package=package_message(package))

    @translate_errors
    async def AckWorkerCommand(
        self, request: scheduler_pb2.AckWorkerCommandRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.AckWorkerCommandResponse:
        """A worker's acknowledgement of a command (its owner's commands only)."""
        principal = self._worker(context, request.worker_id, request.node_id)
        command = await self._handlers.ack_command(
            request.worker_id,
            request.node_id,
            request.command_id,
            OUTCOMES.get(request.outcome, ""),
            request.detail,
            principal.owner_id,
        )
        return scheduler_pb2.AckWorkerCommandResponse(command=command_message(command))

    @translate_errors
    async def ListHandoffAlerts(
        self, request: scheduler_pb2.ListHandoffAlertsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListHandoffAlertsResponse:
        """handoff_missing alerts (a client token: of its owner's threads only)."""
        principal = self._reader(context)
        alerts = await self._handlers.alerts(
            request.thread_id, request.project_id, request.open_only, principal.owner_scope
        )
        return scheduler_pb2.ListHandoffAlertsResponse(alerts=[alert_message(a) for a in alerts])

    async def StreamWorkerCommands(
        self, request: scheduler_pb2.StreamWorkerCommandsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[scheduler_pb2.StreamWorkerCommandsResponse]:
        """The per-node command stream (see the proto): the worker's own owner's commands; ends with
        UNAUTHENTICATED (DEVICE_REVOKED) as soon as the device is revoked."""
        try:
            principal = self._worker(context, request.worker_id, request.node_id)
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
            return
        log.info("command stream opened for worker %s on node %s", request.worker_id, request.node_id)
        commands = self._handlers.follow_commands(
            request.worker_id, request.node_id, owner_id=principal.owner_id
        )
        revocations = self._authority.revocations
        if revocations is not None:
            commands = revocations.guard_stream(principal, commands)
        try:
            async for command in commands:
                yield scheduler_pb2.StreamWorkerCommandsResponse(command=command_message(command))
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))

    async def WatchEvents(
        self, request: scheduler_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[scheduler_pb2.WatchEventsResponse]:
        """The scheduler's event stream, resumable by sequence, in runs of up to 500 events per
        response. Service tokens only: it spans every owner."""
        try:
            self._authority.authorize_grpc(context, SCOPE_EVENTS_READ, SERVICE)
            await self._handlers.event_log.admit(
                request.after_sequence, request.consumer, request.types
            )  # retention
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
            return
        async for envelopes in watch_events(
            self._handlers.event_log, request.after_sequence, list(request.types)
        ):
            yield scheduler_pb2.WatchEventsResponse(events=envelopes)

    # ---- tasks: delegated to TaskServicer -------------------------------------------------------

    async def ClaimTask(
        self, request: scheduler_pb2.ClaimTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ClaimTaskResponse:
        """A node's local agent waits for its next task (TaskServicer.ClaimTask)."""
        return await self._tasks.ClaimTask(request, context)

    async def StartTask(
        self, request: scheduler_pb2.StartTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.StartTaskResponse:
        """claimed -> running, fenced by the lease (TaskServicer.StartTask)."""
        return await self._tasks.StartTask(request, context)

    async def HeartbeatTask(
        self, request: scheduler_pb2.HeartbeatTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.HeartbeatTaskResponse:
        """Renews a running task's lease (TaskServicer.HeartbeatTask)."""
        return await self._tasks.HeartbeatTask(request, context)

    async def FinishTask(
        self, request: scheduler_pb2.FinishTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.FinishTaskResponse:
        """Finishes a running task, fenced by the lease (TaskServicer.FinishTask)."""
        return await self._tasks.FinishTask(request, context)

    async def GetTask(
        self, request: scheduler_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.GetTaskResponse:
        """One task (TaskServicer.GetTask)."""
        return await self._tasks.GetTask(request, context)

    async def ListDevicePresence(
        self, request: scheduler_pb2.ListDevicePresenceRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListDevicePresenceResponse:
        """Whether devices are online (TaskServicer.ListDevicePresence)."""
        return await self._tasks.ListDevicePresence(request, context)
