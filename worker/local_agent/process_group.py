"""Stopping a child process together with everything it started: its process group and strays.

The Codex runner starts Codex in a new session, so Codex, the npm wrapper's native child and the
commands Codex runs share one process group whose id is Codex's pid. :func:`stop_group` ends all
of them: SIGTERM to the group and to every descendant (a descendant may have moved to a group of
its own), SIGKILL to what is left after a grace period, then it waits until the child is reaped
and no process of the group still runs. Zombies (already dead, waiting for init to reap them) do
not count as running. :func:`foreign_groups` and :func:`stop_groups` do the same for the groups
its descendants moved to, after the child itself is gone. Linux reads ``/proc``; macOS asks
``ps``; on Windows only the child itself is terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

GROUP_GONE_TIMEOUT_S = 5.0
"""After SIGKILL, how long to wait for the group's processes to disappear (seconds)."""
POLL_INTERVAL_S = 0.02
"""While waiting for processes to end, how long to sleep between two looks at them (seconds)."""


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies waiting to be reaped by
    init do not count: they hold nothing and cannot be killed)."""
    if sys.platform == "win32":
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    # Some process (perhaps only a zombie) is in the group: only a look at every process tells.
    stats = _proc_stats()
    if stats is not None:
        return any(stat.pgrp == pgid and stat.state != "Z" for stat in stats)
    return True


def group_exists(pgid: int) -> bool:
    """Whether group ``pgid`` still holds any process, perhaps only zombies (no ``/proc`` read)."""
    return bool(_existing_groups([pgid]))


def running_groups(pgids: Iterable[int]) -> set[int]:
    """Those of ``pgids`` in which some process still runs, zombies not counted (one look at
    every process for all of them)."""
    candidates = _existing_groups(pgids)
    if not candidates:
        return set()
    stats = _proc_stats()
    if stats is None:
        return candidates
    return {stat.pgrp for stat in stats if stat.state != "Z"} & candidates


def _signal_group(pgid: int, signum: int, extra_pids: Sequence[int] = ()) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    for pid in extra_pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_group_now(process: asyncio.subprocess.Process) -> None:
    """SIGKILLs the child's group and its descendants at once, without waiting (for a caller that
    is being cancelled; :func:`stop_group` still reaps them)."""
    if sys.platform == "win32":
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        return
    strays = descendants(process.pid) if process.returncode is None else []
    _signal_group(process.pid, signal.SIGKILL, strays)


def kill_groups_now(pgids: Iterable[int]) -> None:
    """SIGKILLs every process of ``pgids`` at once, without waiting."""
    if sys.platform == "win32":
        return
    for pgid in pgids:
        _signal_group(pgid, signal.SIGKILL)


async def stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """Stops ``process`` (a session leader: its pid is its group id) and everything it started.

    SIGTERM to the group and to the descendants that left it, SIGKILL to what is left after
    ``grace_s`` seconds, then waits until ``process`` is reaped and no process of the group runs
    (at most :data:`GROUP_GONE_TIMEOUT_S` more; a warning is logged if some still do). Looks at
    the processes at most every :data:`POLL_INTERVAL_S` seconds. Once ``process`` has exited its
    former children are no longer its descendants: only its group is signalled then.
    """
    if sys.platform == "win32":
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            async with asyncio.timeout(grace_s):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        return
    pgid = process.pid
    strays = descendants(process.pid) if process.returncode is None else []
    _signal_group(pgid, signal.SIGTERM, strays)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        # A pause first: what was just signalled needs a moment, and a look at once would only cost.
        await _pause(process, min(POLL_INTERVAL_S, max(deadline - time.monotonic(), 0.0)))
        if process.returncode is not None and not group_alive(pgid):
            break
    if process.returncode is None or group_alive(pgid) or _any_running(strays):
        late = descendants(process.pid) if process.returncode is None else []
        _signal_group(pgid, signal.SIGKILL, strays + late)
    await process.wait()
    deadline = time.monotonic() + GROUP_GONE_TIMEOUT_S
    while group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_INTERVAL_S)
    if group_alive(pgid):
        logger.warning("processes of group %d are still running after SIGKILL", pgid)


async def _pause(process: asyncio.subprocess.Process, seconds: float) -> None:
    """Waits ``seconds``, less if ``process`` exits meanwhile (an exited one waits them all: its
    ``wait()`` returns at once, and the caller must not look at ``/proc`` back to back)."""
    if process.returncode is not None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await process.wait()


def _any_running(pids: Sequence[int]) -> bool:
    stats = _proc_stats()
    if stats is not None:
        running = {stat.pid for stat in stats if stat.state != "Z"}
        return any(pid in running for pid in pids)
    for pid in pids:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            continue
        return True
    return False


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (Linux ``/proc``, else ``ps -axo pid=,ppid=,pgid=``)."""
    stats = _proc_stats()
    return descendants_in(stats if stats is not None else _ps_stats(), root)


def descendants_in(stats: Iterable[ProcStat], root: int) -> list[int]:
    """The pids among ``stats`` of running (not zombie) descendants of ``root``."""
    children: dict[int, list[int]] = {}
    for stat in stats:
        if stat.state != "Z":
            children.setdefault(stat.ppid, []).append(stat.pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


@dataclass(frozen=True)
class ProcStat:
    """One process as ``/proc/<pid>/stat`` (or ``ps``) shows it: state letter, parent, group."""

    pid: int
    state: str
    ppid: int
    pgrp: int


def foreign_groups(root: int) -> set[int]:
    """The process groups, other than ``root``'s own, of ``root``'s running descendants.

    Codex starts some helpers in sessions of their own (its shell-environment snapshot, commands
    run in a terminal); once Codex has exited they are no longer its descendants, so a caller that
    must leave nothing behind records these groups while Codex runs and stops them afterwards
    (:func:`stop_groups`).
    """
    if sys.platform == "win32":
        return set()
    own_group = group_of(root)
    stats = _proc_stats()
    if stats is None:
        stats = _ps_stats()
    by_pid = {stat.pid: stat for stat in stats}
    return {
        by_pid[pid].pgrp
        for pid in descendants_in(stats, root)
        if pid in by_pid and by_pid[pid].pgrp not in (own_group, 0)
    }


async def stop_groups(pgids: Iterable[int], grace_s: float) -> None:
    """Stops every process still running in ``pgids``: SIGTERM, SIGKILL after ``grace_s``, then
    waits (at most :data:`GROUP_GONE_TIMEOUT_S`) until none runs, looking every
    :data:`POLL_INTERVAL_S` seconds. The SIGTERM goes out before any look at ``/proc``."""
    live = _existing_groups(pgids)
    if not live:
        return
    logger.info("stopping %d process group(s) left behind: %s", len(live), sorted(live))
    for pgid in live:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        await asyncio.sleep(POLL_INTERVAL_S)
        live = running_groups(live)
    kill_groups_now(live)
    deadline = time.monotonic() + GROUP_GONE_TIMEOUT_S
    while live and time.monotonic() < deadline:
        await asyncio.sleep(POLL_INTERVAL_S)
        live = running_groups(live)
    if live:
        logger.warning("processes of group(s) %s are still running after SIGKILL", sorted(live))


def _existing_groups(pgids: Iterable[int]) -> set[int]:
    """Those of ``pgids`` that still hold a process (perhaps only zombies): no ``/proc`` read."""
    existing = set()
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        existing.add(pgid)
    return existing


def group_of(pid: int) -> int:
    """The process group of ``pid`` (``pid`` itself when it is gone or not visible)."""
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return pid


def _proc_stats() -> list[ProcStat] | None:
    """Every process's state, parent and group from ``/proc/*/stat``; None where there is no ``/proc``."""
    pids = proc_pids()
    return None if pids is None else proc_stats_of(pids)


def proc_pids() -> list[int] | None:
    """The pids ``/proc`` lists now (one directory read); None where there is no ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    if "self" not in names:
        return None
    return [int(name) for name in names if name.isdigit()]


def proc_stats_of(pids: Iterable[int]) -> list[ProcStat]:
    """The state, parent and group of each of ``pids`` from ``/proc/<pid>/stat`` (plain ``os``
    calls: this runs on the event loop several times a turn); processes gone meanwhile are left out."""
    stats: list[ProcStat] = []
    for pid in pids:
        stat = _read_small(f"/proc/{pid}/stat")
        if stat is None:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split(None, 3)
        if len(fields) > 2 and fields[1].isdigit() and fields[2].isdigit():
            state = fields[0].decode("ascii", "replace")
            stats.append(ProcStat(pid, state, int(fields[1]), int(fields[2])))
    return stats


def _read_small(path: str) -> bytes | None:
    """The first 4 KiB of a ``/proc`` file, None when it cannot be read (the process is gone)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(descriptor, 4096)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def _ps_stats() -> list[ProcStat]:
    """What ``ps`` says of every process (where there is no ``/proc``); state is ps's first letter."""
    stats: list[ProcStat] = []
    try:
        listing = subprocess.run(
            ["ps", "-axo", "pid=,ppid=,pgid=,state="], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return stats
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(part.isdigit() for part in parts[:3]):
            stats.append(ProcStat(int(parts[0]), parts[3][:1], int(parts[1]), int(parts[2])))
    return stats
