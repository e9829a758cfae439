"""OpenTelemetry set-up: traces through gRPC, HTTP and SQL, exported over OTLP when
OTEL_EXPORTER_OTLP_ENDPOINT is set, and the metrics provider (services/shared/metrics.py: served to
Prometheus at /metrics, and also exported over OTLP when the endpoint is set). The spans of one
worker report connect across the services through the trace context that messages and event
envelopes carry (boss_common/tracing.py, outbox.py, event_stream.py; docs/operations.md, "Traces").

Without an endpoint tracing is off (`tracing_enabled()` is False: tests turn it on with
`boss_common.tracing.enable_tracing` and an in-process exporter), and the instrumentations (a gRPC
interceptor around every call and every streamed message, a hook around every SQL statement, an
HTTP middleware) are not installed at all: they would build spans only to drop them, which cost
about a tenth of the services' CPU under load (measured with a sampling profiler at 1,000
snapshots/s)."""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from boss_common.tracing import enable_otlp_from_environment, tracing_enabled
from services.shared.metrics import configure_metrics, meter

log = logging.getLogger(__name__)
_configured = False


def configure_telemetry(service_name: str) -> None:
    """Installs the tracer provider once per process and, when traces are exported, the span
    exporter and the gRPC client and server instrumentation."""
    global _configured
    if _configured:
        return
    _configured = True
    provider = TracerProvider(resource=Resource.create({"service.name": f"boss-{service_name}"}))
    trace.set_tracer_provider(provider)
    configure_metrics(provider.resource)
    if not enable_otlp_from_environment(service_name):
        return
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer

    GrpcAioInstrumentorServer().instrument()
    GrpcAioInstrumentorClient().instrument()


def instrument_engine(engine: object) -> None:
    """Adds SQL spans for an async engine (when telemetry is configured and traces are exported)."""
    if not _configured or not tracing_enabled():
        return
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine)  # type: ignore[attr-defined]


__all__ = ["configure_telemetry", "instrument_engine", "meter", "tracing_enabled"]
