"""The chat RPCs called directly on conversations' gRPC port by a caller holding a valid token of
someone else, or sending malformed input, on SQLite and PostgreSQL: another owner's project and task
stay NOT_FOUND whatever owner_id the request names; text and ids PostgreSQL cannot store (NUL) or
that no id is (control characters, over 200 characters) are INVALID_ARGUMENT naming the field on
both databases, with nothing stored; undecodable request bytes store nothing; a scheduler report
carrying NUL characters neither stalls the task projection nor loses the reply."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.shared.errors import field_violations_of
from tests.conftest import DatabaseTarget
from tests.integration.conversations.chat_support import (
    failure,
    messages_of,
    post,
    register,
    stored_counts,
    task_status,
)
from tests.integration.conversations.stack import T0, Stack, running_stack

STATUS_CHANGED = "task.status_changed"
POST_MESSAGE = "/boss.conversations.v1.ConversationsService/PostMessage"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_stack(database_target, tmp_path) as running:
        yield running


async def test_owner_id_in_a_request_never_lets_a_client_token_reach_another_owner(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "the deploy key is in vault", "c-1")
    await stack.scheduler.publish(
        STATUS_CHANGED,
        task_status(sent.task, "failed", T0 + timedelta(seconds=2), failure_kind="session_not_found"),
    )
    await stack.settle()
    counts = await stored_counts(stack)
    mallory = stack.client("mallory")

    for call, reason in (
        (
            stack.stub.PostMessage(
                pb.PostMessageRequest(
                    project_id=project_id, text="hi", client_message_id="c-1", owner_id="local"
                ),
                metadata=mallory,
            ),
            "PROJECT_NOT_FOUND",
        ),
        (
            stack.stub.ListMessages(
                pb.ListMessagesRequest(project_id=project_id, owner_id="local"), metadata=mallory
            ),
            "PROJECT_NOT_FOUND",
        ),
        (
            stack.stub.GetChatTask(
                pb.GetChatTaskRequest(task_id=sent.task.task_id, owner_id="local"), metadata=mallory
            ),
            "TASK_NOT_FOUND",
        ),
        (
            stack.stub.RetryChatTask(
                pb.RetryChatTaskRequest(task_id=sent.task.task_id, owner_id="local"), metadata=mallory
            ),
            "TASK_NOT_FOUND",
        ),
    ):
        refused = await failure(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, reason)

    assert await stored_counts(stack) == counts
    retried = await stack.stub.RetryChatTask(
        pb.RetryChatTaskRequest(task_id=sent.task.task_id), metadata=stack.client()
    )
    assert retried.task.retry_of_task_id == sent.task.task_id


async def test_worker_tokens_cannot_read_send_poll_or_retry_chat(stack: Stack) -> None:
    """A worker token (any node's, the thread's own included) carries neither conversations:read
    nor conversations:write."""
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "the deploy key is in vault", "c-1")
    worker = stack.worker()

    for call in (
        stack.stub.PostMessage(
            pb.PostMessageRequest(project_id=project_id, text="hi", client_message_id="c-2"), metadata=worker
        ),
        stack.stub.ListMessages(pb.ListMessagesRequest(project_id=project_id), metadata=worker),
        stack.stub.GetChatTask(pb.GetChatTaskRequest(task_id=sent.task.task_id), metadata=worker),
        stack.stub.RetryChatTask(pb.RetryChatTaskRequest(task_id=sent.task.task_id), metadata=worker),
    ):
        refused = await failure(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.PERMISSION_DENIED, "SCOPE_MISSING")
    assert await stored_counts(stack) == (1, 1)


async def test_text_with_nul_is_refused_naming_text_on_every_database(stack: Stack) -> None:
    """PostgreSQL text cannot hold NUL: refused up front, the same on SQLite, nothing stored (and
    no task.requested the scheduler could not store)."""
    project_id = await register(stack, "th-1")

    refused = await failure(post(stack, project_id, "run\x00the tests", "c-1"))
    added = await failure(
        stack.stub.AddMessage(
            pb.AddMessageRequest(project_id=project_id, author_kind="user", text="note\x00"),
            metadata=stack.client(),
        )
    )

    for call in (refused, added):
        assert call.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [(v.field, v.description) for v in field_violations_of(call.status)] == [
            ("text", "must not contain NUL characters")
        ]
    assert await stored_counts(stack) == (0, 0)


@pytest.mark.parametrize(
    "project_id",
    ["proj\x00x", "proj\x1bx", "p" * 201, " proj"],
    ids=["nul", "escape", "over-200", "leading-space"],
)
async def test_a_project_id_that_no_project_has_is_invalid_argument_naming_it(
    stack: Stack, project_id: str
) -> None:
    await register(stack, "th-1")
    calls = (
        post(stack, project_id, "hi", "c-1"),
        stack.stub.ListMessages(pb.ListMessagesRequest(project_id=project_id), metadata=stack.client()),
        stack.stub.AddMessage(
            pb.AddMessageRequest(project_id=project_id, author_kind="user", text="hi"),
            metadata=stack.client(),
        ),
    )
    for call in calls:
        refused = await failure(call)
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in field_violations_of(refused.status)] == ["project_id"]
    assert await stored_counts(stack) == (0, 0)


async def test_text_with_bidi_controls_is_stored_exactly_as_sent(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    text = "invoice \u202egpj.exe\u202c <b>bold</b> **md**"

    await post(stack, project_id, text, "c-1")

    assert [m.text for m in await messages_of(stack, project_id)] == [text]


@pytest.mark.parametrize(
    "body",
    [b"\xff\xff\xff\xff\x0f", b"\x0a\x03\xff\xfe\xfd", b"\x12\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"],
    ids=["corrupt-wire-format", "invalid-utf8-string", "overlong-varint-length"],
)
async def test_undecodable_request_bytes_store_nothing_and_the_service_keeps_serving(
    stack: Stack, body: bytes
) -> None:
    project_id = await register(stack, "th-1")
    channel = grpc.aio.insecure_channel(stack.address)
    try:
        raw = channel.unary_unary(POST_MESSAGE)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await raw(body, metadata=stack.client())
        assert raised.value.code() not in (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
    finally:
        await channel.close()

    assert await stored_counts(stack) == (0, 0)
    assert (await post(stack, project_id, "still here", "c-1")).created


async def test_a_report_with_nul_characters_is_applied_and_the_next_one_too(stack: Stack) -> None:
    """A reply or detail holding NUL (PostgreSQL text cannot) is stored with U+FFFD in its place;
    a task_id holding NUL is skipped. Either way the projection goes on with the next event."""
    project_id = await register(stack, "th-1")
    first = (await post(stack, project_id, "first", "c-1")).task
    second = (await post(stack, project_id, "second", "c-2")).task

    await stack.scheduler.publish(
        STATUS_CHANGED,
        {**task_status(first, "running", T0 + timedelta(seconds=1)), "task_id": first.task_id + "\x00"},
    )
    await stack.scheduler.publish(
        STATUS_CHANGED,
        task_status(first, "completed", T0 + timedelta(seconds=2), reply_text="bytes: \x00\x01 end"),
    )
    await stack.scheduler.publish(
        STATUS_CHANGED,
        task_status(
            second,
            "failed",
            T0 + timedelta(seconds=3),
            failure_kind="other\x00",
            status_detail="codex said \x00",
        ),
    )
    await stack.settle()

    texts = [(m.author_kind, m.text) for m in await messages_of(stack, project_id)]
    assert texts[:3] == [("user", "first"), ("user", "second"), ("thread", "bytes: \ufffd\x01 end")]
    assert texts[3][0] == "system" and "\x00" not in texts[3][1]
    polled = await stack.stub.GetChatTask(
        pb.GetChatTaskRequest(task_id=second.task_id), metadata=stack.client()
    )
    assert (polled.task.status, polled.task.status_detail) == ("failed", "codex said \ufffd")


async def test_another_nodes_worker_cannot_take_over_a_registered_thread(stack: Stack) -> None:
    project_id = await register(stack, "th-1")

    refused = await failure(
        stack.stub.RegisterThread(
            pb.RegisterThreadRequest(
                thread_id="th-1",
                node_id="node-b",
                worker_id="worker-b",
                owner_id="local",
                codex_folder="/elsewhere",
                codex_thread_ref="0199-elsewhere",
            ),
            metadata=stack.worker("worker-b", "node-b"),
        )
    )

    assert refused.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
    sent = await post(stack, project_id, "the deploy key is in vault", "c-1")
    assert (sent.task.device_id, sent.task.codex_thread_ref) == ("node-a", "0199-th-1")
