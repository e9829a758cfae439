"""Whether this process records trace spans, and the W3C trace context that messages carry.

Tracing is off until something turns it on: `enable_otlp_from_environment` when
OTEL_EXPORTER_OTLP_ENDPOINT is set (the services through services/shared/telemetry.py, the worker at
start), or `enable_tracing` with any span processor (tests use an in-memory exporter). Off, a call
site pays one `tracing_enabled()` test and nothing else: no span is built, and OpenTelemetry is not
even imported on that path, so the worker package needs it only on a node that traces (its
`tracing` extra, packaging/worker/pyproject.toml).

Spans of one report connect across processes through the context that messages carry, not through
the gRPC calls (docs/operations.md, "Traces"): `context_of(span)` is a span's W3C context
(`traceparent`, `tracestate`) as a plain mapping for a message field, `parent_of(carrier)` the
OpenTelemetry context to start a child span in, `link_to(carrier)` a link to it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import Link, Span

log = logging.getLogger(__name__)

OTLP_ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"

_enabled = False


def tracing_enabled() -> bool:
    """Whether this process records spans (cheap: hot paths test it before building anything)."""
    return _enabled


def enable_tracing(processor: SpanProcessor, service_name: str = "boss") -> None:
    """Records spans from now on and hands them to `processor` (e.g. a BatchSpanProcessor of an
    OTLP exporter, or a SimpleSpanProcessor of an InMemorySpanExporter). Adds it to the process's
    SDK tracer provider, installing one named `service_name` when there is none yet."""
    global _enabled
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        trace.set_tracer_provider(provider)
    provider.add_span_processor(processor)
    _enabled = True


def disable_tracing() -> None:
    """Stops recording spans (processors already added stay with the provider; tests shut their
    exporter down)."""
    global _enabled
    _enabled = False


def enable_otlp_from_environment(service_name: str) -> bool:
    """Turns tracing on with spans exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (the
    exporter reads the standard OTEL_EXPORTER_OTLP_* variables). Returns whether it did; logs a
    warning when the endpoint is set but the OpenTelemetry SDK or exporter is not installed."""
    endpoint = os.environ.get(OTLP_ENDPOINT_VARIABLE)
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as missing:
        log.warning(
            "%s is set but the OpenTelemetry SDK is not installed (%s): no traces; install "
            "opentelemetry-sdk and opentelemetry-exporter-otlp (the worker's `tracing` extra)",
            OTLP_ENDPOINT_VARIABLE,
            missing.name,
        )
        return False
    enable_tracing(BatchSpanProcessor(OTLPSpanExporter()), service_name=f"boss-{service_name}")
    log.info("exporting traces to %s", endpoint)
    return True


def context_of(span: Span, carrier: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """The W3C trace context of `span`, written into `carrier` (a new dict when None): what a
    message carries so that the next process continues or links to the span."""
    from opentelemetry import propagate, trace

    carrier = {} if carrier is None else carrier
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def parent_of(carrier: Mapping[str, str]) -> Context:
    """The OpenTelemetry context a message's trace context names, to start child spans in."""
    from opentelemetry import propagate

    return propagate.extract(carrier)


def link_to(carrier: Mapping[str, str]) -> Link | None:
    """A span link to the span a message's trace context names (None when it names none)."""
    from opentelemetry import trace

    span_context = trace.get_current_span(parent_of(carrier)).get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None
