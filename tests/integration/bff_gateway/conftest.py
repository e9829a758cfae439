"""Fixtures of the gateway integration tests: the FastAPI app served in-process (httpx over ASGI)
and talking over real gRPC to a context_budget peer on 127.0.0.1 (see context_budget_double)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.bff_gateway.clients import open_channel
from services.shared.auth import TokenAuthority
from tests.integration.bff_gateway.context_budget_double import SECRET, RunningDouble, start_double
from tests.integration.bff_gateway.support import Gateway, build_app, closed_port_address


@pytest.fixture
async def peer() -> AsyncIterator[RunningDouble]:
    """A context_budget peer on a free local port."""
    running = await start_double()
    try:
        yield running
    finally:
        await running.stop()


async def _gateway_for(address: str, peer: RunningDouble) -> AsyncIterator[Gateway]:
    channel = open_channel(address)
    app = build_app(address, channel=channel)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        try:
            yield Gateway(app=app, http=http, peer=peer, authority=TokenAuthority(SECRET))
        finally:
            await channel.close()


@pytest.fixture
async def gateway(peer: RunningDouble) -> AsyncIterator[Gateway]:
    """The gateway app wired to the running peer."""
    async for value in _gateway_for(peer.address, peer):
        yield value


@pytest.fixture
async def gateway_without_backend(peer: RunningDouble) -> AsyncIterator[Gateway]:
    """The gateway app pointed at an address where no context_budget listens."""
    async for value in _gateway_for(closed_port_address(), peer):
        yield value
