"""Bad input and outages at the gateway, against a real conversations service (SQLite, PostgreSQL):
a control character in a path id is 422 naming it (not a backend's 502); a Last-Event-ID in other
scripts' digits is 400 (not 500); an SSE resume while conversations is down is a clean 503 with
Retry-After before any stream starts; once conversations is back, the gateway reaches it again
within about a second, the SSE hub included."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
import uvicorn
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc

from services.bff_gateway.clients import ChannelSlot
from services.bff_gateway.server import create_app
from services.bff_gateway.settings import GatewaySettings
from services.conversations import server as conversations_server
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.db import Database
from tests.conftest import DatabaseTarget
from tests.integration.trust_stack import free_port

SECRET = "gateway-bad-input-secret-0123456789abcdef"
AUTHORITY = TokenAuthority(SECRET)
CLIENT = {"Authorization": f"Bearer {AUTHORITY.issue_client('local')}"}
PROBLEM = "application/problem+json"


@dataclass
class Setup:
    """A conversations service that can be stopped and started again on its port, and a gateway."""

    app: conversations_server.ConversationsApp
    address: str
    http: httpx.AsyncClient
    server: grpc.aio.Server | None = None

    async def start_backend(self) -> None:
        self.server, _health, _port = await self.app.host(self.address).start()

    async def stop_backend(self) -> None:
        assert self.server is not None
        await self.server.stop(0)
        self.server = None


@pytest.fixture
async def setup(database_target: DatabaseTarget) -> AsyncIterator[Setup]:
    await conversations_server.migrate(database_target.url, database_target.schema or "conversations")
    database = Database.connect(database_target.url, database_target.schema or "conversations")
    app = conversations_server.build_app(database, TokenAuthority(SECRET))
    await app.event_log.ensure_sequencer_row()
    notifier = asyncio.create_task(app.event_log.run_notifier())
    address = f"127.0.0.1:{free_port()}"
    gateway = create_app(
        GatewaySettings(
            listen="127.0.0.1:0",
            context_budget_address="127.0.0.1:9",
            auth_secret=SECRET,
            retry_after_seconds=3,
        )
    )
    gateway.state.conversations.slot = ChannelSlot(target=address)
    server = uvicorn.Server(uvicorn.Config(gateway, host="127.0.0.1", port=0, log_config=None, lifespan="on"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        running = Setup(app, address, http)
        await running.start_backend()
        try:
            yield running
        finally:
            await gateway.state.event_hub.stop()
            server.should_exit = server.force_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(serving, 5)
            await gateway.state.conversations.slot.close()
            if running.server is not None:
                await running.stop_backend()
            notifier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await notifier
            await database.dispose()


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", "/api/v1/threads/a%00b/context-summary", "thread_id"),
        ("GET", "/api/v1/threads/a%00b/context-budget", "thread_id"),
        ("GET", "/api/v1/projects/a%00b", "project_id"),
        ("GET", "/api/v1/handoff-packages/a%00b", "handoff_package_id"),
        ("POST", "/api/v1/threads/a%01b/archive", "thread_id"),
        ("POST", "/api/v1/devices/a%00b/revoke", "device_id"),
        ("PUT", "/api/v1/projects/a%7Fb/pin", "project_id"),
        ("GET", "/api/v1/projects/a%E2%80%AEb", "project_id"),  # U+202E, right-to-left override
    ],
)
async def test_a_control_character_in_a_path_id_is_422_naming_it(
    setup: Setup, method: str, path: str, field: str
) -> None:
    response = await setup.http.request(method, path, headers=CLIENT)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    assert [error["field"] for error in response.json()["errors"]] == [field]


@pytest.mark.parametrize("title", ["North\x00line", "North \x1b[31mline", "North \u202eenil"])
async def test_a_control_or_bidi_character_in_a_project_title_is_422_naming_it(
    setup: Setup, title: str
) -> None:
    async with grpc.aio.insecure_channel(setup.address) as channel:
        registered = await conversations_pb2_grpc.ConversationsServiceStub(channel).RegisterThread(
            pb.RegisterThreadRequest(thread_id="th-title", node_id="n", worker_id="w", title="North"),
            metadata=bearer_metadata(AUTHORITY.issue_worker("w", "n")),
        )
    path = f"/api/v1/projects/{registered.project_id}"
    response = await setup.http.patch(path, json={"project_title": title}, headers=CLIENT)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    assert [error["field"] for error in response.json()["errors"]] == ["project_title"]
    unchanged = await setup.http.get(path, headers=CLIENT)
    assert unchanged.json()["project_title"] == "North"


@pytest.mark.parametrize("value", ["\u0661\u0662\u0663", "\u00b2", "\uff11\uff12", "-1", "12a"])
async def test_a_last_event_id_not_in_ascii_digits_is_400(setup: Setup, value: str) -> None:
    # A header carries bytes, read as Latin-1 (b"\xb2" is "\u00b2"); a query is UTF-8.
    try:
        header = value.encode("latin-1")
    except UnicodeEncodeError:
        header = value.encode()
    response = await setup.http.get(
        "/api/v1/events",
        headers=[(b"authorization", CLIENT["Authorization"].encode()), (b"last-event-id", header)],
    )
    query = await setup.http.get("/api/v1/events", params={"last_event_id": value}, headers=CLIENT)
    for answer in (response, query):
        assert answer.status_code == 400, answer.text
        assert answer.json()["reason"] == "BAD_LAST_EVENT_ID"


async def test_an_sse_resume_during_an_outage_is_503_and_the_gateway_is_back_within_a_second(
    setup: Setup,
) -> None:
    http = setup.http
    async with http.stream("GET", "/api/v1/events", headers=CLIENT) as opened:
        assert opened.status_code == 200  # the event hub follows conversations from here on
    await setup.stop_backend()

    resumed = await http.get("/api/v1/events", headers={**CLIENT, "Last-Event-ID": "0"})
    assert resumed.status_code == 503
    assert resumed.headers["content-type"].startswith(PROBLEM)
    assert resumed.headers["retry-after"] == "3"
    assert (await http.get("/api/v1/conversations", headers=CLIENT)).status_code == 503

    await setup.start_backend()
    back = asyncio.get_running_loop().time()
    while (await http.get("/api/v1/conversations", headers=CLIENT)).status_code != 200:
        assert asyncio.get_running_loop().time() - back < 2.0, "the gateway did not reach conversations again"
        await asyncio.sleep(0.05)

    # The SSE hub is following again: an event committed now reaches a resuming client.
    async with http.stream("GET", "/api/v1/events", headers={**CLIENT, "Last-Event-ID": "0"}) as stream:
        assert stream.status_code == 200
        async with grpc.aio.insecure_channel(setup.address) as channel:
            await conversations_pb2_grpc.ConversationsServiceStub(channel).RegisterThread(
                pb.RegisterThreadRequest(thread_id="th-after-outage", node_id="n", worker_id="w"),
                metadata=bearer_metadata(AUTHORITY.issue_worker("w", "n")),
            )

        async def registered() -> None:
            async for line in stream.aiter_lines():
                if line == "event: thread.registered":
                    return

        await asyncio.wait_for(registered(), 5)
