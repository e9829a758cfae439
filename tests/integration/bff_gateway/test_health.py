"""/healthz and /readyz: liveness needs nothing; readiness is the gRPC health checks of
context_budget and conversations (the peers are test doubles serving the standard health service)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.shared.telemetry import configure_telemetry
from tests.integration.bff_gateway.support import Gateway


async def test_healthz_needs_no_token_and_no_backend(gateway_without_backend: Gateway) -> None:
    response = await gateway_without_backend.http.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {}}


async def test_readyz_is_ready_when_both_backends_serve(gateway: Gateway) -> None:
    response = await gateway.http.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "checks": {"context_budget": "SERVING", "conversations": "SERVING"},
    }


async def test_readyz_is_503_when_context_budget_is_down(gateway_without_backend: Gateway) -> None:
    response = await gateway_without_backend.http.get("/readyz")

    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "7"
    assert response.json()["detail"] == "context_budget is not ready: UNAVAILABLE"


async def test_readyz_is_503_when_conversations_is_down(gateway_without_conversations: Gateway) -> None:
    response = await gateway_without_conversations.http.get("/readyz")

    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == "conversations is not ready: UNAVAILABLE"


async def test_unknown_route_is_404_problem(gateway: Gateway) -> None:
    response = await gateway.http.get("/api/v1/nothing-here")

    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["instance"] == "/api/v1/nothing-here"


async def test_openapi_declares_bearer_auth_and_problem_responses(gateway: Gateway) -> None:
    document = (await gateway.http.get("/openapi.json")).json()

    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    ingest = document["paths"]["/api/v1/workers/{worker_id}/thread-context"]["post"]
    assert ingest["security"] == [{"bearer": []}]
    for status in ("400", "401", "403", "404", "413", "422", "503"):
        content = ingest["responses"][status]["content"]
        assert list(content) == ["application/problem+json"], status
        assert content["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    percent = document["components"]["schemas"]["ThreadContextReport"]["properties"][
        "context_budget_remaining_pct"
    ]
    assert (percent["minimum"], percent["maximum"]) == (0, 100)


async def test_requests_build_no_spans_when_traces_are_not_exported(gateway: Gateway) -> None:
    configure_telemetry("gateway")  # as the gateway process does: a tracer provider, no exporter
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))

    assert (await gateway.http.get("/healthz")).status_code == 200
    assert (await gateway.http.post("/api/v1/workers/w/thread-context", json={})).status_code == 401

    assert spans.get_finished_spans() == ()
