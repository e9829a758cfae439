"""The gateway against the real context_budget service (services/context_budget, started in-process
with build_service), on SQLite and on PostgreSQL: REST in, real gRPC, real validation and storage,
REST out. The only double is the conversations peer answering the owner check of client tokens
(thread-abc is owner-1's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.bff_gateway.clients import open_channel
from services.context_budget.server import build_service
from services.shared.auth import TokenAuthority
from services.shared.config import ServiceSettings
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway.context_budget_double import SECRET
from tests.integration.bff_gateway.conversations_double import start_conversations
from tests.integration.bff_gateway.support import SEED_BODY, SEED_PATH, build_app

THREAD_PATH = "/api/v1/threads/thread-abc/context-budget"
AUTHORITY = TokenAuthority(SECRET)
# The seed's worker reports for owner-1, the owner the conversations double gives its thread.
WORKER = {"Authorization": f"Bearer {AUTHORITY.issue_worker('worker-mac-01', 'mac-01', owner_id='owner-1')}"}
CLIENT = {"Authorization": f"Bearer {AUTHORITY.issue_client('owner-1')}"}


@pytest.fixture
async def http(database_target: DatabaseTarget) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a gateway app wired to a running context_budget on `database_target`."""
    service = build_service(
        ServiceSettings(
            service="context_budget",
            database_url=database_target.url,
            listen="127.0.0.1:0",
            migrate_on_start=True,
            auth_secret=SECRET,
        ),
        schema=database_target.schema or "context_budget",
    )
    await service.start()
    conversations = await start_conversations(AUTHORITY, {"thread-abc": "owner-1", "thread-never": "owner-1"})
    channel = open_channel(service.address)
    conversations_channel = open_channel(conversations.address)
    app = build_app(service.address, channel=channel, conversations_channel=conversations_channel)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway.test"
        ) as client:
            yield client
    finally:
        await channel.close()
        await conversations_channel.close()
        await conversations.stop()
        await service.stop(grace=0)


async def test_seed_report_is_stored_and_read_back(http: httpx.AsyncClient) -> None:
    response = await http.post(SEED_PATH, json=SEED_BODY, headers=WORKER)

    assert response.status_code == 200, response.text
    ack = response.json()
    assert set(ack) == {
        "accepted",
        "thread_id",
        "context_budget_level",
        "next_required_report_in_seconds",
        "master_actions",
        "duplicate",
        "superseded",
    }
    assert (ack["accepted"], ack["thread_id"], ack["context_budget_level"]) == (True, "thread-abc", "urgent")
    assert ack["next_required_report_in_seconds"] == 5
    assert ack["master_actions"][:2] == ["prepare_handoff", "avoid_large_context_append"]
    assert (ack["duplicate"], ack["superseded"]) == (False, False)

    view = (await http.get(THREAD_PATH, headers=CLIENT)).json()

    assert view["context_budget_remaining_pct"] == 37.0
    assert view["context_budget_level"] == "urgent"
    assert view["captured_at"] == "2026-03-25T07:56:00Z"
    assert view["compaction_expected_at"] == "2026-03-25T08:08:30Z"
    assert view["last_compaction_at"] == "2026-03-25T07:12:10Z"
    assert (view["compaction_count"], view["estimated_remaining_turns"]) == (1, 5)
    assert view["must_finish_before_compaction"] is True
    assert view["master_actions"] == ack["master_actions"]
    assert view["updated_at"].endswith("Z")
    assert (view["wrap_up_checklist"], view["handoff_package"]) == ([], None)


async def test_resent_report_is_a_duplicate_and_an_older_one_is_superseded(http: httpx.AsyncClient) -> None:
    newer = {**SEED_BODY, "snapshot_version": 2}
    older = {
        **SEED_BODY,
        "snapshot_version": 1,
        "captured_at": "2026-03-25T15:55:00+08:00",
        "context_budget_remaining_pct": 80,
    }

    first = (await http.post(SEED_PATH, json=newer, headers=WORKER)).json()
    again = (await http.post(SEED_PATH, json=newer, headers=WORKER)).json()
    late = (await http.post(SEED_PATH, json=older, headers=WORKER)).json()

    assert (first["duplicate"], again["duplicate"], late["superseded"]) == (False, True, True)
    view = (await http.get(THREAD_PATH, headers=CLIENT)).json()
    assert view["context_budget_remaining_pct"] == 37.0


async def test_a_different_reading_under_a_stored_snapshot_id_is_409_naming_it(
    http: httpx.AsyncClient,
) -> None:
    body = {**SEED_BODY, "snapshot_id": "snap-reused"}
    assert (await http.post(SEED_PATH, json=body, headers=WORKER)).status_code == 200

    changed = await http.post(SEED_PATH, json={**body, "context_budget_remaining_pct": 12.5}, headers=WORKER)

    assert changed.status_code == 409, changed.text
    assert changed.headers["content-type"] == "application/problem+json"
    assert changed.json()["reason"] == "SNAPSHOT_ID_REUSED"
    assert [error["field"] for error in changed.json()["errors"]] == ["snapshot_id"]
    view = (await http.get(THREAD_PATH, headers=CLIENT)).json()
    assert view["context_budget_remaining_pct"] == 37.0


async def test_another_devices_report_of_a_thread_is_403_and_changes_nothing(http: httpx.AsyncClient) -> None:
    assert (await http.post(SEED_PATH, json=SEED_BODY, headers=WORKER)).status_code == 200
    intruder = {"Authorization": f"Bearer {AUTHORITY.issue_worker('worker-b', 'node-b', owner_id='owner-2')}"}
    body = {**SEED_BODY, "worker_id": "worker-b", "node_id": "node-b", "context_budget_remaining_pct": 12.5}

    response = await http.post("/api/v1/workers/worker-b/thread-context", json=body, headers=intruder)

    assert response.status_code == 403, response.text
    assert response.json()["reason"] == "THREAD_BOUND_TO_OTHER_DEVICE"
    view = (await http.get(THREAD_PATH, headers=CLIENT)).json()
    assert view["context_budget_remaining_pct"] == 37.0


async def test_service_side_violations_come_back_as_422_with_json_field_names(
    http: httpx.AsyncClient,
) -> None:
    body = {**SEED_BODY, "thread_id": "thread\x01abc", "captured_at": "2099-01-01T00:00:00Z"}

    response = await http.post(SEED_PATH, json=body, headers=WORKER)

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert sorted(error["field"] for error in response.json()["errors"]) == ["captured_at", "thread_id"]


async def test_unknown_thread_is_404(http: httpx.AsyncClient) -> None:
    service = {"Authorization": f"Bearer {AUTHORITY.issue_service('scheduler')}"}

    response = await http.get("/api/v1/threads/thread-never/context-budget", headers=CLIENT)
    as_service = await http.get("/api/v1/threads/thread-never/context-budget", headers=service)

    assert response.status_code == as_service.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    # The owner check passed (thread-never is owner-1's); the reason is context_budget's own.
    assert response.json()["reason"] == as_service.json()["reason"] == "THREAD_NOT_FOUND"


async def test_readyz_sees_the_real_health_service(http: httpx.AsyncClient) -> None:
    response = await http.get("/readyz")

    assert response.json() == {
        "status": "ready",
        "checks": {"context_budget": "SERVING", "conversations": "SERVING"},
    }
