"""Chat tasks over real gRPC on SQLite and PostgreSQL: the scheduler's `task.status_changed` events
move the task and write exactly one message per terminal task (the raw reply, or a system message per
failure kind), replays and late events change nothing, GetChatTask with the collaboration gate, and
RetryChatTask."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.domain.model import master_project_id
from services.conversations.master.handlers import model_task
from services.shared.outbox import StoredEvent
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
from tests.integration.conversations.stack import T0, Stack, running_stack

STATUS_CHANGED = "task.status_changed"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_stack(database_target, tmp_path) as running:
        yield running


async def report(stack: Stack, task: pb.ChatTask, status: str, second: int, **fields: object) -> None:
    """Publishes one status change of `task` on the scheduler's stream and waits until applied."""
    await stack.scheduler.publish(
        STATUS_CHANGED,
        task_status(task, status, T0 + timedelta(seconds=second), **fields),  # type: ignore[arg-type]
    )
    await stack.settle()


async def get_task(stack: Stack, task_id: str, owner: str = "local") -> pb.GetChatTaskResponse:
    return await stack.stub.GetChatTask(pb.GetChatTaskRequest(task_id=task_id), metadata=stack.client(owner))


async def retry(stack: Stack, task_id: str, owner: str = "local") -> pb.RetryChatTaskResponse:
    return await stack.stub.RetryChatTask(
        pb.RetryChatTaskRequest(task_id=task_id), metadata=stack.client(owner)
    )


async def test_a_completed_task_writes_the_threads_raw_reply_exactly_once(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "Run the parser tests", "c-1")
    after_send = await head(stack)
    reply = "All 42 parser tests pass.\n\n```\n42 passed in 0.41s\n```"

    await report(stack, sent.task, "claimed", 1)
    await report(stack, sent.task, "running", 2, heartbeat_at=T0 + timedelta(seconds=2))
    await report(stack, sent.task, "completed", 9, reply_text=reply)

    listed = await messages_of(stack, project_id)
    assert [(m.sequence, m.author_kind, m.thread_id, m.text) for m in listed] == [
        (1, "user", "", "Run the parser tests"),
        (2, "thread", "th-1", reply),
    ]
    assert listed[1].task_id == sent.task.task_id and listed[1].client_message_id == ""
    task = (await get_task(stack, sent.task.task_id)).task
    assert (task.status, task.result_message_id, task.failure_kind) == ("completed", listed[1].message_id, "")
    events = await events_of(stack, after_send)
    assert [(kind, payload.get("task", {}).get("status")) for _s, kind, payload in events] == [
        ("task.updated", "claimed"),
        ("task.updated", "running"),
        ("conversation.message.created", None),
        ("task.updated", "completed"),
    ]
    created = events[2][2]
    assert created["message"]["text"] == reply and created["message"]["sequence"] == 2
    assert events[3][2]["task"]["result_message_id"] == listed[1].message_id
    assert events[3][2]["collaboration_gate"] == {
        "state": "open",
        "tasks_total": 0,
        "tasks_done": 0,
        "detail": "",
    }
    [row] = [
        row
        for row in (
            await stack.stub.ListConversations(pb.ListConversationsRequest(), metadata=stack.client())
        ).conversations
        if row.project_id == project_id
    ]
    assert row.latest_reply_at == listed[1].created_at

    # The scheduler's events replayed (twice), and late events after the terminal one: nothing more.
    settled = await head(stack)
    for _ in range(2):
        await report(stack, sent.task, "running", 2)
        await report(stack, sent.task, "completed", 9, reply_text=reply)
    assert await head(stack) == settled
    assert len(await messages_of(stack, project_id)) == 2


async def test_a_batch_applied_again_writes_nothing_twice(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    finished = StoredEvent(
        sequence=1,
        type=STATUS_CHANGED,
        occurred_at=T0,
        thread_id="th-1",
        project_id=project_id,
        node_id="node-a",
        payload=task_status(sent.task, "completed", T0, reply_text="hi there"),
        trace_context={},
    )
    published = []
    for _ in range(2):
        async with stack.app.database.transaction() as connection:
            published.append(await stack.app.handlers.apply_scheduler_events(connection, [finished]))
    assert [[event.type for event in run] for run in published] == [
        ["conversation.message.created", "task.updated"],
        [],
    ]
    assert await stored_counts(stack) == (2, 1)


FAILURES: list[tuple[str, dict[str, Any], str]] = [
    (
        "failed",
        {"failure_kind": "session_not_found", "status_detail": "no rollout found"},
        "Codex on node-a could not find this thread's session (codex_thread_ref 0199-th-1). Nothing was run. "
        "Retry after the device has the session.",
    ),
    (
        "failed",
        {"failure_kind": "device_lost", "heartbeat_at": T0 + timedelta(minutes=4, seconds=5)},
        "The device node-a stopped answering at 01:04:05 UTC while running this message; it was not run "
        "again automatically. You can retry it.",
    ),
    ("failed", {"failure_kind": "thread_busy"}, "This thread is open in another Codex process on node-a"),
    ("failed", {"failure_kind": "not_logged_in"}, "Codex on node-a is not logged in"),
    (
        "failed",
        {"failure_kind": "model_error", "status_detail": "stream disconnected before completion"},
        "The model answered Codex on node-a with an error: stream disconnected before completion.",
    ),
    (
        "timed_out",
        {"failure_kind": "stalled"},
        "stopped producing output and was stopped after its stall timeout",
    ),
    ("timed_out", {"failure_kind": "timed_out"}, "ran longer than its time limit for one message"),
    ("failed", {"failure_kind": "could_not_start"}, "Codex could not be started on node-a."),
    ("failed", {"failure_kind": "no_reply"}, "Codex on node-a finished this message without a reply."),
    ("failed", {"failure_kind": "interrupted"}, "The local agent on node-a was stopped while running"),
    ("failed", {"failure_kind": "other", "status_detail": "exit status 2"}, "failed: exit status 2."),
    (
        "expired",
        {"device_last_seen_at": T0 - timedelta(minutes=30)},
        "This message was not run: the device node-a was offline (last seen at 00:30:00 UTC)",
    ),
    ("cancelled", {}, "This message was cancelled before it ran"),
]


async def test_each_failure_writes_one_system_message_saying_what_failed(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    for index, (status, fields, words) in enumerate(FAILURES):
        sent = await post(stack, project_id, f"message {index}", f"c-{index}")
        await report(stack, sent.task, status, index + 1, **fields)
        task = (await get_task(stack, sent.task.task_id)).task
        assert (task.status, task.failure_kind) == (status, fields.get("failure_kind", ""))
        ending = [m for m in await messages_of(stack, project_id) if m.message_id == task.result_message_id]
        assert len(ending) == 1, status
        assert (ending[0].author_kind, ending[0].thread_id, ending[0].task_id) == ("system", "", task.task_id)
        assert words in ending[0].text, (fields, ending[0].text)
    assert await stored_counts(stack) == (2 * len(FAILURES), len(FAILURES))


async def test_an_older_status_changes_nothing(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    await report(stack, sent.task, "running", 5)
    before = await head(stack)

    await report(stack, sent.task, "claimed", 4)

    assert (await get_task(stack, sent.task.task_id)).task.status == "running"
    assert await head(stack) == before


async def test_a_queued_task_says_when_its_device_was_last_seen(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    seen = T0 - timedelta(minutes=2)
    before = await head(stack)

    await report(
        stack,
        sent.task,
        "queued",
        1,
        status_detail="device node-a last seen at 00:58:00 UTC",
        device_last_seen_at=seen,
    )

    task = (await get_task(stack, sent.task.task_id)).task
    assert (task.status, task.status_detail) == ("queued", "device node-a last seen at 00:58:00 UTC")
    assert task.device_last_seen_at.ToDatetime().isoformat() == "2026-03-25T00:58:00"
    events = await events_of(stack, before)
    assert [kind for _s, kind, _p in events] == ["task.updated"]
    assert events[0][2]["task"]["device_last_seen_at"] == "2026-03-25T00:58:00Z"
    assert len(await messages_of(stack, project_id)) == 1


async def test_events_of_tasks_unknown_here_are_skipped(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    stranger = pb.ChatTask(task_id="task-elsewhere", task_type="conversation_reply", target_thread_id="th-9")
    await stack.scheduler.publish(STATUS_CHANGED, task_status(stranger, "completed", T0, reply_text="??"))
    await stack.scheduler.publish(STATUS_CHANGED, {"task_id": sent.task.task_id, "status": "paused"})
    await report(stack, sent.task, "completed", 3, reply_text="done")

    assert [m.text for m in await messages_of(stack, project_id)] == ["hello", "done"]
    assert await stored_counts(stack) == (2, 1)


async def test_get_chat_task_shows_the_gate_and_is_owner_scoped(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    first = await post(stack, project_id, "first", "c-1")
    second = await post(stack, project_id, "second", "c-2")
    assert second.collaboration_gate == pb.CollaborationGate(
        state="open", tasks_total=2, tasks_done=0, detail="1 earlier message of this thread runs first"
    )
    assert (await get_task(stack, second.task.task_id)).collaboration_gate == second.collaboration_gate
    assert (await get_task(stack, first.task.task_id)).collaboration_gate.detail == ""

    await report(stack, first.task, "completed", 3, reply_text="one")

    for task_id in (first.task.task_id, second.task.task_id):
        assert (await get_task(stack, task_id)).collaboration_gate == pb.CollaborationGate(
            state="open", tasks_total=1, tasks_done=0, detail=""
        )
    for call in (get_task(stack, first.task.task_id, owner="mallory"), get_task(stack, "task-nope")):
        refused = await failure(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")
    assert (await failure(get_task(stack, ""))).code == grpc.StatusCode.INVALID_ARGUMENT


async def test_each_status_change_publishes_the_gate_as_the_task_sees_it_then(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    first = await post(stack, project_id, "first", "c-1")
    second = await post(stack, project_id, "second", "c-2")
    before = await head(stack)

    await report(stack, second.task, "claimed", 1)
    await report(stack, first.task, "claimed", 2)
    await report(stack, first.task, "completed", 3, reply_text="one")
    await report(stack, second.task, "running", 4)
    await report(stack, second.task, "completed", 5, reply_text="two")

    updates = [
        (payload["task"]["task_id"], payload["task"]["status"], payload["collaboration_gate"])
        for _s, kind, payload in await events_of(stack, before)
        if kind == "task.updated"
    ]
    waits_for_one = {"state": "open", "tasks_total": 2, "tasks_done": 0}
    assert updates == [
        (
            second.task.task_id,
            "claimed",
            {**waits_for_one, "detail": "1 earlier message of this thread runs first"},
        ),
        (first.task.task_id, "claimed", {**waits_for_one, "detail": ""}),
        (first.task.task_id, "completed", {"state": "open", "tasks_total": 1, "tasks_done": 0, "detail": ""}),
        (second.task.task_id, "running", {"state": "open", "tasks_total": 1, "tasks_done": 0, "detail": ""}),
        (
            second.task.task_id,
            "completed",
            {"state": "open", "tasks_total": 0, "tasks_done": 0, "detail": ""},
        ),
    ]


async def test_a_master_task_queues_only_behind_its_own_owners_master_tasks(stack: Stack) -> None:
    # Tasks of no thread (the master agent's model answers them), one open per owner.
    owners = ("alice", "bob")
    async with stack.app.database.transaction() as connection:
        for second, owner in enumerate(owners):
            task = model_task(
                f"task-{owner}",
                owner,
                master_project_id(owner),
                f"msg-{owner}",
                T0 + timedelta(seconds=second),
            )
            await SqlAlchemyChatRepository(connection).insert_task(task)
    before = await head(stack)

    for second, owner in enumerate(reversed(owners), start=1):
        task = (await get_task(stack, f"task-{owner}", owner=owner)).task
        await report(stack, task, "running", second, owner_id=owner)

    alone = {"state": "open", "tasks_total": 1, "tasks_done": 0, "detail": ""}
    updates = [
        (payload["task"]["task_id"], payload["collaboration_gate"])
        for _s, kind, payload in await events_of(stack, before)
        if kind == "task.updated"
    ]
    assert updates == [("task-bob", alone), ("task-alice", alone)]
    for owner in owners:
        shown = (await get_task(stack, f"task-{owner}", owner=owner)).collaboration_gate
        assert shown == pb.CollaborationGate(state="open", tasks_total=1, tasks_done=0, detail="")


async def test_retry_makes_a_new_task_for_the_same_message(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "Run the parser tests", "c-1")
    await report(stack, sent.task, "failed", 2, failure_kind="session_not_found")
    before = await head(stack)

    retried = await retry(stack, sent.task.task_id)

    new = retried.task
    assert new.task_id != sent.task.task_id and new.task_id.startswith("task-")
    assert (new.status, new.retry_of_task_id, new.request_message_id) == (
        "queued",
        sent.task.task_id,
        sent.message.message_id,
    )
    assert (new.target_thread_id, new.device_id, new.codex_thread_ref) == ("th-1", "node-a", "0199-th-1")
    assert retried.collaboration_gate == pb.CollaborationGate(state="open", tasks_total=1, tasks_done=0)
    old = (await get_task(stack, sent.task.task_id)).task
    assert (old.status, old.retried_by_task_id) == ("failed", new.task_id)
    events = await events_of(stack, before)
    assert [
        (kind, payload["task_id"] if kind == "task.requested" else payload["task"]["task_id"])
        for _s, kind, payload in events
    ] == [
        ("task.requested", new.task_id),
        ("task.updated", sent.task.task_id),
        ("task.updated", new.task_id),
    ]
    assert events[0][2]["retry_of_task_id"] == sent.task.task_id
    assert events[0][2]["instruction_text"] == "Run the parser tests"
    assert events[0][2]["request_message_id"] == sent.message.message_id
    assert await stored_counts(stack) == (2, 2)  # the user message, its system message; two tasks

    again = await post(stack, project_id, "Run the parser tests", "c-1")
    assert not again.created and again.task == new

    for task_id, why in ((sent.task.task_id, "retried as"), (new.task_id, "it is queued")):
        refused = await failure(retry(stack, task_id))
        assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TASK_NOT_RETRYABLE")
        assert why in refused.status.message
    await report(stack, new, "completed", 9, reply_text="passed")
    refused = await failure(retry(stack, new.task_id))
    assert refused.reason == "TASK_NOT_RETRYABLE"
    refused = await failure(retry(stack, new.task_id, owner="mallory"))
    assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")


async def test_concurrent_retries_make_one_new_task(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    await report(stack, sent.task, "expired", 2)

    outcomes = await asyncio.gather(
        *(retry(stack, sent.task.task_id) for _ in range(4)), return_exceptions=True
    )

    succeeded = [outcome for outcome in outcomes if isinstance(outcome, pb.RetryChatTaskResponse)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, grpc.aio.AioRpcError)]
    assert len(succeeded) == 1 and len(refused) == 3
    assert {error.code() for error in refused} == {grpc.StatusCode.FAILED_PRECONDITION}
    assert await stored_counts(stack) == (2, 2)
    kinds = [kind for _s, kind, _p in await events_of(stack)]
    assert kinds.count("task.requested") == 2


async def test_retry_checks_the_thread_as_a_send_does(stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    await report(stack, sent.task, "failed", 2, failure_kind="no_reply")
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-1"), metadata=stack.client())
    before = await head(stack)

    refused = await failure(retry(stack, sent.task.task_id))

    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "THREAD_ARCHIVED")
    assert await head(stack) == before and await stored_counts(stack) == (2, 1)
    assert (await get_task(stack, sent.task.task_id)).task.retried_by_task_id == ""


async def cancel(stack: Stack, task_id: str, owner: str = "local") -> pb.CancelChatTaskResponse:
    return await stack.stub.CancelChatTask(
        pb.CancelChatTaskRequest(task_id=task_id), metadata=stack.client(owner)
    )


async def test_a_cancel_of_a_queued_task_goes_to_the_scheduler_and_its_answer_ends_the_task(
    stack: Stack,
) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "Run the parser tests", "c-1")
    before = await head(stack)

    answered = await cancel(stack, sent.task.task_id)

    assert (answered.task.task_id, answered.task.status) == (sent.task.task_id, "queued")
    events = await events_of(stack, before)
    assert [(kind, payload["task_id"], payload["owner_id"]) for _s, kind, payload in events] == [
        ("task.cancel_requested", sent.task.task_id, "local")
    ]
    await report(stack, sent.task, "cancelled", 2, status_detail="cancelled by its owner before it ran")
    task = (await get_task(stack, sent.task.task_id)).task
    assert task.status == "cancelled"
    listed = await messages_of(stack, project_id)
    assert [(m.author_kind, m.text) for m in listed] == [
        ("user", "Run the parser tests"),
        ("system", "This message was cancelled before it ran; nothing was run. You can retry it."),
    ]
    again = await cancel(stack, sent.task.task_id)
    assert again.task.status == "cancelled"
    kinds = [kind for _s, kind, _p in await events_of(stack)]
    assert kinds.count("task.cancel_requested") == 1
    assert (await retry(stack, sent.task.task_id)).task.retry_of_task_id == sent.task.task_id


async def test_a_running_or_ended_task_is_not_cancellable_and_another_owners_is_not_found(
    stack: Stack,
) -> None:
    project_id = await register(stack, "th-1")
    sent = await post(stack, project_id, "hello", "c-1")
    refused = await failure(cancel(stack, sent.task.task_id, owner="mallory"))
    assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")

    await report(stack, sent.task, "running", 2)
    refused = await failure(cancel(stack, sent.task.task_id))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TASK_NOT_CANCELLABLE")
    assert "a turn that has started runs to its end" in refused.status.message
    await report(stack, sent.task, "completed", 9, reply_text="hi")
    refused = await failure(cancel(stack, sent.task.task_id))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TASK_NOT_CANCELLABLE")
    assert "it is completed" in refused.status.message
    kinds = [kind for _s, kind, _p in await events_of(stack)]
    assert "task.cancel_requested" not in kinds
