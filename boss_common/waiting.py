"""Waiting with a deadline without ever losing a cancellation.

On Python 3.11, `asyncio.wait_for` returns the awaited result when the waiting task is cancelled in
the same turn of the event loop in which the awaited thing finishes, and the cancellation is gone
(CPython issue 86296; 3.12 rebuilt `wait_for` on `asyncio.timeout`). A loop that waits that way
for a wake-up between polls then cannot be stopped: its task goes on polling after `cancel()`, and
whoever awaits it (a task group, a service's shutdown) waits forever. `asyncio.timeout` does not
lose it, so the project waits with it, directly or through `wait_until_set`; `asyncio.wait_for` is
banned by the linter (pyproject's ruff banned-api).
"""

from __future__ import annotations

import asyncio
import contextlib


async def wait_until_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Waits until `event` is set or `seconds` pass (None: no limit; 0 or less: no wait).

    Returns whether the event is set. A cancellation of the caller always propagates, even one that
    arrives as the event is set."""
    if seconds is not None and seconds <= 0:
        return event.is_set()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
