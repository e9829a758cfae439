"""Fixtures of the gateway integration tests: the FastAPI app served in-process (httpx over ASGI)
and talking over real gRPC to a context_budget peer on 127.0.0.1 (see context_budget_double) and to
a conversations peer that knows the seed's thread as owner-1's (see conversations_double)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.bff_gateway.clients import open_channel
from services.shared.auth import TokenAuthority
from tests.integration.bff_gateway.context_budget_double import SECRET, RunningDouble, start_double
from tests.integration.bff_gateway.conversations_double import RunningConversations, start_conversations
from tests.integration.bff_gateway.support import SEED_OWNER, Gateway, build_app, closed_port_address


@pytest.fixture
async def peer() -> AsyncIterator[RunningDouble]:
    """A context_budget peer on a free local port."""
    running = await start_double()
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def conversations() -> AsyncIterator[RunningConversations]:
    """A conversations peer on a free local port: thread-abc belongs to owner-1."""
    running = await start_conversations(TokenAuthority(SECRET), {"thread-abc": SEED_OWNER})
    try:
        yield running
    finally:
        await running.stop()


async def _gateway_for(
    address: str, peer: RunningDouble, conversations: RunningConversations, conversations_address: str = ""
) -> AsyncIterator[Gateway]:
    channel = open_channel(address)
    conversations_channel = open_channel(conversations_address or conversations.address)
    app = build_app(address, channel=channel, conversations_channel=conversations_channel)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        try:
            yield Gateway(
                app=app, http=http, peer=peer, authority=TokenAuthority(SECRET), conversations=conversations
            )
        finally:
            await channel.close()
            await conversations_channel.close()


@pytest.fixture
async def gateway(peer: RunningDouble, conversations: RunningConversations) -> AsyncIterator[Gateway]:
    """The gateway app wired to the running peers."""
    async for value in _gateway_for(peer.address, peer, conversations):
        yield value


@pytest.fixture
async def gateway_without_backend(
    peer: RunningDouble, conversations: RunningConversations
) -> AsyncIterator[Gateway]:
    """The gateway app pointed at an address where no context_budget listens."""
    async for value in _gateway_for(closed_port_address(), peer, conversations):
        yield value


@pytest.fixture
async def gateway_without_conversations(
    peer: RunningDouble, conversations: RunningConversations
) -> AsyncIterator[Gateway]:
    """The gateway app pointed at an address where no conversations service listens."""
    async for value in _gateway_for(peer.address, peer, conversations, closed_port_address()):
        yield value
