"""Waking waiting claims when a node may have work: in process, and across scheduler processes.

A `ClaimTask` long poll that found nothing waits on its node's marker (`TaskWakeups.marker`, taken
*before* the claim attempt, so a commit that lands during the attempt still wakes it). Whoever
commits a change that can make a node's task claimable (an enqueue, a finish or expiry that frees a
thread, a claim sent back to the queue) calls `wake(node)` after the commit. On PostgreSQL the same
transaction also runs `pg_notify(channel, node)`, delivered at commit to every scheduler process
listening (`PostgresTaskListener`, one connection per process), which wakes its own waiters: a
claim waiting on one replica wakes within milliseconds of an enqueue committed by another.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from sqlalchemy.engine import make_url

from boss_common.reconnection import Reconnection

log = logging.getLogger(__name__)


def notify_channel(schema: str | None) -> str:
    """The LISTEN/NOTIFY channel of a scheduler schema's task wake-ups."""
    return f"boss_tasks_{schema or 'scheduler'}"


class TaskWakeups:
    """Per-node wake-ups of waiting claims (one instance per process).

    `marker(node)` returns the event the next `wake(node)` (or `wake_all()`) sets; a claim waits for
    it with `boss_common.waiting.wait_until_set`. Markers of nodes nobody wakes stay until their
    node is woken (one per node).
    """

    def __init__(self) -> None:
        self._markers: dict[str, asyncio.Event] = {}
        self.wakes = 0

    def marker(self, node_id: str) -> asyncio.Event:
        """The event the next wake of `node_id` sets."""
        marker = self._markers.get(node_id)
        if marker is None:
            marker = self._markers[node_id] = asyncio.Event()
        return marker

    def wake(self, node_id: str) -> None:
        """Wakes every claim of `node_id` waiting on the current marker."""
        marker = self._markers.pop(node_id, None)
        if marker is not None:
            self.wakes += 1
            marker.set()

    def wake_nodes(self, node_ids: set[str] | list[str]) -> None:
        """`wake` for each node."""
        for node_id in node_ids:
            self.wake(node_id)

    def wake_all(self) -> None:
        """Wakes every waiting claim (e.g. after notifications may have been missed)."""
        markers, self._markers = self._markers, {}
        for marker in markers.values():
            marker.set()


def conninfo_of(url: str) -> str:
    """A libpq connection URI for psycopg from a SQLAlchemy URL (driver name dropped)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PostgresTaskListener:
    """LISTENs on the task channel and wakes this process's waiting claims per notified node.

    One dedicated autocommit connection (a pooled one would be returned to the pool mid-LISTEN).
    After each (re)connection every waiter is woken once, so a notification missed while the
    connection was down costs at most one extra claim attempt, never a lost wake-up.
    """

    def __init__(self, url: str, channel: str, wakeups: TaskWakeups) -> None:
        self._conninfo = conninfo_of(url)
        self._channel = channel
        self._wakeups = wakeups
        self._reconnection = Reconnection()
        self.listening = asyncio.Event()

    async def run(self) -> None:
        """Listens until cancelled, reconnecting with backoff when the connection fails or ends."""
        while True:
            self._reconnection.attempt_started()
            try:
                await self._listen_once()
                delay = self._reconnection.ended(log, "task notifications", "connection closed")
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as error:
                delay = self._reconnection.ended(log, "task notifications", error)
            except Exception:
                delay = self._reconnection.next_delay()
                log.exception("task notifications failed; listening again in %.1f s", delay)
            self.listening.clear()
            await asyncio.sleep(delay)

    async def _listen_once(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as connection:
            await connection.execute(f'LISTEN "{self._channel}"')
            self._reconnection.delivered()
            self.listening.set()
            self._wakeups.wake_all()
            async for notification in connection.notifies():
                self._wakeups.wake(notification.payload)
