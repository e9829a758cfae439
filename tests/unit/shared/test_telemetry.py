"""Tracing instrumentation is installed only when traces are exported."""

from __future__ import annotations

import pytest

from services.shared.telemetry import tracing_enabled


def test_tracing_follows_the_otlp_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert tracing_enabled() is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    assert tracing_enabled() is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert tracing_enabled() is True
