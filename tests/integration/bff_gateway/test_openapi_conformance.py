"""Property-based test of the published OpenAPI document (schemathesis, in-process over ASGI).

Every operation of the ingest slice and of the chat routes is exercised with generated requests
(valid and invalid); each answer must not be a 5xx, must use a documented status code, and must
match the documented schema for that status (the problem schema for errors). Requests carry a valid
token for their operation, with the path's worker_id aligned to the body's, so generated snapshots
get past 401/400 and through real gRPC into the real context_budget service (in-process, on
SQLite), which validates and stores them; chat requests carry a client token and reach the
conversations double over real gRPC, which stores sends and answers every chat RPC (its rules are
in conversations_double.py). The peers run in a background thread's loop because schemathesis runs
the app in its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from services.context_budget.server import build_service
from services.shared.auth import TokenAuthority
from services.shared.config import ServiceSettings
from tests.integration.bff_gateway.context_budget_double import SECRET
from tests.integration.bff_gateway.conversations_double import start_conversations
from tests.integration.bff_gateway.support import BackgroundLoop, build_app

# Schemathesis gives every API operation's item the same node id, and pytest-xdist's file scheduler
# keys items by node id (it would run one operation of the lot): these run in one process.
pytestmark = pytest.mark.one_process

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
AUTHORITY = TokenAuthority(SECRET)

# Only the operations of the ingest slice and the chat routes; routes other features add to the
# same app are checked by those features' own tests. The document is read from an app whose
# backend address does not matter (its channel is opened lazily and never used); each call goes to
# `gateway_app`. (A schema from a fixture, schemathesis.pytest.from_fixture, fails on pytest 9 with
# schemathesis 4.32.)
INGEST_SLICE_PATHS = [
    "/healthz",
    "/readyz",
    "/api/v1/workers/{worker_id}/thread-context",
    "/api/v1/threads/{thread_id}/context-budget",
]
CHAT_PATHS = [
    "/api/v1/projects/{project_id}/messages",
    "/api/v1/tasks/{task_id}",
    "/api/v1/tasks/{task_id}/retry",
]
schema = schemathesis.openapi.from_asgi("/openapi.json", build_app("127.0.0.1:9")).include(
    path=INGEST_SLICE_PATHS + CHAT_PATHS
)


@pytest.fixture(scope="module")
def gateway_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """A gateway app (it opens its own channels in schemathesis's loop) over a running
    context_budget service on a fresh SQLite file and a conversations double (for /readyz)."""
    database = tmp_path_factory.mktemp("context_budget") / "context_budget.sqlite3"
    service = build_service(
        ServiceSettings(
            service="context_budget",
            database_url=f"sqlite+aiosqlite:///{Path(database)}",
            listen="127.0.0.1:0",
            migrate_on_start=True,
            auth_secret=SECRET,
        )
    )
    with BackgroundLoop.started() as background:
        background.run(service.start())
        conversations = background.run(start_conversations(AUTHORITY, {}))
        try:
            yield build_app(service.address, conversations_address=conversations.address)
        finally:
            background.run(conversations.stop())
            background.run(service.stop(grace=0))


def authorize(case: schemathesis.Case) -> None:
    """Gives the case a token its operation accepts (worker token for ingest, a client token for
    chat, a service token for reads, which context_budget answers without the owner check a client
    token gets from the conversations service: that check is tested in test_threads.py); the
    probes need none."""
    path = case.operation.path
    if path in CHAT_PATHS:
        case.headers["Authorization"] = f"Bearer {AUTHORITY.issue_client('owner-1')}"
    elif path.startswith("/api/v1/workers/"):
        body = case.body if isinstance(case.body, dict) else {}
        if isinstance(body.get("worker_id"), str):
            case.path_parameters = {**(case.path_parameters or {}), "worker_id": body["worker_id"]}
        raw_node_id = body.get("node_id")
        node_id = raw_node_id if isinstance(raw_node_id, str) else "node"
        worker_id = str((case.path_parameters or {}).get("worker_id", "worker"))
        case.headers["Authorization"] = f"Bearer {AUTHORITY.issue_worker(worker_id, node_id)}"
    elif path.startswith("/api/v1/"):
        case.headers["Authorization"] = f"Bearer {AUTHORITY.issue_service('openapi-test')}"


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_api_conforms_to_its_openapi_document(case: schemathesis.Case, gateway_app: FastAPI) -> None:
    authorize(case)
    case.call_and_validate(checks=CHECKS, app=gateway_app)


def test_generated_chat_cases_reach_the_conversations_double(gateway_app: FastAPI) -> None:
    """Guards the test above against passing on 503s: a send through a gateway app like the one
    under test is stored by the double (201), and its task reads back (200)."""
    from fastapi.testclient import TestClient

    # Its own channel: a grpc.aio channel belongs to one loop.
    app = build_app("127.0.0.1:9", conversations_address=gateway_app.state.conversations.slot.target)
    headers = {"Authorization": f"Bearer {AUTHORITY.issue_client('owner-2')}"}
    with TestClient(app) as http:
        sent = http.post(
            "/api/v1/projects/proj-guard/messages",
            json={"text": "hello", "client_message_id": "guard-1"},
            headers=headers,
        )
        polled = http.get(f"/api/v1/tasks/{sent.json()['task']['taskId']}", headers=headers)

    assert sent.status_code == 201, sent.text
    assert polled.status_code == 200 and polled.json()["task"]["status"] == "queued"
