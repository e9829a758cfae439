"""asyncio's watcher of child processes for the worker process: one that waits on pidfds.

On Python 3.11 asyncio learns that a child exited through a ``ThreadedChildWatcher``, which starts
a thread per child (``waitpid`` in it, then a hand-over to the event loop). Starting that thread
is most of what ``create_subprocess_exec`` costs the Codex runner before Codex runs: 2-5 ms on a
busy 2-core machine against well under 1 ms with a ``PidfdChildWatcher``, which adds the child's
pidfd to the event loop instead (Linux 5.3 and later). Python 3.12 uses pidfds on its own.

The watcher is asyncio's global one, so it is set only for the worker process's own run
(``python -m worker run``) and put back afterwards: it belongs to the event loop it was attached
to, and a process running several loops one after the other (a test run) keeps the default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator

log = logging.getLogger(__name__)


def pidfd_usable() -> bool:
    """Whether this Python needs the pidfd watcher set (3.11) and this kernel has pidfds."""
    if sys.version_info >= (3, 12) or sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def pidfd_child_watcher() -> Iterator[None]:
    """For the ``with`` block, asyncio's child watcher is a PidfdChildWatcher attached to the
    running event loop (where :func:`pidfd_usable`; elsewhere the block runs unchanged). Call it
    from a coroutine; start no child process before the block that outlives it."""
    if not pidfd_usable():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        previous = asyncio.get_child_watcher()
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
    log.debug("child processes are watched through pidfds")
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            asyncio.set_child_watcher(previous)
            watcher.close()
