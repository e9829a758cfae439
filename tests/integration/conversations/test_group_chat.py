"""Group chat (CHAT-4) over real gRPC on SQLite and PostgreSQL: a message into a group stores the
message and its dispatch plan in one transaction (the critical thread left out, with why), the plan
is recoverable from the project detail and the messages, confirming creates one dispatch_execution
task per kept target through `task.requested`, each thread's result comes back named by its thread,
and once all have ended the master agent's summary names the failures. Repeats, double
confirmations, rejections, superseded and expired plans, and another owner's plan."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from google.protobuf import json_format

from services.conversations.groups.settings import DispatchSettings
from tests.conftest import DatabaseTarget
from tests.integration.conversations.chat_support import events_of, failure, head, messages_of, post
from tests.integration.conversations.group_support import (
    confirm,
    get_plan,
    group_of,
    reject,
    report,
    thread_with_budget,
    wait_for_message,
)
from tests.integration.conversations.stack import Stack, running_stack

QUICK = DispatchSettings(expiry_check=timedelta(seconds=0.2))


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_stack(database_target, tmp_path, dispatch=QUICK) as running:
        yield running


async def pilot_group(stack: Stack) -> str:
    """A group of three threads: north (safe, 82 %), south (watch, 44 %), east (critical, 3 %)."""
    await thread_with_budget(stack, "th-north", 82.0, "safe")
    await thread_with_budget(stack, "th-south", 44.0, "watch")
    await thread_with_budget(stack, "th-east", 3.0, "critical")
    return await group_of(stack, "th-north", "th-south", "th-east")


async def test_a_group_message_is_stored_with_a_plan_that_avoids_the_critical_thread(stack: Stack) -> None:
    group = await pilot_group(stack)
    before = await head(stack)

    sent = await post(stack, group, "Run the integration tests", "c-1")

    assert sent.created and sent.message.author_kind == "user" and not sent.HasField("task")
    plan = sent.dispatch_plan
    assert plan.status == "proposed" and plan.request_message_id == sent.message.message_id
    assert [(t.target_id, t.thread_id, t.kind, t.instruction, t.status) for t in plan.targets] == [
        ("t1", "th-north", "member", "Run the integration tests", "proposed"),
        ("t2", "th-south", "member", "Run the integration tests", "proposed"),
    ]
    assert [t.reason for t in plan.targets] == [
        "safe, 82.0 % left, idle, device presence unknown",
        "watch, 44.0 % left, no large context, idle, device presence unknown",
    ]
    assert (plan.targets[0].budget_reported, plan.targets[0].remaining_pct, plan.targets[0].level) == (
        True,
        82.0,
        "safe",
    )
    assert [(left.thread_id, left.reason) for left in plan.left_out] == [
        ("th-east", "critical (3.0 % left): it wraps up and hands off first and takes no new work")
    ]
    assert plan.drafted_by == "user_text" and plan.drafting_note == ""
    assert (plan.expires_at.ToSeconds() - plan.created_at.ToSeconds()) == 1800
    gate = sent.collaboration_gate
    assert (gate.state, gate.tasks_total, gate.tasks_done) == ("awaiting_confirmation", 2, 0)
    events = await events_of(stack, before)
    assert [kind for _s, kind, _p in events] == ["conversation.message.created", "dispatch_plan.updated"]
    assert events[1][2]["change"] == "proposed" and events[1][2]["dispatch_plan"]["plan_id"] == plan.plan_id
    assert events[1][2]["collaboration_gate"]["state"] == "awaiting_confirmation"

    # A client back after a restart finds the waiting plan in the project detail and the messages.
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=group), metadata=stack.client())
    ).project
    assert detail.pending_dispatch_plan == plan and detail.collaboration_gate == gate
    page = await stack.stub.ListMessages(pb.ListMessagesRequest(project_id=group), metadata=stack.client())
    assert page.pending_dispatch_plan.plan_id == plan.plan_id
    assert page.collaboration_gate.state == "awaiting_confirmation"
    assert [m.author_kind for m in page.messages] == ["user"]
    assert (await get_plan(stack, plan.plan_id)).dispatch_plan == plan


async def test_a_repeat_answers_the_stored_message_and_plan(stack: Stack) -> None:
    group = await pilot_group(stack)
    first = await post(stack, group, "Run the integration tests", "c-1")
    settled = await head(stack)

    again = await post(stack, group, "Run the integration tests", "c-1")

    assert not again.created and again.message == first.message and again.dispatch_plan == first.dispatch_plan
    assert again.collaboration_gate.state == "awaiting_confirmation"
    assert await head(stack) == settled
    reused = await failure(post(stack, group, "something else", "c-1"))
    assert (reused.code, reused.reason) == (grpc.StatusCode.ALREADY_EXISTS, "CLIENT_MESSAGE_ID_REUSED")


async def test_confirmed_targets_run_as_dispatch_tasks_whose_results_and_summary_come_back(
    stack: Stack,
) -> None:
    group = await pilot_group(stack)
    await thread_with_budget(stack, "th-west", 70.0, "safe")
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id="th-west", node_id="node-a", worker_id="worker-a", group_project_id=group
        ),
        metadata=stack.worker(),
    )
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan
    assert [t.thread_id for t in plan.targets] == ["th-north", "th-west", "th-south"]
    before = await head(stack)

    confirmed = await confirm(stack, plan.plan_id, dropped=["t3"])

    assert confirmed.dispatch_plan.status == "confirmed"
    assert [(t.target_id, t.status) for t in confirmed.dispatch_plan.targets] == [
        ("t1", "dispatched"),
        ("t2", "dispatched"),
        ("t3", "dropped"),
    ]
    tasks = list(confirmed.tasks)
    assert [(t.task_type, t.status, t.target_thread_id, t.target_project_id) for t in tasks] == [
        ("dispatch_execution", "queued", "th-north", group),
        ("dispatch_execution", "queued", "th-west", group),
    ]
    assert [t.task_id for t in tasks] == [t.task_id for t in confirmed.dispatch_plan.targets[:2]]
    gate = confirmed.collaboration_gate
    assert (gate.state, gate.tasks_total, gate.tasks_done, gate.detail) == ("executing", 2, 0, "0 of 2 done")
    events = await events_of(stack, before)
    requested = [payload for _s, kind, payload in events if kind == "task.requested"]
    assert [
        (r["task_type"], r["dispatch_plan_id"], r["codex_thread_ref"], r["instruction_text"])
        for r in requested
    ] == [
        ("dispatch_execution", plan.plan_id, "0199-th-north", "Run the integration tests"),
        ("dispatch_execution", plan.plan_id, "0199-th-west", "Run the integration tests"),
    ]
    said = await messages_of(stack, group)
    assert [(m.author_kind, m.text) for m in said] == [
        ("user", "Run the integration tests"),
        ("master", "Sent to 2 threads: north, west."),
    ]

    await report(stack, tasks[0], "running", 1)
    assert (await get_plan(stack, plan.plan_id)).collaboration_gate.detail == "0 of 2 done"
    await report(stack, tasks[0], "completed", 5, reply_text="All 120 integration tests pass.")
    progress = (await get_plan(stack, plan.plan_id)).collaboration_gate
    assert (progress.state, progress.tasks_done, progress.detail) == ("executing", 1, "1 of 2 done")
    # Any client, not only the one that confirmed, finds the running plan and its progress in the
    # project detail and on the message page.
    detail = await stack.stub.GetProject(pb.GetProjectRequest(project_id=group), metadata=stack.client())
    page = await stack.stub.ListMessages(pb.ListMessagesRequest(project_id=group), metadata=stack.client())
    for shown in (detail.project.executing_dispatch_plans, page.executing_dispatch_plans):
        (running,) = shown
        assert running.plan_id == plan.plan_id and running.status == "confirmed"
        assert [(t.target_id, t.task_status) for t in running.targets] == [
            ("t1", "completed"),
            ("t2", "queued"),
            ("t3", ""),
        ]
    assert not detail.project.HasField("pending_dispatch_plan")
    await report(stack, tasks[1], "running", 2)
    await report(
        stack, tasks[1], "failed", 6, failure_kind="model_error", status_detail="HTTP 500 from the model"
    )

    summary = await wait_for_message(
        stack, group, lambda m: m.text.startswith("Summary of the dispatch plan")
    )
    listed = await messages_of(stack, group)
    results = [(m.author_kind, m.thread_id, m.task_id) for m in listed[2:4]]
    assert results == [("thread", "th-north", tasks[0].task_id), ("system", "th-west", tasks[1].task_id)]
    assert listed[2].text == "All 120 integration tests pass."
    assert listed[3].text.startswith(
        "west: The model answered Codex on node-a with an error: HTTP 500 from the model."
    )
    assert summary.author_kind == "master" and summary.sequence == listed[-1].sequence
    lines = summary.text.split("\n")
    assert lines[:3] == [
        f"Summary of the dispatch plan {plan.plan_id}: 1 of 2 threads answered.",
        "- north: All 120 integration tests pass.",
        "- west: failed (model_error)",
    ]
    assert (
        lines[3].startswith("Failed: west (west: The model answered Codex on node-a with an error")
        and len(lines) == 4
    )
    done = await get_plan(stack, plan.plan_id)
    assert (done.dispatch_plan.summary_status, done.dispatch_plan.summary_message_id) == (
        "posted",
        summary.message_id,
    )
    assert [t.task_status for t in done.dispatch_plan.targets[:2]] == ["completed", "failed"]
    assert done.collaboration_gate.state == "open"
    task = await stack.stub.GetChatTask(
        pb.GetChatTaskRequest(task_id=tasks[1].task_id), metadata=stack.client()
    )
    assert task.task.result_message_id == listed[3].message_id and task.collaboration_gate.state == "open"
    refused = await failure(
        stack.stub.RetryChatTask(pb.RetryChatTaskRequest(task_id=tasks[1].task_id), metadata=stack.client())
    )
    assert (
        refused.reason == "TASK_NOT_RETRYABLE"
        and "send the message to the group again" in refused.status.message
    )


async def test_the_summary_waits_for_every_task_and_is_posted_once(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Lint", "c-1")).dispatch_plan
    tasks = list((await confirm(stack, plan.plan_id)).tasks)

    await report(stack, tasks[0], "completed", 3, reply_text="clean")
    summarising = (await get_plan(stack, plan.plan_id)).collaboration_gate
    assert summarising.state == "executing"
    await report(stack, tasks[1], "expired", 4)
    await wait_for_message(stack, group, lambda m: m.text.startswith("Summary of the dispatch plan"))
    for _ in range(2):  # replayed terminal reports change nothing
        await report(stack, tasks[1], "expired", 4)
        await report(stack, tasks[0], "completed", 3, reply_text="clean")
    listed = await messages_of(stack, group)
    assert [m.author_kind for m in listed] == ["user", "master", "thread", "system", "master"]
    assert listed[3].text.startswith("south: This message was not run: the device node-a was offline")


async def test_confirming_twice_answers_the_confirmed_plan_and_writes_nothing_more(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan
    first = await confirm(stack, plan.plan_id, dropped=["t2"])
    settled = await head(stack)

    again = await confirm(stack, plan.plan_id)

    assert again.dispatch_plan == first.dispatch_plan and list(again.tasks) == list(first.tasks)
    assert await head(stack) == settled
    assert len([m for m in await messages_of(stack, group) if m.author_kind == "master"]) == 1


async def test_a_rejected_plan_sends_nothing_and_cannot_be_confirmed(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

    rejected = await reject(stack, plan.plan_id)
    again = await reject(stack, plan.plan_id)

    assert rejected.dispatch_plan.status == "rejected" and again.dispatch_plan == rejected.dispatch_plan
    assert rejected.collaboration_gate.state == "open"
    refused = await failure(confirm(stack, plan.plan_id))
    assert (refused.code, refused.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "DISPATCH_PLAN_REJECTED")
    assert "it was rejected; nothing was sent" in refused.status.message
    listed = await messages_of(stack, group)
    assert [(m.author_kind, m.text) for m in listed[1:]] == [
        ("system", "You rejected the dispatch plan; nothing was sent.")
    ]
    events = await events_of(stack)
    assert not [kind for _s, kind, _p in events if kind == "task.requested"]


async def test_a_new_message_supersedes_the_waiting_plan(stack: Stack) -> None:
    group = await pilot_group(stack)
    old = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

    new = await post(stack, group, "Actually, only the unit tests", "c-2")

    superseded = (await get_plan(stack, old.plan_id)).dispatch_plan
    assert (superseded.status, superseded.superseded_by_plan_id) == ("superseded", new.dispatch_plan.plan_id)
    assert new.collaboration_gate.state == "awaiting_confirmation"
    refused = await failure(confirm(stack, old.plan_id))
    assert (
        refused.reason == "DISPATCH_PLAN_SUPERSEDED" and new.dispatch_plan.plan_id in refused.status.message
    )
    refused = await failure(reject(stack, old.plan_id))
    assert refused.reason == "DISPATCH_PLAN_SUPERSEDED"
    changes = [p["change"] for _s, kind, p in await events_of(stack) if kind == "dispatch_plan.updated"]
    assert changes == ["proposed", "superseded", "proposed"]


async def test_another_owners_plan_is_not_found(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

    for call in (
        get_plan(stack, plan.plan_id, "mallory"),
        confirm(stack, plan.plan_id, owner="mallory"),
        reject(stack, plan.plan_id, "mallory"),
    ):
        refused = await failure(call)
        assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "DISPATCH_PLAN_NOT_FOUND")
    refused = await failure(post(stack, group, "hello", "c-9", owner="mallory"))
    assert (refused.code, refused.reason) == (grpc.StatusCode.NOT_FOUND, "PROJECT_NOT_FOUND")
    assert (await get_plan(stack, plan.plan_id)).dispatch_plan.status == "proposed"


async def test_bad_plan_requests_name_the_field(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

    unknown = await failure(confirm(stack, plan.plan_id, dropped=["t9"]))
    every = await failure(confirm(stack, plan.plan_id, dropped=["t1", "t2"]))
    malformed = await failure(get_plan(stack, "plan\x00x"))

    for refused in (unknown, every, malformed):
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "names no target of plan" in unknown.status.message and "dropped_target_ids" in unknown.status.message
    )
    assert "drops every target" in every.status.message
    assert "plan_id" in malformed.status.message
    assert (await get_plan(stack, plan.plan_id)).dispatch_plan.status == "proposed"


async def test_an_unconfirmed_plan_expires_and_the_group_is_told(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    settings = DispatchSettings(plan_ttl=timedelta(seconds=1), expiry_check=timedelta(seconds=0.2))
    async with running_stack(database_target, tmp_path, dispatch=settings) as stack:
        group = await pilot_group(stack)
        plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

        told = await wait_for_message(stack, group, lambda m: "expired" in m.text)

        assert (told.author_kind, told.text) == (
            "system",
            f"The dispatch plan {plan.plan_id} was not confirmed in time and expired; nothing was sent. "
            "Send the message again for a new plan.",
        )
        expired = await get_plan(stack, plan.plan_id)
        assert expired.dispatch_plan.status == "expired" and expired.collaboration_gate.state == "open"
        refused = await failure(confirm(stack, plan.plan_id))
        assert refused.reason == "DISPATCH_PLAN_EXPIRED"
        detail = (
            await stack.stub.GetProject(pb.GetProjectRequest(project_id=group), metadata=stack.client())
        ).project
        assert not detail.HasField("pending_dispatch_plan") and detail.collaboration_gate.state == "open"
        changes = [p["change"] for _s, kind, p in await events_of(stack) if kind == "dispatch_plan.updated"]
        assert changes == ["proposed", "expired"]


async def test_plan_events_carry_the_plan_as_the_rpcs_answer_it(stack: Stack) -> None:
    group = await pilot_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

    payload = [p for _s, kind, p in await events_of(stack) if kind == "dispatch_plan.updated"][-1]

    assert payload["owner_id"] == "local" and payload["project_id"] == group
    assert json_format.ParseDict(payload["dispatch_plan"], pb.DispatchPlan()) == plan
