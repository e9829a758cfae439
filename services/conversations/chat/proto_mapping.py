"""Chat values as ConversationsService protobuf messages (the servicer's conversions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boss.conversations.v1 import conversations_pb2 as pb

from services.conversations.chat.domain import ChatTask, CollaborationGate
from services.shared.time import to_timestamp


def message_message(message: Mapping[str, Any]) -> pb.Message:
    """A stored message (`message_view` fields)."""
    return pb.Message(
        message_id=message["message_id"],
        project_id=message["project_id"],
        author_kind=message["author_kind"],
        thread_id=message["thread_id"],
        text=message["text"],
        created_at=to_timestamp(message["created_at"]),
        sequence=int(message["sequence"]),
        client_message_id=message["client_message_id"] or "",
        task_id=message["task_id"] or "",
    )


def chat_task_message(task: ChatTask) -> pb.ChatTask:
    """A chat task."""
    return pb.ChatTask(
        task_id=task.task_id,
        task_type=task.task_type,
        status=task.status,
        project_id=task.project_id,
        target_project_id=task.target_project_id,
        target_thread_id=task.target_thread_id,
        device_id=task.device_id,
        codex_folder_ref=task.codex_folder_ref,
        codex_thread_ref=task.codex_thread_ref,
        request_message_id=task.request_message_id,
        result_message_id=task.result_message_id,
        failure_kind=task.failure_kind,
        status_detail=task.status_detail,
        device_last_seen_at=to_timestamp(task.device_last_seen_at),
        retry_of_task_id=task.retry_of_task_id,
        retried_by_task_id=task.retried_by_task_id,
        created_at=to_timestamp(task.created_at),
        updated_at=to_timestamp(task.updated_at),
    )


def gate_message(gate: CollaborationGate) -> pb.CollaborationGate:
    """A collaboration gate."""
    return pb.CollaborationGate(
        state=gate.state, tasks_total=gate.tasks_total, tasks_done=gate.tasks_done, detail=gate.detail
    )
