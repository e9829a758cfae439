"""What Codex leaves running after it exits is stopped after the turn's result, holding the thread;
and the look for other Codex processes on the thread, started ahead of the run.

With a `LeftoverCleanups`, the runner returns the result as soon as Codex's main process has
exited; the processes it left (its shell snapshot `bash -lc`, which sources the user's
~/.bashrc, in a session of its own; anything left in its own process group) are stopped in the
background, and the thread's lock stays held until they are gone. The helpers here ignore SIGTERM,
so they outlive the result by at least the kill grace, and are SIGKILLed then (or at once when
the cleanups are closed).

The real Codex CLI runs against the demo model (tests/codex_support.py); the leftover in Codex's
own group comes from a stand-in script, since no real run can be made to leave one on purpose.

The local agent starts the look for other Codex processes on the thread (`look_ahead`) while its
StartTask call is on its way; the run uses what it found when the thread's lock was free at once,
and looks again when it had to wait for the lock.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from demo_model import DemoModelServer, reply_text
from tests.codex_support import CodexThread, NewCodexThread
from worker.local_agent.codex_exec import CodexRunSettings, CodexTurnRequest, look_ahead, run_codex_turn
from worker.local_agent.codex_guard import ThreadBusyError, codex_processes_using, hold_thread_lock
from worker.local_agent.codex_outcome import FailureKind
from worker.local_agent.leftovers import LeftoverCleanups

KILL_GRACE_S = 1.0


def process_runs(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def running_with(marker: str) -> list[int]:
    """Running processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and process_runs(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _lock_is_held(settings: CodexRunSettings, session_id: str) -> bool:
    try:
        with hold_thread_lock(settings.resolved_codex_home(), session_id):
            return False
    except ThreadBusyError:
        return True


def stubborn_bashrc(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A HOME whose ~/.bashrc starts a process that ignores SIGTERM and sleeps a minute: Codex's
    shell snapshot leaves it running. Returns its marker and the environment giving that HOME."""
    marker = f"stubborn-bashrc-{uuid.uuid4()}"
    home = tmp_path / "stubborn-home"
    home.mkdir()
    ignore_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    (home / ".bashrc").write_text(f'"{sys.executable}" -c "{ignore_term}" {marker}\n')
    return marker, {"HOME": str(home)}


def _turn(thread: CodexThread, message: str) -> CodexTurnRequest:
    return CodexTurnRequest(thread.session_id, str(thread.folder), message)


@pytest.fixture
def patient_settings(codex_settings: CodexRunSettings, tmp_path: Path) -> tuple[str, CodexRunSettings]:
    """The marker of the stubborn ~/.bashrc helper, and settings whose runs leave it behind."""
    marker, environment = stubborn_bashrc(tmp_path)
    settings = replace(
        codex_settings,
        kill_grace_s=KILL_GRACE_S,
        lock_wait_s=15.0,
        extra_env={**codex_settings.extra_env, **environment},
    )
    return marker, settings


async def test_the_result_comes_before_the_helpers_are_stopped_and_the_thread_stays_locked_until_then(
    new_codex_thread: NewCodexThread, patient_settings: tuple[str, CodexRunSettings]
) -> None:
    marker, settings = patient_settings
    thread = await new_codex_thread("start")
    cleanups = LeftoverCleanups()
    result = await run_codex_turn(_turn(thread, "hello"), settings, cleanups=cleanups)

    assert result.reply_text == reply_text("hello")
    helpers = running_with(marker)
    assert helpers != [], "Codex's shell snapshot should still be running when the result comes"
    assert cleanups.pending == 1
    assert _lock_is_held(settings, thread.session_id)
    assert codex_processes_using(thread.session_id) == []

    assert await cleanups.idle(thread.session_id, 10.0)
    assert [pid for pid in helpers if process_runs(pid)] == []
    assert running_with(marker) == []
    assert cleanups.pending == 0
    assert not _lock_is_held(settings, thread.session_id)


async def test_the_next_turn_of_the_thread_waits_for_the_cleanup_then_runs(
    new_codex_thread: NewCodexThread, patient_settings: tuple[str, CodexRunSettings]
) -> None:
    marker, settings = patient_settings
    thread = await new_codex_thread("start")
    cleanups = LeftoverCleanups()
    await run_codex_turn(_turn(thread, "first"), settings, cleanups=cleanups)
    first_helpers = running_with(marker)
    assert first_helpers != []

    second = await run_codex_turn(_turn(thread, "second"), settings, cleanups=cleanups)

    assert second.reply_text == reply_text("second"), second.failure_detail
    assert [pid for pid in first_helpers if process_runs(pid)] == []
    await cleanups.close(10.0)
    assert running_with(marker) == []


async def test_a_turn_whose_lock_wait_ends_before_the_cleanup_is_thread_busy(
    new_codex_thread: NewCodexThread, patient_settings: tuple[str, CodexRunSettings]
) -> None:
    marker, settings = patient_settings
    thread = await new_codex_thread("start")
    cleanups = LeftoverCleanups()
    await run_codex_turn(_turn(thread, "first"), settings, cleanups=cleanups)
    assert running_with(marker) != []

    impatient = replace(settings, lock_wait_s=0.0)
    busy = await run_codex_turn(_turn(thread, "too soon"), impatient, cleanups=cleanups)

    assert busy.failure_kind is not None and busy.failure_kind.value == "thread_busy"
    assert busy.exit_code is None
    await cleanups.close(10.0)


async def test_closing_the_cleanups_kills_what_is_left_at_once_and_frees_the_thread(
    new_codex_thread: NewCodexThread, patient_settings: tuple[str, CodexRunSettings]
) -> None:
    marker, settings = patient_settings
    thread = await new_codex_thread("start")
    cleanups = LeftoverCleanups()
    # A grace far longer than the close's wait: only the close's SIGKILL can end the helper in time.
    slow_to_kill = replace(settings, kill_grace_s=60.0)
    await run_codex_turn(_turn(thread, "hello"), slow_to_kill, cleanups=cleanups)
    helpers = running_with(marker)
    assert helpers != []

    await asyncio.wait_for(cleanups.close(0.2), 10.0)

    assert [pid for pid in helpers if process_runs(pid)] == []
    assert cleanups.pending == 0
    assert not _lock_is_held(settings, thread.session_id)


async def test_a_process_left_in_codexs_own_group_is_stopped_after_the_reply(
    tmp_path: Path, codex_settings: CodexRunSettings
) -> None:
    """A stand-in prints a reply and exits 0, leaving a SIGTERM-ignoring child in its group (as a
    plugin sync's `git-remote-https` outlives Codex)."""
    session = str(uuid.uuid4())
    pid_file = tmp_path / "left-pid"
    stand_in = tmp_path / "codex-leaving-a-child"
    stand_in.write_text(
        "#!/bin/bash\n"
        "cat > /dev/null\n"
        "(trap '' TERM; exec sleep 300) < /dev/null > /dev/null 2>&1 &\n"
        'echo $! > "$PID_FILE"\n'
        'echo \'{"type":"thread.started","thread_id":"\'"${@: -2:1}"\'"}\'\n'
        'echo \'{"type":"item.completed","item":{"type":"agent_message","text":"done"}}\'\n'
        'echo \'{"type":"turn.completed"}\'\n'
    )
    stand_in.chmod(0o755)
    settings = replace(
        codex_settings, codex_bin=stand_in, kill_grace_s=KILL_GRACE_S, extra_env={"PID_FILE": str(pid_file)}
    )
    cleanups = LeftoverCleanups()

    result = await run_codex_turn(CodexTurnRequest(session, str(tmp_path), "hi"), settings, cleanups=cleanups)

    assert (result.reply_text, result.exit_code, result.codex_session_id) == ("done", 0, session)
    left = int(pid_file.read_text())
    assert process_runs(left)
    assert _lock_is_held(settings, session)
    assert await cleanups.idle(session, 10.0)
    assert not process_runs(left)
    assert not _lock_is_held(settings, session)


async def test_without_cleanups_the_helpers_are_stopped_before_the_result(
    new_codex_thread: NewCodexThread, patient_settings: tuple[str, CodexRunSettings]
) -> None:
    marker, settings = patient_settings
    thread = await new_codex_thread("start")

    result = await run_codex_turn(_turn(thread, "hello"), settings)

    assert result.reply_text == reply_text("hello")
    assert running_with(marker) == []
    assert not _lock_is_held(settings, thread.session_id)


def _pretend_codex(session: str) -> subprocess.Popen[bytes]:
    """A process whose argv[0] is "codex" with the session among its arguments, as a person's own
    `codex resume <id>` in a terminal has (it only sleeps)."""
    argv = ["codex", "-c", "import time; time.sleep(60)", session]
    return subprocess.Popen(argv, executable=sys.executable)


async def _until_seen(session: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(500):
        if [found.pid for found in codex_processes_using(session)] == [process.pid]:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"the pretend Codex {process.pid} never showed up")


async def test_an_early_look_that_found_another_codex_makes_the_run_thread_busy(
    new_codex_thread: NewCodexThread, codex_settings: CodexRunSettings, demo_model: DemoModelServer
) -> None:
    thread = await new_codex_thread("start")
    sent = len(demo_model.requests_of(thread.session_id))
    other = _pretend_codex(thread.session_id)
    try:
        await _until_seen(thread.session_id, other)
        early = look_ahead(thread.session_id)
        result = await run_codex_turn(_turn(thread, "hello"), codex_settings, early_look=early)
    finally:
        other.kill()
        other.wait(timeout=10)
    assert result.failure_kind is FailureKind.THREAD_BUSY
    busy = f"another Codex process is using thread {thread.session_id} (pid {other.pid}"
    assert result.failure_detail.startswith(busy)
    assert len(demo_model.requests_of(thread.session_id)) == sent


async def test_a_fresh_early_look_stands_for_the_runs_own_look_when_the_lock_is_free_at_once(
    new_codex_thread: NewCodexThread, codex_settings: CodexRunSettings
) -> None:
    """What the early look saw counts then: a pretend Codex started after it is not looked for."""
    thread = await new_codex_thread("start")
    early = look_ahead(thread.session_id)
    assert await early.found == []
    other = _pretend_codex(thread.session_id)
    try:
        await _until_seen(thread.session_id, other)
        trusted = await run_codex_turn(_turn(thread, "early"), codex_settings, early_look=early)
        of_another_thread = look_ahead(str(uuid.uuid4()))
        looked_again = await run_codex_turn(
            _turn(thread, "again"), codex_settings, early_look=of_another_thread
        )
    finally:
        other.kill()
        other.wait(timeout=10)
    assert trusted.reply_text == reply_text("early")
    assert looked_again.failure_kind is FailureKind.THREAD_BUSY


async def test_a_run_that_waited_for_the_lock_looks_again_whatever_the_early_look_found(
    new_codex_thread: NewCodexThread, codex_settings: CodexRunSettings
) -> None:
    thread = await new_codex_thread("start")
    patient = replace(codex_settings, lock_wait_s=10.0)
    early = look_ahead(thread.session_id)
    assert await early.found == []
    other = _pretend_codex(thread.session_id)
    lock = hold_thread_lock(patient.resolved_codex_home(), thread.session_id)
    lock.__enter__()
    try:
        await _until_seen(thread.session_id, other)
        run = asyncio.create_task(run_codex_turn(_turn(thread, "hello"), patient, early_look=early))
        await asyncio.sleep(0.3)
        lock.__exit__(None, None, None)
        result = await run
    finally:
        other.kill()
        other.wait(timeout=10)
    assert result.failure_kind is FailureKind.THREAD_BUSY
    assert f"(pid {other.pid}" in result.failure_detail
