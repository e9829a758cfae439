"""Shared values and helpers of the gateway integration tests: the seed's example body, test
settings and the Gateway handle (app, HTTP client, peers, token authority)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import httpx
from fastapi import FastAPI

from services.bff_gateway.clients import ChannelSlot, NoWrapUpSource, WrapUpSource
from services.bff_gateway.server import create_app
from services.bff_gateway.settings import GatewaySettings
from services.shared.auth import TokenAuthority
from tests.integration.bff_gateway.context_budget_double import SECRET, RunningDouble
from tests.integration.bff_gateway.conversations_double import RunningConversations
from tests.unit.bff_gateway.seed_example import SEED

SEED_BODY = SEED
SEED_PATH = "/api/v1/workers/worker-mac-01/thread-context"
SEED_OWNER = "owner-1"
"""The owner the conversations double gives the seed's thread (thread-abc)."""


def settings_for(context_budget_address: str) -> GatewaySettings:
    """Gateway settings for tests: the test secret, short deadlines."""
    return GatewaySettings(
        listen="127.0.0.1:0",
        context_budget_address=context_budget_address,
        auth_secret=SECRET,
        rpc_timeout_seconds=2.0,
        readiness_timeout_seconds=0.5,
        retry_after_seconds=7,
    )


def build_app(
    context_budget_address: str,
    *,
    channel: grpc.aio.Channel | None = None,
    wrap_up_source: WrapUpSource | None = None,
    conversations_channel: grpc.aio.Channel | None = None,
    conversations_address: str = "",
) -> FastAPI:
    """A gateway app for context_budget at `context_budget_address`, kept apart from any scheduler
    or conversations service running on this machine: CB-14's checklist comes from
    `wrap_up_source` (default: none), the owner check of client tokens goes to
    `conversations_channel`, or to a channel the app opens to `conversations_address` (default: an
    address where nothing listens, so client reads and /readyz are 503)."""
    app = create_app(
        settings_for(context_budget_address),
        context_budget_channel=channel,
        wrap_up_source=wrap_up_source or NoWrapUpSource(),
        conversations_channel=conversations_channel,
    )
    if conversations_channel is None:
        app.state.conversations.slot = ChannelSlot(target=conversations_address or closed_port_address())
    return app


@dataclass
class Gateway:
    """An app under test, its HTTP client and the peer behind it."""

    app: FastAPI
    http: httpx.AsyncClient
    peer: RunningDouble
    authority: TokenAuthority
    conversations: RunningConversations

    def worker_headers(self, worker_id: str = "worker-mac-01", node_id: str = "mac-01") -> dict[str, str]:
        """Authorization header of a worker token bound to worker_id on node_id."""
        return {"Authorization": f"Bearer {self.authority.issue_worker(worker_id, node_id)}"}

    def client_headers(self, owner_id: str = SEED_OWNER) -> dict[str, str]:
        """Authorization header of a client (app) token."""
        return {"Authorization": f"Bearer {self.authority.issue_client(owner_id)}"}


def closed_port_address() -> str:
    """127.0.0.1:<port> where nothing listens (a port just released by the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


T = TypeVar("T")


class BackgroundLoop:
    """An event loop running in its own thread, for async servers used by synchronous tests (the
    schemathesis test, whose app runs in schemathesis's own loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="test-background-loop", daemon=True
        )

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Runs `coroutine` in the background loop and waits for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout)

    @classmethod
    @contextmanager
    def started(cls) -> Iterator[BackgroundLoop]:
        """A running background loop, stopped and closed at exit."""
        background = cls()
        background._thread.start()
        try:
            yield background
        finally:
            background.loop.call_soon_threadsafe(background.loop.stop)
            background._thread.join(timeout=10)
            background.loop.close()
