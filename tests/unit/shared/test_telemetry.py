"""Tracing is off unless turned on (OTLP endpoint or a given span processor), and the trace context
messages carry continues and links spans (boss_common/tracing.py)."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from boss_common.tracing import (
    context_of,
    enable_otlp_from_environment,
    link_to,
    parent_of,
    tracing_enabled,
)
from tests.tracing_support import recorded_spans


def test_tracing_stays_off_without_an_otlp_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert enable_otlp_from_environment("test") is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    assert enable_otlp_from_environment("test") is False
    assert tracing_enabled() is False


def test_a_span_processor_turns_tracing_on_until_it_is_turned_off() -> None:
    with recorded_spans() as spans:
        assert tracing_enabled() is True
        with trace.get_tracer("test").start_as_current_span("work"):
            pass
    assert tracing_enabled() is False
    assert [span.name for span in spans.get_finished_spans()] == ["work"]


def test_a_carried_context_continues_the_trace_and_links_to_the_span() -> None:
    tracer = trace.get_tracer("test")
    with recorded_spans() as spans:
        with tracer.start_as_current_span("sender") as sender:
            carried = dict(context_of(sender))
        with tracer.start_as_current_span("receiver", context=parent_of(carried)):
            pass
        link = link_to(carried)
    sent, received = spans.get_finished_spans()

    assert set(carried) == {"traceparent"}
    assert received.parent is not None and received.parent.span_id == sent.context.span_id
    assert received.context.trace_id == sent.context.trace_id
    assert link is not None and link.context.span_id == sent.context.span_id
    assert link_to({}) is None
