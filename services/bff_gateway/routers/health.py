"""Unauthenticated probes: `/healthz` (the process is up) and `/readyz` (its backends answer)."""

from __future__ import annotations

from fastapi import APIRouter

from services.bff_gateway.problems import ProblemError, error_responses
from services.bff_gateway.schemas import HealthStatus
from services.bff_gateway.state import GatewayDep

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthStatus, summary="Liveness")
async def healthz() -> HealthStatus:
    """Always `{"status": "ok"}` while the process serves HTTP; checks no backend."""
    return HealthStatus(status="ok")


@router.get("/readyz", response_model=HealthStatus, summary="Readiness", responses=error_responses(503))
async def readyz(gateway: GatewayDep) -> HealthStatus:
    """`{"status": "ready"}` when context_budget's gRPC health check answers SERVING; otherwise 503
    problem+json naming the backend and its status (so a load balancer stops sending traffic)."""
    settings = gateway.settings
    status = await gateway.context_budget.health(settings.readiness_timeout_seconds)
    if status != "SERVING":
        raise ProblemError(
            503,
            "service-unavailable",
            f"context_budget is not ready: {status}",
            title="Service unavailable",
            headers={"Retry-After": str(settings.retry_after_seconds)},
        )
    return HealthStatus(status="ready", checks={"context_budget": status})
