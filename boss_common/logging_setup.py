"""One logging set-up for every Boss process, services and worker: text or JSON lines on stderr,
and no tracebacks for errors that are the caller's, not the server's.

| variable | default | meaning |
|---|---|---|
| BOSS_LOG_LEVEL | INFO | Python logging level |
| BOSS_LOG_FORMAT | text | `text`: "time level logger: message"; `json`: one JSON object per line |

A JSON line has `time` (RFC 3339, UTC, milliseconds, `Z`), `level`, `logger` and `message`, the
process's own context fields (the services add the active OpenTelemetry span's `trace_id` and
`span_id`: services/shared/logging_setup.py; the worker has no tracing), and `exception` (the
formatted traceback, as one JSON string) when one is logged. A log collector (Loki, Cloud Logging,
Elasticsearch) reads the fields without a parsing rule.

Expected client errors (`ExpectedClientErrors`) are logged as one line naming the error instead of
a traceback: a refused request is not a server fault, and a traceback per bad request buries the
real ones.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

import grpc

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# gRPC codes that answer a caller's mistake or a normal race, never a server fault.
CLIENT_STATUS_CODES = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def is_expected_client_error(error: BaseException) -> bool:
    """Whether `error` is the caller's, not the server's: a Boss error or a failed gRPC call whose
    code is in CLIENT_STATUS_CODES, an aborted gRPC call, or an HTTP error (a gateway problem, a
    Starlette HTTPException) with a 4xx `status_code`."""
    if isinstance(error, grpc.aio.AbortError):
        return True
    if isinstance(error, grpc.aio.AioRpcError):
        return error.code() in CLIENT_STATUS_CODES
    code = getattr(error, "code", None)
    if isinstance(code, grpc.StatusCode):
        return code in CLIENT_STATUS_CODES
    status = getattr(error, "status_code", None)
    return isinstance(status, int) and 400 <= status < 500


class ExpectedClientErrors(logging.Filter):
    """Turns a record that carries an expected client error (`is_expected_client_error`) into one
    line: the traceback is dropped and "(ErrorType: message)" added to the message. Every other
    record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        error = record.exc_info[1]
        if error is not None and is_expected_client_error(error):
            record.msg = f"{record.getMessage()} ({type(error).__name__}: {error})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class JsonLines(logging.Formatter):
    """Formats a record as one JSON object on one line (module docstring)."""

    def context_fields(self) -> dict[str, str]:
        """Fields added after `message` to every line, from the context the record was logged in
        (none here; a subclass adds e.g. the active trace)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(self.context_fields())
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def log_format() -> str:
    """BOSS_LOG_FORMAT, lower-cased (default "text"). Raises ValueError for another value."""
    value = (os.environ.get("BOSS_LOG_FORMAT") or "text").strip().lower()
    if value not in LOG_FORMATS:
        raise ValueError(f"BOSS_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value


def configure_logging(default_level: str = "INFO", json_lines: type[JsonLines] = JsonLines) -> None:
    """Logs to stderr at BOSS_LOG_LEVEL (default `default_level`) in BOSS_LOG_FORMAT (`json_lines`
    formats the JSON lines), through the `ExpectedClientErrors` filter. Like `logging.basicConfig`,
    does nothing when the root logger already has handlers. Raises ValueError for an unknown
    BOSS_LOG_FORMAT."""
    formatter = json_lines() if log_format() == "json" else logging.Formatter(TEXT_FORMAT)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(ExpectedClientErrors())
    logging.basicConfig(level=os.environ.get("BOSS_LOG_LEVEL", default_level).upper(), handlers=[handler])
