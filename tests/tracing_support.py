"""Tracing on for one test, with every finished span kept in memory (boss_common/tracing.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from boss_common.tracing import disable_tracing, enable_tracing


@contextlib.contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Turns tracing on and yields the exporter that receives every span ended meanwhile; turns it
    off again after (the exporter is shut down: later spans of other tests are not kept)."""
    exporter = InMemorySpanExporter()
    enable_tracing(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        disable_tracing()
        exporter.shutdown()


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The finished spans called `name`, in the order they ended."""
    return [span for span in exporter.get_finished_spans() if span.name == name]


def ids_of(trace_context: Mapping[str, str]) -> tuple[int, int]:
    """(trace id, span id) a carried W3C trace context names."""
    _version, trace_id, span_id, _flags = trace_context["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


def ids(span: ReadableSpan) -> tuple[int, int]:
    """(trace id, span id) of a finished span."""
    return span.context.trace_id, span.context.span_id
