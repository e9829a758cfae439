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
from pathlib import Path

logger = logging.getLogger(__name__)

GROUP_GONE_TIMEOUT_S = 5.0
"""After SIGKILL, how long to wait for the group's processes to disappear (seconds)."""


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies waiting to be reaped by
    init do not count: they hold nothing and cannot be killed)."""
    if sys.platform == "win32":
        return False
    stats = _proc_stats()
    if stats is not None:
        return any(stat.pgrp == pgid and stat.state != "Z" for stat in stats)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    _signal_group(process.pid, signal.SIGKILL, descendants(process.pid))


async def stop_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """Stops ``process`` (a session leader: its pid is its group id) and everything it started.

    SIGTERM to the group and to the descendants that left it, SIGKILL to what is left after
    ``grace_s`` seconds, then waits until ``process`` is reaped and no process of the group runs
    (at most :data:`GROUP_GONE_TIMEOUT_S` more; a warning is logged if some still do).
    """
    if sys.platform == "win32":
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        return
    pgid = process.pid
    strays = descendants(process.pid)
    _signal_group(pgid, signal.SIGTERM, strays)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (process.returncode is None or group_alive(pgid)):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 0.05)
    if process.returncode is None or group_alive(pgid) or _any_running(strays):
        _signal_group(pgid, signal.SIGKILL, strays + descendants(process.pid))
    await process.wait()
    deadline = time.monotonic() + GROUP_GONE_TIMEOUT_S
    while group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if group_alive(pgid):
        logger.warning("processes of group %d are still running after SIGKILL", pgid)


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
    return _descendants_in(stats if stats is not None else _ps_stats(), root)


def _descendants_in(stats: Sequence[_ProcStat], root: int) -> list[int]:
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
class _ProcStat:
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
    own_group = _group_of(root)
    stats = _proc_stats()
    if stats is None:
        stats = _ps_stats()
    by_pid = {stat.pid: stat for stat in stats}
    return {
        by_pid[pid].pgrp
        for pid in _descendants_in(stats, root)
        if pid in by_pid and by_pid[pid].pgrp not in (own_group, 0)
    }


async def stop_groups(pgids: Iterable[int], grace_s: float) -> None:
    """Stops every process still running in ``pgids``: SIGTERM, SIGKILL after ``grace_s``, then
    waits (at most :data:`GROUP_GONE_TIMEOUT_S`) until none runs."""
    live = [pgid for pgid in pgids if group_alive(pgid)]
    if not live:
        return
    logger.info("stopping %d process group(s) left behind: %s", len(live), live)
    for pgid in live:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(group_alive(pgid) for pgid in live):
        await asyncio.sleep(0.02)
    for pgid in live:
        if group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + GROUP_GONE_TIMEOUT_S
    while time.monotonic() < deadline and any(group_alive(pgid) for pgid in live):
        await asyncio.sleep(0.02)


def _group_of(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return pid


def _proc_stats() -> list[_ProcStat] | None:
    """Every process's state, parent and group from ``/proc/*/stat``; None where there is no ``/proc``."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    stats: list[_ProcStat] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[1].isdigit() and fields[2].isdigit():
            stats.append(_ProcStat(int(entry.name), fields[0], int(fields[1]), int(fields[2])))
    return stats


def _ps_stats() -> list[_ProcStat]:
    """What ``ps`` says of every process (where there is no ``/proc``); state is ps's first letter."""
    stats: list[_ProcStat] = []
    try:
        listing = subprocess.run(
            ["ps", "-axo", "pid=,ppid=,pgid=,state="], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return stats
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(part.isdigit() for part in parts[:3]):
            stats.append(_ProcStat(int(parts[0]), parts[3][:1], int(parts[1]), int(parts[2])))
    return stats
