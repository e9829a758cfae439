"""Keeps bearer tokens out of the access log.

Browsers cannot set headers on EventSource, so the SSE endpoint and the console accept a token in
the query string (`access_token=`, `token=`); uvicorn's access log would otherwise write it in full.
"""

from __future__ import annotations

import logging
import re

_TOKEN_IN_QUERY = re.compile(r"((?:^|[?&])(?:access_token|token)=)[^&\s]*", re.IGNORECASE)


def redact_tokens(text: str) -> str:
    """`text` with the value of every `access_token=` / `token=` query parameter replaced by `***`."""
    return _TOKEN_IN_QUERY.sub(r"\1***", text)


class RedactTokensFilter(logging.Filter):
    """A logging filter for `uvicorn.access` that redacts tokens in the logged request path."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_tokens(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact_tokens(record.msg)
        return True


def install() -> None:
    """Adds the filter to uvicorn's access logger (idempotent)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(existing, RedactTokensFilter) for existing in access.filters):
        access.addFilter(RedactTokensFilter())
