"""POST /api/v1/workers/{worker_id}/thread-context through the real app and real gRPC.

The peer is the context_budget test double (context_budget_double.py): a real grpc.aio server whose
answers the test controls, used to check the gateway's JSON <-> proto and error mapping.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from boss.context_budget.v1 import context_budget_pb2 as pb

from services.shared.auth import TokenAuthority
from services.shared.errors import FailedPrecondition, PermissionDenied, Unauthenticated
from services.shared.time import from_timestamp
from tests.integration.bff_gateway.support import SEED_BODY, SEED_PATH, Gateway

PROBLEM = "application/problem+json"


def field_names(response_json: dict) -> list[str]:
    """The `field` of every entry in a problem's `errors`."""
    return [error["field"] for error in response_json["errors"]]


async def test_seed_example_is_accepted_and_answered_in_the_seed_shape(gateway: Gateway) -> None:
    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "accepted": True,
        "thread_id": "thread-abc",
        "context_budget_level": "urgent",
        "next_required_report_in_seconds": 5,
        "master_actions": ["prepare_handoff", "avoid_large_context_append"],
        "duplicate": False,
        "superseded": False,
    }
    [sent] = gateway.peer.servicer.received
    assert from_timestamp(sent.captured_at) == datetime(2026, 3, 25, 7, 56, 0, tzinfo=UTC)
    assert from_timestamp(sent.compaction_expected_at) == datetime(2026, 3, 25, 8, 8, 30, tzinfo=UTC)
    assert from_timestamp(sent.last_compaction_at) == datetime(2026, 3, 25, 7, 12, 10, tzinfo=UTC)
    assert sent.source_kind == pb.SOURCE_KIND_WORKER_ESTIMATOR
    assert sent.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT
    assert sent.context_budget_remaining_pct == 37.0
    assert (sent.node_id, sent.worker_id, sent.thread_id, sent.project_id, sent.task_id) == (
        "mac-01",
        "worker-mac-01",
        "thread-abc",
        "proj-001",
        "task-017",
    )
    assert sent.must_finish_before_compaction is True
    assert (sent.estimated_remaining_turns, sent.estimated_remaining_large_messages) == (5, 2)
    assert sent.compaction_count == 1


async def test_caller_token_is_forwarded_to_context_budget(gateway: Gateway) -> None:
    headers = gateway.worker_headers()

    await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=headers)

    assert gateway.peer.servicer.tokens == [headers["Authorization"].removeprefix("Bearer ")]


async def test_resent_snapshot_is_answered_as_duplicate(gateway: Gateway) -> None:
    first = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())
    second = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert (first.json()["duplicate"], second.json()["duplicate"]) == (False, True)


async def test_path_and_body_worker_mismatch_is_400_naming_worker_id(gateway: Gateway) -> None:
    response = await gateway.http.post(  # the path is the token's worker; the body names another
        SEED_PATH, json={**SEED_BODY, "worker_id": "worker-other"}, headers=gateway.worker_headers()
    )

    assert response.status_code == 400
    assert response.json()["reason"] == "WORKER_ID_MISMATCH"
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert field_names(body) == ["worker_id"]
    assert body["instance"] == SEED_PATH
    assert gateway.peer.servicer.received == []


async def test_token_of_another_worker_than_the_paths_is_403_before_the_body_is_read(
    gateway: Gateway,
) -> None:
    for body in (SEED_BODY, {"not": "a report"}):
        response = await gateway.http.post(
            "/api/v1/workers/worker-other/thread-context", json=body, headers=gateway.worker_headers()
        )

        assert response.status_code == 403
        assert response.headers["content-type"] == PROBLEM
        assert response.json()["reason"] == "WORKER_MISMATCH"
        assert field_names(response.json()) == ["worker_id"]
    assert gateway.peer.servicer.received == []


async def test_token_of_another_worker_is_403(gateway: Gateway) -> None:
    response = await gateway.http.post(
        SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers("worker-win-02", "mac-01")
    )

    assert response.status_code == 403
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["reason"] == "WORKER_MISMATCH"
    assert field_names(response.json()) == ["worker_id"]
    assert gateway.peer.servicer.received == []


async def test_token_of_the_worker_on_another_node_is_403(gateway: Gateway) -> None:
    response = await gateway.http.post(
        SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers("worker-mac-01", "win-02")
    )

    assert response.status_code == 403
    assert response.json()["reason"] == "NODE_MISMATCH"
    assert field_names(response.json()) == ["node_id"]


async def test_client_token_cannot_report(gateway: Gateway) -> None:
    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.client_headers())

    assert response.status_code == 403
    assert response.json()["reason"] == "SCOPE_MISSING"


async def test_missing_token_is_401_with_bearer_challenge(gateway: Gateway) -> None:
    response = await gateway.http.post(SEED_PATH, json=SEED_BODY)

    assert response.status_code == 401
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["status"] == 401


async def test_token_signed_with_another_secret_is_401(gateway: Gateway) -> None:
    forged = TokenAuthority("another-secret-0123456789abcdef-0123456789").issue_worker(
        "worker-mac-01", "mac-01"
    )

    response = await gateway.http.post(
        SEED_PATH, json=SEED_BODY, headers={"Authorization": f"Bearer {forged}"}
    )

    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert response.json()["reason"] == "TOKEN_INVALID"


async def _post_with(gateway: Gateway, **changes: object) -> dict:
    """POSTs the seed body with `changes`, expects 422 problem+json and returns the problem."""
    body = {**SEED_BODY, **changes}
    response = await gateway.http.post(SEED_PATH, json=body, headers=gateway.worker_headers())
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == PROBLEM
    return response.json()


async def test_percent_out_of_range_string_or_boolean_is_422_naming_the_field(gateway: Gateway) -> None:
    for bad in (101, -0.5, "abc", "37", True, None):
        problem = await _post_with(gateway, context_budget_remaining_pct=bad)
        assert field_names(problem) == ["context_budget_remaining_pct"], bad
    assert gateway.peer.servicer.received == []


async def test_unknown_level_or_source_kind_is_422(gateway: Gateway) -> None:
    problem = await _post_with(gateway, context_budget_level="panic")
    assert field_names(problem) == ["context_budget_level"]

    problem = await _post_with(gateway, source_kind="codex_cli")
    assert field_names(problem) == ["source_kind"]


async def test_timestamp_without_offset_or_as_number_is_422(gateway: Gateway) -> None:
    problem = await _post_with(gateway, captured_at="2026-03-25T15:56:00")
    assert field_names(problem) == ["captured_at"]

    problem = await _post_with(gateway, captured_at=1774425360)
    assert field_names(problem) == ["captured_at"]


async def test_every_bad_field_is_named_at_once(gateway: Gateway) -> None:
    problem = await _post_with(gateway, compaction_count=-1, estimated_remaining_turns=True, colour="red")

    assert sorted(field_names(problem)) == ["colour", "compaction_count", "estimated_remaining_turns"]


async def test_missing_required_field_is_422(gateway: Gateway) -> None:
    body = {key: value for key, value in SEED_BODY.items() if key != "thread_id"}

    response = await gateway.http.post(SEED_PATH, json=body, headers=gateway.worker_headers())

    assert response.status_code == 422
    assert response.json()["errors"] == [{"field": "thread_id", "detail": "required"}]


async def test_malformed_json_is_400(gateway: Gateway) -> None:
    response = await gateway.http.post(
        SEED_PATH,
        content=b'{"node_id": "mac-01",',
        headers={**gateway.worker_headers(), "Content-Type": "application/json"},
    )

    assert response.status_code == 400
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["type"].endswith("/malformed-json")
    assert response.json()["reason"] == "MALFORMED_JSON"


async def test_body_over_64_kib_is_413(gateway: Gateway) -> None:
    body = {**SEED_BODY, "must_finish_reason": "x" * (70 * 1024)}

    response = await gateway.http.post(SEED_PATH, json=body, headers=gateway.worker_headers())

    assert response.status_code == 413
    assert response.headers["content-type"] == PROBLEM
    assert gateway.peer.servicer.received == []


async def test_chunked_body_over_64_kib_is_413(gateway: Gateway) -> None:
    payload = json.dumps({**SEED_BODY, "codex_folder": "y" * (70 * 1024)}).encode()

    async def chunks():  # no Content-Length: the limit is enforced while reading
        for start in range(0, len(payload), 8192):
            yield payload[start : start + 8192]

    response = await gateway.http.post(
        SEED_PATH, content=chunks(), headers={**gateway.worker_headers(), "Content-Type": "application/json"}
    )

    assert response.status_code == 413
    assert response.headers["content-type"] == PROBLEM


async def test_field_violation_from_context_budget_is_422_with_json_field_name(gateway: Gateway) -> None:
    problem = await _post_with(gateway, captured_at="2099-01-01T00:00:00+00:00")

    assert field_names(problem) == ["captured_at"]
    assert "5 minutes" in problem["errors"][0]["detail"]
    assert problem["reason"] == "INVALID_ARGUMENT"


async def test_permission_denied_from_context_budget_is_403(gateway: Gateway) -> None:
    gateway.peer.servicer.fail_with = PermissionDenied("node retired", reason="NODE_RETIRED")

    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert response.status_code == 403
    assert response.json()["reason"] == "NODE_RETIRED"
    assert response.json()["detail"] == "node retired"


async def test_unauthenticated_from_context_budget_is_401(gateway: Gateway) -> None:
    gateway.peer.servicer.fail_with = Unauthenticated("token revoked", reason="TOKEN_REVOKED")

    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_failed_precondition_from_context_budget_is_409(gateway: Gateway) -> None:
    gateway.peer.servicer.fail_with = FailedPrecondition("thread archived")

    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert response.status_code == 409
    assert response.json()["detail"] == "thread archived"


async def test_context_budget_down_is_503_with_retry_after(gateway_without_backend: Gateway) -> None:
    gateway = gateway_without_backend

    response = await gateway.http.post(SEED_PATH, json=SEED_BODY, headers=gateway.worker_headers())

    assert response.status_code == 503
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["retry-after"] == "7"
    assert "context_budget" in response.json()["detail"]
