"""Stopping a process group whose leader has already exited, and groups left behind, on Linux."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from worker.local_agent import process_group
from worker.local_agent.descendant_watch import DescendantWatch
from worker.local_agent.process_group import (
    POLL_INTERVAL_S,
    foreign_groups,
    group_alive,
    proc_pids,
    running_groups,
    stop_group,
    stop_groups,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

GRACE_S = 0.5

STUBBORN_CHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
)
# The leader starts a child that ignores SIGTERM, says its pid once the child is ready, and exits.
LEADER = (
    "import subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {STUBBORN_CHILD!r}],"
    " stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
)


def process_runs(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def _leader_gone_child_left() -> tuple[asyncio.subprocess.Process, int]:
    """A session leader that has exited, leaving a SIGTERM-ignoring child in its group."""
    leader = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LEADER,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert leader.stdout is not None
    child = int((await leader.stdout.readline()).decode())
    await leader.wait()
    assert process_runs(child) and group_alive(leader.pid)
    return leader, child


async def test_a_group_whose_leader_exited_is_polled_not_spun_on_and_killed_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    leader, child = await _leader_gone_child_left()
    looks: list[int] = []
    real_group_alive = process_group.group_alive

    def counting_group_alive(pgid: int) -> bool:
        looks.append(pgid)
        return real_group_alive(pgid)

    monkeypatch.setattr(process_group, "group_alive", counting_group_alive)
    await stop_group(leader, GRACE_S)

    assert not process_runs(child)
    assert not real_group_alive(leader.pid)
    # One look per poll interval during the grace, a few around the SIGKILL: not one per loop turn.
    assert len(looks) <= GRACE_S / POLL_INTERVAL_S + 10, f"{len(looks)} looks at the group in {GRACE_S} s"
    assert set(looks) == {leader.pid}


async def test_running_groups_names_only_groups_with_a_live_process() -> None:
    leader, child = await _leader_gone_child_left()
    idle = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass", start_new_session=True)
    await idle.wait()
    try:
        assert running_groups([leader.pid, idle.pid]) == {leader.pid}
    finally:
        await stop_group(leader, 0.1)
    assert running_groups([leader.pid, idle.pid]) == set()
    assert not process_runs(child)


# A session leader with a child in its group and a grandchild in a session of its own, all asleep.
TREE = (
    "import subprocess, sys, time\n"
    "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
    "child = subprocess.Popen(sleep)\n"
    "helper = subprocess.Popen(sleep, start_new_session=True)\n"
    "print(child.pid, helper.pid, flush=True)\n"
    "sys.stdin.readline()\n"
    "late = subprocess.Popen(sleep, start_new_session=True)\n"
    "print(late.pid, flush=True)\n"
    "time.sleep(60)\n"
)


async def test_the_descendant_watch_finds_what_a_full_look_finds_reading_only_what_changed() -> None:
    tree = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        TREE,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert tree.stdin is not None and tree.stdout is not None
    watch = DescendantWatch(tree.pid)
    helpers: set[int] = set()
    try:
        child, helper = map(int, (await tree.stdout.readline()).split())
        first = watch.foreign_groups()
        helpers |= first
        assert first == foreign_groups(tree.pid) == {helper}
        assert watch.reads >= 2

        tree.stdin.write(b"go\n")
        await tree.stdin.drain()
        late = int(await tree.stdout.readline())
        listed = proc_pids()
        assert listed is not None
        reads_before = watch.reads
        second = watch.foreign_groups()
        helpers |= second

        assert second == foreign_groups(tree.pid) == {helper, late}
        assert process_runs(child)
        # The known descendants and the few processes created since the first look, not all of them.
        assert watch.reads - reads_before < len(listed)
    finally:
        await stop_group(tree, 0.5)
        await stop_groups(helpers, 0.5)
    assert running_groups({tree.pid, *helpers}) == set()
