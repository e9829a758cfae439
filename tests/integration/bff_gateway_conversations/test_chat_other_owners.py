"""The chat REST routes and SSE against a running conversations service (real gRPC, SQLite and
PostgreSQL) used by a caller holding a valid client token of another owner: another owner's project
and task are 404 on every route whatever owner the request names, the SSE stream (fresh or resumed
from the start) carries none of the other owner's chat events and never `task.requested`, and a
project id holding NUL is a 422 naming it on both databases, not a backend failure."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.shared.auth import bearer_metadata
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.bff_gateway_conversations.test_chat_api import fail, register
from tests.integration.conversations.stack import Stack, running_stack


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack, heartbeat_seconds=0.3) as running:
        yield running


async def register_for(stack: Stack, owner: str, thread_id: str, node: str) -> str:
    """Registers a thread of `owner` as its own node's worker does; returns its project id."""
    response = await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=thread_id,
            node_id=node,
            worker_id=f"worker-{node}",
            codex_folder=f"/srv/{thread_id}",
            codex_thread_ref=f"0199-{thread_id}",
        ),
        # The owner comes from the worker's token, never from the request.
        metadata=bearer_metadata(stack.authority.issue_worker(f"worker-{node}", node, owner_id=owner)),
    )
    return str(response.project_id)


async def test_another_owners_project_and_task_are_404_on_every_chat_route(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    sent = await gateway.http.post(
        f"/api/v1/projects/{project_id}/messages",
        json={"text": "the deploy key is in vault", "client_message_id": "c-1"},
        headers=gateway.headers(),
    )
    task_id = sent.json()["task"]["taskId"]
    await fail(stack, task_id)
    mallory = gateway.headers("mallory")

    answers = [
        await gateway.http.post(
            f"/api/v1/projects/{project_id}/messages",
            json={"text": "the deploy key is in vault", "client_message_id": "c-1"},
            headers=mallory,
        ),
        await gateway.http.get(f"/api/v1/projects/{project_id}/messages?owner_id=local", headers=mallory),
        await gateway.http.get(f"/api/v1/tasks/{task_id}?owner_id=local", headers=mallory),
        await gateway.http.post(f"/api/v1/tasks/{task_id}/retry?owner_id=local", headers=mallory),
    ]

    assert [(a.status_code, a.json()["reason"]) for a in answers] == [
        (404, "PROJECT_NOT_FOUND"),
        (404, "PROJECT_NOT_FOUND"),
        (404, "TASK_NOT_FOUND"),
        (404, "TASK_NOT_FOUND"),
    ]
    assert all("vault" not in a.text for a in answers)
    named = await gateway.http.post(
        f"/api/v1/projects/{project_id}/messages",
        json={"text": "hi", "client_message_id": "c-2", "owner_id": "local"},
        headers=mallory,
    )
    assert (named.status_code, [e["field"] for e in named.json()["errors"]]) == (422, ["owner_id"])
    listed = (
        await gateway.http.get(f"/api/v1/projects/{project_id}/messages", headers=gateway.headers())
    ).json()
    assert [m["authorKind"] for m in listed["messages"]] == ["user", "system"]  # none of mallory's
    assert listed["messages"][0]["text"] == "the deploy key is in vault"
    retried = await gateway.http.post(f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers())
    assert retried.status_code == 201


async def test_sse_never_carries_another_owners_chat_events_live_or_resumed(
    gateway: RunningGateway, stack: Stack
) -> None:
    mine = await register_for(stack, "local", "th-mine", "node-a")
    theirs = await register_for(stack, "mallory", "th-theirs", "node-b")
    await stack.settle()

    async with gateway.http.stream(
        "GET", f"/api/v1/events?access_token={gateway.token('local')}"
    ) as response:
        live = SseReader(response)
        assert (await live.next_event()).event == "stream.opened"
        await gateway.http.post(
            f"/api/v1/projects/{theirs}/messages",
            json={"text": "mallory's secret", "client_message_id": "m-1"},
            headers=gateway.headers("mallory"),
        )
        await gateway.http.post(
            f"/api/v1/projects/{mine}/messages",
            json={"text": "mine", "client_message_id": "l-1"},
            headers=gateway.headers(),
        )
        seen_live = await live.events_until(lambda e: e.event == "task.updated")
    await stack.settle()
    async with gateway.http.stream(
        "GET", "/api/v1/events", headers={**gateway.headers(), "Last-Event-ID": "0"}
    ) as response:
        resumed = SseReader(response)
        seen_resumed = await resumed.events_until(
            lambda e: e.event == "task.updated" and e.data["project_id"] == mine
        )

    for seen in (seen_live, seen_resumed):
        assert {e.data["owner_id"] for e in seen} == {"local"}
        assert "task.requested" not in [e.event for e in seen]
        assert all("mallory" not in json.dumps(e.data) and theirs not in json.dumps(e.data) for e in seen)
    assert [e.event for e in seen_live] == ["conversation.message.created", "task.updated"]


async def test_a_project_id_holding_nul_is_422_naming_it_on_every_database(
    gateway: RunningGateway, stack: Stack
) -> None:
    await register(stack, "th-1")

    answers = [
        await gateway.http.get("/api/v1/projects/proj%00x/messages", headers=gateway.headers()),
        await gateway.http.post(
            "/api/v1/projects/proj%00x/messages",
            json={"text": "hi", "client_message_id": "c-1"},
            headers=gateway.headers(),
        ),
    ]

    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert [e["field"] for e in answer.json()["errors"]] == ["project_id"]
