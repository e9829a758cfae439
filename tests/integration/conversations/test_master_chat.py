"""The master agent's chat (CHAT-2) through the real conversations service on SQLite and PostgreSQL,
its openai_api backend against the demo model running as its own process (real HTTP, the official
`openai` client, never a patched one): the reply inline and true to the state, a slow answer as a
task that completes later, a 500 retried once then a system message, the endpoint down, restarts
mid-call, idempotent sends and retries; the master_codex_node backend's task for the master's own
Codex thread; the master conversation existing from installation on and reads that never write."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from sqlalchemy import select

from services.conversations.adapters.tables import projects
from services.conversations.domain.model import master_project_id
from services.conversations.master.settings import MASTER_CODEX_NODE, MasterSettings
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
    task_status,
)
from tests.integration.conversations.stack import Stack, budget_payload, running_stack
from tests.master_support import DemoModelProcess, demo_model_process, free_port  # noqa: F401

MASTER = master_project_id("local")
WINDOW = 16_000


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Polls `condition` every 0.1 s; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def task_of(stack: Stack, task_id: str) -> pb.ChatTask:
    return (
        await stack.stub.GetChatTask(pb.GetChatTaskRequest(task_id=task_id), metadata=stack.client())
    ).task


async def ended(stack: Stack, task_id: str) -> pb.ChatTask:
    """The task once it has ended."""
    found: dict[str, pb.ChatTask] = {}

    async def done() -> bool:
        found["task"] = await task_of(stack, task_id)
        return found["task"].status in ("completed", "failed", "timed_out", "cancelled", "expired")

    await until(done, f"task {task_id} to end")
    return found["task"]


async def with_budgets(stack: Stack) -> None:
    """Three threads: parser critical at 18.4 %, ios at watch 45 %, billing safe at 72 %."""
    for thread_id, title, pct, level in (
        ("th-parser", "parser", 18.4, "critical"),
        ("th-ios", "ios-sync-client", 45.0, "watch"),
        ("th-billing", "billing-api", 72.0, "safe"),
    ):
        await register(stack, thread_id, title=title)
        await stack.budget.publish("thread.context.updated", budget_payload(thread_id, pct, level))
    await stack.settle()


@pytest.fixture
def master_settings(demo_model_process: DemoModelProcess) -> MasterSettings:  # noqa: F811
    return demo_model_process.settings(context_window_tokens=WINDOW)


@pytest.fixture
async def stack(
    database_target: DatabaseTarget, tmp_path: Path, master_settings: MasterSettings
) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path, master=master_settings) as running:
        yield running


async def test_the_master_answers_inline_and_truly_from_the_state(
    stack: Stack,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    await with_budgets(stack)
    question = "Which thread is close to compaction?"

    sent = await post(stack, "master-agent", question, "m-1")

    assert sent.created and sent.HasField("master_reply")
    assert sent.master_reply.startswith("Demo model (not a real model), answering from Boss's state")
    assert (
        'The thread closest to compaction is "parser" (th-parser) with 18 % of its context budget left'
        in (sent.master_reply)
    )
    assert '"ios-sync-client" (th-ios) at 45 % (watch)' in sent.master_reply
    assert (sent.task.task_type, sent.task.status) == ("conversation_reply", "completed")
    assert (sent.task.project_id, sent.task.target_thread_id, sent.task.device_id) == (MASTER, "", "")
    listed = await messages_of(stack, "master-agent")
    assert [(m.author_kind, m.text) for m in listed] == [("user", question), ("master", sent.master_reply)]
    assert listed[1].task_id == sent.task.task_id == listed[0].task_id
    assert sent.task.result_message_id == listed[1].message_id
    asked = demo_model_process.chat_requests(question)[-1]  # the session's demo model answers every run
    assert (asked["tag"], asked["status"]) == ("master_chat", 200)

    # The ring: the share of the model's window the answer left (its prompt carried the state).
    master = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client())
    ).project
    ring = master.conversation.context_budget_indicator
    expected = (100 * (WINDOW - asked["total_tokens"])) // WINDOW
    assert (ring.visible, ring.percent) == (True, expected) and 0 < expected < 100
    assert ring.level == ("safe" if expected >= 60 else "watch" if expected >= 40 else "urgent")
    events = await events_of(stack)
    [shown] = [
        p
        for _s, t, p in events
        if t == "conversation.context_indicator.updated" and p["project_id"] == MASTER
    ]
    assert shown["context_budget_indicator"]["percent"] == expected
    assert [t for _s, t, _p in events if t == "task.requested"] == []  # the scheduler is not involved


async def test_a_question_about_one_thread_gets_that_threads_facts(stack: Stack) -> None:
    await with_budgets(stack)
    thread_project = await register(stack, "th-ios", title="ios-sync-client")
    busy = await post(stack, thread_project, "rebase onto main and rerun the sync tests", "t-1")

    sent = await post(stack, "master-agent", "What is ios-sync-client doing?", "m-1")

    assert (
        '"ios-sync-client" (th-ios) on node-a has 45 % of its context budget left (watch)'
        in sent.master_reply
    )
    assert 'It has 1 open task(s): queued "rebase onto main and rerun the sync tests"' in sent.master_reply
    assert busy.task.status == "queued"


async def test_a_slow_answer_is_a_task_that_completes_later(
    database_target: DatabaseTarget,
    tmp_path: Path,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    settings = demo_model_process.settings(inline_wait_seconds=0.3)
    async with running_stack(database_target, tmp_path, master=settings) as stack:
        sent = await post(stack, "master-agent", "status please [[demo:slow=1.5]]", "m-1")

        assert sent.created and not sent.HasField("master_reply")
        assert sent.task.status in ("queued", "running")
        assert [m.author_kind for m in await messages_of(stack, "master-agent")] == ["user"]
        done = await ended(stack, sent.task.task_id)
        assert done.status == "completed"
        listed = await messages_of(stack, "master-agent")
        assert [m.author_kind for m in listed] == ["user", "master"]
        assert listed[1].text.startswith("Demo model (not a real model), answering from Boss's state")
        statuses = [
            p["task"]["status"]
            for _s, t, p in await events_of(stack)
            if t == "task.updated" and p["task"]["task_id"] == sent.task.task_id
        ]
        assert statuses == ["queued", "running", "completed"]

        repeat = await post(stack, "master-agent", "status please [[demo:slow=1.5]]", "m-1")
        assert (
            not repeat.created and repeat.master_reply == listed[1].text and repeat.task.status == "completed"
        )


async def test_a_500_is_retried_once_then_ends_in_a_system_message(
    stack: Stack,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    text = f"hello [[demo:http500]] {time.monotonic_ns()}"
    sent = await post(stack, "master-agent", text, "m-1")

    assert not sent.HasField("master_reply")
    assert (sent.task.status, sent.task.failure_kind) == ("failed", "model_error")
    assert [r["status"] for r in demo_model_process.chat_requests(text)] == [500, 500]
    listed = await messages_of(stack, "master-agent")
    assert [m.author_kind for m in listed] == ["user", "system"]
    assert listed[1].text.startswith(
        f"The master agent could not answer: The model at {demo_model_process.base_url}"
    )
    assert "answered HTTP 500 (after one retry)" in listed[1].text
    assert "Your message is kept; retry it" in listed[1].text
    assert (
        "demo-key-not-secret" not in listed[1].text and "demo-key-not-secret" not in sent.task.status_detail
    )

    retried = await stack.stub.RetryChatTask(
        pb.RetryChatTaskRequest(task_id=sent.task.task_id), metadata=stack.client()
    )
    assert retried.task.retry_of_task_id == sent.task.task_id
    again = await ended(stack, retried.task.task_id)
    assert again.status == "failed"
    assert [m.author_kind for m in await messages_of(stack, "master-agent")] == ["user", "system", "system"]
    refused = await failure(
        stack.stub.RetryChatTask(pb.RetryChatTaskRequest(task_id=sent.task.task_id), metadata=stack.client())
    )
    assert refused.reason == "TASK_NOT_RETRYABLE"


async def test_an_unreachable_endpoint_ends_in_a_system_message(
    database_target: DatabaseTarget,
    tmp_path: Path,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    settings = demo_model_process.settings(base_url=down)
    async with running_stack(database_target, tmp_path, master=settings) as stack:
        sent = await post(stack, "master-agent", "anyone there?", "m-1")
        done = await ended(stack, sent.task.task_id)
        assert (done.status, done.failure_kind) == ("failed", "model_error")
        system = (await messages_of(stack, "master-agent"))[-1]
        assert system.author_kind == "system"
        assert f"The model at {down} could not be reached" in system.text


async def test_a_nonsense_or_empty_answer_is_said_plainly(stack: Stack) -> None:
    malformed = await post(stack, "master-agent", "be broken [[demo:malformed]]", "m-1")
    empty = await post(stack, "master-agent", "say nothing [[demo:no_reply]]", "m-2")

    assert (malformed.task.status, malformed.task.failure_kind) == ("failed", "model_error")
    assert (empty.task.status, empty.task.failure_kind) == ("failed", "no_reply")
    texts = [m.text for m in await messages_of(stack, "master-agent") if m.author_kind == "system"]
    assert "not a chat completion" in texts[0]
    assert texts[1] == (
        "The master agent's model (boss-demo-model) answered with no text. Your message is kept; you can "
        "retry it."
    )


async def test_sends_are_idempotent_by_client_message_id(stack: Stack) -> None:
    first = await post(stack, "master-agent", "how many threads?", "m-1")
    repeat = await post(stack, "master-agent", "how many threads?", "m-1")
    by_real_id = await post(stack, MASTER, "how many threads?", "m-1")

    assert first.created and not repeat.created and not by_real_id.created
    assert repeat.message == first.message == by_real_id.message
    assert repeat.task.task_id == first.task.task_id and repeat.master_reply == first.master_reply
    reused = await failure(post(stack, "master-agent", "something else", "m-1"))
    assert (reused.code, reused.reason) == (grpc.StatusCode.ALREADY_EXISTS, "CLIENT_MESSAGE_ID_REUSED")
    assert await stored_counts(stack) == (2, 1)


async def test_the_master_conversation_exists_from_installation_and_reads_never_write(stack: Stack) -> None:
    async def master_row() -> dict[str, object]:
        async with stack.app.database.read() as connection:
            row = (
                (await connection.execute(select(projects).where(projects.c.project_id == MASTER)))
                .mappings()
                .one()
            )
        return dict(row)

    before_row, before_head = await master_row(), await head(stack)
    rows = (
        await stack.stub.ListConversations(pb.ListConversationsRequest(), metadata=stack.client())
    ).conversations
    assert [(r.project_id, r.manual_pinned, r.project_title) for r in rows] == [
        (MASTER, True, "Master agent")
    ]

    for _ in range(3):
        detail = await stack.stub.GetProject(
            pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client()
        )
        assert detail.project.conversation.conversation_type == pb.CONVERSATION_TYPE_MASTER_AGENT
        assert (
            await stack.stub.ListMessages(
                pb.ListMessagesRequest(project_id="master-agent"), metadata=stack.client()
            )
        ).messages == []

    assert await master_row() == before_row and await head(stack) == before_head
    missing = await failure(
        stack.stub.GetProject(
            pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client("nobody")
        )
    )
    assert missing.reason == "PROJECT_NOT_FOUND"
    async with stack.app.database.read() as connection:
        assert (
            await connection.execute(select(projects.c.project_id).where(projects.c.owner_id == "nobody"))
        ).all() == []

    # A new owner's first thread brings their master conversation.
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(thread_id="th-o", node_id="node-a", worker_id="worker-a", owner_id="other"),
        metadata=stack.service(),
    )
    theirs = await stack.stub.GetProject(
        pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client("other")
    )
    assert theirs.project.conversation.project_id == master_project_id("other")


async def test_a_restart_mid_call_fails_the_lost_call_and_runs_the_queued_one(
    database_target: DatabaseTarget,
    tmp_path: Path,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    settings = demo_model_process.settings(inline_wait_seconds=0.2, timeout_seconds=2.0)
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    async with running_stack(database_target, tmp_path / "first", master=settings) as stack:
        lost = await post(stack, "master-agent", "think long [[demo:slow=30]]", "m-1")
        queued = await post(stack, "master-agent", "which thread is close to compaction?", "m-2")
        assert (lost.task.status, queued.task.status) == ("running", "queued")
    started = utc_now()

    async with running_stack(database_target, tmp_path / "second", master=settings) as stack:
        first = await ended(stack, lost.task.task_id)
        second = await ended(stack, queued.task.task_id)

        assert (first.status, first.failure_kind) == ("failed", "interrupted")
        assert second.status == "completed"
        listed = await messages_of(stack, "master-agent")
        assert [(m.author_kind, m.task_id) for m in listed[2:]] == [
            ("system", lost.task.task_id),
            ("master", queued.task.task_id),
        ] or [(m.author_kind, m.task_id) for m in listed[2:]] == [
            ("master", queued.task.task_id),
            ("system", lost.task.task_id),
        ]
        system = next(m for m in listed if m.author_kind == "system")
        assert "the conversations service stopped while the model was answering" in system.text
        assert (utc_now() - started).total_seconds() < 15


async def test_master_codex_node_asks_the_masters_own_codex_thread(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    settings = MasterSettings(backend=MASTER_CODEX_NODE)
    async with running_stack(database_target, tmp_path, master=settings) as stack:
        refused = await failure(post(stack, "master-agent", "hello", "m-0"))
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "CHAT_PATH_NOT_AVAILABLE",
        )
        assert "is_master_main_thread" in refused.status.message and await stored_counts(stack) == (0, 0)

        await with_budgets(stack)
        await register(stack, "th-master", title="master", is_master_main_thread=True)
        sent = await post(stack, "master-agent", "which thread is close to compaction?", "m-1")

        assert not sent.HasField("master_reply") and sent.task.status == "queued"
        assert (sent.task.target_thread_id, sent.task.device_id) == ("th-master", "node-a")
        assert (sent.task.project_id, sent.task.target_project_id) == (MASTER, MASTER)
        [requested] = [p for _s, t, p in await events_of(stack) if t == "task.requested"]
        instruction = requested["instruction_text"]
        assert instruction.startswith("[boss:master_chat]\n")
        assert '"parser" (th-parser) on node-a: 18 % left, critical' in instruction
        assert instruction.endswith("<boss-question>\nwhich thread is close to compaction?\n</boss-question>")

        await stack.scheduler.publish(
            "task.status_changed",
            task_status(sent.task, "completed", utc_now(), reply_text="parser is closest"),
        )
        await stack.settle()
        reply = (await messages_of(stack, "master-agent"))[-1]
        assert (reply.author_kind, reply.thread_id, reply.text) == (
            "master",
            "th-master",
            "parser is closest",
        )


async def test_a_queued_master_message_can_be_cancelled_a_running_one_not(
    database_target: DatabaseTarget,
    tmp_path: Path,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> None:
    settings = demo_model_process.settings(inline_wait_seconds=0.2)
    async with running_stack(database_target, tmp_path, master=settings) as stack:
        running = await post(stack, "master-agent", "think [[demo:slow=2]]", "m-1")
        queued = await post(stack, "master-agent", "and then?", "m-2")
        assert (running.task.status, queued.task.status) == ("running", "queued")

        cancelled = await stack.stub.CancelChatTask(
            pb.CancelChatTaskRequest(task_id=queued.task.task_id), metadata=stack.client()
        )
        refused = await failure(
            stack.stub.CancelChatTask(
                pb.CancelChatTaskRequest(task_id=running.task.task_id), metadata=stack.client()
            )
        )

        assert cancelled.task.status == "cancelled"
        assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TASK_NOT_CANCELLABLE")
        again = await stack.stub.CancelChatTask(
            pb.CancelChatTaskRequest(task_id=queued.task.task_id), metadata=stack.client()
        )
        assert again.task.status == "cancelled"
        assert (await ended(stack, running.task.task_id)).status == "completed"
        authors = [(m.author_kind, m.task_id) for m in await messages_of(stack, "master-agent")]
        assert authors == [
            ("user", running.task.task_id),
            ("user", queued.task.task_id),
            ("system", queued.task.task_id),
            ("master", running.task.task_id),
        ]
