"""Tokens passed in the query string never reach the access log."""

from __future__ import annotations

import logging

from services.bff_gateway.access_log import RedactTokensFilter, redact_tokens


def test_query_tokens_are_redacted_and_other_parameters_kept() -> None:
    assert redact_tokens("/api/v1/events?access_token=eyJ.abc.def&last_event_id=7") == (
        "/api/v1/events?access_token=***&last_event_id=7"
    )
    assert redact_tokens("/console/?token=eyJ.abc") == "/console/?token=***"
    assert redact_tokens("/api/v1/conversations?page_size=5") == "/api/v1/conversations?page_size=5"


def test_filter_rewrites_uvicorn_access_record_arguments() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/api/v1/events?access_token=secret-value", "1.1", 200),
        None,
    )
    assert RedactTokensFilter().filter(record)
    assert "secret-value" not in record.getMessage()
    assert "access_token=***" in record.getMessage()
