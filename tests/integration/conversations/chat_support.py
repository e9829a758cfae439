"""Helpers of the chat tests: registering threads, sending messages, reading events and failures,
and the scheduler's `task.status_changed` payload (its Task message as JSON, scheduler.proto)."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from google.rpc import status_pb2
from grpc_status import rpc_status
from sqlalchemy import func, select

from services.conversations.adapters.tables import chat_tasks, messages
from services.shared.errors import reason_of
from services.shared.time import isoformat_utc
from tests.integration.conversations.stack import Stack


async def register(stack: Stack, thread_id: str, **fields: object) -> str:
    """Registers a thread on node-a with complete metadata (unless `fields` blank some); returns its
    single_device project id."""
    values: dict[str, object] = {
        "thread_id": thread_id,
        "node_id": "node-a",
        "worker_id": "worker-a",
        "codex_folder": f"/home/dev/{thread_id}",
        "codex_thread_ref": f"0199-{thread_id}",
        **fields,
    }
    response = await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(**values),  # type: ignore[arg-type]
        metadata=stack.worker(),
    )
    return response.project_id


async def post(
    stack: Stack, project_id: str, text: str, client_message_id: str, owner: str = "local"
) -> pb.PostMessageResponse:
    """PostMessage with a client token of `owner`."""
    return await stack.stub.PostMessage(
        pb.PostMessageRequest(project_id=project_id, text=text, client_message_id=client_message_id),
        metadata=stack.client(owner),
    )


async def events_of(stack: Stack, after: int = 0) -> list[tuple[int, str, dict[str, Any]]]:
    """(sequence, type, payload) of every committed event after `after` (service token)."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    while True:
        page = await stack.stub.ListEvents(
            pb.ListEventsRequest(after_sequence=after, page_size=1000), metadata=stack.service()
        )
        found += [(e.sequence, e.type, json.loads(e.payload_json)) for e in page.events]
        if page.scanned_through_sequence >= page.head_sequence or page.scanned_through_sequence == after:
            return found
        after = page.scanned_through_sequence


async def head(stack: Stack) -> int:
    """The conversations stream's last sequence."""
    events = await events_of(stack)
    return events[-1][0] if events else 0


@dataclass
class Failure:
    """A failed call: its code, ErrorInfo reason and rich status."""

    code: grpc.StatusCode
    reason: str | None
    status: status_pb2.Status


async def failure(call: Awaitable[Any]) -> Failure:
    """Awaits a call that must fail."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    status = rpc_status.from_call(raised.value)
    assert status is not None
    return Failure(raised.value.code(), reason_of(status), status)


async def messages_of(stack: Stack, project_id: str, **fields: object) -> list[pb.Message]:
    """Every message of a project (following page tokens)."""
    found: list[pb.Message] = []
    token = ""
    while True:
        page = await stack.stub.ListMessages(
            pb.ListMessagesRequest(project_id=project_id, page_token=token, **fields),  # type: ignore[arg-type]
            metadata=stack.client(),
        )
        found += page.messages
        token = page.next_page_token
        if not token:
            return found


async def stored_counts(stack: Stack) -> tuple[int, int]:
    """(messages, chat tasks) stored."""
    async with stack.app.database.read() as connection:
        message_count = (await connection.execute(select(func.count()).select_from(messages))).scalar_one()
        task_count = (await connection.execute(select(func.count()).select_from(chat_tasks))).scalar_one()
    return int(message_count), int(task_count)


def task_status(
    task: pb.ChatTask,
    status: str,
    updated_at: datetime,
    *,
    failure_kind: str = "",
    status_detail: str = "",
    reply_text: str = "",
    heartbeat_at: datetime | None = None,
    device_last_seen_at: datetime | None = None,
    owner_id: str = "local",
    codex_session_id: str = "",
    worker_id: str = "worker-a",
) -> dict[str, Any]:
    """`task.status_changed` as the scheduler publishes it for `task` (every Task field)."""
    terminal = status in ("completed", "failed", "timed_out", "cancelled", "expired")
    return {
        "task_id": task.task_id,
        "task_type": task.task_type,
        "status": status,
        "owner_id": owner_id,
        "project_id": task.project_id,
        "target_project_id": task.target_project_id,
        "target_thread_id": task.target_thread_id,
        "device_id": task.device_id,
        "codex_folder_ref": task.codex_folder_ref,
        "codex_thread_ref": task.codex_thread_ref,
        "request_message_id": task.request_message_id,
        "instruction_text": "",
        "dispatch_plan_id": "",
        "retry_of_task_id": task.retry_of_task_id,
        "attempt": 1,
        "worker_id": worker_id,
        "created_at": isoformat_utc(task.created_at.ToDatetime(tzinfo=UTC)),
        "claimed_at": None,
        "started_at": None,
        "finished_at": isoformat_utc(updated_at) if terminal else None,
        "lease_expires_at": None,
        "heartbeat_at": isoformat_utc(heartbeat_at),
        "reply_text": reply_text,
        "failure_kind": failure_kind,
        "status_detail": status_detail,
        "device_last_seen_at": isoformat_utc(device_last_seen_at),
        "codex_session_id": codex_session_id,
        "updated_at": isoformat_utc(updated_at),
    }
