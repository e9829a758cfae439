"""The gateway's group chat (CHAT-4) against a running conversations service (real gRPC, SQLite and
PostgreSQL): a send into a group answers `dispatchPlan` with `collaborationGate`
awaiting_confirmation, the project detail and the message page show the pending plan (so a client
comes back to it after a reload), confirm (dropping a target) and reject, every error as
problem+json naming the field or reason, another owner's plan 404, and `dispatch_plan.updated` on
SSE in the same shape as the REST answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.conversations.chat_support import register
from tests.integration.conversations.group_support import group_of, thread_with_budget
from tests.integration.conversations.stack import Stack, running_stack

PROBLEM = "application/problem+json"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack, heartbeat_seconds=0.3) as running:
        yield running


async def pilot_group(stack: Stack) -> str:
    await thread_with_budget(stack, "th-north", 82.0, "safe")
    await thread_with_budget(stack, "th-south", 44.0, "watch")
    await thread_with_budget(stack, "th-east", 3.0, "critical")
    return await group_of(stack, "th-north", "th-south", "th-east")


async def send(
    gateway: RunningGateway, group: str, text: str, key: str, owner: str = "local"
) -> httpx.Response:
    return await gateway.http.post(
        f"/api/v1/projects/{group}/messages",
        json={"text": text, "client_message_id": key},
        headers=gateway.headers(owner),
    )


async def test_a_group_send_answers_the_plan_and_a_reload_finds_it_waiting(
    gateway: RunningGateway, stack: Stack
) -> None:
    group = await pilot_group(stack)

    sent = await send(gateway, group, "Run the integration tests", "c-1")

    assert sent.status_code == 201
    body = sent.json()
    assert body["task"] is None and body["masterReply"] is None
    plan = body["dispatchPlan"]
    assert plan["status"] == "proposed" and plan["draftedBy"] == "user_text" and plan["draftingNote"] is None
    assert [
        (t["targetId"], t["threadTitle"], t["level"], t["remainingPct"], t["status"]) for t in plan["targets"]
    ] == [
        ("t1", "north", "safe", 82.0, "proposed"),
        ("t2", "south", "watch", 44.0, "proposed"),
    ]
    assert plan["targets"][0]["codexThreadRef"] == "0199-th-north" and plan["targets"][0]["taskId"] is None
    assert plan["leftOut"] == [
        {
            "threadId": "th-east",
            "threadTitle": "east",
            "reason": "critical (3.0 % left): it wraps up and hands off first and takes no new work",
        }
    ]
    assert plan["expiresAt"].endswith("Z") and plan["decidedAt"] is None and plan["summaryStatus"] is None
    assert body["collaborationGate"]["state"] == "awaiting_confirmation"

    detail = (await gateway.http.get(f"/api/v1/projects/{group}", headers=gateway.headers())).json()
    assert detail["pending_dispatch_plan"] == plan and detail["executing_dispatch_plans"] == []
    assert detail["collaboration_gate"] == body["collaborationGate"]
    page = (await gateway.http.get(f"/api/v1/projects/{group}/messages", headers=gateway.headers())).json()
    assert (
        page["pendingDispatchPlan"] == plan and page["collaborationGate"]["state"] == "awaiting_confirmation"
    )
    got = (
        await gateway.http.get(f"/api/v1/dispatch-plans/{plan['planId']}", headers=gateway.headers())
    ).json()
    assert got == {"dispatchPlan": plan, "collaborationGate": body["collaborationGate"]}
    solo = await register(stack, "th-solo")
    solo_page = (
        await gateway.http.get(f"/api/v1/projects/{solo}/messages", headers=gateway.headers())
    ).json()
    assert solo_page["pendingDispatchPlan"] is None and solo_page["collaborationGate"] is None


async def test_confirm_with_a_dropped_target_then_confirm_again(
    gateway: RunningGateway, stack: Stack
) -> None:
    group = await pilot_group(stack)
    plan = (await send(gateway, group, "Run the integration tests", "c-1")).json()["dispatchPlan"]
    url = f"/api/v1/dispatch-plans/{plan['planId']}/confirm"

    confirmed = await gateway.http.post(url, json={"dropped_target_ids": ["t2"]}, headers=gateway.headers())
    again = await gateway.http.post(url, headers=gateway.headers())

    assert confirmed.status_code == 200 and again.status_code == 200
    body = confirmed.json()
    assert [(t["targetId"], t["status"], t["taskStatus"]) for t in body["dispatchPlan"]["targets"]] == [
        ("t1", "dispatched", "queued"),
        ("t2", "dropped", None),
    ]
    assert [(t["taskType"], t["targetThreadId"], t["status"]) for t in body["tasks"]] == [
        ("dispatch_execution", "th-north", "queued")
    ]
    assert body["collaborationGate"] == {
        "state": "executing",
        "tasksTotal": 1,
        "tasksDone": 0,
        "detail": "0 of 1 done",
    }
    assert again.json() == body
    detail = (await gateway.http.get(f"/api/v1/projects/{group}", headers=gateway.headers())).json()
    assert detail["pending_dispatch_plan"] is None and detail["collaboration_gate"]["state"] == "executing"
    # The running plan, for any tab or a reload: in the detail and on the message page.
    assert detail["executing_dispatch_plans"] == [body["dispatchPlan"]]
    page = (await gateway.http.get(f"/api/v1/projects/{group}/messages", headers=gateway.headers())).json()
    assert page["executingDispatchPlans"] == [body["dispatchPlan"]]


async def test_plan_errors_are_problems_naming_the_field_or_reason(
    gateway: RunningGateway, stack: Stack
) -> None:
    group = await pilot_group(stack)
    plan = (await send(gateway, group, "Run the integration tests", "c-1")).json()["dispatchPlan"]
    base = f"/api/v1/dispatch-plans/{plan['planId']}"

    unknown = await gateway.http.post(
        f"{base}/confirm", json={"dropped_target_ids": ["t9"]}, headers=gateway.headers()
    )
    extra = await gateway.http.post(f"{base}/confirm", json={"drop": ["t1"]}, headers=gateway.headers())
    foreign = await gateway.http.get(base, headers=gateway.headers("mallory"))
    foreign_confirm = await gateway.http.post(f"{base}/confirm", headers=gateway.headers("mallory"))
    rejected = await gateway.http.post(f"{base}/reject", headers=gateway.headers())
    closed = await gateway.http.post(f"{base}/confirm", headers=gateway.headers())
    worker = await gateway.http.post(
        f"{base}/reject",
        headers={"Authorization": f"Bearer {stack.authority.issue_worker('worker-a', 'node-a')}"},
    )

    assert unknown.status_code == 422 and unknown.headers["content-type"].startswith(PROBLEM)
    assert "dropped_target_ids" in unknown.text and "names no target of plan" in unknown.text
    assert extra.status_code == 422 and "drop" in extra.text
    for response in (foreign, foreign_confirm):
        assert response.status_code == 404 and response.json()["reason"] == "DISPATCH_PLAN_NOT_FOUND"
    assert rejected.status_code == 200 and rejected.json()["dispatchPlan"]["status"] == "rejected"
    assert closed.status_code == 409 and closed.json()["reason"] == "DISPATCH_PLAN_REJECTED"
    assert worker.status_code == 403


async def test_sse_carries_plan_changes_in_the_rest_shape(gateway: RunningGateway, stack: Stack) -> None:
    group = await pilot_group(stack)
    async with gateway.http.stream("GET", "/api/v1/events", headers=gateway.headers()) as response:
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        sent = (await send(gateway, group, "Run the integration tests", "c-1")).json()
        proposed = (await reader.events_until(lambda e: e.event == "dispatch_plan.updated"))[-1]
        confirmed = (
            await gateway.http.post(
                f"/api/v1/dispatch-plans/{sent['dispatchPlan']['planId']}/confirm", headers=gateway.headers()
            )
        ).json()
        moved = (
            await reader.events_until(
                lambda e: e.event == "dispatch_plan.updated" and e.data["change"] == "confirmed"
            )
        )[-1]

    assert proposed.data["change"] == "proposed" and proposed.data["dispatchPlan"] == sent["dispatchPlan"]
    assert proposed.data["collaborationGate"] == sent["collaborationGate"]
    assert "dispatch_plan" not in proposed.data and proposed.data["project_id"] == group
    assert moved.data["dispatchPlan"] == confirmed["dispatchPlan"]
    assert moved.data["collaborationGate"] == confirmed["collaborationGate"]
