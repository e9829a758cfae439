"""OpenTelemetry set-up: traces through gRPC and SQL, and metrics (ingest rate and batch sizes,
SSE clients), exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (otherwise they are
recorded but not exported). Trace context also travels inside event envelopes (outbox.py)."""

from __future__ import annotations

import logging
import os

from opentelemetry import metrics, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)
_configured = False


def configure_telemetry(service_name: str) -> None:
    """Installs the tracer provider and the gRPC instrumentation once per process."""
    global _configured
    if _configured:
        return
    _configured = True
    provider = TracerProvider(resource=Resource.create({"service.name": f"boss-{service_name}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("exporting traces to %s", os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    trace.set_tracer_provider(provider)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
        metrics.set_meter_provider(MeterProvider(resource=provider.resource, metric_readers=[reader]))
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer

    GrpcAioInstrumentorServer().instrument()
    GrpcAioInstrumentorClient().instrument()


def instrument_engine(engine: object) -> None:
    """Adds SQL spans for an async engine (when telemetry is configured)."""
    if not _configured:
        return
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine)  # type: ignore[attr-defined]


meter = metrics.get_meter("boss")
