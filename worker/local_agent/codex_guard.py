"""One Codex run per thread: a per-thread lock file, and a look for other Codex processes on the thread.

Two Codex processes appending to one session file corrupt it, so before a turn the runner:

1. takes ``<codex home>/boss/thread-locks/<session id>.lock`` with a non-blocking exclusive
   ``flock`` (``msvcrt.locking`` on Windows) and holds it for the whole run
   (:func:`hold_thread_lock`); every Boss run, and anything else that wants to write a thread
   (the demo's grower), takes the same lock, so they never overlap. The lock is the operating
   system's: it goes away with the process holding it, even after SIGKILL;
2. looks for a live process running Codex with the session id among its arguments
   (:func:`codex_processes_using`): ``/proc/*/cmdline`` on Linux, ``ps -axo pid=,args=`` on macOS
   (no scan on Windows). That catches a person's own ``codex resume <id>`` in a terminal, which
   knows nothing of the lock.

Either one found means the thread is busy (:class:`ThreadBusyError`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOCKS_SUBDIR = Path("boss") / "thread-locks"
"""Where the lock files live, relative to the Codex home."""

_SAFE_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CODEX_PROGRAM_NAMES = frozenset({"codex", "codex.exe", "codex.js"})


class ThreadBusyError(Exception):
    """Another run holds the thread's lock, or another Codex process is using the thread."""


@dataclass(frozen=True)
class CodexProcess:
    """A live process running Codex on a thread: its ``pid`` and its command line."""

    pid: int
    command: str


def lock_path(codex_home: Path, session_id: str) -> Path:
    """The lock file of one thread: ``<codex_home>/boss/thread-locks/<session_id>.lock``.

    Raises:
        ValueError: ``session_id`` is not a plain id (letters, digits, ``.``, ``_``, ``-``).
    """
    if not _SAFE_SESSION_ID.match(session_id):
        raise ValueError(f"not a Codex session id: {session_id!r}")
    return codex_home / LOCKS_SUBDIR / f"{session_id}.lock"


@contextmanager
def hold_thread_lock(codex_home: Path, session_id: str) -> Iterator[Path]:
    """Holds the thread's lock for the ``with`` block (never waits for it).

    Yields:
        The lock file's path (the file holds the holder's pid, for people reading it).

    Raises:
        ThreadBusyError: another process (or another holder in this one) has the lock.
        ValueError: ``session_id`` is not a plain id.
        OSError: the lock folder cannot be created.
    """
    path = lock_path(codex_home, session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        if not _try_lock(handle):
            raise ThreadBusyError(f"another run is using Codex thread {session_id} (its lock {path} is held)")
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield path
        finally:
            _unlock(handle)
    finally:
        handle.close()


def is_codex_command(argv: Sequence[str], session_id: str) -> bool:
    """Whether a command line runs Codex on ``session_id``.

    True when the program (or, for ``node codex.js`` style wrappers, the script) is named ``codex``
    (``codex.exe``, ``codex.js``) and ``session_id`` is one of the later arguments.
    """
    if len(argv) < 2:
        return False
    names = {_program_name(argv[0]), _program_name(argv[1])}
    return bool(names & _CODEX_PROGRAM_NAMES) and session_id in argv[1:]


def _program_name(arg: str) -> str:
    """The last path component of an argument, for POSIX and Windows paths alike, lower-cased."""
    return arg.replace("\\", "/").rsplit("/", 1)[-1].lower()


def codex_processes_using(
    session_id: str, *, exclude_pids: frozenset[int] = frozenset()
) -> list[CodexProcess]:
    """Live processes (other than this one and ``exclude_pids``) running Codex on ``session_id``.

    Linux reads ``/proc``; macOS and other Unixes ask ``ps``; Windows returns ``[]``. Processes
    that vanish or cannot be read while looking are skipped.
    """
    skip = exclude_pids | {os.getpid()}
    return [
        CodexProcess(pid, " ".join(argv))
        for pid, argv in _processes(session_id)
        if pid not in skip and is_codex_command(argv, session_id)
    ]


def ensure_thread_idle(session_id: str, found: Sequence[CodexProcess] | None = None) -> None:
    """Raises :class:`ThreadBusyError` naming the first other Codex process using the thread, if
    any: of those ``found`` by an earlier :func:`codex_processes_using`, else of a look now."""
    busy = codex_processes_using(session_id) if found is None else found
    if busy:
        first = busy[0]
        raise ThreadBusyError(
            f"another Codex process is using thread {session_id} (pid {first.pid}: {first.command[:200]})"
        )


def _processes(containing: str) -> Iterator[tuple[int, list[str]]]:
    """Live processes as (pid, argv), at least those whose command line contains `containing`."""
    if sys.platform == "win32":
        return iter(())
    if os.path.exists("/proc/self/cmdline"):
        return _proc_processes(containing.encode("utf-8"))
    return _ps_processes()


def _proc_processes(containing: bytes) -> Iterator[tuple[int, list[str]]]:
    """The processes whose ``/proc/<pid>/cmdline`` contains `containing` (plain ``os`` calls, and
    only those command lines decoded: this looks at every process before each turn)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = _read_cmdline(f"/proc/{name}/cmdline")
        if raw and containing in raw:
            yield int(name), raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")


def _read_cmdline(path: str) -> bytes:
    """The whole file, b"" when it cannot be read (the process is gone, or a kernel thread)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    chunks = []
    try:
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
    except OSError:
        return b""
    finally:
        os.close(descriptor)
    return b"".join(chunks)


def _ps_processes() -> Iterator[tuple[int, list[str]]]:
    try:
        listing = subprocess.run(
            ["ps", "-axo", "pid=,args="], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return
    for line in listing.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit():
            yield int(pid), args.split()


if sys.platform == "win32":
    import msvcrt

    def _try_lock(handle: IO[str]) -> bool:
        handle.seek(0)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(handle: IO[str]) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(handle: IO[str]) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(handle: IO[str]) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
