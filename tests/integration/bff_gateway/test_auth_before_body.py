"""Authentication and the token's scope come before the request body on every gateway route with a
body: a caller without a token is 401, a token without the route's scope is 403 SCOPE_MISSING,
whatever the body (malformed JSON, wrong fields, empty), and nothing reaches a backend. The bodies
stay documented in OpenAPI exactly as FastAPI documents a body parameter of the same model.

The app is served in-process (httpx over ASGI); every backend address is one where nothing listens,
so a request that got past the checks would be 503, not 401 / 403.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from services.bff_gateway.chat.schemas import SendMessageBody
from services.bff_gateway.clients import ChannelSlot
from services.bff_gateway.routers.conversations import CreateGroupBody, RenameBody
from services.bff_gateway.routers.handoff import ConsumeRequest
from services.bff_gateway.schemas import ThreadContextReport
from services.shared.auth import SCOPE_CONTEXT_READ, SCOPE_SCHEDULER_READ, TokenAuthority
from tests.integration.bff_gateway.context_budget_double import SECRET
from tests.integration.bff_gateway.support import SEED_BODY, build_app, closed_port_address

AUTHORITY = TokenAuthority(SECRET)
READ_ONLY_CLIENT = AUTHORITY.issue(
    kind="client", subject="client:reader", scopes=[SCOPE_CONTEXT_READ, SCOPE_SCHEDULER_READ], owner_id="o"
)
"""A client token that may read but neither write conversations nor consume handoff packages."""


@dataclass(frozen=True)
class BodyRoute:
    """A gateway route with a request body, a token without its scope, and its body model."""

    method: str
    path: str
    template: str
    token: str
    model: type[BaseModel]
    body_required: bool = True

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


WORKER = AUTHORITY.issue_worker("worker-mac-01", "mac-01")
ROUTES_WITH_A_BODY = [
    BodyRoute(
        "POST",
        "/api/v1/workers/worker-mac-01/thread-context",
        "/api/v1/workers/{worker_id}/thread-context",
        AUTHORITY.issue_client("owner-1"),
        ThreadContextReport,
    ),
    BodyRoute("POST", "/api/v1/projects", "/api/v1/projects", WORKER, CreateGroupBody),
    BodyRoute("PATCH", "/api/v1/projects/proj-1", "/api/v1/projects/{project_id}", WORKER, RenameBody),
    BodyRoute(
        "POST",
        "/api/v1/projects/proj-1/messages",
        "/api/v1/projects/{project_id}/messages",
        WORKER,
        SendMessageBody,
    ),
    BodyRoute(
        "POST",
        "/api/v1/handoff-packages/hp-1/consume",
        "/api/v1/handoff-packages/{handoff_package_id}/consume",
        READ_ONLY_CLIENT,
        ConsumeRequest,
        body_required=False,
    ),
]
BODIES = {
    "malformed JSON": b'{"node_id": "mac-01",',
    "unknown and missing fields": b'{"colour": "red", "compaction_count": -1}',
    "wrong JSON type": b"[1, 2, 3]",
    "empty": b"",
}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for a gateway app whose backends are all unreachable."""
    app = build_app(closed_port_address())
    app.state.scheduler_client.slot = ChannelSlot(target=closed_port_address())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gateway.test"
    ) as client:
        yield client


async def send(http: httpx.AsyncClient, route: BodyRoute, body: bytes, token: str | None) -> httpx.Response:
    """`body` to `route` as JSON, with `token` as the bearer token when given."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return await http.request(route.method, route.path, content=body, headers=headers)


@pytest.mark.parametrize("route", ROUTES_WITH_A_BODY, ids=str)
@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
async def test_a_token_without_the_scope_is_403_whatever_the_body(
    http: httpx.AsyncClient, route: BodyRoute, body: bytes
) -> None:
    response = await send(http, route, body, route.token)

    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["reason"] == "SCOPE_MISSING"


@pytest.mark.parametrize("route", ROUTES_WITH_A_BODY, ids=str)
@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
async def test_no_token_is_401_whatever_the_body(
    http: httpx.AsyncClient, route: BodyRoute, body: bytes
) -> None:
    response = await send(http, route, body, None)

    assert response.status_code == 401, response.text
    assert response.json()["reason"] == "TOKEN_MISSING"
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_the_scope_is_checked_before_the_worker_binding_and_the_body_after_it(
    http: httpx.AsyncClient,
) -> None:
    """A worker token (it has the scope) still gets the body checked as before: 400 for malformed
    JSON, 422 naming the field, and 403 only for the binding, which needs the body."""
    path = "/api/v1/workers/worker-mac-01/thread-context"
    worker = {"Authorization": f"Bearer {AUTHORITY.issue_worker('worker-mac-01', 'mac-01')}"}

    malformed = await http.post(
        path, content=BODIES["malformed JSON"], headers={**worker, "Content-Type": "application/json"}
    )
    invalid = await http.post(path, json={**SEED_BODY, "compaction_count": -1}, headers=worker)
    other_node = await http.post(path, json={**SEED_BODY, "node_id": "win-02"}, headers=worker)

    assert (malformed.status_code, malformed.json()["reason"]) == (400, "MALFORMED_JSON")
    assert (invalid.status_code, [e["field"] for e in invalid.json()["errors"]]) == (
        422,
        ["compaction_count"],
    )
    assert (other_node.status_code, other_node.json()["reason"]) == (403, "NODE_MISMATCH")


def declared_body_document(model: type[BaseModel], required: bool) -> dict[str, Any]:
    """The OpenAPI document FastAPI writes for one route taking `model` as a body parameter
    (`body: model`, or `body: model | None = None` when not required)."""

    async def endpoint(**_values: Any) -> None:
        return None

    body = (
        inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=model)
        if required
        else inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY, annotation=model | None, default=None)
    )
    endpoint.__signature__ = inspect.Signature([body])  # type: ignore[attr-defined]
    reference = FastAPI()
    reference.post("/reference")(endpoint)
    return get_openapi(title="reference", version="1", routes=reference.routes)


@pytest.mark.parametrize("route", ROUTES_WITH_A_BODY, ids=str)
def test_the_request_body_is_documented_as_fastapi_documents_a_body_parameter(route: BodyRoute) -> None:
    document = build_app(closed_port_address()).openapi()
    expected = declared_body_document(route.model, required=route.body_required)

    operation = document["paths"][route.template][route.method.lower()]
    assert operation["requestBody"] == expected["paths"]["/reference"]["post"]["requestBody"]
    for name, schema in expected["components"]["schemas"].items():
        if name not in ("HTTPValidationError", "ValidationError"):
            assert document["components"]["schemas"][name] == schema, name
