"""Tracing on for one test, with every finished span kept in memory (boss_common/tracing.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
