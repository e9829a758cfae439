"""The one conversion of chat resources: conversations protos -> the REST shapes of chat/schemas.py.

The REST routes convert RPC answers with these functions; the SSE stream converts the payloads of
`conversation.message.created` and `task.updated` events with the same functions, after parsing the
payload's `message`, `task` and `collaboration_gate` objects (proto field names, RFC 3339 instants,
as the conversations service writes them) into the same protos. So an event's `message` is exactly
what `GET .../messages` answers for that message. No I/O here: unit-tested with plain values.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, cast

from boss.conversations.v1 import conversations_pb2 as pb
from google.protobuf import json_format
from google.protobuf.message import Message

from services.bff_gateway.chat.schemas import (
    AuthorKindName,
    ChatTaskAnswer,
    ChatTaskView,
    CollaborationGateView,
    ConfirmDispatchPlanAnswer,
    DispatchLeftOutView,
    DispatchPlanAnswer,
    DispatchPlanView,
    DispatchTargetView,
    GateStateName,
    MessagePage,
    MessageView,
    PlanStatusName,
    SendMessageAnswer,
    TargetStatusName,
    TaskStatusName,
    TaskTypeName,
)
from services.shared.time import from_timestamp

MessageT = TypeVar("MessageT", bound=Message)

MESSAGE_CREATED = "conversation.message.created"
TASK_UPDATED = "task.updated"
TASK_REQUESTED = "task.requested"
TASK_CANCEL_REQUESTED = "task.cancel_requested"
DISPATCH_PLAN_UPDATED = "dispatch_plan.updated"
INTERNAL_EVENT_TYPES: frozenset[str] = frozenset({TASK_REQUESTED, TASK_CANCEL_REQUESTED})
"""Event types of the conversations stream that are never sent to SSE clients: `task.requested` and
`task.cancel_requested` are the scheduler's (the first carries the instruction text and Codex
references); the client learns their outcome from `task.updated`."""


def _optional(value: str) -> str | None:
    """An optional id or kind: "" (proto3's unset string) -> None."""
    return value or None


def _instant(message: Message, field: str) -> Any:
    """An aware UTC datetime from Timestamp `field`, or None when it is unset."""
    if not message.HasField(field):
        return None
    return from_timestamp(getattr(message, field))


def message_view(message: pb.Message) -> MessageView:
    """A stored message as JSON. Raises pydantic.ValidationError for an author kind this gateway
    does not know (a newer server)."""
    return MessageView(
        message_id=message.message_id,
        project_id=message.project_id,
        author_kind=cast(AuthorKindName, message.author_kind),
        thread_id=_optional(message.thread_id),
        text=message.text,
        created_at=_instant(message, "created_at"),
        sequence=message.sequence,
        client_message_id=_optional(message.client_message_id),
        task_id=_optional(message.task_id),
    )


def chat_task_view(task: pb.ChatTask) -> ChatTaskView:
    """A chat task as JSON: unset optional ids, failure kind and detail are null. Raises
    pydantic.ValidationError for a task type or status this gateway does not know."""
    return ChatTaskView(
        task_id=task.task_id,
        task_type=cast(TaskTypeName, task.task_type),
        status=cast(TaskStatusName, task.status),
        project_id=task.project_id,
        target_project_id=task.target_project_id,
        target_thread_id=task.target_thread_id,
        device_id=task.device_id,
        codex_folder_ref=task.codex_folder_ref,
        codex_thread_ref=task.codex_thread_ref,
        request_message_id=task.request_message_id,
        result_message_id=_optional(task.result_message_id),
        failure_kind=_optional(task.failure_kind),
        status_detail=_optional(task.status_detail),
        device_last_seen_at=_instant(task, "device_last_seen_at"),
        retry_of_task_id=_optional(task.retry_of_task_id),
        retried_by_task_id=_optional(task.retried_by_task_id),
        created_at=_instant(task, "created_at"),
        updated_at=_instant(task, "updated_at"),
    )


def gate_view(gate: pb.CollaborationGate) -> CollaborationGateView:
    """The collaboration gate as JSON; an unset gate (no state) reads as "open" with no tasks."""
    return CollaborationGateView(
        state=cast(GateStateName, gate.state or "open"),
        tasks_total=gate.tasks_total,
        tasks_done=gate.tasks_done,
        detail=gate.detail,
    )


def send_message_answer(response: pb.PostMessageResponse) -> SendMessageAnswer:
    """The answer of a send: the stored message, `masterReply` (null unless set), `dispatchPlan`
    (a group's plan; null elsewhere), the task (null when none was created) and the gate."""
    return SendMessageAnswer(
        message=message_view(response.message),
        master_reply=response.master_reply if response.HasField("master_reply") else None,
        dispatch_plan=dispatch_plan_view(response.dispatch_plan)
        if response.HasField("dispatch_plan")
        else None,
        task=chat_task_view(response.task) if response.HasField("task") else None,
        collaboration_gate=gate_view(response.collaboration_gate),
    )


def message_page(response: pb.ListMessagesResponse) -> MessagePage:
    """A page of messages; `nextPageToken` null at the end; a group's pending plan and gate (null
    for other projects)."""
    return MessagePage(
        messages=[message_view(message) for message in response.messages],
        next_page_token=_optional(response.next_page_token),
        pending_dispatch_plan=dispatch_plan_view(response.pending_dispatch_plan)
        if response.HasField("pending_dispatch_plan")
        else None,
        collaboration_gate=gate_view(response.collaboration_gate)
        if response.HasField("collaboration_gate")
        else None,
        executing_dispatch_plans=[dispatch_plan_view(plan) for plan in response.executing_dispatch_plans],
    )


def dispatch_target_view(target: pb.DispatchTarget) -> DispatchTargetView:
    """A plan's target as JSON: unset optional ids, budget and task are null."""
    return DispatchTargetView(
        target_id=target.target_id,
        position=target.position,
        kind=cast(Literal["member", "relay"], target.kind),
        thread_id=target.thread_id,
        thread_title=target.thread_title,
        device_id=target.device_id,
        codex_folder_ref=target.codex_folder_ref,
        codex_thread_ref=_optional(target.codex_thread_ref),
        instruction=target.instruction,
        reason=target.reason,
        remaining_pct=target.remaining_pct if target.budget_reported else None,
        level=_optional(target.level),
        relay_of_thread_id=_optional(target.relay_of_thread_id),
        status=cast(TargetStatusName, target.status),
        status_detail=_optional(target.status_detail),
        task_id=_optional(target.task_id),
        task_status=cast(TaskStatusName, target.task_status) if target.task_status else None,
    )


def dispatch_plan_view(plan: pb.DispatchPlan) -> DispatchPlanView:
    """A dispatch plan as JSON. Raises pydantic.ValidationError for a status or kind this gateway
    does not know (a newer server)."""
    return DispatchPlanView(
        plan_id=plan.plan_id,
        project_id=plan.project_id,
        request_message_id=plan.request_message_id,
        status=cast(PlanStatusName, plan.status),
        targets=[dispatch_target_view(target) for target in plan.targets],
        left_out=[
            DispatchLeftOutView(thread_id=left.thread_id, thread_title=left.thread_title, reason=left.reason)
            for left in plan.left_out
        ],
        drafted_by=cast(Literal["master_model", "user_text"], plan.drafted_by or "user_text"),
        drafting_note=_optional(plan.drafting_note),
        created_at=_instant(plan, "created_at"),
        expires_at=_instant(plan, "expires_at"),
        decided_at=_instant(plan, "decided_at"),
        updated_at=_instant(plan, "updated_at"),
        superseded_by_plan_id=_optional(plan.superseded_by_plan_id),
        summary_status=cast(Literal["pending", "posted"], plan.summary_status)
        if plan.summary_status
        else None,
        summary_message_id=_optional(plan.summary_message_id),
    )


def dispatch_plan_answer(
    response: pb.GetDispatchPlanResponse | pb.RejectDispatchPlanResponse,
) -> DispatchPlanAnswer:
    """A plan and its group's gate (GetDispatchPlan and RejectDispatchPlan answer the same fields)."""
    return DispatchPlanAnswer(
        dispatch_plan=dispatch_plan_view(response.dispatch_plan),
        collaboration_gate=gate_view(response.collaboration_gate),
    )


def confirm_dispatch_plan_answer(response: pb.ConfirmDispatchPlanResponse) -> ConfirmDispatchPlanAnswer:
    """The confirmed plan, its tasks and the gate."""
    return ConfirmDispatchPlanAnswer(
        dispatch_plan=dispatch_plan_view(response.dispatch_plan),
        tasks=[chat_task_view(task) for task in response.tasks],
        collaboration_gate=gate_view(response.collaboration_gate),
    )


def chat_task_answer(
    response: pb.GetChatTaskResponse | pb.RetryChatTaskResponse | pb.CancelChatTaskResponse,
) -> ChatTaskAnswer:
    """A task and its project's gate (GetChatTask, RetryChatTask and CancelChatTask answer the same
    two fields)."""
    return ChatTaskAnswer(
        task=chat_task_view(response.task), collaboration_gate=gate_view(response.collaboration_gate)
    )


# --- event payloads ----------------------------------------------------------------------------------


def _parsed(value: Any, message: MessageT) -> MessageT:
    """`message` filled from a payload object (proto field names or their JSON names; unknown
    keys ignored, nulls left unset). Raises json_format.ParseError for a value of the wrong type."""
    json_format.ParseDict(value if isinstance(value, dict) else {}, message, ignore_unknown_fields=True)
    return message


def _dumped(view: MessageView | ChatTaskView | CollaborationGateView | DispatchPlanView) -> dict[str, Any]:
    """A view as the JSON REST answers carry (camelCase names, `Z` instants, nulls kept)."""
    return view.model_dump(mode="json", by_alias=True)


def client_event_data(event_type: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The SSE `data` of one conversations event, before the stream adds `sequence` and
    `occurred_at`; None for an event SSE clients never get (INTERNAL_EVENT_TYPES).

    - `conversation.message.created`: `message` becomes the MessageView of `GET .../messages`.
    - `task.updated`: `task` becomes the ChatTaskView of `GET /api/v1/tasks/{id}`, and the payload's
      `collaboration_gate` becomes `collaborationGate` (the same view as there).
    - `dispatch_plan.updated`: `dispatch_plan` becomes `dispatchPlan`, the DispatchPlanView of
      `GET /api/v1/dispatch-plans/{id}`, and `collaboration_gate` becomes `collaborationGate`.
    - Every other type: the payload unchanged.

    Other keys of a payload (owner_id, project_id, ...) are kept. Raises
    json_format.ParseError or pydantic.ValidationError for a chat payload this gateway cannot read.
    """
    if event_type in INTERNAL_EVENT_TYPES:
        return None
    if event_type == MESSAGE_CREATED:
        message = _parsed(payload.get("message"), pb.Message())
        return {**payload, "message": _dumped(message_view(message))}
    if event_type == TASK_UPDATED:
        data = {key: value for key, value in payload.items() if key != "collaboration_gate"}
        task = _parsed(payload.get("task"), pb.ChatTask())
        gate = _parsed(payload.get("collaboration_gate"), pb.CollaborationGate())
        data["task"] = _dumped(chat_task_view(task))
        data["collaborationGate"] = _dumped(gate_view(gate))
        return data
    if event_type == DISPATCH_PLAN_UPDATED:
        data = {
            key: value for key, value in payload.items() if key not in ("dispatch_plan", "collaboration_gate")
        }
        plan = _parsed(payload.get("dispatch_plan"), pb.DispatchPlan())
        gate = _parsed(payload.get("collaboration_gate"), pb.CollaborationGate())
        data["dispatchPlan"] = _dumped(dispatch_plan_view(plan))
        data["collaborationGate"] = _dumped(gate_view(gate))
        return data
    return payload
