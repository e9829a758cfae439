"""The gateway process's Prometheus metrics (services/shared/metrics.py), with its open SSE streams
(`boss.gateway.sse_clients`).

Where: with BOSS_GATEWAY_METRICS_LISTEN set (as the Kubernetes manifests do), on that separate
listener only, so a public ingress in front of the API never exposes them; the SSE gauge is then
sampled every BOSS_METRICS_SAMPLE_SECONDS by `serve`. Unset (local runs), at `GET /metrics` on the
API's own port, sampled at each scrape. No token either way: Prometheus scrapes it like /healthz,
and it carries counts only (no owner, thread or message).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

from services.bff_gateway.routers.events import EventHub
from services.shared.metrics import (
    METRICS_PATH,
    GaugeSampler,
    Probe,
    Reading,
    configure_metrics,
    metrics_exposition,
)


def sse_clients_probe(hub: EventHub) -> Probe:
    """`boss.gateway.sse_clients`: the hub's connected subscribers."""

    async def probe() -> list[Reading]:
        return [Reading("boss.gateway.sse_clients", float(hub.subscriber_count))]

    return probe


def install(app: FastAPI, *, on_api_port: bool) -> None:
    """Creates the gateway's sampler (`app.state.metrics_sampler`) and, when `on_api_port`, adds
    `GET /metrics` (not in the OpenAPI document). Needs `app.state.event_hub`
    (routers/conversations.install)."""
    configure_metrics()
    sampler = GaugeSampler("gateway", [sse_clients_probe(app.state.event_hub)])
    app.state.metrics_sampler = sampler
    if not on_api_port:
        return

    @app.get(METRICS_PATH, include_in_schema=False)
    async def metrics() -> Response:
        await sampler.sample()
        body, content_type = metrics_exposition()
        return Response(body, media_type=content_type)
