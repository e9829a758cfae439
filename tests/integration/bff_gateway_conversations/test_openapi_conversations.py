"""Schemathesis over the gateway's conversation and chat endpoints (in-process over ASGI): generated
valid and invalid requests never get a 5xx, every status is documented, every body matches its
schema.

The conversations service (SQLite, with a few registered threads and budgets) runs in a background
thread with its own event loop, because schemathesis drives the app from its own loop. The SSE
endpoint is left out (an endless stream); test_conversations_api.py covers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from boss.conversations.v1 import conversations_pb2 as pb
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from services.bff_gateway.clients import ChannelSlot
from services.bff_gateway.server import create_app
from services.bff_gateway.settings import GatewaySettings
from services.shared.auth import TokenAuthority
from tests.conftest import DatabaseTarget
from tests.integration.conversations.stack import SECRET, budget_payload, running_stack

# Schemathesis gives every API operation's item the same node id, and pytest-xdist's file scheduler
# keys items by node id (it would run one operation of the lot): these run in one process.
pytestmark = pytest.mark.one_process

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
AUTHORITY = TokenAuthority(SECRET)
PATHS = [
    "/api/v1/conversations",
    "/api/v1/projects",
    "/api/v1/projects/{project_id}",
    "/api/v1/projects/{project_id}/pin",
    "/api/v1/threads/{thread_id}/context-summary",
    "/api/v1/threads/{thread_id}/archive",
    "/api/v1/projects/{project_id}/messages",
    "/api/v1/tasks/{task_id}",
    "/api/v1/tasks/{task_id}/retry",
]


def gateway_settings() -> GatewaySettings:
    return GatewaySettings(listen="127.0.0.1:0", context_budget_address="127.0.0.1:9", auth_secret=SECRET)


schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(gateway_settings())).include(path=PATHS)


@contextlib.contextmanager
def conversations_in_background() -> Iterator[str]:
    """A seeded conversations service on its own loop and thread; yields its address."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ready: asyncio.Future[str] = asyncio.Future(loop=loop)
    stop = asyncio.Event()
    folder = Path(tempfile.mkdtemp())

    async def main() -> None:
        target = DatabaseTarget("sqlite", f"sqlite+aiosqlite:///{folder / 'conversations.sqlite3'}", "")
        async with running_stack(target, folder) as stack:
            for index, thread_id in enumerate(("th-1", "th-2")):
                await stack.stub.RegisterThread(
                    pb.RegisterThreadRequest(thread_id=thread_id, node_id="node-a", worker_id="worker-a"),
                    metadata=stack.worker(),
                )
                await stack.budget.publish(
                    "thread.context.updated",
                    budget_payload(thread_id, 30.0 + 40 * index, "urgent" if index == 0 else "safe"),
                )
            await stack.settle()
            ready.set_result(stack.address)
            await stop.wait()

    finished = asyncio.run_coroutine_threadsafe(main(), loop)
    try:
        yield asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(ready), 30), loop).result()
    finally:
        loop.call_soon_threadsafe(stop.set)
        finished.result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture(scope="module")
def gateway_app() -> Iterator[FastAPI]:
    with conversations_in_background() as address:
        app = create_app(gateway_settings())
        app.state.conversations.slot = ChannelSlot(target=address)
        app.state.test_conversations_address = address
        yield app


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_conversation_endpoints_conform(case: schemathesis.Case, gateway_app: FastAPI) -> None:
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {AUTHORITY.issue_client('local')}"}
    case.call_and_validate(checks=CHECKS, app=gateway_app)


def test_the_generated_cases_reach_the_seeded_service(gateway_app: FastAPI) -> None:
    """Guards the test above against passing on 503s: the app really answers from the service."""
    from fastapi.testclient import TestClient

    app = create_app(gateway_settings())  # its own channel: a grpc.aio channel belongs to one loop
    app.state.conversations.slot = ChannelSlot(target=gateway_app.state.test_conversations_address)
    with TestClient(app) as http:
        response = http.get(
            "/api/v1/conversations", headers={"Authorization": f"Bearer {AUTHORITY.issue_client('local')}"}
        )
    assert response.status_code == 200
    rows = response.json()["conversations"]
    threads = [r for r in rows if r["conversation_type"] != "master_agent"]  # the installation's master
    assert sorted(r["context_budget_indicator"]["percent"] for r in threads) == [30, 70]
