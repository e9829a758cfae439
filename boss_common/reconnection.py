"""Reconnecting a followed gRPC stream: when to try again, and whether the attempt that ended was
healthy (so that a server's routine connection recycling is logged as information, not as a fault).
Used by the services' event consumers, the gateway's event hub and the scheduler's wake-ups, and by
the worker's command listener and local agent."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

# A stream attempt that delivered a response, or stayed open this long, was healthy.
HEALTHY_STREAM_SECONDS = 10.0


class Reconnection:
    """When to reconnect a followed stream. While attempts fail, the delay grows from 0.2 s,
    doubling to at most 10 s; after an attempt that was healthy (it delivered a response, or stayed
    open `HEALTHY_STREAM_SECONDS`: an idle stream that the server's connection recycling ended) it is
    0.2 s again. Delays are jittered by +-50 % so that many followers do not reconnect together.

    Use: `attempt_started()` before connecting, `delivered()` for each response, and once the
    attempt ended `ended()` (logs the end and returns the delay) or `next_delay()` (the delay
    alone; it also sets `was_healthy`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_delay: float = 10.0) -> None:
        """`max_delay`: the longest delay before jitter, seconds (default 10)."""
        self._clock = clock
        self._max_delay = max_delay
        self._failures = 0
        self._started = clock()
        self._delivered = False
        self.was_healthy = False

    def attempt_started(self) -> None:
        """A new attempt begins now."""
        self._started = self._clock()
        self._delivered = False

    def delivered(self) -> None:
        """The current attempt received a response."""
        self._delivered = True

    def next_delay(self) -> float:
        """Seconds to wait before the next attempt, the current one having ended."""
        self.was_healthy = self._delivered or self._clock() - self._started >= HEALTHY_STREAM_SECONDS
        self._failures = 0 if self.was_healthy else self._failures + 1
        base = min(0.2 * 2 ** max(0, self._failures - 1), self._max_delay)
        return base * (0.5 + random.random())

    def ended(self, log: logging.Logger, stream: str, reason: object) -> float:
        """`next_delay()`, with the end logged on `log`: at INFO after a healthy attempt (routine
        connection recycling; reconnecting at once), at WARNING otherwise (`stream` unavailable,
        `reason`, and the delay before the retry)."""
        delay = self.next_delay()
        if self.was_healthy:
            log.info("%s ended (%s); reconnecting", stream, reason)
        else:
            log.warning("%s unavailable (%s); retrying in %.1f s", stream, reason, delay)
        return delay
