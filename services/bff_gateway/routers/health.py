"""Unauthenticated probes: `/healthz` (the process is up) and `/readyz` (its backends answer)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from services.bff_gateway.problems import ProblemError, error_responses
from services.bff_gateway.schemas import HealthStatus
from services.bff_gateway.state import GatewayDep

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthStatus, summary="Liveness")
async def healthz() -> HealthStatus:
    """Always `{"status": "ok"}` while the process serves HTTP; checks no backend."""
    return HealthStatus(status="ok")


@router.get("/readyz", response_model=HealthStatus, summary="Readiness", responses=error_responses(503))
async def readyz(gateway: GatewayDep, request: Request) -> HealthStatus:
    """`{"status": "ready", "checks": {"context_budget": "SERVING", "conversations": "SERVING"}}`
    when the gRPC health checks of both backends the gateway serves from answer SERVING (checked
    at once, each within `readiness_timeout_seconds`); otherwise 503 problem+json naming every
    backend that is not ready and its status, so a load balancer stops sending traffic. The
    scheduler is not checked: the home list, project detail and events work without it."""
    timeout = gateway.settings.readiness_timeout_seconds
    backends = {"context_budget": gateway.context_budget, "conversations": request.app.state.conversations}
    statuses = await asyncio.gather(*(backend.health(timeout) for backend in backends.values()))
    checks = dict(zip(backends, statuses, strict=True))
    not_ready = [f"{name} is not ready: {status}" for name, status in checks.items() if status != "SERVING"]
    if not_ready:
        raise ProblemError(
            503,
            "service-unavailable",
            "; ".join(not_ready),
            title="Service unavailable",
            headers={"Retry-After": str(gateway.settings.retry_after_seconds)},
        )
    return HealthStatus(status="ready", checks=checks)
