"""The one conversion of chat resources: conversations protos -> the REST shapes of chat/schemas.py.

The REST routes convert RPC answers with these functions; the SSE stream converts the payloads of
`conversation.message.created` and `task.updated` events with the same functions, after parsing the
payload's `message`, `task` and `collaboration_gate` objects (proto field names, RFC 3339 instants,
as the conversations service writes them) into the same protos. So an event's `message` is exactly
what `GET .../messages` answers for that message. No I/O here: unit-tested with plain values.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from boss.conversations.v1 import conversations_pb2 as pb
from google.protobuf import json_format
from google.protobuf.message import Message

from services.bff_gateway.chat.schemas import (
    AuthorKindName,
    ChatTaskAnswer,
    ChatTaskView,
    CollaborationGateView,
    GateStateName,
    MessagePage,
    MessageView,
    SendMessageAnswer,
    TaskStatusName,
    TaskTypeName,
)
from services.shared.time import from_timestamp

MessageT = TypeVar("MessageT", bound=Message)

MESSAGE_CREATED = "conversation.message.created"
TASK_UPDATED = "task.updated"
TASK_REQUESTED = "task.requested"
INTERNAL_EVENT_TYPES: frozenset[str] = frozenset({TASK_REQUESTED})
"""Event types of the conversations stream that are never sent to SSE clients: `task.requested` is
the scheduler's (it carries the instruction text and Codex references)."""


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
    (null: no plans in a thread chat), the task (null when none was created) and the gate."""
    return SendMessageAnswer(
        message=message_view(response.message),
        master_reply=response.master_reply if response.HasField("master_reply") else None,
        dispatch_plan=None,
        task=chat_task_view(response.task) if response.HasField("task") else None,
        collaboration_gate=gate_view(response.collaboration_gate),
    )


def message_page(response: pb.ListMessagesResponse) -> MessagePage:
    """A page of messages; `nextPageToken` null at the end."""
    return MessagePage(
        messages=[message_view(message) for message in response.messages],
        next_page_token=_optional(response.next_page_token),
    )


def chat_task_answer(response: pb.GetChatTaskResponse | pb.RetryChatTaskResponse) -> ChatTaskAnswer:
    """A task and its project's gate (GetChatTask and RetryChatTask answer the same two fields)."""
    return ChatTaskAnswer(
        task=chat_task_view(response.task), collaboration_gate=gate_view(response.collaboration_gate)
    )


# --- event payloads ----------------------------------------------------------------------------------


def _parsed(value: Any, message: MessageT) -> MessageT:
    """`message` filled from a payload object (proto field names or their JSON names; unknown
    keys ignored, nulls left unset). Raises json_format.ParseError for a value of the wrong type."""
    json_format.ParseDict(value if isinstance(value, dict) else {}, message, ignore_unknown_fields=True)
    return message


def _dumped(view: MessageView | ChatTaskView | CollaborationGateView) -> dict[str, Any]:
    """A view as the JSON REST answers carry (camelCase names, `Z` instants, nulls kept)."""
    return view.model_dump(mode="json", by_alias=True)


def client_event_data(event_type: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The SSE `data` of one conversations event, before the stream adds `sequence` and
    `occurred_at`; None for an event SSE clients never get (INTERNAL_EVENT_TYPES).

    - `conversation.message.created`: `message` becomes the MessageView of `GET .../messages`.
    - `task.updated`: `task` becomes the ChatTaskView of `GET /api/v1/tasks/{id}`, and the payload's
      `collaboration_gate` becomes `collaborationGate` (the same view as there).
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
    return payload
