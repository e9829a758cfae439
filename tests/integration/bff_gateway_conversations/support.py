"""A gateway served by uvicorn on 127.0.0.1 (SSE needs a real socket: httpx's ASGI transport waits
for the whole body) in front of a running conversations stack, plus an SSE reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from services.bff_gateway.clients import ChannelSlot
from services.bff_gateway.server import create_app
from services.bff_gateway.settings import GatewaySettings
from tests.integration.conversations.stack import SECRET, Stack


@dataclass
class RunningGateway:
    """A served gateway app and an HTTP client for it."""

    base_url: str
    http: httpx.AsyncClient
    stack: Stack
    app: Any = None

    def headers(self, owner_id: str = "local") -> dict[str, str]:
        """Authorization of a client token for `owner_id`."""
        return {"Authorization": f"Bearer {self.stack.authority.issue_client(owner_id)}"}

    def token(self, owner_id: str = "local") -> str:
        """A client token for `owner_id`."""
        return self.stack.authority.issue_client(owner_id)


@contextlib.asynccontextmanager
async def serve_gateway(stack: Stack, heartbeat_seconds: float = 15.0) -> AsyncIterator[RunningGateway]:
    """Serves create_app(...) wired to `stack` on a free port until the block ends."""
    async with serve_gateway_app(stack.address, SECRET, heartbeat_seconds) as (base_url, http, app):
        yield RunningGateway(base_url, http, stack, app)


@contextlib.asynccontextmanager
async def serve_gateway_app(
    conversations_address: str, secret: str, heartbeat_seconds: float = 15.0
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Any]]:
    """Serves create_app(...) wired to the conversations service at `conversations_address`
    (tokens signed with `secret`) on a free port until the block ends; yields its base URL, an HTTP
    client for it and the app."""
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        context_budget_address="127.0.0.1:9",
        auth_secret=secret,
        rpc_timeout_seconds=5.0,
    )
    app = create_app(settings)
    app.state.conversations.slot = ChannelSlot(target=conversations_address)
    app.state.sse_heartbeat_seconds = heartbeat_seconds
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            yield base_url, http, app
    finally:
        await app.state.event_hub.stop()
        server.should_exit = True
        server.force_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)
        await app.state.conversations.slot.close()


@dataclass(frozen=True)
class SseEvent:
    """One received SSE event."""

    id: str
    event: str
    data: dict[str, Any]


class SseReader:
    """Parses an open text/event-stream response into events; comments are counted as pings."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.pings = 0

    async def next_event(self, timeout: float = 5.0) -> SseEvent:
        """The next event (skipping comments and `retry:`); raises TimeoutError."""
        return await asyncio.wait_for(self._next(), timeout)

    async def _next(self) -> SseEvent:
        fields: dict[str, str] = {}
        async for line in self._lines:
            if line == "":
                if "data" in fields:
                    return SseEvent(
                        fields.get("id", ""), fields.get("event", "message"), json.loads(fields["data"])
                    )
                fields = {}
                continue
            if line.startswith(":"):
                self.pings += 1
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        raise ConnectionError("stream ended")

    async def events_until(self, predicate: Any, timeout: float = 5.0) -> list[SseEvent]:
        """Events up to and including the first one matching `predicate`."""
        seen: list[SseEvent] = []
        while True:
            event = await self.next_event(timeout)
            seen.append(event)
            if predicate(event):
                return seen
