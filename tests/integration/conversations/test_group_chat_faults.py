"""Group chat under faults, on SQLite and PostgreSQL: a target archived or gone critical between the
proposal and the confirmation, a member on an offline device, no member fit (a relay thread) or no
thread at all able to take the message, and the master model (the demo model behind the real
`openai` client over HTTP) drafting well, answering nonsense, a wrong plan, late, or not at all."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from demo_model import DemoModelServer
from demo_model.dispatch_drafts import MALFORMED_PLAN_MARKER
from services.conversations.groups.settings import DispatchSettings
from services.conversations.master.settings import OPENAI_API, MasterSettings
from tests.conftest import DatabaseTarget
from tests.integration.conversations.chat_support import events_of, failure, messages_of, post
from tests.integration.conversations.group_support import (
    ReportedPresence,
    confirm,
    group_of,
    report,
    thread_with_budget,
    wait_for_message,
)
from tests.integration.conversations.stack import Stack, budget_payload, running_stack

QUICK = DispatchSettings(expiry_check=timedelta(seconds=0.2), model_timeout_s=3.0)
SEEN = datetime(2026, 3, 25, 0, 59, tzinfo=UTC)


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path, dispatch=QUICK) as running:
        yield running


@pytest.fixture(scope="module")
def demo_model() -> Iterator[DemoModelServer]:
    server = DemoModelServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def master_on(base_url: str) -> MasterSettings:
    return MasterSettings(backend=OPENAI_API, base_url=base_url, model="boss-demo-model", timeout_seconds=3.0)


@contextlib.asynccontextmanager
async def stack_with_model(
    database_target: DatabaseTarget, tmp_path: Path, base_url: str
) -> AsyncIterator[Stack]:
    async with running_stack(
        database_target, tmp_path, master=master_on(base_url), dispatch=QUICK
    ) as running:
        yield running


async def two_thread_group(stack: Stack) -> str:
    await thread_with_budget(stack, "th-north", 82.0, "safe")
    await thread_with_budget(stack, "th-south", 44.0, "watch")
    return await group_of(stack, "th-north", "th-south")


async def test_a_target_archived_before_the_confirmation_is_skipped_and_said(stack: Stack) -> None:
    group = await two_thread_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-south"), metadata=stack.client())

    confirmed = await confirm(stack, plan.plan_id)

    assert [(t.thread_id, t.status, t.status_detail) for t in confirmed.dispatch_plan.targets] == [
        ("th-north", "dispatched", ""),
        ("th-south", "skipped", "it was archived after the plan was proposed"),
    ]
    assert [t.target_thread_id for t in confirmed.tasks] == ["th-north"]
    assert confirmed.collaboration_gate.tasks_total == 1
    said = (await messages_of(stack, group))[-1]
    assert (said.author_kind, said.text) == (
        "master",
        "Sent to 1 thread: north. Not sent to: south (it was archived after the plan was proposed).",
    )


async def test_confirming_when_no_target_can_take_work_any_more_is_a_clear_conflict(stack: Stack) -> None:
    group = await two_thread_group(stack)
    plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-north"), metadata=stack.client())
    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-south", 4.0, "critical", version=2)
    )
    await stack.settle()

    refused = await failure(confirm(stack, plan.plan_id))

    assert (refused.code, refused.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "DISPATCH_PLAN_TARGETS_UNAVAILABLE",
    )
    assert "north: it was archived after the plan was proposed" in refused.status.message
    assert "south: critical (4.0 % left)" in refused.status.message
    assert "Reject it, or send the message again for a new plan" in refused.status.message
    still = await stack.stub.GetDispatchPlan(
        pb.GetDispatchPlanRequest(plan_id=plan.plan_id), metadata=stack.client()
    )
    assert still.dispatch_plan.status == "proposed"
    assert not [kind for _s, kind, _p in await events_of(stack) if kind == "task.requested"]


async def test_a_member_on_an_offline_device_is_left_out_with_when_it_was_last_seen(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    presence = ReportedPresence(online={"node-a": SEEN}, offline={"node-b": SEEN - timedelta(hours=3)})
    async with running_stack(database_target, tmp_path, dispatch=QUICK, device_presence=presence) as stack:
        await thread_with_budget(stack, "th-north", 82.0, "safe")
        await thread_with_budget(stack, "th-far", 95.0, "safe", node_id="node-b")
        group = await group_of(stack, "th-north", "th-far")

        plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

        assert [(t.thread_id, t.reason) for t in plan.targets] == [("th-north", "safe, 82.0 % left, idle")]
        assert [(left.thread_id, left.reason) for left in plan.left_out] == [
            ("th-far", "its device node-b is offline (last seen at 2026-03-24T21:59:00Z)")
        ]
        assert presence.asked == [["node-a", "node-b"]] and presence.owners == ["local"]


async def test_a_new_relay_thread_takes_the_message_when_no_member_is_fit(stack: Stack) -> None:
    await thread_with_budget(stack, "th-hot", 2.0, "critical")
    await thread_with_budget(stack, "th-tight", 14.0, "urgent")
    group = await group_of(stack, "th-hot", "th-tight")

    plan = (await post(stack, group, "Write the release notes", "c-1")).dispatch_plan

    (relay,) = plan.targets
    assert (relay.kind, relay.codex_thread_ref, relay.relay_of_thread_id) == ("relay", "", "th-tight")
    assert relay.thread_id == f"relay-{plan.plan_id.removeprefix('plan-')}-t1"
    assert relay.codex_folder_ref == "/home/dev/th-tight" and relay.device_id == "node-a"
    assert relay.reason == (
        "new Codex thread in /home/dev/th-tight on node-a (device presence unknown), the folder of tight: "
        "no member can take new work (1 critical, 1 urgent)"
    )
    assert (relay.thread_title, relay.budget_reported, relay.level) == ("tight (relay)", False, "")
    confirmed = await confirm(stack, plan.plan_id)
    requested = [p for _s, kind, p in await events_of(stack) if kind == "task.requested"]
    assert [(r["target_thread_id"], r["codex_thread_ref"], r["codex_folder_ref"]) for r in requested] == [
        (relay.thread_id, "", "/home/dev/th-tight")
    ]
    await report(stack, confirmed.tasks[0], "completed", 5, reply_text="Release notes drafted.")
    result = await wait_for_message(stack, group, lambda m: m.author_kind == "thread")
    assert (result.thread_id, result.text) == (relay.thread_id, "Release notes drafted.")


async def test_when_no_thread_can_take_the_message_the_master_says_why_and_nothing_waits(
    stack: Stack,
) -> None:
    await thread_with_budget(stack, "th-north", 82.0, "safe")
    await thread_with_budget(stack, "th-south", 44.0, "watch")
    group = await group_of(stack, "th-north", "th-south")
    for thread_id in ("th-north", "th-south"):
        await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id=thread_id), metadata=stack.client())

    sent = await post(stack, group, "Run the integration tests", "c-1")

    assert not sent.HasField("dispatch_plan") and sent.collaboration_gate.state == "open"
    listed = await messages_of(stack, group)
    assert [(m.author_kind, m.text) for m in listed] == [
        ("user", "Run the integration tests"),
        (
            "master",
            "Nothing was sent: no thread of the group can take new work and none can host a new relay "
            "thread (north: archived; south: archived).",
        ),
    ]


# --- the master model ----------------------------------------------------------------------------------


async def test_the_master_model_drafts_each_instruction_and_summarises(
    database_target: DatabaseTarget, tmp_path: Path, demo_model: DemoModelServer
) -> None:
    async with stack_with_model(database_target, tmp_path, demo_model.base_url) as stack:
        group = await two_thread_group(stack)

        plan = (await post(stack, group, "Run the integration tests", "c-1")).dispatch_plan

        assert (plan.drafted_by, plan.drafting_note) == ("master_model", "")
        assert [t.instruction for t in plan.targets] == [
            "Run the integration tests\n\n(Demo model (not a real model) drafted this for north.)",
            "Run the integration tests\n\n(Demo model (not a real model) drafted this for south.)",
        ]
        tasks = list((await confirm(stack, plan.plan_id)).tasks)
        requested = [
            p["instruction_text"] for _s, kind, p in await events_of(stack) if kind == "task.requested"
        ]
        assert requested == [t.instruction for t in plan.targets]
        await report(stack, tasks[0], "completed", 3, reply_text="120 passed")
        await report(stack, tasks[1], "failed", 4, failure_kind="stalled")
        summary = await wait_for_message(stack, group, lambda m: "summarising" in m.text)
        assert summary.author_kind == "master"
        assert summary.text == (
            "Demo model (not a real model), summarising: 1 of 2 threads answered.\n"
            "north: 120 passed\n"
            "Failed: south (stalled)."
        )


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("[[demo:nonsense]]", "its answer is not JSON"),
        (MALFORMED_PLAN_MARKER, "it names a target the plan does not have ('t999')"),
        ("[[demo:no_reply]]", "it answered nothing"),
    ],
)
async def test_an_unusable_draft_falls_back_to_the_users_text_and_the_plan_says_so(
    database_target: DatabaseTarget, tmp_path: Path, demo_model: DemoModelServer, marker: str, problem: str
) -> None:
    async with stack_with_model(database_target, tmp_path, demo_model.base_url) as stack:
        group = await two_thread_group(stack)
        text = f"Run the integration tests {marker}"

        plan = (await post(stack, group, text, "c-1")).dispatch_plan

        assert plan.drafted_by == "user_text"
        assert plan.drafting_note == (
            f"the master model's draft was not used ({problem}); "
            "each thread gets your message as you wrote it"
        )
        assert [t.instruction for t in plan.targets] == [text, text]


@pytest.mark.parametrize("fault", ["late", "down"])
async def test_a_late_model_or_a_model_that_is_down_leaves_the_users_text(
    database_target: DatabaseTarget, tmp_path: Path, demo_model: DemoModelServer, fault: str
) -> None:
    text, said, base_url = "Run the tests [[demo:slow=10]]", "did not answer within 3 s", demo_model.base_url
    if fault == "down":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            text, said, base_url = (
                "Run the tests",
                "could not be reached",
                f"http://127.0.0.1:{probe.getsockname()[1]}/v1",
            )
    async with stack_with_model(database_target, tmp_path, base_url) as stack:
        group = await two_thread_group(stack)

        sent = await post(stack, group, text, "c-1")

        plan = sent.dispatch_plan
        assert plan.drafted_by == "user_text" and said in plan.drafting_note
        assert plan.drafting_note.startswith(
            "the master model's draft was not used (the model could not answer"
        )
        assert [t.instruction for t in plan.targets] == [text, text]
        assert sent.collaboration_gate.state == "awaiting_confirmation"
