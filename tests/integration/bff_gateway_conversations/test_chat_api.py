"""The gateway's chat endpoints and chat SSE events against a running conversations service (real
gRPC, SQLite and PostgreSQL): send (201 with the seed's four fields, 200 for a repeat), every error
as problem+json, `GET messages?after=`, task polling and retry (a task driven to failed by a
`task.status_changed` event as the scheduler publishes it), and SSE events in the REST shapes,
never `task.requested`, resumed with Last-Event-ID without a gap."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.shared.time import isoformat_utc, utc_now
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.conversations.stack import Stack, running_stack

PROBLEM = "application/problem+json"
CODEX_THREAD_REF = "019b3c2e-5a1d-7c40-9f1e-2b8d7e6a0c11"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack, heartbeat_seconds=0.3) as running:
        yield running


async def register(stack: Stack, thread_id: str, *, codex_thread_ref: str = CODEX_THREAD_REF) -> str:
    """Registers a thread on node-a as its worker does; returns its project id."""
    response = await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=thread_id,
            node_id="node-a",
            worker_id="worker-a",
            codex_folder=f"/srv/{thread_id}",
            codex_thread_ref=codex_thread_ref,
        ),
        metadata=stack.worker(),
    )
    return str(response.project_id)


async def send(
    gateway: RunningGateway, project_id: str, text: str, key: str, owner: str = "local"
) -> httpx.Response:
    return await gateway.http.post(
        f"/api/v1/projects/{project_id}/messages",
        json={"text": text, "client_message_id": key},
        headers=gateway.headers(owner),
    )


async def messages(gateway: RunningGateway, project_id: str, query: str = "") -> httpx.Response:
    return await gateway.http.get(f"/api/v1/projects/{project_id}/messages{query}", headers=gateway.headers())


async def task_requested(stack: Stack, task_id: str) -> dict[str, Any]:
    """The `task.requested` payload conversations published for `task_id` (read as the scheduler
    reads it, with a service token)."""
    page = await stack.stub.ListEvents(pb.ListEventsRequest(after_sequence=0), metadata=stack.service())
    for event in page.events:
        payload = json.loads(event.payload_json)
        if event.type == "task.requested" and payload["task_id"] == task_id:
            return dict(payload)
    raise AssertionError(f"no task.requested for {task_id}")


def status_changed(requested: dict[str, Any], status: str, **changes: Any) -> dict[str, Any]:
    """A `task.status_changed` payload as the scheduler publishes it: its Task message with proto
    field names, enums as lower-case suffixes ("" when unspecified), instants RFC 3339 UTC or null."""
    now = isoformat_utc(utc_now())
    task = {
        "task_id": requested["task_id"],
        "task_type": requested["task_type"],
        "status": status,
        "owner_id": requested["owner_id"],
        "project_id": requested["project_id"],
        "target_project_id": requested["target_project_id"],
        "target_thread_id": requested["target_thread_id"],
        "device_id": requested["device_id"],
        "codex_folder_ref": requested["codex_folder_ref"],
        "codex_thread_ref": requested["codex_thread_ref"],
        "request_message_id": requested["request_message_id"],
        "instruction_text": requested["instruction_text"],
        "dispatch_plan_id": requested["dispatch_plan_id"],
        "retry_of_task_id": requested["retry_of_task_id"],
        "attempt": 1,
        "worker_id": "worker-a",
        "created_at": now,
        "claimed_at": now,
        "started_at": now,
        "finished_at": now if status in ("completed", "failed", "timed_out") else None,
        "lease_expires_at": None,
        "heartbeat_at": now,
        "reply_text": "",
        "failure_kind": "",
        "status_detail": "",
        "device_last_seen_at": now,
        "codex_session_id": requested["codex_thread_ref"],
        "updated_at": now,
    }
    return {**task, **changes}


async def fail(stack: Stack, task_id: str) -> None:
    """Drives a task to failed (session not found) as the scheduler would, and waits until
    conversations applied it."""
    requested = await task_requested(stack, task_id)
    await stack.scheduler.publish(
        "task.status_changed",
        status_changed(
            requested,
            "failed",
            failure_kind="session_not_found",
            status_detail=f"no Codex session {CODEX_THREAD_REF} on node-a",
        ),
    )
    await stack.settle()


# --- send ----------------------------------------------------------------------------------------


async def test_send_is_201_with_the_seeds_fields_and_a_repeat_is_200_with_the_same_ids(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")

    first = await send(gateway, project_id, "run the tests again", "c-1")
    again = await send(gateway, project_id, "run the tests again", "c-1")

    assert first.status_code == 201, first.text
    body = first.json()
    assert list(body) == ["message", "masterReply", "dispatchPlan", "task", "collaborationGate"]
    assert (body["masterReply"], body["dispatchPlan"]) == (None, None)
    message, task = body["message"], body["task"]
    assert {k: message[k] for k in ("projectId", "authorKind", "threadId", "text", "sequence")} == {
        "projectId": project_id,
        "authorKind": "user",
        "threadId": None,
        "text": "run the tests again",
        "sequence": 1,
    }
    assert (message["clientMessageId"], message["taskId"]) == ("c-1", task["taskId"])
    assert message["createdAt"].endswith("Z")
    assert {k: task[k] for k in ("taskType", "status", "projectId", "targetProjectId")} == {
        "taskType": "conversation_reply",
        "status": "queued",
        "projectId": project_id,
        "targetProjectId": project_id,
    }
    assert {k: task[k] for k in ("targetThreadId", "deviceId", "codexFolderRef", "codexThreadRef")} == {
        "targetThreadId": "th-1",
        "deviceId": "node-a",
        "codexFolderRef": "/srv/th-1",
        "codexThreadRef": CODEX_THREAD_REF,
    }
    assert task["requestMessageId"] == message["messageId"]
    assert (task["resultMessageId"], task["failureKind"], task["retryOfTaskId"]) == (None, None, None)
    assert body["collaborationGate"]["state"] == "open"

    assert again.status_code == 200, again.text
    assert again.json()["message"]["messageId"] == message["messageId"]
    assert again.json()["task"]["taskId"] == task["taskId"]
    listed = (await messages(gateway, project_id)).json()["messages"]
    assert [m["messageId"] for m in listed] == [message["messageId"]]


async def test_send_errors_are_problems_naming_the_field_or_reason(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    incomplete = await register(stack, "th-2", codex_thread_ref="")
    archived = await register(stack, "th-3")
    await gateway.http.post("/api/v1/threads/th-3/archive", headers=gateway.headers())
    assert (await send(gateway, project_id, "first", "c-1")).status_code == 201

    answers = {
        "empty text": await send(gateway, project_id, "", "c-2"),
        "blank text": await send(gateway, project_id, " \n\t", "c-3"),
        "text over 100,000 characters": await send(gateway, project_id, "x" * 100_001, "c-4"),
        "bad key": await send(gateway, project_id, "hello", "has space"),
        "unknown project": await send(gateway, "proj-none", "hello", "c-5"),
        "another owner's project": await send(gateway, project_id, "hello", "c-6", owner="mallory"),
        "master agent": await send(gateway, "master-agent", "hello", "c-7"),
        "archived thread": await send(gateway, archived, "hello", "c-9"),
        "key reused": await send(gateway, project_id, "another text", "c-1"),
    }
    for name, answer in answers.items():
        assert answer.headers["content-type"] == PROBLEM, name
    shown = {
        name: (a.status_code, a.json().get("reason"), [e["field"] for e in a.json()["errors"]])
        for name, a in answers.items()
    }
    assert shown == {
        "empty text": (422, "INVALID_ARGUMENT", ["text"]),
        "blank text": (422, "INVALID_ARGUMENT", ["text"]),
        "text over 100,000 characters": (422, "INVALID_ARGUMENT", ["text"]),
        "bad key": (422, "INVALID_ARGUMENT", ["client_message_id"]),
        "unknown project": (404, "PROJECT_NOT_FOUND", []),
        "another owner's project": (404, "PROJECT_NOT_FOUND", []),
        "master agent": (409, "CHAT_PATH_NOT_AVAILABLE", []),
        "archived thread": (409, "THREAD_ARCHIVED", []),
        "key reused": (409, "CLIENT_MESSAGE_ID_REUSED", ["client_message_id"]),
    }

    missing = await send(gateway, incomplete, "hello", "c-10")
    assert (missing.status_code, missing.json()["reason"]) == (409, "THREAD_METADATA_INCOMPLETE")
    assert missing.json()["missing_fields"] == ["codexThreadRef"]
    assert [e["field"] for e in missing.json()["errors"]] == ["codexThreadRef"]
    assert "codexThreadRef" in missing.json()["detail"]
    assert (await messages(gateway, incomplete)).json()["messages"] == []
    assert [m["text"] for m in (await messages(gateway, project_id)).json()["messages"]] == ["first"]


async def test_a_longest_text_fits_past_the_default_body_limit_and_a_huge_body_is_413(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    longest = "é" * 100_000  # 200,000 bytes of UTF-8, over the gateway's 64 KiB default

    stored = await send(gateway, project_id, longest, "c-1")
    huge = await gateway.http.post(
        f"/api/v1/projects/{project_id}/messages",
        content=b'{"text": "' + b"x" * 900_000 + b'", "client_message_id": "c-2"}',
        headers={**gateway.headers(), "Content-Type": "application/json"},
    )

    assert stored.status_code == 201, stored.text[:300]
    assert stored.json()["message"]["text"] == longest
    assert (huge.status_code, huge.headers["content-type"]) == (413, PROBLEM)


async def test_only_client_tokens_may_chat(gateway: RunningGateway, stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    worker = {"Authorization": f"Bearer {stack.authority.issue_worker('worker-a', 'node-a')}"}
    service = {"Authorization": f"Bearer {stack.authority.issue_service('tool')}"}
    path = f"/api/v1/projects/{project_id}/messages"
    body = {"text": "hello", "client_message_id": "c-1"}

    calls = {
        "worker send": await gateway.http.post(path, json=body, headers=worker),
        "worker read": await gateway.http.get(path, headers=worker),
        "worker poll": await gateway.http.get("/api/v1/tasks/task-x", headers=worker),
        "service send": await gateway.http.post(path, json=body, headers=service),
        "service retry": await gateway.http.post("/api/v1/tasks/task-x/retry", headers=service),
        "no token": await gateway.http.post(path, json=body),
    }

    assert {name: (r.status_code, r.json()["reason"]) for name, r in calls.items()} == {
        "worker send": (403, "SCOPE_MISSING"),
        "worker read": (403, "SCOPE_MISSING"),
        "worker poll": (403, "SCOPE_MISSING"),
        "service send": (403, "CLIENT_TOKEN_REQUIRED"),
        "service retry": (403, "CLIENT_TOKEN_REQUIRED"),
        "no token": (401, "TOKEN_MISSING"),
    }
    assert (await messages(gateway, project_id)).json()["messages"] == []


# --- reads -----------------------------------------------------------------------------------------


async def test_messages_after_a_sequence_are_exactly_those_missed(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    for index in range(1, 4):
        assert (await send(gateway, project_id, f"message {index}", f"c-{index}")).status_code == 201

    missed = (await messages(gateway, project_id, "?after=1")).json()
    first_page = (await messages(gateway, project_id, "?after=1&page_size=1")).json()
    second_page = (
        await messages(gateway, project_id, f"?after=1&page_size=1&page_token={first_page['nextPageToken']}")
    ).json()
    nothing = (await messages(gateway, project_id, "?after=3")).json()

    assert [(m["sequence"], m["text"]) for m in missed["messages"]] == [(2, "message 2"), (3, "message 3")]
    assert missed["nextPageToken"] is None
    assert [m["sequence"] for m in first_page["messages"]] == [2]
    assert [m["sequence"] for m in second_page["messages"]] == [3]
    assert second_page["nextPageToken"] is None
    assert nothing == {
        "messages": [],
        "nextPageToken": None,
        "pendingDispatchPlan": None,
        "collaborationGate": None,
        "executingDispatchPlans": [],
    }

    bad = {
        "negative": await messages(gateway, project_id, "?after=-1"),
        "not a number": await messages(gateway, project_id, "?after=two"),
        "page size": await messages(gateway, project_id, "?page_size=500"),
        "page token": await messages(gateway, project_id, "?page_token=garbage"),
        "unknown project": await messages(gateway, "proj-none"),
    }
    assert {name: (r.status_code, [e["field"] for e in r.json()["errors"]]) for name, r in bad.items()} == {
        "negative": (422, ["after"]),
        "not a number": (422, ["after"]),
        "page size": (422, ["page_size"]),
        "page token": (400, ["page_token"]),
        "unknown project": (404, []),
    }
    assert bad["unknown project"].json()["reason"] == "PROJECT_NOT_FOUND"


async def test_a_failed_task_is_polled_and_retried_once(gateway: RunningGateway, stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    sent = (await send(gateway, project_id, "run the tests again", "c-1")).json()
    task_id = sent["task"]["taskId"]

    queued = await gateway.http.get(f"/api/v1/tasks/{task_id}", headers=gateway.headers())
    too_early = await gateway.http.post(f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers())
    assert queued.status_code == 200 and queued.json()["task"] == sent["task"]
    assert list(queued.json()) == ["task", "collaborationGate"]
    assert (too_early.status_code, too_early.json()["reason"]) == (409, "TASK_NOT_RETRYABLE")

    await fail(stack, task_id)

    failed = (await gateway.http.get(f"/api/v1/tasks/{task_id}", headers=gateway.headers())).json()["task"]
    assert (failed["status"], failed["failureKind"]) == ("failed", "session_not_found")
    assert failed["statusDetail"] and failed["resultMessageId"]
    history = (await messages(gateway, project_id)).json()["messages"]
    assert [(m["authorKind"], m["taskId"]) for m in history] == [("user", task_id), ("system", task_id)]
    assert history[1]["messageId"] == failed["resultMessageId"]

    retried = await gateway.http.post(f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers())
    assert retried.status_code == 201, retried.text
    new_task = retried.json()["task"]
    assert (new_task["status"], new_task["retryOfTaskId"]) == ("queued", task_id)
    assert new_task["requestMessageId"] == sent["message"]["messageId"]
    assert new_task["taskId"] != task_id
    old = (await gateway.http.get(f"/api/v1/tasks/{task_id}", headers=gateway.headers())).json()["task"]
    assert old["retriedByTaskId"] == new_task["taskId"]
    repeat = await send(gateway, project_id, "run the tests again", "c-1")
    assert (repeat.status_code, repeat.json()["task"]["taskId"]) == (200, new_task["taskId"])
    assert repeat.json()["message"]["messageId"] == sent["message"]["messageId"]

    twice = await gateway.http.post(f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers())
    unknown = await gateway.http.get("/api/v1/tasks/task-none", headers=gateway.headers())
    foreign = await gateway.http.get(f"/api/v1/tasks/{task_id}", headers=gateway.headers("mallory"))
    foreign_retry = await gateway.http.post(
        f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers("mallory")
    )
    assert (twice.status_code, twice.json()["reason"]) == (409, "TASK_NOT_RETRYABLE")
    for answer in (unknown, foreign, foreign_retry):
        assert (answer.status_code, answer.json()["reason"]) == (404, "TASK_NOT_FOUND")


async def test_a_queued_task_is_cancelled_through_rest_and_a_running_one_is_409(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    first = (await send(gateway, project_id, "run the tests", "c-1")).json()["task"]["taskId"]
    second = (await send(gateway, project_id, "then lint", "c-2")).json()["task"]["taskId"]

    accepted = await gateway.http.post(f"/api/v1/tasks/{second}/cancel", headers=gateway.headers())
    assert accepted.status_code == 202, accepted.text
    assert list(accepted.json()) == ["task", "collaborationGate"]
    assert (accepted.json()["task"]["taskId"], accepted.json()["task"]["status"]) == (second, "queued")
    requested = await task_requested(stack, second)
    await stack.scheduler.publish(
        "task.status_changed",
        status_changed(requested, "cancelled", status_detail="cancelled by its owner before it ran"),
    )
    await stack.settle()
    cancelled = (await gateway.http.get(f"/api/v1/tasks/{second}", headers=gateway.headers())).json()["task"]
    assert (cancelled["status"], bool(cancelled["resultMessageId"])) == ("cancelled", True)

    await stack.scheduler.publish(
        "task.status_changed", status_changed(await task_requested(stack, first), "running")
    )
    await stack.settle()
    running = await gateway.http.post(f"/api/v1/tasks/{first}/cancel", headers=gateway.headers())
    foreign = await gateway.http.post(f"/api/v1/tasks/{second}/cancel", headers=gateway.headers("mallory"))
    bad = await gateway.http.post("/api/v1/tasks/%20x/cancel", headers=gateway.headers())
    assert (running.status_code, running.json()["reason"]) == (409, "TASK_NOT_CANCELLABLE")
    assert (foreign.status_code, foreign.json()["reason"]) == (404, "TASK_NOT_FOUND")
    assert bad.status_code == 422 and [e["field"] for e in bad.json()["errors"]] == ["task_id"]


# --- SSE -------------------------------------------------------------------------------------------


async def test_sse_carries_chat_events_in_rest_shape_and_never_task_requested(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    await stack.settle()
    async with gateway.http.stream("GET", "/api/v1/events", headers=gateway.headers()) as response:
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        sent = (await send(gateway, project_id, "run the tests again", "c-1")).json()
        live = await reader.events_until(lambda e: e.event == "task.updated")

    assert [e.event for e in live] == ["conversation.message.created", "task.updated"]
    created, updated = live
    assert created.data["message"] == sent["message"]
    assert created.data["message"] == (await messages(gateway, project_id)).json()["messages"][0]
    assert updated.data["task"] == sent["task"]
    assert updated.data["collaborationGate"] == sent["collaborationGate"]
    assert int(updated.id) > int(created.id) + 1  # task.requested lies between them, unsent
    assert created.data["sequence"] == int(created.id)


async def test_sse_resume_across_task_requested_misses_nothing_else(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    sent = (await send(gateway, project_id, "run the tests again", "c-1")).json()
    task_id = sent["task"]["taskId"]
    await stack.settle()
    async with gateway.http.stream("GET", "/api/v1/events", headers=gateway.headers()) as response:
        opened = await SseReader(response).next_event()
    last_seen = int(opened.id)

    # While the client is away: the task fails (a system message), it is retried (a new
    # task.requested), and a second message is sent.
    await fail(stack, task_id)
    retried = (await gateway.http.post(f"/api/v1/tasks/{task_id}/retry", headers=gateway.headers())).json()
    await send(gateway, project_id, "and then the linter", "c-2")
    await stack.settle()
    committed = (
        await stack.stub.ListEvents(pb.ListEventsRequest(after_sequence=last_seen), metadata=stack.client())
    ).events
    expected = [(e.sequence, e.type) for e in committed if e.type != "task.requested"]
    assert any(e.type == "task.requested" for e in committed)
    assert [t for _, t in expected].count("task.updated") >= 4

    async with gateway.http.stream(
        "GET", "/api/v1/events", headers={**gateway.headers(), "Last-Event-ID": str(last_seen)}
    ) as response:
        reader = SseReader(response)
        resumed = [await reader.next_event() for _ in expected]

    assert [(int(e.id), e.event) for e in resumed] == expected
    tasks = [e.data["task"] for e in resumed if e.event == "task.updated"]
    assert ("failed", "session_not_found") in [(t["status"], t["failureKind"]) for t in tasks]
    assert retried["task"]["taskId"] in [t["taskId"] for t in tasks]
    texts = [e.data["message"]["authorKind"] for e in resumed if e.event == "conversation.message.created"]
    assert texts == ["system", "user"]
