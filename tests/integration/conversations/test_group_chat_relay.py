"""A group's relay thread taken in as a real thread, on SQLite and PostgreSQL: once its dispatch task
reports the new Codex session, the session is a thread titled after its host, in the home list, a
member of the group, and its own conversation shows the instruction and the answer. The device's
worker registers the same session too: before the report, after it, or at the same time; every
order ends in the same one thread, one conversation and one membership."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.conversations.domain.model import Registration, single_device_project_id
from services.conversations.groups.relay import RelayThread
from services.conversations.groups.settings import DispatchSettings
from tests.conftest import DatabaseTarget
from tests.integration.conversations.chat_support import events_of, messages_of, post
from tests.integration.conversations.group_support import (
    confirm,
    get_plan,
    group_of,
    report,
    thread_with_budget,
    wait_for_message,
)
from tests.integration.conversations.stack import T0, Stack, budget_payload, running_stack

QUICK = DispatchSettings(expiry_check=timedelta(seconds=0.2), model_timeout_s=3.0)
SESSION = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
RELAY_PROJECT = single_device_project_id("local", SESSION)


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path, dispatch=QUICK) as running:
        yield running


async def relay_plan(stack: Stack) -> tuple[str, pb.DispatchPlan, pb.ConfirmDispatchPlanResponse]:
    """A group of a critical and an urgent thread, a message it can only give a relay thread, and
    the plan confirmed. Returns (group id, plan, confirmation)."""
    await thread_with_budget(stack, "th-hot", 2.0, "critical")
    await thread_with_budget(stack, "th-tight", 14.0, "urgent")
    group = await group_of(stack, "th-hot", "th-tight")
    plan = (await post(stack, group, "Write the release notes", "c-1")).dispatch_plan
    return group, plan, await confirm(stack, plan.plan_id)


async def worker_registers(stack: Stack) -> pb.RegisterThreadResponse:
    """The device's worker registering the session it found (as worker/agent.py does: the session
    id as thread id and Codex reference, the session's folder, no title)."""
    return await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=SESSION,
            node_id="node-a",
            worker_id="worker-a",
            codex_folder="/home/dev/th-tight",
            codex_thread_ref=SESSION,
        ),
        metadata=stack.worker(),
    )


async def relay_ends(stack: Stack, task: pb.ChatTask) -> None:
    """The relay task's final report, naming the Codex session it started."""
    await report(stack, task, "completed", 5, reply_text="Release notes drafted.", codex_session_id=SESSION)


async def home_list(stack: Stack) -> dict[str, pb.Conversation]:
    page = await stack.stub.ListConversations(
        pb.ListConversationsRequest(page_size=50), metadata=stack.client()
    )
    return {row.project_id: row for row in page.conversations}


async def member_ids(stack: Stack, project_id: str) -> list[str]:
    detail = await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    return sorted(summary.thread_id for summary in detail.project.active_thread_contexts)


async def assert_taken_in(stack: Stack, group: str, plan_id: str) -> None:
    """The one state every order of intake and registration ends in."""
    listed = await home_list(stack)
    assert listed[RELAY_PROJECT].project_title == "tight (relay)"
    shown = [row.project_id for row in listed.values() if row.context_budget_thread_id == SESSION]
    assert shown in ([], [RELAY_PROJECT])  # one conversation (its ring follows once it reports)
    assert await member_ids(stack, group) == sorted(["th-hot", "th-tight", SESSION])
    assert await member_ids(stack, RELAY_PROJECT) == [SESSION]
    own = await messages_of(stack, RELAY_PROJECT)
    assert [(m.author_kind, m.thread_id, m.text) for m in own] == [
        ("master", "", "Write the release notes"),
        ("thread", SESSION, "Release notes drafted."),
    ]
    result = await wait_for_message(stack, group, lambda m: m.author_kind == "thread")
    assert (result.thread_id, result.text) == (SESSION, "Release notes drafted.")
    (target,) = (await get_plan(stack, plan_id)).dispatch_plan.targets
    assert (target.kind, target.thread_id, target.codex_thread_ref, target.thread_title) == (
        "relay",
        SESSION,
        SESSION,
        "tight (relay)",
    )
    task = await stack.stub.GetChatTask(
        pb.GetChatTaskRequest(task_id=target.task_id), metadata=stack.client()
    )
    assert (task.task.target_thread_id, task.task.codex_thread_ref) == (SESSION, SESSION)
    # The worker's budget reports of the session reach the thread: its device is the one that ran it.
    await stack.budget.publish(
        "thread.context.updated", budget_payload(SESSION, 97.0, "safe", codex_folder="/home/dev/th-tight")
    )
    await stack.settle()
    listed = await home_list(stack)
    ring = listed[RELAY_PROJECT].context_budget_indicator
    assert (ring.visible, ring.percent, ring.level) == (True, 97, "safe")
    assert [row.project_id for row in listed.values() if row.context_budget_thread_id == SESSION] == [
        RELAY_PROJECT
    ]


async def test_the_relay_is_taken_in_when_its_task_reports_the_session_and_the_worker_registers_after(
    stack: Stack,
) -> None:
    group, plan, confirmed = await relay_plan(stack)

    await relay_ends(stack, confirmed.tasks[0])

    registered = [p for _s, kind, p in await events_of(stack) if kind == "thread.registered"]
    assert [(p["thread_id"], p["project_id"], p["title"]) for p in registered][-1] == (
        SESSION,
        RELAY_PROJECT,
        "tight (relay)",
    )
    # The worker finds the session afterwards: its registration keeps the thread as taken in.
    answer = await worker_registers(stack)
    assert (answer.created, answer.project_id, answer.thread.title) == (False, RELAY_PROJECT, "tight (relay)")
    await assert_taken_in(stack, group, plan.plan_id)


async def test_the_relay_is_taken_in_when_the_worker_registered_the_session_first(stack: Stack) -> None:
    group, plan, confirmed = await relay_plan(stack)
    first = await worker_registers(stack)
    assert (first.created, first.project_id) == (True, RELAY_PROJECT)
    assert (await home_list(stack))[RELAY_PROJECT].project_title == "th-tight"  # the folder's name

    await relay_ends(stack, confirmed.tasks[0])

    # The intake found the registered thread: no second thread or conversation; the default title
    # (its folder's name) gave way to the relay's.
    renamed = [p for _s, kind, p in await events_of(stack) if kind == "conversation.updated"]
    assert renamed[-1]["change"] == "renamed" and renamed[-1]["project_id"] == RELAY_PROJECT
    await assert_taken_in(stack, group, plan.plan_id)


async def test_the_relay_is_taken_in_once_when_the_worker_registers_at_the_same_time(stack: Stack) -> None:
    group, plan, confirmed = await relay_plan(stack)

    registered, _ended = await asyncio.gather(worker_registers(stack), relay_ends(stack, confirmed.tasks[0]))

    assert registered.project_id == RELAY_PROJECT
    await assert_taken_in(stack, group, plan.plan_id)


async def test_a_replayed_report_takes_nothing_in_twice(stack: Stack) -> None:
    group, plan, confirmed = await relay_plan(stack)
    await relay_ends(stack, confirmed.tasks[0])

    await relay_ends(stack, confirmed.tasks[0])

    await assert_taken_in(stack, group, plan.plan_id)
    registered = [p for _s, kind, p in await events_of(stack) if kind == "thread.registered"]
    assert [p["thread_id"] for p in registered].count(SESSION) == 1


async def test_a_session_registered_by_another_device_is_not_taken_in(stack: Stack) -> None:
    group, plan, confirmed = await relay_plan(stack)
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=SESSION, node_id="node-b", worker_id="worker-b", codex_folder="/elsewhere"
        ),
        metadata=stack.worker("worker-b", "node-b"),
    )

    await relay_ends(stack, confirmed.tasks[0])

    # The result still reaches the group, named by the relay target; the other device's thread
    # joins nothing.
    result = await wait_for_message(stack, group, lambda m: m.author_kind == "thread")
    assert result.text == "Release notes drafted." and result.thread_id.startswith("relay-")
    assert await member_ids(stack, group) == ["th-hot", "th-tight"]
    (target,) = (await get_plan(stack, plan.plan_id)).dispatch_plan.targets
    assert target.codex_thread_ref == ""


# --- one side's transaction open while the other writes the same thread ------------------------------
# On PostgreSQL the second writer's insert waits on the first's uncommitted row, then conflicts; on
# SQLite it waits for the write lock and then finds the row. Either way one thread comes out.


def relay_of(group: str) -> RelayThread:
    return RelayThread(SESSION, "local", "node-a", "worker-a", "/home/dev/th-tight", "tight (relay)", group)


async def test_a_registration_that_waits_on_the_intakes_open_transaction_keeps_the_relay(
    stack: Stack,
) -> None:
    group, _plan, _confirmed = await relay_plan(stack)

    async with stack.app.database.transaction() as connection:
        taken = await stack.app.handlers.take_in_relay_thread(connection, relay_of(group), T0)
        registering = asyncio.create_task(worker_registers(stack))
        await asyncio.sleep(0.3)  # lets the registration reach the thread's row before the commit

    answer = await registering
    assert taken is not None and taken.project_id == RELAY_PROJECT
    assert (answer.created, answer.project_id, answer.thread.title) == (False, RELAY_PROJECT, "tight (relay)")
    assert answer.thread.worker_id == "worker-a"
    assert await member_ids(stack, group) == sorted(["th-hot", "th-tight", SESSION])


async def test_an_intake_that_waits_on_the_registrations_open_transaction_finds_the_thread(
    stack: Stack,
) -> None:
    group, plan, confirmed = await relay_plan(stack)
    registration = Registration(
        thread_id=SESSION,
        node_id="node-a",
        worker_id="worker-a",
        owner_id="local",
        codex_folder="/home/dev/th-tight",
        codex_thread_ref=SESSION,
    )

    async with stack.app.database.transaction() as connection:
        # RegisterThread's own transaction, held open while the relay's report is applied.
        await stack.app.handlers._register(connection, registration, T0)
        ending = asyncio.create_task(relay_ends(stack, confirmed.tasks[0]))
        await asyncio.sleep(0.3)  # lets the intake reach the thread's row before the commit

    await ending
    await assert_taken_in(stack, group, plan.plan_id)
