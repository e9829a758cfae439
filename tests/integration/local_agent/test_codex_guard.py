"""The per-thread lock across holders and processes, and the scan for other Codex processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from worker.local_agent.codex_guard import (
    ThreadBusyError,
    codex_processes_using,
    ensure_thread_idle,
    hold_thread_lock,
    lock_path,
)

HOLD_LOCK = """
import sys, time
from pathlib import Path
from worker.local_agent.codex_guard import hold_thread_lock
with hold_thread_lock(Path(sys.argv[1]), sys.argv[2]):
    sys.stdout.write("held\\n")
    sys.stdout.flush()
    time.sleep(60)
"""


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path: Path) -> None:
    session = str(uuid.uuid4())
    with hold_thread_lock(tmp_path, session) as path:
        assert path == lock_path(tmp_path, session)
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(ThreadBusyError, match=session), hold_thread_lock(tmp_path, session):
            pass
        with hold_thread_lock(tmp_path, str(uuid.uuid4())):
            pass
    with hold_thread_lock(tmp_path, session):
        pass


def test_a_lock_held_by_another_process_is_freed_when_it_is_killed(tmp_path: Path) -> None:
    session = str(uuid.uuid4())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path), session],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ThreadBusyError), hold_thread_lock(tmp_path, session):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    with hold_thread_lock(tmp_path, session):
        pass


def test_a_process_named_codex_with_the_session_among_its_arguments_is_found() -> None:
    session = str(uuid.uuid4())
    # A process whose argv[0] is "codex", as a person's `codex resume <id>` in a terminal has.
    argv = ["codex", "-c", "import time; time.sleep(60)", session]
    stand_in = subprocess.Popen(argv, executable=sys.executable)
    try:
        deadline = time.monotonic() + 5
        found = codex_processes_using(session)
        while not found and time.monotonic() < deadline:
            time.sleep(0.02)
            found = codex_processes_using(session)
        assert [process.pid for process in found] == [stand_in.pid]
        assert found[0].command == f"codex -c import time; time.sleep(60) {session}"
        with pytest.raises(ThreadBusyError, match=f"pid {stand_in.pid}"):
            ensure_thread_idle(session)
        assert codex_processes_using(session, exclude_pids=frozenset({stand_in.pid})) == []
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)
    assert codex_processes_using(session) == []
    ensure_thread_idle(session)
