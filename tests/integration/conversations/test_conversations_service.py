"""The conversations service end to end over real gRPC, on SQLite and PostgreSQL: registration, the
home list fed by context_budget events (CB-12, CB-16), the project detail (CB-13), the thread page
(CB-14), handoff events from the scheduler, owner isolation, paging, errors and the event stream."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from grpc_status import rpc_status

from services.conversations.domain.model import single_device_project_id
from services.shared.auth import bearer_metadata
from services.shared.errors import field_violations_of, reason_of
from services.shared.outbox import StoredEvent
from tests.conftest import DatabaseTarget
from tests.integration.conversations.stack import T0, Stack, budget_payload, running_stack


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_stack(database_target, tmp_path) as running:
        yield running


async def register(stack: Stack, thread_id: str, **fields: object) -> pb.RegisterThreadResponse:
    defaults: dict[str, object] = {
        "codex_folder": f"/home/dev/{thread_id}",
        "codex_thread_ref": f"ref-{thread_id}",
    }
    request = pb.RegisterThreadRequest(
        thread_id=thread_id,
        node_id="node-a",
        worker_id="worker-a",
        **{**defaults, **fields},
    )  # type: ignore[arg-type]
    return await stack.stub.RegisterThread(request, metadata=stack.worker())


async def home(
    stack: Stack, owner: str = "local", *, with_master: bool = False, **fields: object
) -> pb.ListConversationsResponse:
    """The owner's home list; the master conversation every installation has (pinned) is left out
    of the rows unless `with_master`."""
    response = await stack.stub.ListConversations(
        pb.ListConversationsRequest(**fields),  # type: ignore[arg-type]
        metadata=stack.client(owner),
    )
    if not with_master:
        kept = [r for r in response.conversations if r.conversation_type != pb.CONVERSATION_TYPE_MASTER_AGENT]
        del response.conversations[:]
        response.conversations.extend(kept)
    return response


async def events_of(stack: Stack, after: int = 0, owner: str = "local") -> list[tuple[str, dict]]:
    page = await stack.stub.ListEvents(
        pb.ListEventsRequest(after_sequence=after), metadata=stack.client(owner)
    )
    return [(e.type, json.loads(e.payload_json)) for e in page.events]


async def test_registration_creates_a_single_device_project_once(stack: Stack) -> None:
    first = await register(stack, "th-1", title="North line regression")
    again = await register(stack, "th-1", title="North line regression")

    assert first.created and not again.created
    assert first.project_id == again.project_id and first.project_id.startswith("proj-")
    assert first.thread.codex_thread_ref == "ref-th-1" and first.thread.node_id == "node-a"
    rows = (await home(stack)).conversations
    assert [(r.project_id, r.project_title, r.conversation_type) for r in rows] == [
        (first.project_id, "North line regression", pb.CONVERSATION_TYPE_SINGLE_DEVICE)
    ]
    assert rows[0].conversation_id == f"conv-{first.project_id}"
    assert not rows[0].context_budget_indicator.visible


async def test_a_default_title_follows_the_folder_a_later_registration_brings(stack: Stack) -> None:
    first = await register(stack, "th-1", codex_folder="")  # no folder known yet: titled by its id
    assert first.thread.title == "th-1"
    later = await register(stack, "th-1", codex_folder="/home/dev/billing-api")
    assert later.thread.title == "billing-api" and later.thread.codex_folder == "/home/dev/billing-api"
    named = await register(stack, "th-1", title="Billing API")
    moved = await register(stack, "th-1", codex_folder="/home/dev/billing-api-v2")
    assert named.thread.title == "Billing API" and moved.thread.title == "Billing API"  # given: kept
    rows = (await home(stack)).conversations
    assert [r.project_title for r in rows] == ["Billing API"]


async def test_budget_events_drive_the_ring_detail_and_thread_page_identically(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 52.7, "watch", version=1))
    await stack.settle()

    row = (await home(stack)).conversations[0]
    assert row.context_budget_indicator == pb.ContextBudgetIndicator(
        visible=True, style="ring_percent", percent=52, level="watch"
    )
    assert row.context_budget_source_node_id == "node-a"
    assert row.context_budget_updated_at.ToDatetime().isoformat().startswith("2026-03-25T01:00:01.005")
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    page = (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-1"), metadata=stack.client()
        )
    ).thread_context_budget
    shown = {
        (row.context_budget_indicator.percent, row.context_budget_indicator.level),
        (detail.active_thread_contexts[0].percent, detail.active_thread_contexts[0].level),
        (page.context.percent, page.context.level),
    }
    assert shown == {(52, "watch")}
    assert page.context.remaining_pct == pytest.approx(52.7)
    assert page.wrap_up_checklist == []  # watch and nothing to finish: no checklist yet

    await stack.budget.publish(
        "thread.context.updated",
        budget_payload("th-1", 21.0, "critical", version=2, must_finish_before_compaction=True),
    )
    await stack.settle()
    row = (await home(stack)).conversations[0]
    assert (row.context_budget_indicator.percent, row.context_budget_indicator.level) == (21, "critical")
    assert row.must_finish_before_compaction
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert detail.next_compaction_risk_thread_id == "th-1"
    assert list(detail.threads_requiring_handoff) == ["th-1"]
    assert "Critical" in detail.master_context_strategy_summary
    page = (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-1"), metadata=stack.client()
        )
    ).thread_context_budget
    assert [item.key for item in page.wrap_up_checklist][:2] == ["files_touched", "patches"]
    assert not any(item.done for item in page.wrap_up_checklist)

    types = [t for t, _ in await events_of(stack)]
    assert types.count("conversation.context_indicator.updated") == 2
    assert types.count("project.context_risk.updated") == 2
    indicator_events = [p for t, p in await events_of(stack) if t == "conversation.context_indicator.updated"]
    assert indicator_events[-1]["context_budget_indicator"] == {
        "visible": True,
        "style": "ring_percent",
        "percent": 21,
        "level": "critical",
        "awaiting_reading_after_compaction": False,
    }


async def test_older_or_replayed_readings_change_nothing(stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 40.0, "watch", version=5))
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 90.0, "safe", version=4))
    await stack.settle()
    row = (await home(stack)).conversations[0]
    assert row.context_budget_indicator.percent == 40


async def test_a_reading_that_leaves_the_ring_unchanged_publishes_no_indicator_event(stack: Stack) -> None:
    """61.6 % and then 61.8 % both show 61 % (rings show whole percents, rounded down): the second
    reading refreshes the row's time and the project's risk, but sends no
    `conversation.context_indicator.updated` (the ring did not change); a third at 58.9 % does."""
    await register(stack, "th-1")
    for version, percent in ((1, 61.6), (2, 61.8), (3, 58.9)):
        payload = budget_payload("th-1", percent, "safe", version=version)
        await stack.budget.publish("thread.context.updated", payload)
        await stack.settle()
    events = await events_of(stack)
    rings = [
        p["context_budget_indicator"]["percent"]
        for t, p in events
        if t == "conversation.context_indicator.updated"
    ]
    risks = [p["thread_context"]["remaining_pct"] for t, p in events if t == "project.context_risk.updated"]
    assert rings == [61, 58]
    assert risks == [61.6, 61.8, 58.9]
    row = (await home(stack)).conversations[0]
    assert row.context_budget_indicator.percent == 58
    assert row.context_budget_updated_at.ToDatetime(UTC) == T0 + timedelta(seconds=3, milliseconds=5)


async def test_unregistered_reporting_thread_is_imported_for_the_default_owner(stack: Stack) -> None:
    await stack.budget.publish("thread.context.updated", budget_payload("th-new", 75.0, "safe"))
    await stack.settle()
    rows = (await home(stack)).conversations
    assert [(r.project_title, r.context_budget_indicator.percent) for r in rows] == [("north-line", 75)]


async def test_group_hides_the_ring_and_detail_lists_every_thread(stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(thread_id="th-2", node_id="node-b", worker_id="w-b"),
        metadata=stack.worker("w-b", "node-b"),
    )
    group = (
        await stack.stub.CreateGroupProject(
            pb.CreateGroupProjectRequest(title="Pilot line", thread_ids=["th-1", "th-2"]),
            metadata=stack.client(),
        )
    ).project
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 30.0, "urgent"))
    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-2", 80.0, "safe", node_id="node-b", worker_id="w-b")
    )
    await stack.settle()

    rows = {r.project_id: r for r in (await home(stack)).conversations}
    group_row = rows[group.conversation.project_id]
    assert group_row.conversation_type == pb.CONVERSATION_TYPE_GROUP
    assert not group_row.context_budget_indicator.visible and group_row.context_budget_indicator.percent == 0
    detail = (
        await stack.stub.GetProject(
            pb.GetProjectRequest(project_id=group.conversation.project_id), metadata=stack.client()
        )
    ).project
    assert [(t.thread_id, t.percent, t.level, t.node_id) for t in detail.active_thread_contexts] == [
        ("th-1", 30, "urgent", "node-a"),
        ("th-2", 80, "safe", "node-b"),
    ]
    assert detail.next_compaction_risk_thread_id == "th-1"


async def test_master_agent_ring_follows_its_main_thread(stack: Stack) -> None:
    await register(stack, "master-th", is_master_main_thread=True)
    await stack.budget.publish("thread.context.updated", budget_payload("master-th", 64.2, "safe"))
    await stack.settle()
    master = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client())
    ).project
    assert master.conversation.conversation_type == pb.CONVERSATION_TYPE_MASTER_AGENT
    assert (
        master.conversation.context_budget_indicator.percent,
        master.conversation.context_budget_thread_id,
    ) == (64, "master-th")
    rows = (await home(stack, with_master=True)).conversations
    assert rows[0].conversation_type == pb.CONVERSATION_TYPE_MASTER_AGENT  # pinned by default


async def test_the_master_agent_stays_on_its_device_until_its_owner_archives_its_thread(stack: Stack) -> None:
    await register(stack, "master-th", is_master_main_thread=True)

    def on_node_b(thread_id: str) -> pb.RegisterThreadRequest:
        return pb.RegisterThreadRequest(
            thread_id=thread_id,
            node_id="node-b",
            worker_id="worker-b",
            codex_folder="/home/dev/cheap-box",
            codex_thread_ref=f"ref-{thread_id}",
            is_master_main_thread=True,
        )

    # Another device of the same owner cannot take the master agent over, and nothing is stored.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.RegisterThread(
            on_node_b("rogue-master"), metadata=stack.worker("worker-b", "node-b")
        )
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "MASTER_ON_OTHER_DEVICE" in str(refused.value.trailing_metadata())
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="rogue-master"), metadata=stack.client()
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    # Its own device registers its next thread (a relay) ...
    await register(stack, "master-th-2", is_master_main_thread=True)
    await stack.budget.publish("thread.context.updated", budget_payload("master-th-2", 70.0, "safe"))
    await stack.settle()
    master = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client())
    ).project
    assert master.conversation.context_budget_thread_id == "master-th-2"
    # ... and once the owner archives the master's thread, another device may take it on.
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="master-th-2"), metadata=stack.client())
    await stack.stub.RegisterThread(on_node_b("new-master"), metadata=stack.worker("worker-b", "node-b"))
    await stack.budget.publish(
        "thread.context.updated",
        budget_payload("new-master", 90.0, "safe", node_id="node-b", worker_id="worker-b"),
    )
    await stack.settle()
    master = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client())
    ).project
    assert master.conversation.context_budget_thread_id == "new-master"


async def test_the_master_agents_page_states_the_risk_of_every_thread_it_oversees(stack: Stack) -> None:
    await register(stack, "th-1", title="firmware-flasher")
    await register(stack, "th-2", title="billing-api")
    await register(stack, "th-3", title="old-spike")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 8.0, "critical"))
    await stack.budget.publish("thread.context.updated", budget_payload("th-2", 81.0, "safe"))
    await stack.settle()
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-3"), metadata=stack.client())
    master = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id="master-agent"), metadata=stack.client())
    ).project
    # The master agent runs on a model here: it has no thread of its own, yet it oversees both live
    # threads of its owner (the archived one is left out).
    assert list(master.active_thread_contexts) == []
    assert master.next_compaction_risk_thread_id == "th-1"
    assert list(master.threads_requiring_handoff) == ["th-1"]
    assert master.master_context_strategy_summary == (
        "Critical: firmware-flasher (8%): run the pre-compaction wrap-up now and allow no further "
        "context growth. Safe: 1 thread(s) keep going; new subtasks go to them first."
    )


async def test_order_is_pinned_then_latest_reply_and_pages_cover_everything(stack: Stack) -> None:
    ids = [(await register(stack, f"th-{i}")).project_id for i in range(5)]
    await stack.stub.AddMessage(
        pb.AddMessageRequest(project_id=ids[1], author_kind="user", text="status?"), metadata=stack.client()
    )
    await stack.stub.SetConversationPinned(
        pb.SetConversationPinnedRequest(project_id=ids[3], pinned=True), metadata=stack.client()
    )
    seen: list[str] = []
    token = ""
    while True:
        page = await home(stack, page_size=2, page_token=token)
        seen += [r.project_id for r in page.conversations]
        token = page.next_page_token
        if not token:
            break
    assert seen[:2] == [ids[3], ids[1]]
    assert sorted(seen) == sorted(ids) and len(seen) == 5


def required_payload(thread_id: str, package_id: str, **fields: object) -> dict[str, object]:
    """`thread.handoff.required` as the scheduler writes it for a prepare_handoff
    (services/scheduler/service.py `_persist_decision`)."""
    return {
        "thread_id": thread_id,
        "project_id": "",
        "node_id": "node-a",
        "reason": "context_urgent",
        "command_id": "cmd-1",
        "handoff_package_id": package_id,
        "to_thread_id": "relay-1",
        "context_budget_level": "urgent",
        "context_budget_remaining_pct": 31.5,
        "compaction_expected_at": None,
        **fields,
    }


def package_payload(thread_id: str, package_id: str, status: str, **fields: object) -> dict[str, object]:
    """`thread.handoff.ready` / `.consumed` / `.expired` as the scheduler writes them
    (services/scheduler/service.py `package_payload`)."""
    return {
        "handoff_package_id": package_id,
        "thread_id": thread_id,
        "from_thread_id": thread_id,
        "to_thread_id": "relay-1",
        "project_id": "",
        "node_id": "node-a",
        "package_status": status,
        "created_at": "2026-03-25T01:00:00Z",
        "ready_at": "2026-03-25T01:05:00Z" if status != "draft" else None,
        "consumed_at": None,
        "missing_items": [],
        **fields,
    }


async def thread_page(stack: Stack, thread_id: str) -> pb.ThreadContextBudget:
    return (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id=thread_id), metadata=stack.client()
        )
    ).thread_context_budget


async def test_scheduler_handoff_events_set_state_checklist_and_are_relayed(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.scheduler.publish("thread.handoff.required", required_payload("th-1", "hp-1"))
    await stack.settle()
    page = await thread_page(stack, "th-1")
    assert (page.handoff_status, page.handoff_package_id, page.handoff_reason) == (
        "required",
        "hp-1",
        "context budget urgent (31.5 % left): wrap up before Codex compacts",
    )
    assert [item.key for item in page.wrap_up_checklist] == [
        "files_touched",
        "patches",
        "last_key_command",
        "last_test_run",
        "open_questions",
        "next_actions",
        "evidence_links",
    ]
    assert not any(item.done for item in page.wrap_up_checklist)
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert list(detail.threads_requiring_handoff) == ["th-1"]

    await stack.scheduler.publish(
        "thread.handoff.ready",
        package_payload("th-1", "hp-1", "ready", missing_items=["last_test_run", "evidence_links"]),
    )
    await stack.settle()
    page = await thread_page(stack, "th-1")
    assert (page.handoff_status, page.handoff_package_id) == ("ready", "hp-1")
    assert page.handoff_reason.startswith("context budget urgent")
    assert [item.key for item in page.wrap_up_checklist if not item.done] == [
        "last_test_run",
        "evidence_links",
    ]
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert list(detail.threads_requiring_handoff) == []

    relayed = [(t, p) for t, p in await events_of(stack) if t.startswith("thread.handoff.")]
    assert [(t, p["handoff_status"], p["handoff_package_id"], p["project_ids"]) for t, p in relayed] == [
        ("thread.handoff.required", "required", "hp-1", [project_id]),
        ("thread.handoff.ready", "ready", "hp-1", [project_id]),
    ]
    assert relayed[0][1]["to_thread_id"] == "relay-1" and relayed[0][1]["owner_id"] == "local"

    await stack.scheduler.publish("thread.handoff.expired", package_payload("th-0", "hp-0", "expired"))
    await stack.scheduler.publish(
        "thread.handoff.expired", package_payload("th-1", "hp-old", "expired", missing_items=[])
    )
    await stack.settle()
    assert (await thread_page(stack, "th-1")).handoff_status == "ready"  # an older package expired
    assert [row.project_id for row in (await home(stack)).conversations] == [project_id]  # th-0 not invented

    await stack.scheduler.publish(
        "thread.handoff.consumed",
        {**package_payload("th-1", "hp-1", "consumed"), "consumed_by_thread_id": "relay-1"},
    )
    await stack.settle()
    page = await thread_page(stack, "th-1")
    assert (page.handoff_status, page.handoff_package_id, page.handoff_reason) == ("none", "", "")
    assert all(not item.done for item in page.wrap_up_checklist)  # urgent: in force, nothing carried over


async def test_a_ready_package_shows_its_details_until_a_compaction_closes_it(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.scheduler.publish("thread.handoff.required", required_payload("th-1", "hp-1"))
    details = {
        "files_touched": "2 files: parser.py, lexer.py",
        "last_test_run": "no test run found in the session",
        "evidence_links": "not reported by the worker",
    }
    await stack.scheduler.publish(
        "thread.handoff.ready",
        package_payload(
            "th-1",
            "hp-1",
            "ready",
            missing_items=["last_test_run", "evidence_links"],
            checklist_details=details,
            current_for_thread=True,
        ),
    )
    await stack.settle()
    page = await thread_page(stack, "th-1")
    shown = {item.key: (item.done, item.detail) for item in page.wrap_up_checklist}
    assert shown["files_touched"] == (True, "2 files: parser.py, lexer.py")
    assert shown["last_test_run"] == (False, "no test run found in the session")
    assert shown["evidence_links"] == (False, "not reported by the worker")
    assert shown["patches"] == (True, "")

    await stack.scheduler.publish(
        "thread.handoff.closed",
        {
            "thread_id": "th-1",
            "project_id": "",
            "node_id": "node-a",
            "reason": "compaction",
            "handoff_package_id": "hp-1",
            "package_status": "ready",
            "compaction_count": 1,
        },
    )
    await stack.settle()
    page = await thread_page(stack, "th-1")
    assert (page.handoff_status, page.handoff_package_id) == ("none", "")
    assert all(not item.done and item.detail == "" for item in page.wrap_up_checklist)  # urgent: in force

    late = package_payload("th-1", "hp-1", "ready", checklist_details=details, current_for_thread=False)
    await stack.scheduler.publish("thread.handoff.ready", late)
    await stack.settle()
    assert (await thread_page(stack, "th-1")).handoff_status == "none"
    relayed = [
        (t, p["handoff_package_id"]) for t, p in await events_of(stack) if t.startswith("thread.handoff.")
    ]
    assert relayed == [("thread.handoff.required", "hp-1"), ("thread.handoff.ready", "hp-1")]
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert detail.active_thread_contexts[0].handoff_status == "none"


async def test_scheduler_strategy_summary_reaches_the_project_detail_and_the_stream(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.settle()
    summary = "1 thread: 1 urgent. th-1 finishes its current subtask; relay thread pre-created."
    for target, text in ((project_id, summary), ("proj-unknown-here", "nobody's project")):
        await stack.scheduler.publish(
            "project.context_strategy.updated",
            {
                "project_id": target,
                "master_context_strategy_summary": text,
                "ranked_thread_ids": ["th-1"],
                "next_compaction_risk_thread_id": "th-1",
                "threads_requiring_handoff": ["th-1"],
                "new_work_thread_id": None,
            },
        )
    await stack.settle()
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert detail.master_context_strategy_summary == summary
    risk = [p for t, p in await events_of(stack) if t == "project.context_risk.updated"]
    assert risk[-1]["master_context_strategy_summary"] == summary
    assert risk[-1]["thread_context"]["thread_id"] == "th-1" and risk[-1]["project_id"] == project_id


async def test_a_strategy_summary_of_another_owner_or_of_threads_not_in_the_project_is_not_stored(
    stack: Stack,
) -> None:
    """The scheduler groups readings by the project id their worker names: conversations stores a
    summary only for the project's owner and of the project's own member threads."""
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.settle()
    for owner_id, ranked in (("mallory", ["th-1"]), ("local", ["th-1", "th-mallory"])):
        await stack.scheduler.publish(
            "project.context_strategy.updated",
            {
                "owner_id": owner_id,
                "project_id": project_id,
                "master_context_strategy_summary": f"FOREIGN {' '.join(ranked)}",
                "ranked_thread_ids": ranked,
            },
        )
    await stack.settle()
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert "FOREIGN" not in detail.master_context_strategy_summary
    risk = [p for t, p in await events_of(stack) if t == "project.context_risk.updated"]
    assert all("FOREIGN" not in p["master_context_strategy_summary"] for p in risk)


async def test_a_reading_at_a_new_level_does_not_carry_the_schedulers_older_summary(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.settle()
    summary = "1 thread: 1 urgent. th-1 finishes its current subtask; relay thread pre-created."
    await stack.scheduler.publish(
        "project.context_strategy.updated",
        {"project_id": project_id, "master_context_strategy_summary": summary},
    )
    await stack.settle()

    async def latest_summaries() -> tuple[str, str]:
        risk = [p for t, p in await events_of(stack) if t == "project.context_risk.updated"]
        detail = (
            await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
        ).project
        return risk[-1]["master_context_strategy_summary"], detail.master_context_strategy_summary

    same_level = budget_payload("th-1", 30.0, "urgent", version=2)
    await stack.budget.publish("thread.context.updated", same_level)
    await stack.settle()
    assert await latest_summaries() == (summary, summary), "a reading at the same level keeps it"

    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 12.0, "critical", version=3))
    await stack.settle()
    on_stream, on_detail = await latest_summaries()
    assert on_stream == on_detail
    assert on_stream.startswith("Critical: th-1 (12%)"), on_stream

    newer = "1 thread: 1 critical. th-1 wraps up now."
    await stack.scheduler.publish(
        "project.context_strategy.updated",
        {"project_id": project_id, "master_context_strategy_summary": newer},
    )
    await stack.settle()
    assert await latest_summaries() == (newer, newer)


async def test_handoff_for_a_thread_not_seen_yet_is_kept_until_its_budget_arrives(stack: Stack) -> None:
    await stack.scheduler.publish(
        "thread.handoff.required",
        required_payload(
            "th-early",
            "hp-7",
            reason="context_critical",
            context_budget_level="critical",
            context_budget_remaining_pct=18.0,
        ),
    )
    await stack.settle()
    await stack.budget.publish("thread.context.updated", budget_payload("th-early", 18.0, "critical"))
    await stack.settle()
    page = await thread_page(stack, "th-early")
    assert (page.handoff_status, page.handoff_package_id) == ("required", "hp-7")
    assert page.handoff_reason == "context budget critical (18.0 % left): wrap up before Codex compacts"
    assert (page.context.percent, page.context.level) == (18, "critical")
    assert (page.thread.worker_id, page.thread.codex_folder) == ("worker-a", "/home/dev/north-line")


async def test_another_owner_sees_nothing(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 50.0, "watch"))
    await stack.settle()
    assert list((await home(stack, owner="mallory")).conversations) == []
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.stub.GetProject(
            pb.GetProjectRequest(project_id=project_id), metadata=stack.client("mallory")
        )
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert await events_of(stack, owner="mallory") == []
    assert len(await events_of(stack)) > 0


async def test_unknown_ids_name_what_is_unknown(stack: Stack) -> None:
    """Every NOT_FOUND carries the reason of the resource that is unknown, whether it does not
    exist or belongs to another owner (the two are answered alike)."""
    project_id = (await register(stack, "th-1")).project_id
    mallory = stack.client("mallory")

    async def reason_of_failure(call: Any) -> str | None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        return reason_of(rpc_status.from_call(raised.value))

    calls = {
        "GetProject unknown": stack.stub.GetProject(
            pb.GetProjectRequest(project_id="proj-nope"), metadata=stack.client()
        ),
        "GetProject foreign": stack.stub.GetProject(
            pb.GetProjectRequest(project_id=project_id), metadata=mallory
        ),
        "SetConversationPinned": stack.stub.SetConversationPinned(
            pb.SetConversationPinnedRequest(project_id="proj-nope", pinned=True), metadata=stack.client()
        ),
        "RenameProject": stack.stub.RenameProject(
            pb.RenameProjectRequest(project_id=project_id, title="x"), metadata=mallory
        ),
        "AddMessage": stack.stub.AddMessage(
            pb.AddMessageRequest(project_id="proj-nope", author_kind="user", text="hi"),
            metadata=stack.client(),
        ),
        "ListMessages": stack.stub.ListMessages(
            pb.ListMessagesRequest(project_id="proj-nope"), metadata=stack.client()
        ),
        "RegisterThread into an unknown group": stack.stub.RegisterThread(
            pb.RegisterThreadRequest(
                thread_id="th-2", node_id="node-a", worker_id="worker-a", group_project_id="group-nope"
            ),
            metadata=stack.worker(),
        ),
        "GetThreadContextBudget unknown": stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-none"), metadata=stack.client()
        ),
        "GetThreadContextBudget foreign": stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-1"), metadata=mallory
        ),
        "ArchiveThread": stack.stub.ArchiveThread(
            pb.ArchiveThreadRequest(thread_id="th-none"), metadata=stack.client()
        ),
        "CreateGroupProject": stack.stub.CreateGroupProject(
            pb.CreateGroupProjectRequest(title="Pilot", thread_ids=["th-1", "ghost"]), metadata=stack.client()
        ),
    }
    reasons = {name: await reason_of_failure(call) for name, call in calls.items()}

    assert reasons == {
        "GetProject unknown": "PROJECT_NOT_FOUND",
        "GetProject foreign": "PROJECT_NOT_FOUND",
        "SetConversationPinned": "PROJECT_NOT_FOUND",
        "RenameProject": "PROJECT_NOT_FOUND",
        "AddMessage": "PROJECT_NOT_FOUND",
        "ListMessages": "PROJECT_NOT_FOUND",
        "RegisterThread into an unknown group": "PROJECT_NOT_FOUND",
        "GetThreadContextBudget unknown": "THREAD_NOT_FOUND",
        "GetThreadContextBudget foreign": "THREAD_NOT_FOUND",
        "ArchiveThread": "THREAD_NOT_FOUND",
        "CreateGroupProject": "THREAD_NOT_FOUND",
    }


async def test_bad_input_names_the_field(stack: Stack) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await home(stack, page_token="not-a-token")
    status = rpc_status.from_call(raised.value)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert status is not None and [v.field for v in field_violations_of(status)] == ["page_token"]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.stub.CreateGroupProject(
            pb.CreateGroupProjectRequest(title=" ", thread_ids=["x"]), metadata=stack.client()
        )
    status = rpc_status.from_call(raised.value)
    assert status is not None and {v.field for v in field_violations_of(status)} == {"title", "thread_ids"}
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.stub.RegisterThread(
            pb.RegisterThreadRequest(thread_id="t", node_id="node-x", worker_id="worker-a"),
            metadata=stack.worker(),
        )
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.stub.ListConversations(pb.ListConversationsRequest(), metadata=stack.worker())
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_archive_removes_the_conversation(stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.stub.ArchiveThread(pb.ArchiveThreadRequest(thread_id="th-1"), metadata=stack.client())
    assert list((await home(stack)).conversations) == []


async def test_only_services_keep_a_durable_position_on_the_event_stream(stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.settle()
    positions = stack.app.event_log.consumer_positions
    assert positions is not None
    # A client naming a consumer would hold back retention for every owner (or move a service's
    # position past what it has taken): refused, and nothing recorded.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in stack.stub.WatchEvents(
            pb.WatchEventsRequest(after_sequence=2**63 - 1, consumer="scheduler/conversations"),
            metadata=stack.client(),
        ):
            pass
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "consumer" in (refused.value.details() or "")
    assert [position.consumer for position in await positions.all()] == []
    # A service's durable position is recorded as before.
    call = stack.stub.WatchEvents(
        pb.WatchEventsRequest(after_sequence=0, consumer="scheduler/conversations"), metadata=stack.service()
    )
    first = await asyncio.wait_for(call.read(), 5)
    call.cancel()
    assert first.events[0].sequence == 1
    assert [(p.consumer, p.last_sequence) for p in await positions.all()] == [("scheduler/conversations", 0)]


async def test_an_event_stream_ends_when_its_token_expires(stack: Stack) -> None:
    token = stack.authority.issue_client("local", lifetime=timedelta(seconds=2))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        async with asyncio.timeout(5):
            async for _ in stack.stub.WatchEvents(pb.WatchEventsRequest(), metadata=bearer_metadata(token)):
                pass
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "TOKEN_EXPIRED" in str(ended.value.trailing_metadata())


async def test_watch_events_streams_live_and_resumes_without_gaps(stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.settle()
    received: list[int] = []

    async def watch(after: int, count: int) -> None:
        call = stack.stub.WatchEvents(pb.WatchEventsRequest(after_sequence=after), metadata=stack.client())
        async for response in call:
            received.extend(event.sequence for event in response.events)
            if len(received) >= count:
                call.cancel()
                return

    await asyncio.wait_for(watch(0, 2), 5)
    for version in (1, 2):
        await stack.budget.publish(
            "thread.context.updated", budget_payload("th-1", 60.0 - version, "watch", version=version)
        )
        await stack.settle()  # one batch each: readings of one thread in one batch are coalesced
    await asyncio.wait_for(watch(received[-1], 6), 5)
    assert received == list(range(1, 7))


async def test_one_batch_of_many_threads_updates_every_ring_and_risk_in_thread_order(stack: Stack) -> None:
    single_1 = (await register(stack, "th-1")).project_id
    single_2 = (await register(stack, "th-2")).project_id
    group = (
        await stack.stub.CreateGroupProject(
            pb.CreateGroupProjectRequest(title="Pilot line", thread_ids=["th-1", "th-2"]),
            metadata=stack.client(),
        )
    ).project.conversation.project_id
    readings = [
        ("th-1", 50.0, "watch", 1),
        ("th-2", 80.0, "safe", 1),
        ("th-1", 30.0, "urgent", 2),
        ("th-1", 90.0, "safe", 0),  # older than version 2: ignored
        ("th-new", 64.0, "safe", 1),
    ]
    batch = [
        StoredEvent(
            sequence=index,
            type="thread.context.updated",
            occurred_at=T0,
            thread_id=thread_id,
            project_id="",
            node_id="node-a",
            payload=budget_payload(thread_id, pct, level, version=version),
            trace_context={},
        )
        for index, (thread_id, pct, level, version) in enumerate(readings, start=1)
    ]
    async with stack.app.database.transaction() as connection:
        publication = await stack.app.handlers.apply_budget_events(connection, batch)
        if publication.carrying is not None:  # PostgreSQL: the writes the outbox append would make
            await publication.carrying.run(connection)
    published = publication.events

    imported = single_device_project_id("local", "th-new")
    assert [(e.type, e.thread_id, e.project_id) for e in published] == [
        ("conversation.context_indicator.updated", "th-1", single_1),
        *sorted(
            [
                ("project.context_risk.updated", "th-1", single_1),
                ("project.context_risk.updated", "th-1", group),
            ]
        ),
        ("conversation.context_indicator.updated", "th-2", single_2),
        *sorted(
            [
                ("project.context_risk.updated", "th-2", single_2),
                ("project.context_risk.updated", "th-2", group),
            ]
        ),
        ("conversation.context_indicator.updated", "th-new", imported),
        ("project.context_risk.updated", "th-new", imported),
    ]
    assert [
        e.payload["context_budget_indicator"]["percent"]
        for e in published
        if e.type.endswith("indicator.updated")
    ] == [30, 80, 64]
    group_risks = [e.payload for e in published if e.project_id == group]
    assert {p["next_compaction_risk_thread_id"] for p in group_risks} == {"th-1"}
    assert [p["thread_context"]["percent"] for p in group_risks] == [30, 80]
    rows = {r.project_id: r.context_budget_indicator for r in (await home(stack)).conversations}
    assert (rows[single_1].percent, rows[single_2].percent, rows[imported].percent) == (30, 80, 64)
    assert not rows[group].visible


async def test_pinning_twice_or_renaming_to_the_same_title_publishes_nothing_more(stack: Stack) -> None:
    project_id = (await register(stack, "th-pin")).project_id
    before = len(await events_of(stack))

    async def pin(pinned: bool) -> None:
        await stack.stub.SetConversationPinned(
            pb.SetConversationPinnedRequest(project_id=project_id, pinned=pinned), metadata=stack.client()
        )

    async def rename(title: str) -> None:
        await stack.stub.RenameProject(
            pb.RenameProjectRequest(project_id=project_id, title=title), metadata=stack.client()
        )

    await pin(True)
    await pin(True)
    await pin(False)
    await pin(False)
    await rename("Release work")
    await rename("Release work")
    changes = [
        payload.get("change")
        for kind, payload in (await events_of(stack))[before:]
        if kind == "conversation.updated"
    ]
    assert changes == ["pinned", "unpinned", "renamed"]


def closed_payload(thread_id: str, package_id: str, compaction_count: int) -> dict[str, object]:
    """`thread.handoff.closed` as the scheduler writes it when a report shows a compaction."""
    return {
        "thread_id": thread_id,
        "project_id": "",
        "node_id": "node-a",
        "reason": "compaction",
        "handoff_package_id": package_id,
        "package_status": "ready",
        "compaction_count": compaction_count,
    }


async def test_a_cycle_closed_before_the_compaction_reading_arrives_raises_no_false_alarm(
    stack: Stack,
) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 3.0, "critical"))
    await stack.scheduler.publish("thread.handoff.required", required_payload("th-1", "hp-1"))
    await stack.scheduler.publish("thread.handoff.ready", package_payload("th-1", "hp-1", "ready"))
    await stack.settle()
    before = len(await events_of(stack))

    # The scheduler's stream is ahead: the cycle closes before the reading showing compaction 1.
    await stack.scheduler.publish("thread.handoff.closed", closed_payload("th-1", "hp-1", 1))
    await stack.settle()
    risks = [p for t, p in (await events_of(stack))[before:] if t == "project.context_risk.updated"]
    assert risks == [], "no risk published that pairs the pre-compaction critical budget with no package"

    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-1", 97.0, "safe", version=2, compaction_count=1)
    )
    await stack.settle()
    risks = [p for t, p in (await events_of(stack))[before:] if t == "project.context_risk.updated"]
    assert risks and risks[-1]["threads_requiring_handoff"] == []
    assert risks[-1]["project_id"] == project_id

    # In the usual order (the reading first), the closed cycle is published at once.
    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-1", 20.0, "critical", version=3, compaction_count=2)
    )
    await stack.settle()
    after_reading = len(await events_of(stack))
    await stack.scheduler.publish("thread.handoff.closed", closed_payload("th-1", "hp-2", 2))
    await stack.settle()
    assert [t for t, _p in (await events_of(stack))[after_reading:]] == ["project.context_risk.updated"]


async def test_a_compaction_awaiting_its_first_reading_is_shown_as_such(stack: Stack) -> None:
    project_id = (await register(stack, "th-1")).project_id
    await stack.budget.publish(
        "thread.context.updated",
        budget_payload("th-1", 8.0, "critical", version=1, compaction_limit_source="configured"),
    )
    # Settled apart: one batch holding both readings would rightly show only the later one.
    await stack.settle()
    await stack.budget.publish(
        "thread.context.updated",
        budget_payload(
            "th-1",
            100.0,
            "safe",
            version=2,
            compaction_count=1,
            compaction_limit_source="configured",
            awaiting_reading_after_compaction=True,
        ),
    )
    await stack.settle()
    page = (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-1"), metadata=stack.client()
        )
    ).thread_context_budget
    assert page.context.awaiting_reading_after_compaction
    assert (page.context.level, page.context.compaction_count) == ("safe", 1)
    assert page.context.compaction_limit_source == "configured"
    # The home list's ring says it too: its percent (100) is a placeholder, not a measurement.
    row = (await home(stack)).conversations[0]
    assert row.context_budget_indicator == pb.ContextBudgetIndicator(
        visible=True,
        style="ring_percent",
        percent=100,
        level="safe",
        awaiting_reading_after_compaction=True,
    )
    detail = (
        await stack.stub.GetProject(pb.GetProjectRequest(project_id=project_id), metadata=stack.client())
    ).project
    assert detail.conversation.context_budget_indicator.awaiting_reading_after_compaction
    assert detail.active_thread_contexts[0].awaiting_reading_after_compaction
    indicators = [
        p["context_budget_indicator"]
        for t, p in await events_of(stack)
        if t == "conversation.context_indicator.updated"
    ]
    shown = [(i["percent"], i["awaiting_reading_after_compaction"]) for i in indicators]
    assert shown == [(8, False), (100, True)]
    risks = [p["thread_context"] for t, p in await events_of(stack) if t == "project.context_risk.updated"]
    assert risks[-1]["awaiting_reading_after_compaction"] is True
    seen = len(await events_of(stack))

    # The next real reading clears it, even when it measures 100 % too (the thread holds less than
    # Codex's 12,000-token baseline): the ring changed from "compacted" to a measured percent.
    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-1", 100.0, "safe", version=3, compaction_count=1)
    )
    await stack.settle()
    page = (
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-1"), metadata=stack.client()
        )
    ).thread_context_budget
    assert not page.context.awaiting_reading_after_compaction
    assert page.context.compaction_limit_source == ""
    row = (await home(stack)).conversations[0]
    assert row.context_budget_indicator == pb.ContextBudgetIndicator(
        visible=True, style="ring_percent", percent=100, level="safe"
    )
    after = [p for t, p in (await events_of(stack))[seen:] if t == "conversation.context_indicator.updated"]
    assert [p["context_budget_indicator"]["awaiting_reading_after_compaction"] for p in after] == [False]
    await stack.budget.publish(
        "thread.context.updated", budget_payload("th-1", 86.3, "safe", version=4, compaction_count=1)
    )
    await stack.settle()
    row = (await home(stack)).conversations[0]
    indicator = row.context_budget_indicator
    assert (indicator.percent, indicator.awaiting_reading_after_compaction) == (86, False)
