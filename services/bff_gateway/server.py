"""Composition root of the gateway: `create_app` wires settings, auth, backend clients, routers,
problem+json errors and the OpenAPI document; `serve` runs it under uvicorn.

Later issues add their clients to GatewayState (conversations; the scheduler is in routers/handoff.py)
and their routers (conversations, SSE, web console) here.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import grpc
import uvicorn
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from services.bff_gateway import access_log, api_docs, metrics
from services.bff_gateway.clients import (
    ChannelSlot,
    ContextBudgetClient,
    WrapUpSource,
    open_channel,
)
from services.bff_gateway.path_ids import refuse_malformed_path_ids
from services.bff_gateway.problems import BodySizeLimit, install_problem_handlers, use_problem_media_type
from services.bff_gateway.request_body import add_body_schemas
from services.bff_gateway.routers import chat, conversations, handoff, health, threads, workers
from services.bff_gateway.routers.events import EventHub
from services.bff_gateway.settings import GatewaySettings, split_host_port
from services.bff_gateway.state import GatewayState
from services.shared import config
from services.shared.auth import TokenAuthority
from services.shared.metrics import MetricsEndpoint
from services.shared.runtime import tune_garbage_collection

log = logging.getLogger(__name__)

API_TITLE = "Boss gateway"
API_VERSION = "1.0.0"
API_DESCRIPTION = (
    "REST face of the Boss control plane. Errors are application/problem+json (RFC 9457) with the "
    "offending fields in `errors`. Instants are RFC 3339; answers are in UTC with `Z`."
)


def create_app(
    settings: GatewaySettings,
    *,
    context_budget_channel: grpc.aio.Channel | None = None,
    wrap_up_source: WrapUpSource | None = None,
    scheduler_channel: grpc.aio.Channel | None = None,
    conversations_channel: grpc.aio.Channel | None = None,
) -> FastAPI:
    """The gateway's FastAPI app.

    Args:
        settings: listen address, backend addresses, auth secret, limits.
        context_budget_channel: a grpc.aio channel to context_budget, owned by the caller. When None,
            the app opens one to `settings.context_budget_address` inside its event loop (at
            startup, or at first use when no lifespan runs) and closes it at shutdown.
        wrap_up_source: where CB-14's wrap-up checklist and handoff package come from (by default
            the scheduler, see routers/handoff.py).
        scheduler_channel: a grpc.aio channel to the scheduler, owned by the caller; when None one is
            opened to BOSS_SCHEDULER_ADDRESS on first use. Serves the handoff routes and, unless
            `wrap_up_source` is given, CB-14's checklist and package status.
        conversations_channel: a grpc.aio channel to conversations, owned by the caller; when None
            one is opened to BOSS_CONVERSATIONS_ADDRESS on first use. Serves the conversation routes,
            the SSE stream and the owner check of client tokens on thread reads (ownership.py).
    """
    slot = ChannelSlot(target=settings.context_budget_address, channel=context_budget_channel)
    scheduler_slot = ChannelSlot(target=config.service_address("scheduler"), channel=scheduler_channel)
    scheduler = handoff.SchedulerClient(slot=scheduler_slot, timeout_seconds=settings.rpc_timeout_seconds)
    state = GatewayState(
        settings=settings,
        authority=TokenAuthority(settings.auth_secret),
        context_budget=ContextBudgetClient(slot=slot, timeout_seconds=settings.rpc_timeout_seconds),
        wrap_up=wrap_up_source or handoff.SchedulerWrapUpSource(scheduler),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        slot.get()
        try:
            yield
        finally:
            _app.state.metrics_sampler.close()
            await slot.close()
            await scheduler_slot.close()

    app = FastAPI(
        title=API_TITLE,
        version=API_VERSION,
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # api_docs serves /docs from local assets, not a CDN
        redoc_url=None,
        # FastAPI's own OpenTelemetry hooks are off: they switch themselves on whenever a tracer or
        # meter provider is installed (every service installs one) and then build request,
        # dependency and serialization spans on every request, exported or not. HTTP spans come
        # from `_instrument` (OpenTelemetry's FastAPI instrumentation) when traces are exported.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        # A control character in a path id is 422 before any backend sees it (path_ids.py).
        dependencies=[Depends(refuse_malformed_path_ids)],
    )
    app.state.gateway = state
    install_problem_handlers(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        larger=[(chat.MESSAGES_PATH, chat.MESSAGE_BODY_MAX_BYTES)],
    )
    app.include_router(health.router)
    api_docs.install(app)
    app.include_router(workers.router)
    app.include_router(threads.router)
    handoff.install(app, scheduler)
    conversations.install(app, conversations_channel)
    metrics.install(app, on_api_port=settings.metrics_listen is None)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            app.openapi_schema = use_problem_media_type(add_body_schemas(document))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# REST calls finish well within this; SSE streams never end by themselves and are cut at the deadline
# (clients reconnect with Last-Event-ID), so a longer grace would only delay every shutdown.
GRACE_SECONDS = 3


async def serve(settings: GatewaySettings, stop: asyncio.Event | None = None) -> None:
    """Serves the gateway on `settings.listen` until SIGTERM/SIGINT (or `stop` is set).

    The context_budget channel is opened here, in the serving loop, and closed after uvicorn's
    graceful shutdown (in-flight requests get up to GRACE_SECONDS). With
    `settings.metrics_listen`, Prometheus metrics are served there (metrics.py).
    """
    host, port = split_host_port(settings.listen)
    channel = open_channel(settings.context_budget_address)
    app = create_app(settings, context_budget_channel=channel)
    _instrument(app)
    access_log.install()
    server = _Server(
        uvicorn.Config(app, host=host, port=port, log_config=None, timeout_graceful_shutdown=GRACE_SECONDS)
    )
    tune_garbage_collection()
    watcher = asyncio.create_task(_stop_when(stop, server)) if stop is not None else None
    closer = asyncio.create_task(_end_streams_on_exit(server, app.state.event_hub))
    endpoint = MetricsEndpoint(settings.metrics_listen) if settings.metrics_listen else None
    sampling = None
    if endpoint is not None:
        endpoint.start()
        sampling = asyncio.create_task(app.state.metrics_sampler.run())
    try:
        log.info(
            "gateway serving on %s (context_budget at %s)", settings.listen, settings.context_budget_address
        )
        await server.serve()
    finally:
        closer.cancel()
        if watcher is not None:
            watcher.cancel()
        if sampling is not None:
            sampling.cancel()
        if endpoint is not None:
            await endpoint.stop()
        await channel.close()


class _Server(uvicorn.Server):
    """uvicorn's server, ending with exit status 0 after its graceful shutdown on SIGTERM or SIGINT,
    as the gRPC services do. uvicorn's own signal capture raises the signal again once it has shut
    down, so the process would end "killed by SIGTERM" (status 143), which supervisors and our
    lifecycle test read as a crash."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT start the graceful shutdown (a second SIGINT forces it), and nothing
        is raised again afterwards. Called by `serve()` inside the running event loop."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread alone: whoever runs this thread stops it
            return
        loop = asyncio.get_running_loop()
        handled = (signal.SIGINT, signal.SIGTERM)
        for number in handled:
            loop.add_signal_handler(number, self.handle_exit, number, None)
        try:
            yield
        finally:
            for number in handled:
                loop.remove_signal_handler(number)


async def _end_streams_on_exit(server: uvicorn.Server, hub: EventHub) -> None:
    """Once uvicorn begins to shut down (a signal, or `stop`), ends the open SSE streams, so that
    its graceful shutdown does not wait out its timeout on them. Uvicorn has no hook for that
    moment; its flag is polled every 0.1 s."""
    while not server.should_exit:
        await asyncio.sleep(0.1)
    hub.close_subscribers()


async def _stop_when(stop: asyncio.Event, server: uvicorn.Server) -> None:
    """Asks uvicorn to exit once `stop` is set."""
    await stop.wait()
    server.should_exit = True


def _instrument(app: FastAPI) -> None:
    """Adds OpenTelemetry HTTP spans when traces are exported (gRPC client spans come from
    configure_telemetry)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    from services.shared.telemetry import tracing_enabled

    if not tracing_enabled():
        return
    FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz")
