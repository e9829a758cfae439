"""Failure switches written into a user message: ``[[demo:NAME]]`` or ``[[demo:NAME=VALUE]]``.

Pure parsing, no I/O. The markers and what the demo model does for each are listed in the package
docstring (:mod:`demo_model`). Names are case-sensitive; an unknown name, or a value that does not
parse (``[[demo:slow=soon]]``), is ignored, so an ordinary message that happens to contain brackets
is answered normally.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum

MARKER_PATTERN = re.compile(r"\[\[demo:([a-z_0-9]+)(?:=(.*?))?\]\]", re.DOTALL)
"""``[[demo:name]]`` or ``[[demo:name=value]]``; the value is everything up to the first ``]]``."""

MAX_SLOW_SECONDS = 3600.0
"""``[[demo:slow=N]]`` waits at most this long (seconds)."""


class Failure(StrEnum):
    """How the demo model fails a request instead of answering it."""

    HTTP401 = "http401"
    HTTP500 = "http500"
    HTTP400 = "http400"
    HTTP429 = "http429"
    RESPONSE_FAILED = "response_failed"
    STALL = "stall"
    NO_REPLY = "no_reply"


_FAILURE_NAMES = frozenset(failure.value for failure in Failure)


@dataclass(frozen=True)
class Directives:
    """What the markers in one user message ask for.

    Attributes:
        failure: the failure to produce, or None to answer normally. With several failure markers
            the first one in the text wins.
        slow_seconds: seconds to wait before answering (0 when not asked; at most
            :data:`MAX_SLOW_SECONDS`).
        shell_command: the command of one ``exec_command`` tool call to make before replying, or
            None.
    """

    failure: Failure | None = None
    slow_seconds: float = 0.0
    shell_command: str | None = None


def parse_directives(text: str) -> Directives:
    """Reads the ``[[demo:...]]`` markers of one user message.

    Args:
        text: the message as the user wrote it.

    Returns:
        The directives; ``Directives()`` (answer normally) when the text has no known marker.
    """
    failure: Failure | None = None
    slow_seconds = 0.0
    shell_command: str | None = None
    for match in MARKER_PATTERN.finditer(text):
        name, value = match.group(1), match.group(2)
        if value is None and name in _FAILURE_NAMES:
            failure = failure or Failure(name)
        elif name == "slow" and value is not None:
            slow_seconds = _parse_seconds(value, default=slow_seconds)
        elif name == "shell" and value is not None and value.strip():
            shell_command = shell_command or value.strip()
    return Directives(failure=failure, slow_seconds=slow_seconds, shell_command=shell_command)


def _parse_seconds(value: str, *, default: float) -> float:
    try:
        seconds = float(value.strip())
    except ValueError:
        return default
    if not math.isfinite(seconds) or seconds < 0:
        return default
    return min(seconds, MAX_SLOW_SECONDS)
