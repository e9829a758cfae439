"""Sending a message to a thread (PostMessage) over real gRPC on SQLite and PostgreSQL: the message,
its task and their events in one transaction, idempotency by client_message_id (sequential and
racing repeats), every refusal, message sequences and ListMessages(after_sequence)."""

from __future__ import annotations

import asyncio
from datetime import UTC
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from sqlalchemy import delete, insert, select, text

from services.conversations.adapters.repository import SqlAlchemyConversationsRepository
from services.conversations.adapters.tables import outbox_sequencer
from services.conversations.chat.domain import ChatThread, new_chat_task
from services.conversations.chat.handlers import write_message
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.shared.errors import field_violations_of, precondition_violations_of
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget
from tests.integration.conversations.chat_support import (
    events_of,
    failure,
    head,
    messages_of,
    post,
    register,
    stored_counts,
)
from tests.integration.conversations.stack import Stack, running_stack


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_stack(database_target, tmp_path) as running:
        yield running


async def test_a_send_stores_the_message_its_task_and_their_events_together(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    before = await head(stack)

    sent = await post(stack, project_id, "Run the parser tests", "c-1")

    assert sent.created and not sent.HasField("master_reply")
    message, task = sent.message, sent.task
    assert (message.author_kind, message.text, message.sequence, message.client_message_id) == (
        "user",
        "Run the parser tests",
        1,
        "c-1",
    )
    assert message.task_id == task.task_id and message.project_id == project_id
    assert task.task_id.startswith("task-") and len(task.task_id) == len("task-") + 32
    assert (task.task_type, task.status, task.project_id, task.target_project_id) == (
        "conversation_reply",
        "queued",
        project_id,
        project_id,
    )
    assert (task.target_thread_id, task.device_id, task.codex_folder_ref, task.codex_thread_ref) == (
        "th-1",
        "node-a",
        "/home/dev/th-1",
        "0199-th-1",
    )
    assert task.request_message_id == message.message_id and task.result_message_id == ""
    assert sent.collaboration_gate == pb.CollaborationGate(state="open", tasks_total=1, tasks_done=0)

    events = await events_of(stack, before)
    assert [kind for _sequence, kind, _payload in events] == [
        "conversation.message.created",
        "task.requested",
        "task.updated",
    ]
    assert [sequence for sequence, _kind, _payload in events] == [before + 1, before + 2, before + 3]
    created, requested, updated = (payload for _sequence, _kind, payload in events)
    assert requested == {
        "owner_id": "local",
        "task_id": task.task_id,
        "task_type": "conversation_reply",
        "project_id": project_id,
        "target_project_id": project_id,
        "target_thread_id": "th-1",
        "device_id": "node-a",
        "codex_folder_ref": "/home/dev/th-1",
        "codex_thread_ref": "0199-th-1",
        "request_message_id": message.message_id,
        "instruction_text": "Run the parser tests",
        "retry_of_task_id": "",
        "dispatch_plan_id": "",
    }
    assert created["conversation_id"] == f"conv-{project_id}" and created["owner_id"] == "local"
    assert created["latest_reply_at"] == created["message"]["created_at"]
    assert {key: created["message"][key] for key in ("sequence", "client_message_id", "task_id", "text")} == {
        "sequence": 1,
        "client_message_id": "c-1",
        "task_id": task.task_id,
        "text": "Run the parser tests",
    }
    assert updated["task"]["task_id"] == task.task_id and updated["task"]["status"] == "queued"
    assert updated["collaboration_gate"] == {"state": "open", "tasks_total": 1, "tasks_done": 0, "detail": ""}
    assert (updated["owner_id"], updated["project_id"]) == ("local", project_id)

    polled = await stack.stub.GetChatTask(
        pb.GetChatTaskRequest(task_id=task.task_id), metadata=stack.client()
    )
    assert polled.task == task
    assert [m.message_id for m in await messages_of(stack, project_id)] == [message.message_id]
    [row] = [
        row
        for row in (
            await stack.stub.ListConversations(pb.ListConversationsRequest(), metadata=stack.client())
        ).conversations
        if row.project_id == project_id
    ]
    assert row.latest_reply_at == message.created_at


async def test_nothing_is_stored_when_the_transaction_cannot_commit(stack: Stack) -> None:
    """The outbox append is the transaction's last write; when it fails, the message, the task and
    the taken sequence are rolled back with it."""
    project_id = await register(stack, "th-1")
    async with stack.app.database.transaction() as connection:
        last = (await connection.execute(select(outbox_sequencer.c.last_sequence))).scalar_one()
        await connection.execute(delete(outbox_sequencer))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await post(stack, project_id, "hello", "c-1")
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        assert raised.value.details() == "internal error"
        assert await stored_counts(stack) == (0, 0)
    finally:
        async with stack.app.database.transaction() as connection:
            await connection.execute(insert(outbox_sequencer).values(id=1, last_sequence=last))

    sent = await post(stack, project_id, "hello", "c-1")
    assert sent.created and sent.message.sequence == 1  # the rolled-back send left no gap
    assert await stored_counts(stack) == (1, 1)


async def test_a_repeat_answers_the_stored_message_and_task_and_stores_nothing(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    first = await post(stack, project_id, "Run the parser tests", "c-1")
    before = await head(stack)

    again = await post(stack, project_id, "Run the parser tests", "c-1")

    assert not again.created
    assert again.message == first.message and again.task == first.task
    assert await head(stack) == before
    assert await stored_counts(stack) == (1, 1)


async def test_the_same_client_message_id_with_another_text_is_already_exists(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    await post(stack, project_id, "Run the parser tests", "c-1")
    before = await head(stack)

    refused = await failure(post(stack, project_id, "Run the lexer tests", "c-1"))

    assert (refused.code, refused.reason) == (grpc.StatusCode.ALREADY_EXISTS, "CLIENT_MESSAGE_ID_REUSED")
    assert [v.field for v in field_violations_of(refused.status)] == ["client_message_id"]
    assert await head(stack) == before and await stored_counts(stack) == (1, 1)


async def test_concurrent_repeats_create_one_message_and_one_task(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    answers = await asyncio.gather(*(post(stack, project_id, "Deploy it", "c-race") for _ in range(6)))

    assert sum(answer.created for answer in answers) == 1
    assert len({answer.message.message_id for answer in answers}) == 1
    assert len({answer.task.task_id for answer in answers}) == 1
    assert await stored_counts(stack) == (1, 1)
    kinds = [kind for _sequence, kind, _payload in await events_of(stack)]
    assert kinds.count("task.requested") == 1


async def test_a_repeat_that_loses_the_race_to_the_insert_answers_the_winner(
    stack: Stack, database_target: DatabaseTarget
) -> None:
    """The first send is still uncommitted when the repeat looks for its key, so the repeat goes on
    to store its own message; the unique index refuses it and the stored message is answered. (On
    SQLite the repeat's transaction cannot begin before the first one commits, and it finds the
    message straight away.)"""
    project_id = await register(stack, "th-1")
    thread = ChatThread("th-1", "node-a", "/home/dev/th-1", "0199-th-1")
    async with stack.app.database.transaction() as connection:
        project = await SqlAlchemyConversationsRepository(connection).project(project_id)
        assert project is not None
        message, _event = await write_message(
            connection,
            project,
            author_kind="user",
            thread_id="",
            text="Deploy it",
            now=utc_now(),
            client_message_id="c-race",
            task_id="task-first",
        )
        first = new_chat_task("task-first", "local", project_id, thread, message["message_id"], utc_now())
        await SqlAlchemyChatRepository(connection).insert_task(first)
        racing = asyncio.create_task(
            stack.app.handlers.chat.post_message("local", project_id, "Deploy it", "c-race")
        )
        if database_target.backend == "postgresql":
            holder = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            await _until_a_session_waits_for(stack, holder)
        else:
            await asyncio.sleep(0.05)

    answer = await racing
    assert not answer.created
    assert answer.message["message_id"] == message["message_id"]
    assert answer.task is not None and answer.task.task_id == "task-first"
    assert await stored_counts(stack) == (1, 1)


async def _until_a_session_waits_for(stack: Stack, holder_pid: int) -> None:
    """Waits (at most 10 s) until some PostgreSQL session is blocked by the session `holder_pid`."""
    for _ in range(1000):
        async with stack.app.database.read() as connection:
            waiting = (
                await connection.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE :holder = ANY(pg_blocking_pids(pid))"),
                    {"holder": holder_pid},
                )
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the racing send never waited for the first one's locks")


BAD_FIELDS = [
    ("", "c-1", ["text"]),
    ("   \n\t", "c-1", ["text"]),
    ("x" * 100_001, "c-1", ["text"]),
    ("hello", "", ["client_message_id"]),
    ("hello", "has space", ["client_message_id"]),
    ("hello", "c" * 201, ["client_message_id"]),
    ("", "bad/id", ["text", "client_message_id"]),
]


async def test_bad_fields_are_invalid_argument_naming_them(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    for text_sent, client_message_id, fields in BAD_FIELDS:
        refused = await failure(post(stack, project_id, text_sent, client_message_id))
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in field_violations_of(refused.status)] == fields, (
            text_sent[:10],
            client_message_id,
        )
    assert await stored_counts(stack) == (0, 0)


async def test_an_unknown_or_another_owners_project_is_not_found(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    for call in (
        post(stack, "proj-nope", "hi", "c-1"),
        post(stack, project_id, "hi", "c-1", owner="mallory"),
    ):
        refused = await failure(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "PROJECT_NOT_FOUND")
    assert await stored_counts(stack) == (0, 0)


async def test_worker_tokens_cannot_send(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    refused = await failure(
        stack.stub.PostMessage(
            pb.PostMessageRequest(project_id=project_id, text="hi", client_message_id="c-1"),
            metadata=stack.worker(),
        )
    )
    assert refused.code == grpc.StatusCode.PERMISSION_DENIED


async def test_incomplete_thread_metadata_refuses_the_message_naming_each_missing_field(stack: Stack) -> None:
    """The message is refused (not stored, no task): the client keeps its draft and sends it again."""
    partial = await register(stack, "th-1", codex_folder="", codex_thread_ref="")
    await stack.scheduler.publish(
        "thread.handoff.required",
        {"thread_id": "th-seen", "node_id": "", "reason": "context_urgent", "handoff_package_id": "hp-1"},
    )
    await stack.settle()
    bare = (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-seen"), metadata=stack.client()
        )
    ).thread_context_budget.thread.single_device_project_id
    before = await head(stack)

    missing = {}
    for project_id in (partial, bare):
        refused = await failure(post(stack, project_id, "hello", "c-1"))
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "THREAD_METADATA_INCOMPLETE",
        )
        missing[project_id] = [(v.type, v.subject) for v in precondition_violations_of(refused.status)]

    assert missing[partial] == [("THREAD_METADATA", "codexFolderRef"), ("THREAD_METADATA", "codexThreadRef")]
    assert [subject for _type, subject in missing[bare]] == ["deviceId", "codexFolderRef", "codexThreadRef"]
    assert await head(stack) == before and await stored_counts(stack) == (0, 0)


async def test_an_archived_thread_refuses_the_message(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-1"), metadata=stack.client())
    refused = await failure(post(stack, project_id, "hello", "c-1"))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "THREAD_ARCHIVED")
    assert await stored_counts(stack) == (0, 0)


async def test_master_agent_chat_without_a_backend_says_how_to_configure_one(stack: Stack) -> None:
    await register(stack, "th-1")
    master = await stack.stub.GetProject(
        pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client()
    )
    before = await head(stack)

    for project_id in ("master-agent", master.project.conversation.project_id):
        refused = await failure(post(stack, project_id, "hello", "c-1"))
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "CHAT_PATH_NOT_AVAILABLE",
        )
        assert "no backend configured" in refused.status.message
        assert "BOSS_MASTER_BACKEND=openai_api" in refused.status.message
    assert await head(stack) == before and await stored_counts(stack) == (0, 0)


async def test_every_message_of_a_conversation_gets_the_next_sequence_whoever_writes_it(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    other = await register(stack, "th-2")

    async def add(index: int) -> int:
        response = await stack.stub.AddMessage(
            pb.AddMessageRequest(project_id=project_id, author_kind="system", text=f"note {index}"),
            metadata=stack.client(),
        )
        return response.message.sequence

    async def send(index: int) -> int:
        return (await post(stack, project_id, f"message {index}", f"c-{index}")).message.sequence

    sequences = await asyncio.gather(*(add(i) if i % 2 else send(i) for i in range(12)))

    assert sorted(sequences) == list(range(1, 13))
    listed = await messages_of(stack, project_id, page_size=5)
    assert [m.sequence for m in listed] == list(range(1, 13))
    assert (await post(stack, other, "hello", "c-1")).message.sequence == 1


async def test_after_sequence_returns_exactly_what_a_client_missed(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    for index in range(5):
        await post(stack, project_id, f"message {index}", f"c-{index}")

    assert [m.sequence for m in await messages_of(stack, project_id, after_sequence=2)] == [3, 4, 5]
    assert [m.text for m in await messages_of(stack, project_id, after_sequence=2)] == [
        "message 2",
        "message 3",
        "message 4",
    ]
    first = await stack.stub.ListMessages(
        pb.ListMessagesRequest(project_id=project_id, after_sequence=1, page_size=2), metadata=stack.client()
    )
    assert [m.sequence for m in first.messages] == [2, 3] and first.next_page_token
    rest = await stack.stub.ListMessages(
        pb.ListMessagesRequest(
            project_id=project_id, after_sequence=1, page_size=2, page_token=first.next_page_token
        ),
        metadata=stack.client(),
    )
    assert [m.sequence for m in rest.messages] == [4, 5] and rest.next_page_token == ""
    assert await messages_of(stack, project_id, after_sequence=5) == []

    negative = await failure(
        stack.stub.ListMessages(
            pb.ListMessagesRequest(project_id=project_id, after_sequence=-1), metadata=stack.client()
        )
    )
    assert [v.field for v in field_violations_of(negative.status)] == ["after_sequence"]
    foreign = await failure(
        stack.stub.ListMessages(
            pb.ListMessagesRequest(project_id=project_id, after_sequence=3, page_token=first.next_page_token),
            metadata=stack.client(),
        )
    )
    assert [v.field for v in field_violations_of(foreign.status)] == ["page_token"]


async def test_messages_are_listed_in_sequence_with_their_chat_fields(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    note = await stack.stub.AddMessage(
        pb.AddMessageRequest(project_id=project_id, author_kind="system", text="a note"),
        metadata=stack.client(),
    )
    listed = await messages_of(stack, project_id)
    assert [(m.sequence, m.author_kind, m.client_message_id, m.task_id) for m in listed] == [
        (1, "user", "c-1", sent.task.task_id),
        (2, "system", "", ""),
    ]
    assert listed[1] == note.message
    assert listed[1].created_at.ToDatetime(UTC) >= listed[0].created_at.ToDatetime(UTC)
