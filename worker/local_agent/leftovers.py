"""Stopping what a Codex run left running, after its result is known, still holding its thread.

When Codex's main process exits, the turn's output is complete, but processes it started may
still run: in its own process group (a plugin sync's ``git-remote-https``) and in groups of their
own (its shell-environment snapshot ``bash -lc``, a command of the turn left in the background).
The runner (:mod:`~worker.local_agent.codex_exec`) reports the turn as soon as Codex has exited and
its output is parsed, and hands what is left over as :class:`Leftovers`. With a
:class:`LeftoverCleanups` they are stopped in the background **while the thread's lock is still
held**, so the thread's next turn, which waits for the lock, never starts beside them::

    cleanups = LeftoverCleanups()
    cleanups.start(thread_ref, leftovers, lock)   # returns at once; `lock` is released when done
    await cleanups.idle(thread_ref, timeout_s)    # before taking the thread's lock again
    await cleanups.close(timeout_s)               # on shutdown: completes, else kills, all of them

Stopping is SIGTERM, SIGKILL after the run's kill grace, then a wait until none of them runs
(:mod:`~worker.local_agent.process_group`); a cleanup that is cancelled SIGKILLs everything at
once and still waits (at most :data:`~worker.local_agent.process_group.GROUP_GONE_TIMEOUT_S`)
until it is gone before it lets the lock go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from worker.local_agent.process_group import (
    GROUP_GONE_TIMEOUT_S,
    POLL_INTERVAL_S,
    group_exists,
    kill_group_now,
    kill_groups_now,
    running_groups,
    stop_group,
    stop_groups,
)

logger = logging.getLogger(__name__)


@dataclass
class Leftovers:
    """What one Codex run may have left running once its result is known.

    Attributes:
        process: Codex's main process, a session leader (its pid is its process group's id);
            usually exited already, else it is stopped too. None when Codex never started.
        helper_groups: the process groups, other than Codex's own, its descendants moved to.
        kill_grace_s: seconds between SIGTERM and SIGKILL.
        readers: the run's pipe readers still going (cancelled once everything is stopped).
    """

    process: asyncio.subprocess.Process | None
    helper_groups: frozenset[int]
    kill_grace_s: float
    readers: tuple[asyncio.Future[None], ...] = field(default=())

    async def stop(self) -> None:
        """Stops every leftover process (SIGTERM, SIGKILL after the grace) and waits until none runs.

        Raises:
            asyncio.CancelledError: when cancelled meanwhile; everything is SIGKILLed and waited
                for first (see :meth:`kill`).
        """
        try:
            process = self.process
            if process is not None and (process.returncode is None or group_exists(process.pid)):
                await stop_group(process, self.kill_grace_s)
            await stop_groups(self.helper_groups, self.kill_grace_s)
        except asyncio.CancelledError:
            await self.kill()
            raise
        finally:
            self._cancel_readers()

    async def kill(self) -> None:
        """SIGKILLs every leftover process at once and waits (at most GROUP_GONE_TIMEOUT_S, even
        when cancelled meanwhile) until Codex is reaped and none of them runs."""
        if self.process is not None:
            kill_group_now(self.process)
        kill_groups_now(self.helper_groups)
        gone = asyncio.ensure_future(self._gone(time.monotonic() + GROUP_GONE_TIMEOUT_S))
        try:
            await asyncio.shield(gone)
        except asyncio.CancelledError:
            await gone
            raise
        finally:
            self._cancel_readers()

    async def _gone(self, deadline: float) -> None:
        groups = set(self.helper_groups)
        if self.process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    await self.process.wait()
            groups.add(self.process.pid)
        while (groups := running_groups(groups)) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_INTERVAL_S)
        if groups:
            logger.warning("processes of group(s) %s are still running after SIGKILL", sorted(groups))

    def _cancel_readers(self) -> None:
        for reader in self.readers:
            reader.cancel()


class LeftoverCleanups:
    """The background stops of what finished Codex runs left running.

    Each cleanup holds its thread's lock (an exit stack given to :meth:`start`) until its
    leftovers are gone. Not thread-safe: use it from one event loop.
    """

    def __init__(self) -> None:
        self._by_thread: dict[str, set[asyncio.Task[None]]] = {}

    @property
    def pending(self) -> int:
        """How many cleanups are still running."""
        return sum(len(tasks) for tasks in self._by_thread.values())

    def start(self, thread_ref: str, leftovers: Leftovers, lock: contextlib.ExitStack) -> None:
        """Stops `leftovers` in the background, then closes `lock` (the thread's lock)."""
        task = asyncio.create_task(
            self._clean(thread_ref, leftovers, lock), name=f"codex-leftovers-{thread_ref}"
        )
        self._by_thread.setdefault(thread_ref, set()).add(task)
        task.add_done_callback(lambda done: self._forget(thread_ref, done))

    def _forget(self, thread_ref: str, task: asyncio.Task[None]) -> None:
        tasks = self._by_thread.get(thread_ref, set())
        tasks.discard(task)
        if not tasks:
            self._by_thread.pop(thread_ref, None)

    async def _clean(self, thread_ref: str, leftovers: Leftovers, lock: contextlib.ExitStack) -> None:
        began = time.monotonic()
        with lock:
            try:
                await leftovers.stop()
            except Exception:
                logger.exception("stopping what the Codex run on thread %s left running failed", thread_ref)
                await leftovers.kill()
        logger.debug(
            "codex run for thread %s: leftovers stopped %.3f s after its result; thread released",
            thread_ref,
            time.monotonic() - began,
        )

    async def idle(self, thread_ref: str, timeout_s: float) -> bool:
        """Waits up to `timeout_s` seconds until no cleanup of `thread_ref` runs; True when none
        does (then). Cancelling the wait does not cancel the cleanups."""
        tasks = self._by_thread.get(thread_ref)
        if not tasks:
            return True
        _, running = await asyncio.wait(set(tasks), timeout=max(timeout_s, 0.0))
        return not running

    async def close(self, timeout_s: float) -> None:
        """Waits up to `timeout_s` seconds for the running cleanups, then cancels the rest (each
        SIGKILLs its leftovers and waits until they are gone), and returns once all have ended.
        Cancelling it cancels them all the same."""
        tasks = [task for running in self._by_thread.values() for task in running if not task.done()]
        if not tasks:
            return
        logger.info("waiting up to %.1f s for %d Codex run(s) to stop their leftovers", timeout_s, len(tasks))
        try:
            await asyncio.wait(tasks, timeout=max(timeout_s, 0.0))
        finally:
            late = [task for task in tasks if not task.done()]
            for task in late:
                task.cancel()
            if late:
                logger.warning("killing the leftovers of %d Codex run(s): not stopped in time", len(late))
                await asyncio.gather(*late, return_exceptions=True)
