"""The gRPC face of the conversations context: authorisation, proto <-> domain conversion, errors.

Owner rule: a client token acts for its own `owner_id` (the request's owner_id is ignored); a service
token names the owner in the request (empty: the default owner). Another owner's data is NOT_FOUND,
answered exactly as an unknown id (reason THREAD_NOT_FOUND, PROJECT_NOT_FOUND or TASK_NOT_FOUND).
Messages and chat tasks are the chat sub-package's (`ConversationsHandlers.chat`, conversions in
chat/proto_mapping.py).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc

from services.conversations.adapters.repository import indicator_of
from services.conversations.chat.domain import CHAT_PATH_NOT_AVAILABLE
from services.conversations.chat.proto_mapping import chat_task_message, gate_message, message_message
from services.conversations.devices import DeviceHandlers
from services.conversations.devices_servicer import DeviceServicer
from services.conversations.domain.model import (
    GROUP,
    MASTER_AGENT,
    SINGLE_DEVICE,
    Registration,
    ThreadView,
    conversation_id_of,
)
from services.conversations.groups.handlers import GroupHandlers, GroupState
from services.conversations.groups.proto_mapping import plan_message
from services.conversations.service import ConversationsHandlers, ProjectDetailView, ThreadBudgetView
from services.shared.auth import (
    SCOPE_CONVERSATIONS_READ,
    SCOPE_CONVERSATIONS_WRITE,
    SCOPE_EVENTS_READ,
    SCOPE_THREADS_REGISTER,
    SERVICE,
    WORKER,
    Principal,
    TokenAuthority,
)
from services.shared.devices import DeviceRevocations
from services.shared.errors import (
    BossError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    grpc_status_of,
)
from services.shared.event_stream import to_envelope
from services.shared.grpc_server import translate_errors
from services.shared.outbox import EventLog, StoredEvent
from services.shared.time import to_timestamp, utc_now

SERVICE_NAME = "boss.conversations.v1.ConversationsService"

CONVERSATION_TYPES = {
    MASTER_AGENT: pb.CONVERSATION_TYPE_MASTER_AGENT,
    SINGLE_DEVICE: pb.CONVERSATION_TYPE_SINGLE_DEVICE,
    GROUP: pb.CONVERSATION_TYPE_GROUP,
}
MAX_EVENTS_PAGE = 1_000


def conversation_message(project: Mapping[Any, Any]) -> pb.Conversation:
    """A home-list row (CB-12) from a project row."""
    indicator = indicator_of(project)
    return pb.Conversation(
        conversation_id=conversation_id_of(project["project_id"]),
        project_id=project["project_id"],
        conversation_type=CONVERSATION_TYPES[project["conversation_type"]],
        project_title=project["title"],
        manual_pinned=bool(project["manual_pinned"]),
        latest_reply_at=to_timestamp(project["latest_reply_at"]),
        context_budget_indicator=pb.ContextBudgetIndicator(
            visible=indicator.visible,
            style=indicator.style,
            percent=indicator.percent,
            level=indicator.level,
            awaiting_reading_after_compaction=indicator.awaiting_reading_after_compaction,
        ),
        context_budget_source_node_id=indicator.source_node_id,
        context_budget_updated_at=to_timestamp(indicator.updated_at),
        must_finish_before_compaction=indicator.must_finish_before_compaction,
        context_budget_thread_id=indicator.thread_id,
    )


def summary_message(view: ThreadView) -> pb.ThreadContextSummary:
    """A thread's budget summary (the same figures everywhere: CB-19)."""
    message = pb.ThreadContextSummary(
        thread_id=view.thread_id,
        title=view.title,
        node_id=view.node_id,
        worker_id=view.worker_id,
        handoff_status=view.handoff_status,
    )
    budget = view.budget
    if budget is not None:
        message.reported = True
        message.percent = budget.percent
        message.remaining_pct = budget.remaining_pct
        message.level = budget.level
        message.must_finish_before_compaction = budget.must_finish_before_compaction
        message.must_finish_reason = budget.must_finish_reason
        message.compaction_count = budget.compaction_count
        message.awaiting_reading_after_compaction = budget.awaiting_reading_after_compaction
        message.compaction_limit_source = budget.compaction_limit_source
        message.updated_at.CopyFrom(to_timestamp(budget.updated_at))
        if budget.compaction_expected_at:
            message.compaction_expected_at.CopyFrom(to_timestamp(budget.compaction_expected_at))
        if budget.last_compaction_at:
            message.last_compaction_at.CopyFrom(to_timestamp(budget.last_compaction_at))
    return message


def thread_message(row: Mapping[Any, Any]) -> pb.Thread:
    """Registered thread metadata."""
    return pb.Thread(
        thread_id=row["thread_id"],
        owner_id=row["owner_id"],
        node_id=row["node_id"],
        worker_id=row["worker_id"],
        codex_folder=row["codex_folder"],
        codex_thread_ref=row["codex_thread_ref"],
        title=row["title"],
        single_device_project_id=row["single_device_project_id"],
        registered_at=to_timestamp(row["registered_at"]),
        archived_at=to_timestamp(row["archived_at"]),
        is_master_main_thread=bool(row["is_master_main_thread"]),
    )


def detail_message(detail: ProjectDetailView) -> pb.ProjectDetail:
    """CB-13 project detail."""
    return pb.ProjectDetail(
        conversation=conversation_message(detail.project),
        active_thread_contexts=[summary_message(view) for view in detail.threads],
        next_compaction_risk_thread_id=detail.next_compaction_risk_thread_id,
        threads_requiring_handoff=detail.threads_requiring_handoff,
        master_context_strategy_summary=detail.master_context_strategy_summary,
    )


def budget_message(view: ThreadBudgetView) -> pb.ThreadContextBudget:
    """CB-14 thread page."""
    return pb.ThreadContextBudget(
        context=summary_message(view.view),
        thread=thread_message(view.thread),
        wrap_up_checklist=[
            pb.ChecklistItem(key=i.key, label=i.label, done=i.done, detail=i.detail) for i in view.checklist
        ],
        handoff_status=view.view.handoff_status,
        handoff_package_id=view.thread["handoff_package_id"],
        handoff_reason=view.thread["handoff_reason"],
        project_ids=view.project_ids,
    )


def event_visible_to(event: StoredEvent, owner: str | None) -> bool:
    """Whether an event belongs to `owner` (None: every owner, for service tokens)."""
    return owner is None or event.payload.get("owner_id") == owner


class ConversationsServicer(conversations_pb2_grpc.ConversationsServiceServicer):
    """ConversationsService over the handlers; every method verifies the caller's token first."""

    def __init__(
        self,
        handlers: ConversationsHandlers,
        event_log: EventLog,
        authority: TokenAuthority,
        devices: DeviceHandlers | None = None,
    ) -> None:
        """`devices`: the device registry (default: one on the handlers' database whose
        revocations `authority` refuses)."""
        self._handlers = handlers
        self._event_log = event_log
        self._authority = authority
        self.authority = authority
        if authority.revocations is None:
            authority.revocations = DeviceRevocations()
        registry = devices or DeviceHandlers(handlers.database, event_log, authority, authority.revocations)
        self.devices = DeviceServicer(handlers, registry, authority, thread_message)

    def _owner(self, principal: Principal, requested: str) -> str:
        """The owner a call acts for (see the module docstring)."""
        if principal.kind == "client":
            return principal.owner_id
        return requested or self._handlers.default_owner_id

    def _stream_owner(self, principal: Principal, requested: str) -> str | None:
        if principal.kind == "client":
            return principal.owner_id
        return requested or None

    @translate_errors
    async def RegisterThread(
        self, request: pb.RegisterThreadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterThreadResponse:
        """Registers (or refreshes) a thread seen by a worker: worker tokens for their own worker,
        node and owner (a request naming another owner is PERMISSION_DENIED, reason
        OWNER_MISMATCH), or service tokens naming the owner. A thread belongs to the device that
        first registered or reported it: another device's registration is PERMISSION_DENIED
        (THREAD_BOUND_TO_OTHER_DEVICE) and changes nothing."""
        principal = self._authority.authorize_grpc(context, SCOPE_THREADS_REGISTER, WORKER, SERVICE)
        principal.require_worker(request.worker_id, request.node_id)
        owner = request.owner_id or self._handlers.default_owner_id
        if principal.kind == WORKER:
            if request.owner_id and request.owner_id != principal.owner_id:
                raise PermissionDenied(
                    f"owner_id {request.owner_id!r} is not this worker's owner: a worker registers "
                    "threads for the owner it was enrolled for (leave owner_id empty)",
                    reason="OWNER_MISMATCH",
                )
            owner = principal.owner_id
        registration = Registration(
            thread_id=request.thread_id,
            node_id=request.node_id,
            worker_id=request.worker_id,
            owner_id=owner,
            codex_folder=request.codex_folder,
            codex_thread_ref=request.codex_thread_ref,
            title=request.title,
            group_project_id=request.group_project_id,
            is_master_main_thread=request.is_master_main_thread,
        )
        thread, created, project_id = await self._handlers.register_thread(registration)
        return pb.RegisterThreadResponse(
            thread=thread_message(thread), created=created, project_id=project_id
        )

    @translate_errors
    async def ArchiveThread(
        self, request: pb.ArchiveThreadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ArchiveThreadResponse:
        """Archives a thread."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        thread = await self._handlers.archive_thread(
            self._owner(principal, request.owner_id), request.thread_id
        )
        return pb.ArchiveThreadResponse(thread=thread_message(thread))

    @translate_errors
    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConversationsResponse:
        """The home list."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        rows, token = await self._handlers.list_conversations(
            self._owner(principal, request.owner_id), request.page_size, request.page_token
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_message(row) for row in rows], next_page_token=token
        )

    @translate_errors
    async def GetProject(
        self, request: pb.GetProjectRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetProjectResponse:
        """The project detail."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        owner = self._owner(principal, request.owner_id)
        detail = await self._handlers.get_project(owner, request.project_id)
        message = detail_message(detail)
        groups = self._handlers.chat.groups
        state = await groups.group_state(owner, detail.project) if groups is not None else None
        if state is not None:  # a group: its pending plan (CHAT-4) and gate
            _set_group_state(message, state)
        return pb.GetProjectResponse(project=message)

    @translate_errors
    async def GetThreadContextBudget(
        self, request: pb.GetThreadContextBudgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThreadContextBudgetResponse:
        """The thread page."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        view = await self._handlers.get_thread_budget(
            self._owner(principal, request.owner_id), request.thread_id
        )
        return pb.GetThreadContextBudgetResponse(thread_context_budget=budget_message(view))

    @translate_errors
    async def SetConversationPinned(
        self, request: pb.SetConversationPinnedRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetConversationPinnedResponse:
        """Pins or unpins a conversation."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        row = await self._handlers.set_pinned(
            self._owner(principal, request.owner_id), request.project_id, request.pinned
        )
        return pb.SetConversationPinnedResponse(conversation=conversation_message(row))

    @translate_errors
    async def RenameProject(
        self, request: pb.RenameProjectRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenameProjectResponse:
        """Renames a project."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        row = await self._handlers.rename_project(
            self._owner(principal, request.owner_id), request.project_id, request.title
        )
        return pb.RenameProjectResponse(conversation=conversation_message(row))

    @translate_errors
    async def CreateGroupProject(
        self, request: pb.CreateGroupProjectRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateGroupProjectResponse:
        """Creates a group project."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        detail = await self._handlers.create_group(
            self._owner(principal, request.owner_id), request.title, list(request.thread_ids)
        )
        return pb.CreateGroupProjectResponse(project=detail_message(detail))

    @translate_errors
    async def AddMessage(
        self, request: pb.AddMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddMessageResponse:
        """Stores a message."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        row = await self._handlers.chat.add_message(
            self._owner(principal, request.owner_id),
            request.project_id,
            request.author_kind,
            request.thread_id,
            request.text,
        )
        return pb.AddMessageResponse(message=message_message(row))

    @translate_errors
    async def PostMessage(
        self, request: pb.PostMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.PostMessageResponse:
        """A user sends a message to a project's thread (ChatHandlers.post_message). Client and
        service tokens only (worker tokens lack conversations:write: PERMISSION_DENIED)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        sent = await self._handlers.chat.post_message(
            self._owner(principal, request.owner_id),
            request.project_id,
            request.text,
            request.client_message_id,
        )
        return pb.PostMessageResponse(
            message=message_message(sent.message),
            master_reply=sent.master_reply,
            dispatch_plan=plan_message(sent.dispatch_plan, utc_now())
            if sent.dispatch_plan is not None
            else None,
            task=chat_task_message(sent.task) if sent.task is not None else None,
            collaboration_gate=gate_message(sent.gate),
            created=sent.created,
        )

    @translate_errors
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        """A project's messages, oldest first, after `after_sequence` when set."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        owner = self._owner(principal, request.owner_id)
        rows, token = await self._handlers.chat.list_messages(
            owner,
            request.project_id,
            request.page_size,
            request.page_token,
            request.after_sequence,
        )
        response = pb.ListMessagesResponse(
            messages=[message_message(row) for row in rows], next_page_token=token
        )
        groups = self._handlers.chat.groups
        state = await groups.group_state_of(owner, request.project_id) if groups is not None else None
        if state is not None:  # a group: its pending plan (CHAT-4) and gate
            _set_group_state(response, state)
        return response

    @translate_errors
    async def GetDispatchPlan(
        self, request: pb.GetDispatchPlanRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetDispatchPlanResponse:
        """A group's dispatch plan and the group's gate (GroupHandlers.get_plan)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        view = await self._groups().get_plan(self._owner(principal, request.owner_id), request.plan_id)
        return pb.GetDispatchPlanResponse(
            dispatch_plan=plan_message(view.plan, utc_now()), collaboration_gate=gate_message(view.gate)
        )

    @translate_errors
    async def ConfirmDispatchPlan(
        self, request: pb.ConfirmDispatchPlanRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConfirmDispatchPlanResponse:
        """Confirms a proposed plan: its dispatch_execution tasks (GroupHandlers.confirm_plan)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        confirmed = await self._groups().confirm_plan(
            self._owner(principal, request.owner_id), request.plan_id, list(request.dropped_target_ids)
        )
        return pb.ConfirmDispatchPlanResponse(
            dispatch_plan=plan_message(confirmed.plan, utc_now()),
            tasks=[chat_task_message(task) for task in confirmed.tasks],
            collaboration_gate=gate_message(confirmed.gate),
        )

    @translate_errors
    async def RejectDispatchPlan(
        self, request: pb.RejectDispatchPlanRequest, context: grpc.aio.ServicerContext
    ) -> pb.RejectDispatchPlanResponse:
        """Rejects a proposed plan (GroupHandlers.reject_plan)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        view = await self._groups().reject_plan(self._owner(principal, request.owner_id), request.plan_id)
        return pb.RejectDispatchPlanResponse(
            dispatch_plan=plan_message(view.plan, utc_now()), collaboration_gate=gate_message(view.gate)
        )

    def _groups(self) -> GroupHandlers:
        """The group chat. Raises FailedPrecondition (CHAT_PATH_NOT_AVAILABLE) when not wired."""
        groups = self._handlers.chat.groups
        if groups is None:
            raise FailedPrecondition("group chat is not available here", reason=CHAT_PATH_NOT_AVAILABLE)
        return groups

    @translate_errors
    async def GetChatTask(
        self, request: pb.GetChatTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetChatTaskResponse:
        """One chat task and its project's gate (ChatHandlers.get_task)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_READ)
        view = await self._handlers.chat.get_task(self._owner(principal, request.owner_id), request.task_id)
        return pb.GetChatTaskResponse(
            task=chat_task_message(view.task), collaboration_gate=gate_message(view.gate)
        )

    @translate_errors
    async def RetryChatTask(
        self, request: pb.RetryChatTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.RetryChatTaskResponse:
        """Retries a task that ended without a reply (ChatHandlers.retry_task)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        view = await self._handlers.chat.retry_task(self._owner(principal, request.owner_id), request.task_id)
        return pb.RetryChatTaskResponse(
            task=chat_task_message(view.task), collaboration_gate=gate_message(view.gate)
        )

    @translate_errors
    async def CancelChatTask(
        self, request: pb.CancelChatTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelChatTaskResponse:
        """Asks the scheduler to cancel a task that has not started (ChatHandlers.cancel_task)."""
        principal = self._authority.authorize_grpc(context, SCOPE_CONVERSATIONS_WRITE)
        view = await self._handlers.chat.cancel_task(
            self._owner(principal, request.owner_id), request.task_id
        )
        return pb.CancelChatTaskResponse(
            task=chat_task_message(view.task), collaboration_gate=gate_message(view.gate)
        )

    @translate_errors
    async def ListEvents(
        self, request: pb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEventsResponse:
        """One page of committed events after `after_sequence`, filtered by owner."""
        principal = self._authority.authorize_grpc(context, SCOPE_EVENTS_READ)
        if request.page_size < 0:
            raise InvalidArgument([FieldViolation("page_size", "must not be negative")])
        owner = self._stream_owner(principal, request.owner_id)
        limit = min(request.page_size or 500, MAX_EVENTS_PAGE)
        await self._event_log.admit(request.after_sequence)  # EVENTS_PRUNED when history is gone
        batch = await self._event_log.read_after(request.after_sequence, limit=limit)
        scanned = batch[-1].sequence if batch else request.after_sequence
        head = max(scanned, self._event_log.last_sequence)
        return pb.ListEventsResponse(
            events=[to_envelope(event) for event in batch if event_visible_to(event, owner)],
            scanned_through_sequence=scanned,
            head_sequence=head,
        )

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WatchEventsResponse]:
        """Committed events after `after_sequence` (or the head), then live ones, filtered by owner,
        in runs of up to 500 per response (a run another owner's events emptied is not sent).

        The stream ends with UNAUTHENTICATED (reason TOKEN_EXPIRED) when the caller's token expires.
        PERMISSION_DENIED (reason CONSUMER_NOT_ALLOWED) for a `consumer` named with a token other
        than a service's: a durable position holds back retention for every owner, so only Boss's
        own services keep one."""
        try:
            principal = self._authority.authorize_grpc(context, SCOPE_EVENTS_READ)
            if request.consumer and principal.kind != SERVICE:
                raise PermissionDenied(
                    "consumer: only Boss services keep a durable position on this stream; "
                    "clients resume with after_sequence alone",
                    reason="CONSUMER_NOT_ALLOWED",
                )
            if not request.from_head:
                await self._event_log.admit(request.after_sequence, request.consumer, request.types)
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
            return
        owner = self._stream_owner(principal, request.owner_id)
        after = self._event_log.last_sequence if request.from_head else request.after_sequence
        # Payloads are decoded only to filter by owner; an every-owner stream sends their text.
        decode = owner is not None
        batches = self._event_log.follow_batches(after, types=list(request.types), decode=decode)
        # The token was verified once: the stream ends when it expires (UNAUTHENTICATED,
        # TOKEN_EXPIRED), and the caller resumes with a fresh one, losing nothing. The deadline
        # covers each wait for the next batch, never a yield (the caller's code runs there).
        left = principal.seconds_until_expiry()
        expires = None if math.isinf(left) else asyncio.get_running_loop().time() + left
        while True:
            try:
                async with asyncio.timeout_at(expires):
                    batch = await anext(batches)
            except StopAsyncIteration:
                return
            except TimeoutError:
                await context.abort_with_status(
                    grpc_status_of(Unauthenticated("token expired", reason="TOKEN_EXPIRED"))
                )
                return
            visible = [to_envelope(event) for event in batch if event_visible_to(event, owner)]
            if visible:
                yield pb.WatchEventsResponse(events=visible)

    # ---- devices: delegated to DeviceServicer ----------------------------------------------------

    async def MoveThread(
        self, request: pb.MoveThreadRequest, context: grpc.aio.ServicerContext
    ) -> pb.MoveThreadResponse:
        """Moves a thread to another of its owner's devices (DeviceServicer.MoveThread)."""
        return await self.devices.MoveThread(request, context)

    async def CreatePairingCode(
        self, request: pb.CreatePairingCodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePairingCodeResponse:
        """A one-time pairing code (DeviceServicer.CreatePairingCode)."""
        return await self.devices.CreatePairingCode(request, context)

    async def EnrollDevice(
        self, request: pb.EnrollDeviceRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollDeviceResponse:
        """A device's credential for a pairing code (DeviceServicer.EnrollDevice)."""
        return await self.devices.EnrollDevice(request, context)

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDevicesResponse:
        """The owner's devices (DeviceServicer.ListDevices)."""
        return await self.devices.ListDevices(request, context)

    async def RevokeDevice(
        self, request: pb.RevokeDeviceRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeDeviceResponse:
        """Revokes a device (DeviceServicer.RevokeDevice)."""
        return await self.devices.RevokeDevice(request, context)


def _set_group_state(message: pb.ProjectDetail | pb.ListMessagesResponse, state: GroupState) -> None:
    """Fills a group's pending plan (when one waits), gate and executing plans into a detail or a
    message page."""
    now = utc_now()
    if state.pending_plan is not None:
        message.pending_dispatch_plan.CopyFrom(plan_message(state.pending_plan, now))
    message.collaboration_gate.CopyFrom(gate_message(state.gate))
    message.executing_dispatch_plans.extend(plan_message(plan, now) for plan in state.executing_plans)


def payload_of(envelope_json: str) -> dict[str, Any]:
    """The JSON payload of an envelope (helper for clients and tests)."""
    value = json.loads(envelope_json or "{}")
    return value if isinstance(value, dict) else {}
