"""The Codex runner driving the real Codex CLI against the demo model, one test per way a turn ends.

Every test resumes a real thread made by `codex exec` (fixtures in tests/codex_support.py); the
demo model's [[demo:...]] markers produce each failure. After every run that had to be stopped,
no Codex process may be left on the thread.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from demo_model import DemoModelServer, demo_model_environment, reply_text, tool_reply_text, write_codex_home
from demo_model.markers import Failure
from tests.codex_support import TEST_STALL_TIMEOUT_S, TEST_TURN_TIMEOUT_S, CodexThread, NewCodexThread
from worker.local_agent.codex_exec import (
    CodexRunSettings,
    CodexThreadCreationError,
    CodexTurnRequest,
    create_codex_thread,
    resume_command,
    run_codex_turn,
)
from worker.local_agent.codex_guard import codex_processes_using, hold_thread_lock
from worker.local_agent.codex_install import PROJECT_CODEX_DIR
from worker.local_agent.codex_outcome import FailureKind
from worker.local_agent.process_group import foreign_groups, stop_groups


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, codex_bin: Path, demo_model: DemoModelServer
) -> tuple[CodexThread, CodexRunSettings]:
    """One real thread (and its Codex home) for the tests that only need some existing thread."""
    home = tmp_path_factory.mktemp("codex-home")
    write_codex_home(home, demo_model.base_url)
    settings = CodexRunSettings(
        codex_bin=codex_bin,
        codex_home=home,
        extra_env=demo_model_environment(),
        stall_timeout_s=TEST_STALL_TIMEOUT_S,
        turn_timeout_s=TEST_TURN_TIMEOUT_S,
    )
    folder = tmp_path_factory.mktemp("shared-thread")
    return CodexThread(asyncio.run(create_codex_thread(folder, "hello", settings)), folder), settings


def _turn(thread: CodexThread, message: str) -> CodexTurnRequest:
    return CodexTurnRequest(thread.session_id, str(thread.folder), message)


def _is_running(pid: int) -> bool:
    """Alive and not a zombie waiting for init to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def _wait_for_request(server: DemoModelServer, session_id: str, failure: Failure, after: int) -> None:
    """Waits (at most 10 s) until the demo model has received a request of the thread with `failure`,
    beyond the first `after` requests of that thread."""
    for _ in range(1000):
        if any(record.failure is failure for record in server.requests_of(session_id)[after:]):
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"Codex never sent the {failure} request of {session_id}")


async def test_a_turn_returns_the_threads_exact_reply_and_session(
    new_codex_thread: NewCodexThread, codex_settings: CodexRunSettings, demo_model: DemoModelServer
) -> None:
    thread = await new_codex_thread("start the work")
    result = await run_codex_turn(_turn(thread, "what is left to do?"), codex_settings)
    assert result.succeeded
    assert result.reply_text == reply_text("what is left to do?")
    assert result.reply_text == "Demo model (not a real model): you said: what is left to do?"
    assert (result.failure_kind, result.failure_detail) == (None, "")
    assert result.codex_session_id == thread.session_id
    assert result.exit_code == 0
    assert 0 < result.duration_s < 20
    assert [record.user_turns for record in demo_model.requests_of(thread.session_id)] == [1, 2]
    rollouts = list((codex_settings.resolved_codex_home() / "sessions").rglob(f"*{thread.session_id}.jsonl"))
    assert len(rollouts) == 1
    assert "what is left to do?" in rollouts[0].read_text()


async def test_the_message_goes_in_exactly_as_given(shared: tuple[CodexThread, CodexRunSettings]) -> None:
    thread, codex_settings = shared
    message = 'line one\n  line two with ünïcode and `quotes` "here"\n'
    result = await run_codex_turn(_turn(thread, message), codex_settings)
    assert result.reply_text == reply_text(message)


async def test_a_tool_call_runs_in_the_threads_folder(shared: tuple[CodexThread, CodexRunSettings]) -> None:
    thread, codex_settings = shared
    message = "[[demo:shell=touch made-by-codex.txt]] make a file"
    result = await run_codex_turn(_turn(thread, message), codex_settings)
    expected = tool_reply_text(message, "touch made-by-codex.txt", "Process exited with code 0")
    assert result.reply_text == expected
    assert (thread.folder / "made-by-codex.txt").is_file()


async def test_an_unknown_session_is_session_not_found(
    tmp_path: Path, codex_settings: CodexRunSettings
) -> None:
    missing = str(uuid.uuid4())
    result = await run_codex_turn(CodexTurnRequest(missing, str(tmp_path), "hello"), codex_settings)
    assert result.failure_kind is FailureKind.SESSION_NOT_FOUND
    assert result.failure_detail == (
        f"this machine's Codex has no session {missing} (no rollout file for it in its Codex home)"
    )
    assert result.exit_code == 1 and result.codex_session_id == ""


async def test_a_thread_name_instead_of_an_id_is_refused_before_codex_starts_a_new_thread(
    tmp_path: Path, codex_settings: CodexRunSettings, demo_model: DemoModelServer
) -> None:
    before = len(demo_model.requests)
    result = await run_codex_turn(CodexTurnRequest("my-thread", str(tmp_path), "hello"), codex_settings)
    assert result.failure_kind is FailureKind.SESSION_NOT_FOUND
    assert result.exit_code is None
    assert len(demo_model.requests) == before
    assert not (codex_settings.resolved_codex_home() / "sessions").exists()


async def test_a_held_thread_lock_is_thread_busy_and_codex_is_not_run(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    sent = len(demo_model.requests_of(thread.session_id))
    with hold_thread_lock(codex_settings.resolved_codex_home(), thread.session_id):
        result = await run_codex_turn(_turn(thread, "hello"), codex_settings)
    assert result.failure_kind is FailureKind.THREAD_BUSY
    assert "lock" in result.failure_detail and result.exit_code is None
    assert len(demo_model.requests_of(thread.session_id)) == sent
    after = await run_codex_turn(_turn(thread, "hello"), codex_settings)
    assert after.succeeded


async def test_a_run_waits_for_a_lock_another_run_releases_within_its_lock_wait(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    patient = replace(codex_settings, lock_wait_s=10.0)
    sent = len(demo_model.requests_of(thread.session_id))
    lock = hold_thread_lock(patient.resolved_codex_home(), thread.session_id)
    lock.__enter__()
    run = asyncio.create_task(run_codex_turn(_turn(thread, "after the demo turn"), patient))
    await asyncio.sleep(0.5)
    assert not run.done() and len(demo_model.requests_of(thread.session_id)) == sent
    lock.__exit__(None, None, None)
    result = await run
    assert result.succeeded, result.failure_detail
    assert result.reply_text == reply_text("after the demo turn")


async def test_another_codex_process_on_the_thread_is_thread_busy(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    assert codex_settings.codex_bin is not None
    sent = len(demo_model.requests_of(thread.session_id))
    other = await asyncio.create_subprocess_exec(
        *resume_command(codex_settings.codex_bin, thread.session_id, codex_settings),
        cwd=thread.folder,
        env={**os.environ, **codex_settings.extra_env, "CODEX_HOME": str(codex_settings.codex_home)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert other.stdin is not None
        other.stdin.write(b"[[demo:stall]] someone else's turn")
        other.stdin.close()
        await _wait_for_request(demo_model, thread.session_id, Failure.STALL, after=sent)
        result = await run_codex_turn(_turn(thread, "hello"), codex_settings)
    finally:
        helpers = foreign_groups(other.pid)
        os.killpg(other.pid, signal.SIGKILL)
        await other.wait()
        await stop_groups(helpers, 1.0)
    assert result.failure_kind is FailureKind.THREAD_BUSY
    busy = f"another Codex process is using thread {thread.session_id} (pid "
    assert result.failure_detail.startswith(busy)
    assert [record.failure for record in demo_model.requests_of(thread.session_id)[sent:]] == [Failure.STALL]


async def test_an_unset_api_key_variable_is_not_logged_in(
    shared: tuple[CodexThread, CodexRunSettings],
) -> None:
    thread, codex_settings = shared
    assert "BOSS_DEMO_MODEL_API_KEY" not in os.environ
    result = await run_codex_turn(_turn(thread, "hello"), replace(codex_settings, extra_env={}))
    assert result.failure_kind is FailureKind.NOT_LOGGED_IN
    assert result.failure_detail == (
        "Codex has no API key: the environment variable BOSS_DEMO_MODEL_API_KEY its model provider reads "
        "is not set for the local agent"
    )


async def test_a_refused_api_key_is_not_logged_in(shared: tuple[CodexThread, CodexRunSettings]) -> None:
    thread, codex_settings = shared
    result = await run_codex_turn(_turn(thread, "[[demo:http401]]"), codex_settings)
    assert result.failure_kind is FailureKind.NOT_LOGGED_IN
    assert "401 Unauthorized" in result.failure_detail


@pytest.mark.parametrize(
    ("marker", "detail"),
    [
        ("[[demo:http500]]", "the model failed: We\u2019re currently experiencing high demand"),
        ("[[demo:http400]]", "the model failed: Demo model (not a real model): HTTP 400 on purpose"),
        ("[[demo:http429]]", "the model failed: exceeded retry limit, last status: 429 Too Many Requests"),
        ("[[demo:response_failed]]", "the model failed: stream disconnected before completion: Demo model"),
    ],
)
async def test_model_failures_are_model_errors_in_plain_words(
    shared: tuple[CodexThread, CodexRunSettings], marker: str, detail: str
) -> None:
    thread, codex_settings = shared
    result = await run_codex_turn(_turn(thread, f"please {marker}"), codex_settings)
    assert result.failure_kind is FailureKind.MODEL_ERROR
    assert result.failure_detail.startswith(detail)
    assert result.exit_code == 1 and result.codex_session_id == thread.session_id


async def test_a_response_without_a_message_is_no_reply(shared: tuple[CodexThread, CodexRunSettings]) -> None:
    thread, codex_settings = shared
    result = await run_codex_turn(_turn(thread, "[[demo:no_reply]]"), codex_settings)
    assert result.failure_kind is FailureKind.NO_REPLY
    assert result.exit_code == 0 and result.reply_text == ""


async def test_a_stalled_model_is_stalled_and_codex_is_killed(
    shared: tuple[CodexThread, CodexRunSettings],
) -> None:
    thread, codex_settings = shared
    settings = replace(codex_settings, stall_timeout_s=1.0)
    result = await run_codex_turn(_turn(thread, "[[demo:stall]]"), settings)
    assert result.failure_kind is FailureKind.STALLED
    assert result.failure_detail == "Codex showed no progress for 1 s, so the run was stopped"
    assert result.exit_code == -signal.SIGTERM
    assert codex_processes_using(thread.session_id) == []
    assert (await run_codex_turn(_turn(thread, "after the stall"), codex_settings)).succeeded


async def test_a_slow_model_past_the_turn_cap_is_timed_out(
    shared: tuple[CodexThread, CodexRunSettings],
) -> None:
    thread, codex_settings = shared
    settings = replace(codex_settings, turn_timeout_s=1.0)
    result = await run_codex_turn(_turn(thread, "[[demo:slow=20]] take your time"), settings)
    assert result.failure_kind is FailureKind.TIMED_OUT
    assert result.failure_detail.startswith("the turn was still running after 1 s (the turn cap)")
    assert result.duration_s < 10
    assert codex_processes_using(thread.session_id) == []


async def test_a_slow_model_within_the_limits_replies(shared: tuple[CodexThread, CodexRunSettings]) -> None:
    thread, codex_settings = shared
    result = await run_codex_turn(_turn(thread, "[[demo:slow=0.5]] hi"), codex_settings)
    assert result.reply_text == reply_text("[[demo:slow=0.5]] hi")


async def test_setting_stop_interrupts_the_run(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    sent = len(demo_model.requests_of(thread.session_id))
    stop = asyncio.Event()
    run = asyncio.create_task(run_codex_turn(_turn(thread, "[[demo:stall]]"), codex_settings, stop=stop))
    await _wait_for_request(demo_model, thread.session_id, Failure.STALL, after=sent)
    stop.set()
    result = await run
    assert result.failure_kind is FailureKind.INTERRUPTED
    assert result.codex_session_id == thread.session_id
    assert codex_processes_using(thread.session_id) == []


async def test_a_stop_set_before_the_start_runs_nothing(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    sent = len(demo_model.requests_of(thread.session_id))
    stop = asyncio.Event()
    stop.set()
    result = await run_codex_turn(_turn(thread, "hello"), codex_settings, stop=stop)
    assert result.failure_kind is FailureKind.INTERRUPTED and result.exit_code is None
    assert len(demo_model.requests_of(thread.session_id)) == sent


async def test_cancelling_the_caller_kills_codex_and_frees_the_thread(
    shared: tuple[CodexThread, CodexRunSettings], demo_model: DemoModelServer
) -> None:
    thread, codex_settings = shared
    sent = len(demo_model.requests_of(thread.session_id))
    run = asyncio.create_task(run_codex_turn(_turn(thread, "[[demo:stall]]"), codex_settings))
    await _wait_for_request(demo_model, thread.session_id, Failure.STALL, after=sent)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert codex_processes_using(thread.session_id) == []
    assert (await run_codex_turn(_turn(thread, "again"), codex_settings)).succeeded


async def test_killing_a_run_through_the_npm_wrapper_leaves_no_native_codex(
    shared: tuple[CodexThread, CodexRunSettings],
) -> None:
    wrapper = PROJECT_CODEX_DIR / "node_modules" / ".bin" / "codex"
    if not wrapper.is_file():
        pytest.fail(f"the npm wrapper {wrapper} is missing: run `make codex`", pytrace=False)
    thread, codex_settings = shared
    settings = replace(codex_settings, codex_bin=wrapper, stall_timeout_s=1.5)
    result = await run_codex_turn(_turn(thread, "[[demo:stall]]"), settings)
    assert result.failure_kind is FailureKind.STALLED
    assert codex_processes_using(thread.session_id) == []


async def test_a_run_that_ignores_sigterm_is_killed_with_its_strays(
    tmp_path: Path, codex_settings: CodexRunSettings
) -> None:
    """The kill path itself, with a stand-in that ignores SIGTERM and starts a child in its own
    session (what no real Codex run could be made to do on purpose)."""
    pid_file = tmp_path / "pids"
    stand_in = tmp_path / "stubborn-codex"
    stand_in.write_text(
        "#!/bin/bash\n"
        "trap '' TERM\n"
        'sleep 300 & echo $! >> "$PID_FILE"\n'
        'setsid sleep 300 & echo $! >> "$PID_FILE"\n'
        'echo $$ >> "$PID_FILE"\n'
        "cat > /dev/null\n"
        "wait\n"
    )
    stand_in.chmod(0o755)
    settings = replace(
        codex_settings,
        codex_bin=stand_in,
        stall_timeout_s=0.5,
        kill_grace_s=0.5,
        extra_env={"PID_FILE": str(pid_file)},
    )
    result = await run_codex_turn(CodexTurnRequest(str(uuid.uuid4()), str(tmp_path), "hi"), settings)
    assert result.failure_kind is FailureKind.STALLED
    assert result.exit_code == -signal.SIGKILL
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 3
    assert [pid for pid in pids if _is_running(pid)] == []


async def test_helpers_codex_leaves_in_sessions_of_their_own_are_stopped_after_the_turn(
    shared: tuple[CodexThread, CodexRunSettings], tmp_path: Path
) -> None:
    """Codex snapshots the shell with `bash -lc`, sourcing ~/.bashrc, in a session of its own, and
    does not wait for it; a slow ~/.bashrc would outlive the turn."""
    thread, codex_settings = shared
    marker = f"slow-bashrc-{uuid.uuid4()}"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(f'"{sys.executable}" -c "import time; time.sleep(60)" {marker}\n')
    settings = replace(codex_settings, extra_env={**codex_settings.extra_env, "HOME": str(home)})
    result = await run_codex_turn(_turn(thread, "hello"), settings)
    assert result.succeeded
    assert [pid for pid in _pids_mentioning(marker) if _is_running(pid)] == []


async def test_a_missing_binary_could_not_start(
    shared: tuple[CodexThread, CodexRunSettings], tmp_path: Path
) -> None:
    thread, codex_settings = shared
    missing = tmp_path / "no-such-codex"
    result = await run_codex_turn(_turn(thread, "hello"), replace(codex_settings, codex_bin=missing))
    assert result.failure_kind is FailureKind.COULD_NOT_START
    assert result.failure_detail == f"Codex could not be started ({missing}): No such file or directory"


async def test_a_missing_folder_could_not_start(
    shared: tuple[CodexThread, CodexRunSettings], tmp_path: Path
) -> None:
    thread, codex_settings = shared
    gone = tmp_path / "moved-away"
    result = await run_codex_turn(CodexTurnRequest(thread.session_id, str(gone), "hello"), codex_settings)
    assert result.failure_kind is FailureKind.COULD_NOT_START
    assert result.failure_detail == f"the thread's folder {gone} does not exist on this machine"


async def test_creating_a_thread_that_fails_raises_with_the_result(
    tmp_path: Path, codex_settings: CodexRunSettings
) -> None:
    with pytest.raises(CodexThreadCreationError) as raised:
        await create_codex_thread(tmp_path, "[[demo:http500]]", codex_settings)
    assert raised.value.result.failure_kind is FailureKind.MODEL_ERROR


async def test_a_message_larger_than_the_pipe_goes_in_whole(
    shared: tuple[CodexThread, CodexRunSettings],
) -> None:
    """Longer than a pipe's 64 KiB: the rest is sent while Codex reads, stdin closed after it."""
    thread, codex_settings = shared
    message = "".join(f"line {number:06d} of a long message\n" for number in range(3_000))
    assert len(message.encode()) > 65_536
    result = await run_codex_turn(_turn(thread, message), codex_settings)
    assert result.reply_text == reply_text(message)
