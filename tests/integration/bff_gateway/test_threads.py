"""GET /api/v1/threads/{thread_id}/context-budget through the real app and real gRPC, against the
context_budget test double (context_budget_double.py) that stores what was reported and the
conversations double (conversations_double.py) that answers the owner check of client tokens."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from boss.context_budget.v1 import context_budget_pb2 as pb

from services.bff_gateway.clients import ChannelSlot, WrapUpView
from services.shared.time import to_timestamp
from tests.integration.bff_gateway.support import (
    SEED_BODY,
    SEED_PATH,
    Gateway,
    build_app,
    closed_port_address,
)

THREAD_PATH = "/api/v1/threads/thread-abc/context-budget"


async def test_reported_thread_reads_back_with_every_cb14_field(gateway: Gateway) -> None:
    body = {
        **SEED_BODY,
        "last_total_tokens": 150_000,
        "model_context_window": 258_400,
        "auto_compact_token_limit": 244_800,
        "codex_context_left_pct": 42,
        "must_finish_reason": "uncommitted changes in 3 files",
    }
    await gateway.http.post(SEED_PATH, json=body, headers=gateway.worker_headers())

    response = await gateway.http.get(THREAD_PATH, headers=gateway.client_headers())

    assert response.status_code == 200, response.text
    view = response.json()
    updated_at = view.pop("updated_at")
    assert updated_at.endswith("Z")
    assert view == {
        "thread_id": "thread-abc",
        "project_id": "proj-001",
        "node_id": "mac-01",
        "context_budget_remaining_pct": 37.0,
        "context_budget_level": "urgent",
        "compaction_expected_at": "2026-03-25T08:08:30Z",
        "last_compaction_at": "2026-03-25T07:12:10Z",
        "compaction_count": 1,
        "must_finish_before_compaction": True,
        "must_finish_reason": "uncommitted changes in 3 files",
        "estimated_remaining_turns": 5,
        "estimated_remaining_large_messages": 2,
        "codex_context_left_pct": 42,
        "last_total_tokens": 150_000,
        "model_context_window": 258_400,
        "auto_compact_token_limit": 244_800,
        "compaction_limit_source": None,
        "awaiting_reading_after_compaction": False,
        "source_kind": "worker_estimator",
        "captured_at": "2026-03-25T07:56:00Z",
        "next_required_report_in_seconds": 5,
        "master_actions": ["prepare_handoff", "avoid_large_context_append"],
        "open_alerts": [],
        "wrap_up_checklist": [],
        "handoff_package": None,
    }


async def test_open_alerts_are_listed_with_lower_case_names(gateway: Gateway) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    stored = gateway.peer.servicer.contexts["thread-abc"]
    stored.open_alerts.append(
        pb.ThreadContextAlert(
            alert_id="alert-1",
            thread_id="thread-abc",
            alert_type=pb.ALERT_TYPE_COMPACTION_RISK,
            alert_status=pb.ALERT_STATUS_OPENED,
            opened_at=to_timestamp(datetime(2026, 3, 25, 7, 44, tzinfo=UTC)),
            reason="compaction expected in 12 min with an uncommitted patch",
        )
    )

    response = await gateway.http.get(THREAD_PATH, headers=gateway.client_headers())

    [alert] = response.json()["open_alerts"]
    assert alert["alert_type"] == "compaction_risk"
    assert alert["alert_status"] == "opened"
    assert alert["opened_at"] == "2026-03-25T07:44:00Z"
    assert alert["reason"] == "compaction expected in 12 min with an uncommitted patch"


async def test_unknown_thread_is_404_problem(gateway: Gateway) -> None:
    response = await gateway.http.get(
        "/api/v1/threads/thread-nobody/context-budget", headers=gateway.client_headers()
    )

    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert "thread-nobody" in response.json()["detail"]
    assert response.json()["reason"] == "THREAD_NOT_FOUND"


async def test_thread_context_budget_never_reported_has_the_same_reason_as_unknown(gateway: Gateway) -> None:
    service = {"Authorization": f"Bearer {gateway.authority.issue_service('scheduler')}"}

    response = await gateway.http.get("/api/v1/threads/thread-nobody/context-budget", headers=service)

    assert response.status_code == 404
    assert response.json()["reason"] == "THREAD_NOT_FOUND"


async def test_service_token_may_read_and_worker_token_may_not(gateway: Gateway) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    service = {"Authorization": f"Bearer {gateway.authority.issue_service('scheduler')}"}

    assert (await gateway.http.get(THREAD_PATH, headers=service)).status_code == 200
    denied = await gateway.http.get(THREAD_PATH, headers=gateway.worker_headers())
    assert denied.status_code == 403
    assert denied.json()["reason"] == "SCOPE_MISSING"


async def test_read_without_token_is_401(gateway: Gateway) -> None:
    response = await gateway.http.get(THREAD_PATH)
    basic = await gateway.http.get(THREAD_PATH, headers={"Authorization": "Basic dXNlcjpwYXNz"})

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["reason"] == "TOKEN_MISSING"
    assert basic.status_code == 401 and basic.json()["reason"] == "TOKEN_SCHEME_UNSUPPORTED"
    assert "Basic" in basic.json()["detail"]


async def test_wrap_up_source_fills_checklist_and_handoff_package(gateway: Gateway) -> None:
    class FixedWrapUp:
        async def wrap_up_view(self, thread_id: str, token: str) -> WrapUpView | None:
            return WrapUpView(
                checklist=[
                    {
                        "key": "last_test_run",
                        "label": "The last test conclusion",
                        "status": "missing",
                        "detail": "no test run found",
                    }
                ],
                handoff_package={"handoff_package_id": "hp-1", "package_status": "draft"},
            )

    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    app = build_app(
        gateway.peer.address,
        channel=gateway.app.state.gateway.context_budget.slot.get(),
        wrap_up_source=FixedWrapUp(),
        conversations_channel=gateway.app.state.conversations.slot.get(),
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway.test"
    ) as http:
        view = (await http.get(THREAD_PATH, headers=gateway.client_headers())).json()

    assert view["wrap_up_checklist"] == [
        {
            "key": "last_test_run",
            "label": "The last test conclusion",
            "status": "missing",
            "detail": "no test run found",
        }
    ]
    assert view["handoff_package"] == {"handoff_package_id": "hp-1", "package_status": "draft"}


async def test_context_budget_down_is_503(gateway_without_backend: Gateway) -> None:
    gateway = gateway_without_backend

    response = await gateway.http.get(THREAD_PATH, headers=gateway.client_headers())

    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"


# --- owner scoping of client tokens -----------------------------------------------------------------


async def test_client_reads_its_own_owners_thread_and_the_owner_check_gets_its_token(
    gateway: Gateway,
) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    headers = gateway.client_headers("owner-1")

    response = await gateway.http.get(THREAD_PATH, headers=headers)

    assert response.status_code == 200, response.text
    assert response.json()["context_budget_remaining_pct"] == 37.0
    token = headers["Authorization"].removeprefix("Bearer ")
    assert gateway.conversations.servicer.calls == [("thread-abc", token)]


async def test_another_owners_thread_is_404_like_an_unknown_one_and_never_read(gateway: Gateway) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    reads_before = len(gateway.peer.servicer.tokens)
    stranger = gateway.client_headers("owner-2")

    foreign = await gateway.http.get(THREAD_PATH, headers=stranger)
    unknown = await gateway.http.get("/api/v1/threads/thread-nobody/context-budget", headers=stranger)

    assert (foreign.status_code, unknown.status_code) == (404, 404)
    assert foreign.headers["content-type"] == "application/problem+json"
    assert foreign.json()["detail"] == "thread 'thread-abc' not found"
    assert foreign.json()["reason"] == unknown.json()["reason"] == "THREAD_NOT_FOUND"
    assert {k: v for k, v in foreign.json().items() if k not in ("detail", "instance")} == {
        k: v for k, v in unknown.json().items() if k not in ("detail", "instance")
    }
    assert "37" not in foreign.text
    assert len(gateway.peer.servicer.tokens) == reads_before


async def test_service_token_is_not_owner_checked(gateway: Gateway) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    service = {"Authorization": f"Bearer {gateway.authority.issue_service('scheduler')}"}

    response = await gateway.http.get(THREAD_PATH, headers=service)

    assert response.status_code == 200
    assert gateway.conversations.servicer.calls == []


async def test_conversations_down_is_503_not_a_bypass(gateway: Gateway) -> None:
    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    gateway.app.state.conversations.slot = ChannelSlot(target=closed_port_address())
    try:
        response = await gateway.http.get(THREAD_PATH, headers=gateway.client_headers())
    finally:
        await gateway.app.state.conversations.slot.close()

    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "7"
    assert "conversations" in response.json()["detail"]


def test_openapi_documents_one_checklist_item_shape_for_both_thread_reads() -> None:
    schemas = build_app(closed_port_address()).openapi()["components"]["schemas"]
    item_ref = {"$ref": "#/components/schemas/ChecklistItemView"}

    assert schemas["ThreadContextBudgetView"]["properties"]["wrap_up_checklist"]["items"] == item_ref
    assert schemas["ThreadPageView"]["properties"]["wrap_up_checklist"]["items"] == item_ref
    item = schemas["ChecklistItemView"]
    assert item["required"] == ["key", "label", "status", "detail"]
    assert item["properties"]["status"]["enum"] == ["done", "missing", "pending"]
