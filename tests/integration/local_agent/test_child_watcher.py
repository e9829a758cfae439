"""The worker's pidfd child watcher: children's exits are seen through it, and the default is back after."""

from __future__ import annotations

import asyncio
import sys
import warnings

import pytest

from worker.local_agent.child_watcher import pidfd_child_watcher, pidfd_usable

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or sys.version_info >= (3, 12), reason="Python 3.11 on Linux sets it"
)


def _current_watcher() -> asyncio.AbstractChildWatcher:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return asyncio.get_child_watcher()


async def test_inside_the_block_children_are_watched_through_pidfds_and_the_default_comes_back() -> None:
    assert pidfd_usable()
    before = _current_watcher()
    with pidfd_child_watcher():
        inside = _current_watcher()
        child = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(7)")
        code = await asyncio.wait_for(child.wait(), 10)
    assert isinstance(inside, asyncio.PidfdChildWatcher)
    assert code == 7
    assert _current_watcher() is before
    after = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
    assert await asyncio.wait_for(after.wait(), 10) == 3
