"""Following which process groups a running process's descendants moved to, without reading every
process each time.

The Codex runner looks for Codex's descendants many times a turn (while it prints, and when its
output ends), to record the groups of helpers that left Codex's own (see
:func:`~worker.local_agent.process_group.foreign_groups`). Reading every ``/proc/<pid>/stat`` each
time costs milliseconds on the event loop and competes with Codex for the cores. A
:class:`DescendantWatch` reads only what can have changed since its previous look:

- the descendants it found then (still there, or gone), and
- the processes created since: Linux hands out pids in increasing order, wrapping around at
  ``pid_max``, and ``/proc/sys/kernel/ns_last_pid`` is the last one handed out, so the new ones
  are those listed with a pid after the previous look's last pid, up to the current one
  (:func:`pids_to_read`, which also handles one wrap-around in between).

A process that was not a descendant when it was created never becomes one, so nothing else can
be a descendant now. Two wrap-arounds between looks cannot be told apart from none, so a look
more than :data:`FULL_LOOK_INTERVAL_S` after the previous one reads every process, as does every
look where ``ns_last_pid`` cannot be read, or where there is no ``/proc`` at all (macOS: ``ps``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable

from worker.local_agent.process_group import (
    descendants_in,
    foreign_groups,
    group_of,
    proc_pids,
    proc_stats_of,
)

FULL_LOOK_INTERVAL_S = 1.0
"""A look later than this after the previous one reads every process (seconds): far too short
for pids to wrap around twice."""
LAST_PID_FILE = "/proc/sys/kernel/ns_last_pid"


def pids_to_read(listed: Iterable[int], known: Collection[int], previous_last: int, last: int) -> set[int]:
    """Which of the ``listed`` pids a look must read: the ``known`` descendants still listed, and
    those created since the previous look, i.e. handed out after ``previous_last`` up to ``last``
    (the last pid handed out then and now). ``last`` below ``previous_last`` means the pids
    wrapped around once in between: the new ones are above ``previous_last`` or up to ``last``.
    """
    if last >= previous_last:
        return {pid for pid in listed if previous_last < pid <= last or pid in known}
    return {pid for pid in listed if pid > previous_last or pid <= last or pid in known}


class DescendantWatch:
    """Looks at a running process's descendants again and again, reading little each time.

    Args:
        root: the watched process (Codex, a session leader), just started: its first look reads
            the processes created since the pid before ``root``.
        clock: monotonic seconds.
    """

    def __init__(self, root: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self._clock = clock
        self._own_group = group_of(root)
        self._known: frozenset[int] = frozenset()
        self._last = root - 1
        self._looked_at = clock()
        self.reads = 0
        """How many ``/proc/<pid>/stat`` files the looks have read so far (all of them)."""

    def foreign_groups(self) -> set[int]:
        """The process groups, other than the root's own, of its running descendants now."""
        last = _last_pid()
        now = self._clock()
        listed = proc_pids()
        if listed is None:
            return foreign_groups(self.root)
        if last is None or now - self._looked_at > FULL_LOOK_INTERVAL_S:
            wanted: Iterable[int] = listed
        else:
            wanted = pids_to_read(listed, self._known, self._last, last)
        stats = proc_stats_of(wanted)
        self.reads += len(stats)
        found = descendants_in(stats, self.root)
        self._known = frozenset(found)
        if last is not None:
            self._last, self._looked_at = last, now
        by_pid = {stat.pid: stat for stat in stats}
        return {by_pid[pid].pgrp for pid in found if by_pid[pid].pgrp not in (self._own_group, 0)}


def _last_pid() -> int | None:
    """The last pid handed out in this pid namespace, None when the kernel does not say."""
    try:
        descriptor = os.open(LAST_PID_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(descriptor, 32)
    except OSError:
        return None
    finally:
        os.close(descriptor)
    return int(text) if text.strip().isdigit() else None
