"""The gateway's conversation endpoints and SSE stream against a running conversations service (real
gRPC, SQLite and PostgreSQL): home list rings, project detail, thread page, pin/rename/group, the
error cases (404, 400, 403, 401 problem+json), and SSE resume with nothing missed or repeated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from services.bff_gateway.routers.handoff import checklist_json
from services.bff_gateway.server import _end_streams_on_exit
from services.scheduler import service as scheduler_service
from services.scheduler.domain.handoff import (
    ChecklistEntry,
    HandoffPackage,
    PackageContent,
    normalise_checklist,
)
from services.scheduler.domain.model import PackageStatus
from services.scheduler.servicer import package_message
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, SseReader, serve_gateway
from tests.integration.conversations.stack import Stack, budget_payload, running_stack
from tests.integration.conversations.test_conversations_service import package_payload, required_payload

PROBLEM = "application/problem+json"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack, heartbeat_seconds=0.3) as running:
        yield running


async def register(stack: Stack, thread_id: str, node_id: str = "node-a") -> str:
    response = await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=thread_id, node_id=node_id, worker_id="worker-a", codex_folder=f"/srv/{thread_id}"
        ),
        metadata=stack.worker("worker-a", node_id),
    )
    return response.project_id


async def test_home_list_detail_and_thread_page_agree(gateway: RunningGateway, stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 52.4, "watch"))
    await stack.settle()

    listing = await gateway.http.get("/api/v1/conversations", headers=gateway.headers())
    assert listing.status_code == 200
    [row] = [r for r in listing.json()["conversations"] if r["project_id"] == project_id]
    assert row["context_budget_indicator"] == {
        "visible": True,
        "style": "ring_percent",
        "percent": 52,
        "level": "watch",
        "awaiting_reading_after_compaction": False,
    }
    assert row["conversation_type"] == "single_device" and row["project_id"] == project_id
    assert row["context_budget_source_node_id"] == "node-a" and row["must_finish_before_compaction"] is False
    detail = (await gateway.http.get(f"/api/v1/projects/{project_id}", headers=gateway.headers())).json()
    page = (await gateway.http.get("/api/v1/threads/th-1/context-summary", headers=gateway.headers())).json()
    assert (detail["active_thread_contexts"][0]["percent"], detail["active_thread_contexts"][0]["level"]) == (
        52,
        "watch",
    )
    assert (page["context"]["percent"], page["context"]["level"]) == (52, "watch")
    assert page["codex_folder"] == "/srv/th-1" and page["handoff_status"] == "none"


async def test_the_home_ring_says_compacted_until_the_next_real_reading(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 9.0, "critical", version=1))
    await stack.settle()

    async def ring() -> dict[str, object]:
        listing = (await gateway.http.get("/api/v1/conversations", headers=gateway.headers())).json()
        [row] = [r for r in listing["conversations"] if r["project_id"] == project_id]
        return row["context_budget_indicator"]

    assert (await ring())["awaiting_reading_after_compaction"] is False
    async with gateway.http.stream("GET", "/api/v1/events", headers=gateway.headers()) as response:
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        await stack.budget.publish(
            "thread.context.updated",
            budget_payload(
                "th-1", 100.0, "safe", version=2, compaction_count=1, awaiting_reading_after_compaction=True
            ),
        )
        live = await reader.events_until(lambda e: e.event == "conversation.context_indicator.updated")
        assert live[-1].data["context_budget_indicator"] == {
            "visible": True,
            "style": "ring_percent",
            "percent": 100,
            "level": "safe",
            "awaiting_reading_after_compaction": True,
        }
        assert await ring() == live[-1].data["context_budget_indicator"]
        detail = (await gateway.http.get(f"/api/v1/projects/{project_id}", headers=gateway.headers())).json()
        assert detail["context_budget_indicator"]["awaiting_reading_after_compaction"] is True
        assert detail["active_thread_contexts"][0]["awaiting_reading_after_compaction"] is True

        await stack.budget.publish(
            "thread.context.updated", budget_payload("th-1", 83.0, "safe", version=3, compaction_count=1)
        )
        live = await reader.events_until(lambda e: e.event == "conversation.context_indicator.updated")
        assert live[-1].data["context_budget_indicator"]["awaiting_reading_after_compaction"] is False
    assert await ring() == {
        "visible": True,
        "style": "ring_percent",
        "percent": 83,
        "level": "safe",
        "awaiting_reading_after_compaction": False,
    }
    schema = (await gateway.http.get("/openapi.json")).json()["components"]["schemas"]
    flag = schema["ContextBudgetIndicatorView"]["properties"]["awaiting_reading_after_compaction"]
    assert flag["type"] == "boolean" and "not a measurement" in flag["description"]


async def test_pin_rename_and_group(gateway: RunningGateway, stack: Stack) -> None:
    first = await register(stack, "th-1")
    second = await register(stack, "th-2", node_id="node-b")
    pinned = await gateway.http.put(f"/api/v1/projects/{second}/pin", headers=gateway.headers())
    assert pinned.status_code == 200 and pinned.json()["manual_pinned"] is True
    renamed = await gateway.http.patch(
        f"/api/v1/projects/{first}", json={"project_title": "Line B"}, headers=gateway.headers()
    )
    assert renamed.json()["project_title"] == "Line B"
    group = await gateway.http.post(
        "/api/v1/projects",
        json={"project_title": "Pilot", "thread_ids": ["th-1", "th-2"]},
        headers=gateway.headers(),
    )
    assert group.status_code == 201
    body = group.json()
    assert body["conversation_type"] == "group" and body["context_budget_indicator"]["visible"] is False
    assert {t["thread_id"] for t in body["active_thread_contexts"]} == {"th-1", "th-2"}
    order = [
        r["project_id"]
        for r in (await gateway.http.get("/api/v1/conversations", headers=gateway.headers())).json()[
            "conversations"
        ]
    ]
    assert order[0] == second
    unpinned = await gateway.http.delete(f"/api/v1/projects/{second}/pin", headers=gateway.headers())
    assert unpinned.json()["manual_pinned"] is False


async def test_errors_are_problems(gateway: RunningGateway, stack: Stack) -> None:
    project_id = await register(stack, "th-1")
    missing = await gateway.http.get("/api/v1/projects/nope", headers=gateway.headers())
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM
    bad_token = await gateway.http.get("/api/v1/conversations?page_token=garbage", headers=gateway.headers())
    assert bad_token.status_code == 400 and bad_token.headers["content-type"] == PROBLEM
    assert [e["field"] for e in bad_token.json()["errors"]] == ["page_token"]
    assert missing.json()["reason"] == "PROJECT_NOT_FOUND"
    foreign = await gateway.http.get(f"/api/v1/projects/{project_id}", headers=gateway.headers("mallory"))
    assert foreign.status_code == 404 and foreign.json()["reason"] == "PROJECT_NOT_FOUND"
    worker = {"Authorization": f"Bearer {stack.authority.issue_worker('worker-a', 'node-a')}"}
    assert (await gateway.http.get("/api/v1/conversations", headers=worker)).status_code == 403
    assert (await gateway.http.get("/api/v1/conversations")).status_code == 401
    short_group = await gateway.http.post(
        "/api/v1/projects", json={"project_title": "x", "thread_ids": ["th-1"]}, headers=gateway.headers()
    )
    assert short_group.status_code == 422 and short_group.json()["errors"][0]["field"] == "thread_ids"
    assert short_group.json()["reason"] == "INVALID_ARGUMENT"
    negative = await gateway.http.get("/api/v1/conversations?page_size=-1", headers=gateway.headers())
    assert negative.status_code == 422 and negative.json()["reason"] == "INVALID_ARGUMENT"
    assert [e["field"] for e in negative.json()["errors"]] == ["page_size"]
    unknown_thread = await gateway.http.post(
        "/api/v1/projects",
        json={"project_title": "x", "thread_ids": ["th-1", "ghost"]},
        headers=gateway.headers(),
    )
    assert unknown_thread.status_code == 404 and unknown_thread.json()["reason"] == "THREAD_NOT_FOUND"


async def test_unknown_ids_have_one_reason_per_kind_on_every_route(
    gateway: RunningGateway, stack: Stack
) -> None:
    project_id = await register(stack, "th-1")
    mine, mallory = gateway.headers(), gateway.headers("mallory")
    requests = {
        "thread context-budget, unknown": ("GET", "/api/v1/threads/th-none/context-budget", mine, None),
        "thread context-budget, foreign": ("GET", "/api/v1/threads/th-1/context-budget", mallory, None),
        "thread context-summary, unknown": ("GET", "/api/v1/threads/th-none/context-summary", mine, None),
        "thread context-summary, foreign": ("GET", "/api/v1/threads/th-1/context-summary", mallory, None),
        "thread archive": ("POST", "/api/v1/threads/th-none/archive", mine, None),
        "project detail": ("GET", "/api/v1/projects/proj-none", mine, None),
        "project rename": ("PATCH", f"/api/v1/projects/{project_id}", mallory, {"project_title": "x"}),
        "project pin": ("PUT", "/api/v1/projects/proj-none/pin", mine, None),
        "project unpin": ("DELETE", f"/api/v1/projects/{project_id}/pin", mallory, None),
    }
    answers = {}
    for name, (method, url, headers, body) in requests.items():
        response = await gateway.http.request(method, url, headers=headers, json=body)
        assert response.headers["content-type"] == PROBLEM, name
        answers[name] = (response.status_code, response.json()["reason"])

    thread, project = (404, "THREAD_NOT_FOUND"), (404, "PROJECT_NOT_FOUND")
    assert answers == {
        "thread context-budget, unknown": thread,
        "thread context-budget, foreign": thread,
        "thread context-summary, unknown": thread,
        "thread context-summary, foreign": thread,
        "thread archive": thread,
        "project detail": project,
        "project rename": project,
        "project pin": project,
        "project unpin": project,
    }


async def test_an_sse_stream_ends_when_its_token_expires(gateway: RunningGateway, stack: Stack) -> None:
    token = stack.authority.issue_client("local", lifetime=timedelta(seconds=2))
    started = time.monotonic()
    async with gateway.http.stream("GET", f"/api/v1/events?access_token={token}") as response:
        assert response.status_code == 200
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        # The server ends the stream at the token's expiry (within its 2 s, rounded to the second).
        with pytest.raises(ConnectionError, match="stream ended"):
            await reader.next_event(timeout=5)
    assert time.monotonic() - started < 4
    again = await gateway.http.get(f"/api/v1/events?access_token={token}")
    assert again.status_code == 401
    assert again.json()["reason"] == "TOKEN_EXPIRED"


async def test_sse_headers_live_event_and_exact_resume(gateway: RunningGateway, stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.settle()
    token = gateway.token()
    async with gateway.http.stream("GET", f"/api/v1/events?access_token={token}") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers
        reader = SseReader(response)
        opened = await reader.next_event()
        assert opened.event == "stream.opened"
        await stack.budget.publish("thread.context.updated", budget_payload("th-1", 71.0, "safe", version=1))
        live = await reader.events_until(lambda e: e.event == "conversation.context_indicator.updated")
        assert int(live[-1].id) > int(opened.id)
        assert live[-1].data["context_budget_indicator"]["percent"] == 71
        last_seen = live[-1].id

    for version in (2, 3, 4):  # missed while disconnected
        await stack.budget.publish(
            "thread.context.updated", budget_payload("th-1", 70.0 - version, "safe", version=version)
        )
        await stack.settle()
    expected = [
        e.sequence
        for e in (
            await stack.stub.ListEvents(
                pb.ListEventsRequest(after_sequence=int(last_seen)), metadata=stack.client()
            )
        ).events
    ]
    assert len(expected) >= 6

    async with gateway.http.stream(
        "GET", "/api/v1/events", headers={**gateway.headers(), "Last-Event-ID": last_seen}
    ) as response:
        reader = SseReader(response)
        resumed = [await reader.next_event() for _ in expected]
        assert [int(e.id) for e in resumed] == expected
        await stack.budget.publish("thread.context.updated", budget_payload("th-1", 50.0, "watch", version=9))
        after = await reader.events_until(lambda e: e.event == "conversation.context_indicator.updated")
        assert all(int(e.id) > expected[-1] for e in after)
        assert after[-1].data["context_budget_indicator"] == {
            "visible": True,
            "style": "ring_percent",
            "percent": 50,
            "level": "watch",
            "awaiting_reading_after_compaction": False,
        }


async def test_open_streams_end_when_the_gateway_shuts_down(gateway: RunningGateway, stack: Stack) -> None:
    await register(stack, "th-1")
    server = SimpleNamespace(should_exit=False)
    closer = asyncio.create_task(_end_streams_on_exit(server, gateway.app.state.event_hub))  # type: ignore[arg-type]
    async with gateway.http.stream("GET", "/api/v1/events", headers=gateway.headers()) as response:
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        await asyncio.sleep(0.2)
        assert not closer.done()
        server.should_exit = True  # what uvicorn sets on SIGINT / SIGTERM
        await asyncio.wait_for(closer, 2)
        with pytest.raises(ConnectionError, match="stream ended"):  # after what was queued
            for _ in range(20):
                await reader.next_event(timeout=2.0)


async def test_sse_shows_only_the_callers_owner_and_sends_heartbeats(
    gateway: RunningGateway, stack: Stack
) -> None:
    await register(stack, "th-1")
    async with gateway.http.stream(
        "GET", f"/api/v1/events?access_token={gateway.token('mallory')}"
    ) as response:
        reader = SseReader(response)
        assert (await reader.next_event()).event == "stream.opened"
        await stack.budget.publish("thread.context.updated", budget_payload("th-1", 33.0, "urgent"))
        await stack.settle()
        with pytest.raises(TimeoutError):
            await reader.next_event(timeout=1.0)
        assert reader.pings >= 2


async def test_sse_bad_last_event_ids(gateway: RunningGateway, stack: Stack) -> None:
    bad = await gateway.http.get("/api/v1/events", headers={**gateway.headers(), "Last-Event-ID": "abc"})
    assert bad.status_code == 400 and bad.headers["content-type"] == PROBLEM
    assert bad.json()["errors"][0]["field"] == "Last-Event-ID"
    no_token = await gateway.http.get("/api/v1/events")
    assert no_token.status_code == 401 and no_token.json()["reason"] == "TOKEN_MISSING"
    basic = await gateway.http.get("/api/v1/events", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert basic.status_code == 401 and basic.json()["reason"] == "TOKEN_SCHEME_UNSUPPORTED"
    await register(stack, "th-1")
    await stack.settle()
    async with gateway.http.stream(
        "GET", "/api/v1/events", headers={**gateway.headers(), "Last-Event-ID": "999999"}
    ) as response:
        reader = SseReader(response)
        resync = await reader.next_event()
        assert resync.event == "stream.resync"
        assert resync.data["last_event_id"] == 999999 and int(resync.id) == resync.data["head_sequence"] >= 2


async def test_many_sse_clients_all_get_the_event(gateway: RunningGateway, stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.settle()
    token = gateway.token()

    async def one_client(ready: asyncio.Event, started: list[int]) -> int:
        async with gateway.http.stream("GET", f"/api/v1/events?access_token={token}") as response:
            reader = SseReader(response)
            await reader.next_event()
            started.append(1)
            if len(started) == 20:
                ready.set()
            events = await reader.events_until(lambda e: e.event == "conversation.context_indicator.updated")
            return events[-1].data["context_budget_indicator"]["percent"]

    ready = asyncio.Event()
    started: list[int] = []
    clients = [asyncio.create_task(one_client(ready, started)) for _ in range(20)]
    await asyncio.wait_for(ready.wait(), 10)
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 44.0, "watch"))
    assert await asyncio.wait_for(asyncio.gather(*clients), 10) == [44] * 20


async def test_thread_page_checklist_has_the_one_item_shape(gateway: RunningGateway, stack: Stack) -> None:
    await register(stack, "th-1")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.scheduler.publish("thread.handoff.required", required_payload("th-1", "hp-1"))
    await stack.settle()
    url = "/api/v1/threads/th-1/context-summary"

    required = (await gateway.http.get(url, headers=gateway.headers())).json()["wrap_up_checklist"]
    assert required[2] == {
        "key": "last_key_command",
        "label": "The last key command and its result",
        "status": "pending",
        "detail": "not gathered yet",
    }
    assert {item["status"] for item in required} == {"pending"}

    await stack.scheduler.publish(
        "thread.handoff.ready",
        package_payload("th-1", "hp-1", "ready", missing_items=["last_test_run", "evidence_links"]),
    )
    await stack.settle()
    ready = (await gateway.http.get(url, headers=gateway.headers())).json()["wrap_up_checklist"]
    assert [(item["key"], item["status"]) for item in ready] == [
        ("files_touched", "done"),
        ("patches", "done"),
        ("last_key_command", "done"),
        ("last_test_run", "missing"),
        ("open_questions", "done"),
        ("next_actions", "done"),
        ("evidence_links", "missing"),
    ]
    assert ready[3] == {
        "key": "last_test_run",
        "label": "The last test conclusion",
        "status": "missing",
        "detail": "not in the handoff package",
    }


async def test_context_budget_read_is_scoped_by_the_real_owner_rule(
    gateway: RunningGateway, stack: Stack
) -> None:
    await register(stack, "th-1")

    foreign = await gateway.http.get("/api/v1/threads/th-1/context-budget", headers=gateway.headers("other"))
    unknown = await gateway.http.get("/api/v1/threads/th-none/context-budget", headers=gateway.headers())
    own = await gateway.http.get("/api/v1/threads/th-1/context-budget", headers=gateway.headers())

    assert (foreign.status_code, unknown.status_code) == (404, 404)
    assert foreign.headers["content-type"] == unknown.headers["content-type"] == PROBLEM
    assert foreign.json()["detail"] == "thread 'th-1' not found"
    assert foreign.json()["reason"] == unknown.json()["reason"] == "THREAD_NOT_FOUND"
    # The owner check passed: the read went on to context_budget, which is not running here.
    assert own.status_code == 503
    assert own.json()["detail"].startswith("context_budget is unavailable")


async def test_thread_page_checklist_agrees_with_the_schedulers_for_the_same_package(
    gateway: RunningGateway, stack: Stack
) -> None:
    """The same ready package as `GET .../context-budget` shows it (the scheduler's package through
    the gateway's handoff mapping) and as `GET .../context-summary` shows it (the scheduler's
    `thread.handoff.ready` payload through the conversations projection): the same items, statuses
    and details, done and missing alike."""
    uploaded = [
        ChecklistEntry("files_touched", "done", "2 files: parser.py, lexer.py"),
        ChecklistEntry("patches", "done", "1 patch done, 1 not done"),
        ChecklistEntry("last_key_command", "done", "pytest -q: exit 1"),
        ChecklistEntry("last_test_run", "missing", "no test conclusion in the session"),
        ChecklistEntry("open_questions", "done", "1 open question"),
        ChecklistEntry("next_actions", "done", "2 next actions"),
    ]  # evidence_links not reported: the scheduler records it missing
    now = datetime(2026, 3, 25, 1, 5, tzinfo=UTC)
    package = HandoffPackage(
        handoff_package_id="hp-1",
        project_id="",
        task_id="",
        from_thread_id="th-1",
        to_thread_id="relay-1",
        node_id="node-a",
        package_status=PackageStatus.READY,
        content=PackageContent(checklist=normalise_checklist(uploaded)),
        epoch=0,
        created_at=now,
        ready_at=now,
    )
    await register(stack, "th-1")
    await stack.budget.publish("thread.context.updated", budget_payload("th-1", 31.5, "urgent"))
    await stack.scheduler.publish("thread.handoff.required", required_payload("th-1", "hp-1"))
    ready_payload = {**scheduler_service.package_payload(package), "current_for_thread": True}
    await stack.scheduler.publish("thread.handoff.ready", ready_payload)
    await stack.settle()

    page = (await gateway.http.get("/api/v1/threads/th-1/context-summary", headers=gateway.headers())).json()

    scheduler_view = checklist_json(package_message(package))
    assert page["wrap_up_checklist"] == scheduler_view
    assert scheduler_view[0]["detail"] == "2 files: parser.py, lexer.py"
    assert scheduler_view[-1] == {
        "key": "evidence_links",
        "label": "Links to required evidence",
        "status": "missing",
        "detail": "not reported by the worker",
    }
