"""The services' logging: boss_common/logging_setup.py (text or JSON lines on stderr, expected
client errors as one line; BOSS_LOG_LEVEL, BOSS_LOG_FORMAT) with the trace of the active
OpenTelemetry span in every JSON line: `trace_id` (32 hex digits) and `span_id` (16), so that a
trace id found in the logs finds the trace in the tracing backend.
"""

from __future__ import annotations

from opentelemetry import trace

from boss_common import logging_setup


class JsonLines(logging_setup.JsonLines):
    """One JSON object a line, with the active span's `trace_id` and `span_id` after `message`."""

    def context_fields(self) -> dict[str, str]:
        span = trace.get_current_span().get_span_context()
        if not span.is_valid:
            return {}
        return {"trace_id": format(span.trace_id, "032x"), "span_id": format(span.span_id, "016x")}


def configure_logging(default_level: str = "INFO") -> None:
    """`boss_common.logging_setup.configure_logging` with the services' JSON lines (`JsonLines`)."""
    logging_setup.configure_logging(default_level, JsonLines)
