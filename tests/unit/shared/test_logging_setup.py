"""Log lines (boss_common/logging_setup.py; the services' JSON lines, services/shared/logging_setup.py,
add the trace of the active span): the JSON format's fields, the format setting, and expected client
errors logged as one line while a server fault keeps its traceback."""

from __future__ import annotations

import io
import json
import logging

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from boss_common.logging_setup import ExpectedClientErrors, is_expected_client_error, log_format
from services.bff_gateway.problems import ProblemError
from services.shared.errors import NotFound
from services.shared.logging_setup import JsonLines


def logged(formatter: logging.Formatter, emit: object) -> list[str]:
    """The lines a logger writes through `formatter` and the client-error filter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ExpectedClientErrors())
    logger = logging.getLogger("boss.test.logging")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        emit(logger)  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_a_json_line_has_time_level_logger_and_message() -> None:
    [line] = logged(JsonLines(), lambda log: log.info("accepted %s", "thread-1"))
    entry = json.loads(line)

    assert set(entry) == {"time", "level", "logger", "message"}
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "INFO",
        "boss.test.logging",
        "accepted thread-1",
    )
    assert entry["time"].endswith("Z") and len(entry["time"]) == len("2026-12-01T09:00:00.000Z")


def test_a_json_line_carries_the_active_spans_trace_and_span_ids() -> None:
    tracer = TracerProvider().get_tracer("test")

    def emit(log: logging.Logger) -> None:
        with tracer.start_as_current_span("ingest") as span:
            context = span.get_span_context()
            emit.ids = (format(context.trace_id, "032x"), format(context.span_id, "016x"))  # type: ignore[attr-defined]
            log.info("in a span")

    [line] = logged(JsonLines(), emit)
    entry = json.loads(line)

    assert (entry["trace_id"], entry["span_id"]) == emit.ids  # type: ignore[attr-defined]
    assert len(entry["trace_id"]) == 32 and len(entry["span_id"]) == 16


def test_a_server_fault_keeps_its_traceback_inside_its_one_json_line() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise RuntimeError("database disappeared")
        except RuntimeError:
            log.exception("ingest batch failed")

    [line] = logged(JsonLines(), emit)
    entry = json.loads(line)

    assert entry["message"] == "ingest batch failed"
    assert entry["exception"].startswith("Traceback (most recent call last)")
    assert "RuntimeError: database disappeared" in entry["exception"]


@pytest.mark.parametrize(
    "error",
    [
        NotFound("thread t-1 not found", reason="THREAD_NOT_FOUND"),
        ProblemError(404, "not-found", "no such project"),
        ProblemError(422, "invalid-request", "percent: must be at most 100"),
    ],
)
def test_an_expected_client_error_is_one_line_without_a_traceback(error: Exception) -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise error
        except Exception:
            log.exception("request refused")

    lines = logged(logging.Formatter("%(levelname)s %(message)s"), emit)

    assert lines == [f"ERROR request refused ({type(error).__name__}: {error})"]


def test_which_errors_are_the_callers() -> None:
    assert is_expected_client_error(NotFound("gone", reason="THREAD_NOT_FOUND"))
    assert is_expected_client_error(ProblemError(401, "unauthenticated", "missing token"))
    assert not is_expected_client_error(ProblemError(503, "unavailable", "context_budget is down"))
    assert not is_expected_client_error(RuntimeError("bug"))
    internal = type("Internal", (Exception,), {"code": grpc.StatusCode.INTERNAL})
    assert not is_expected_client_error(internal())


def test_the_format_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOSS_LOG_FORMAT", raising=False)
    assert log_format() == "text"
    monkeypatch.setenv("BOSS_LOG_FORMAT", "JSON")
    assert log_format() == "json"
    monkeypatch.setenv("BOSS_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="BOSS_LOG_FORMAT must be one of text, json"):
        log_format()
