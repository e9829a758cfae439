"""The master agent's chat over the gateway's REST API (CHAT-2, CHAT-5), SQLite and PostgreSQL, with
the openai_api backend against the demo model as its own process: `POST
/api/v1/projects/master-agent/messages` answers `masterReply` inline (201, then 200 for a repeat),
or a task that completes later; the reply's event reaches SSE; `GET /api/v1/projects/master-agent`
answers the master project from installation on without writing anything; without a backend the
send is a 409 problem saying how to configure one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.conversations.domain.model import master_project_id
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.conversations.chat_support import head
from tests.integration.conversations.stack import Stack, budget_payload, running_stack
from tests.master_support import DemoModelProcess, demo_model_process  # noqa: F401

MASTER = master_project_id("local")
PROBLEM = "application/problem+json"


@pytest.fixture
async def gateway(
    database_target: DatabaseTarget,
    tmp_path: Path,
    demo_model_process: DemoModelProcess,  # noqa: F811
) -> AsyncIterator[RunningGateway]:
    settings = demo_model_process.settings(inline_wait_seconds=2.0, context_window_tokens=32_000)
    async with (
        running_stack(database_target, tmp_path, master=settings) as stack,
        serve_gateway(stack, heartbeat_seconds=0.3) as running,
    ):
        yield running


async def send(gateway: RunningGateway, text: str, key: str) -> tuple[int, dict]:
    answer = await gateway.http.post(
        "/api/v1/projects/master-agent/messages",
        json={"text": text, "client_message_id": key},
        headers=gateway.headers(),
    )
    return answer.status_code, answer.json()


async def with_a_critical_thread(stack: Stack) -> None:
    from tests.integration.conversations.chat_support import register

    await register(stack, "th-parser", title="parser")
    await stack.budget.publish("thread.context.updated", budget_payload("th-parser", 12.0, "critical"))
    await stack.settle()


async def test_a_master_message_is_answered_inline_with_the_true_state(gateway: RunningGateway) -> None:
    await with_a_critical_thread(gateway.stack)

    status, answer = await send(gateway, "which thread is close to compaction?", "m-1")

    assert status == 201
    assert answer["masterReply"].startswith("Demo model (not a real model), answering from Boss's state")
    assert '"parser" (th-parser) with 12 % of its context budget left (critical)' in answer["masterReply"]
    assert answer["dispatchPlan"] is None
    assert {key: answer["task"][key] for key in ("taskType", "status", "projectId", "targetThreadId")} == {
        "taskType": "conversation_reply",
        "status": "completed",
        "projectId": MASTER,
        "targetThreadId": "",
    }
    assert answer["collaborationGate"]["state"] == "open"
    listed = (
        await gateway.http.get("/api/v1/projects/master-agent/messages", headers=gateway.headers())
    ).json()
    assert [(m["authorKind"], m["text"]) for m in listed["messages"]] == [
        ("user", "which thread is close to compaction?"),
        ("master", answer["masterReply"]),
    ]
    repeat_status, repeat = await send(gateway, "which thread is close to compaction?", "m-1")
    assert (repeat_status, repeat["masterReply"], repeat["message"]) == (
        200,
        answer["masterReply"],
        answer["message"],
    )

    detail = (await gateway.http.get("/api/v1/projects/master-agent", headers=gateway.headers())).json()
    ring = detail["context_budget_indicator"]
    assert ring["visible"] is True and 0 < ring["percent"] < 100


async def test_a_slow_reply_is_a_task_whose_reply_arrives_on_sse(gateway: RunningGateway) -> None:
    headers = {**gateway.headers(), "Accept": "text/event-stream"}
    async with gateway.http.stream("GET", "/api/v1/events", headers=headers, timeout=20) as response:
        reader = SseReader(response)
        status, answer = await send(gateway, "status? [[demo:slow=3]]", "m-1")
        assert status == 201 and answer["masterReply"] is None
        assert answer["task"]["status"] in ("queued", "running")
        task_id = answer["task"]["taskId"]
        events = await reader.events_until(
            lambda e: (
                e.event == "task.updated"
                and e.data["task"]["taskId"] == task_id
                and e.data["task"]["status"] == "completed"
            ),
            timeout=15,
        )
    [reply] = [
        e.data["message"]
        for e in events
        if e.event == "conversation.message.created" and e.data["message"]["authorKind"] == "master"
    ]
    assert reply["taskId"] == task_id and reply["projectId"] == MASTER
    statuses = [
        e.data["task"]["status"]
        for e in events
        if e.event == "task.updated" and e.data["task"]["taskId"] == task_id
    ]
    assert statuses == ["queued", "running", "completed"]
    polled = (await gateway.http.get(f"/api/v1/tasks/{task_id}", headers=gateway.headers())).json()
    assert (polled["task"]["status"], polled["task"]["resultMessageId"]) == ("completed", reply["messageId"])


async def test_reading_the_master_project_never_writes(gateway: RunningGateway) -> None:
    before = await head(gateway.stack)
    for _ in range(3):
        detail = await gateway.http.get("/api/v1/projects/master-agent", headers=gateway.headers())
        assert detail.status_code == 200
        shown = detail.json()
        assert (shown["project_id"], shown["manual_pinned"], shown["conversation_type"]) == (
            MASTER,
            True,
            "master_agent",
        )
    await asyncio.sleep(0.2)
    assert await head(gateway.stack) == before


async def test_without_a_backend_a_master_message_is_a_409_saying_how_to_configure_one(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    async with running_stack(database_target, tmp_path) as stack, serve_gateway(stack) as gateway:
        started = time.monotonic()
        status, problem = await send(gateway, "hello", "m-1")
        assert (status, problem["reason"]) == (409, "CHAT_PATH_NOT_AVAILABLE")
        assert "BOSS_MASTER_BACKEND=openai_api" in problem["detail"] and time.monotonic() - started < 5
        listed = (
            await gateway.http.get("/api/v1/projects/master-agent/messages", headers=gateway.headers())
        ).json()
        assert listed["messages"] == []
