"""Running one turn of a Codex thread with the real Codex CLI: ``codex exec resume --json``.

The one call the local agent needs::

    result = await run_codex_turn(
        CodexTurnRequest(codex_thread_ref=task.codex_thread_ref,
                         codex_folder_ref=task.codex_folder_ref,
                         message=task.instruction_text),
        CodexRunSettings(),          # Codex found as codex_install says; CODEX_HOME or ~/.codex
        stop=cancel_event,           # set it to stop the run: the result is then `interrupted`
    )
    if result.succeeded: ... result.reply_text ...
    else: ... result.failure_kind (FailureKind), result.failure_detail (plain words) ...

It never raises for a run that goes wrong: every way a turn can fail is a :class:`CodexTurnResult`
with a :class:`~worker.local_agent.codex_outcome.FailureKind` (cancelling the calling task is the
exception: the run is killed and ``CancelledError`` propagates).

What a run does (every point observed on Codex 0.169, ``real-codex.md`` §6 and §9):

- refuses at once, without starting Codex, when the folder does not exist (could_not_start), the
  thread ref is not a session id (session_not_found), or the thread is busy (thread_busy: its
  lock under the Codex home is held, or another live process runs Codex on it; see
  :mod:`~worker.local_agent.codex_guard`); the lock is held until the run is over;
- starts ``codex exec resume --json --skip-git-repo-check -c approval_policy="never"
  -c sandbox_mode="<sandbox>" --disable unbounded_connection_retries <thread ref> -`` in the
  thread's folder, in a new session (its own process group), with ``CODEX_HOME`` set. ``exec
  resume`` rejects ``-s/--sandbox``, ``-C/--cd``, ``--color``, ``-a`` and ``--full-auto`` (clap
  exit 2), hence the ``-c`` overrides and the working directory. Without
  ``--disable unbounded_connection_retries`` an unreachable model is retried for ever;
- writes the message to stdin and closes it (an open stdin makes Codex wait for ever);
- reads stdout line by line: no line for ``stall_timeout_s`` is a stall, ``turn_timeout_s`` in
  all is the turn cap, and ``stop`` being set is an interruption; each kills the whole process
  group (SIGTERM, then SIGKILL after ``kill_grace_s``), including descendants that left the group,
  and waits until none is left, so no native ``codex`` outlives the run;
- leaves nothing running after the turn, however it ended: Codex starts some helpers in sessions
  of their own (its shell-environment snapshot runs ``bash -lc`` with the user's ``~/.bashrc``,
  which can take a minute) and does not wait for them when it exits; the process groups Codex's
  descendants moved to are recorded while it runs and stopped afterwards. So a background process
  a command of the turn started is stopped when the turn ends, too;
- keeps the head and tail of stderr (``no rollout found`` is printed there);
- classifies the facts with :func:`~worker.local_agent.codex_outcome.classify_run`.

:func:`create_codex_thread` starts a new thread the same way (``codex exec --json``) and returns
its session id; tests and the demo use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.local_agent.codex_guard import ThreadBusyError, ensure_thread_idle, hold_thread_lock
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.local_agent.codex_outcome import (
    CodexEvents,
    FailureKind,
    RunEnding,
    RunFacts,
    classify_run,
    fold_event,
)
from worker.local_agent.process_group import (
    foreign_groups,
    group_alive,
    kill_group_now,
    stop_group,
    stop_groups,
)

logger = logging.getLogger(__name__)

SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
APPROVAL_POLICIES = ("never", "on-request", "on-failure", "untrusted")
DEFAULT_STALL_TIMEOUT_S = 300.0
DEFAULT_TURN_TIMEOUT_S = 1800.0
DEFAULT_KILL_GRACE_S = 3.0
STDOUT_LINE_LIMIT = 32 * 1024 * 1024
"""Longest stdout line read whole (bytes); an ``agent_message`` or command output can be long."""
STDERR_HEAD_BYTES = 4096
STDERR_TAIL_BYTES = 12288
HELPER_SCAN_INTERVAL_S = 0.1
"""Codex's descendants are looked for at most this often while it prints (seconds)."""
LOCK_RETRY_INTERVAL_S = 0.1
"""How often a run waiting for its thread's lock tries again (seconds)."""
STDERR_DRAIN_TIMEOUT_S = 2.0
"""After the run's processes are gone, how long stderr may take to reach EOF (seconds)."""


@dataclass(frozen=True)
class CodexTurnRequest:
    """One turn to run.

    Attributes:
        codex_thread_ref: Codex's session id of the thread (a UUID, what ``codex exec resume`` takes).
        codex_folder_ref: the thread's working folder on this machine (Codex runs there).
        message: the text sent to the thread, exactly as given.
    """

    codex_thread_ref: str
    codex_folder_ref: str
    message: str


@dataclass(frozen=True)
class CodexRunSettings:
    """How Codex is run on this machine.

    Attributes:
        codex_bin: the Codex binary; None finds it with
            :func:`~worker.local_agent.codex_install.find_codex_binary` (``BOSS_CODEX_BIN``, the
            project's ``.tools/codex``, ``codex`` on PATH).
        codex_home: Codex's home (sessions, config, the thread locks); None is ``$CODEX_HOME``, else
            ``~/.codex``. Codex is started with ``CODEX_HOME`` set to it.
        sandbox: Codex's ``sandbox_mode`` for commands the model runs (one of :data:`SANDBOX_MODES`).
        approval_policy: Codex's ``approval_policy``; "never", so no run waits on a prompt.
        stall_timeout_s: seconds without a stdout line before the run counts as stalled.
        turn_timeout_s: seconds the whole run may take.
        kill_grace_s: seconds between SIGTERM and SIGKILL when a run is stopped.
        lock_wait_s: seconds to wait for the thread's lock while another Boss run holds it (e.g. a
            demo turn of a second or so) before answering thread_busy; 0 answers at once. A Codex
            process of the user's own on the thread is thread_busy at once either way.
        extra_env: variables added to (or replacing) this process's environment for Codex.
        config_overrides: more ``-c key=value`` overrides, passed as given.

    Raises:
        ValueError: an unknown sandbox or approval policy, or a timeout that is not positive.
    """

    codex_bin: Path | None = None
    codex_home: Path | None = None
    sandbox: str = "workspace-write"
    approval_policy: str = "never"
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    lock_wait_s: float = 0.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    config_overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {self.sandbox!r}")
        if self.approval_policy not in APPROVAL_POLICIES:
            raise ValueError(
                f"approval_policy must be one of {', '.join(APPROVAL_POLICIES)}, got {self.approval_policy!r}"
            )
        for name in ("stall_timeout_s", "turn_timeout_s", "kill_grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive (seconds), got {getattr(self, name)}")
        if self.lock_wait_s < 0:
            raise ValueError(f"lock_wait_s must not be negative (seconds), got {self.lock_wait_s}")

    def resolved_codex_home(self) -> Path:
        """The Codex home in force: ``codex_home``, else ``$CODEX_HOME``, else ``~/.codex``."""
        if self.codex_home is not None:
            return self.codex_home
        configured = os.environ.get("CODEX_HOME", "").strip()
        return Path(configured).expanduser() if configured else Path.home() / ".codex"


@dataclass(frozen=True)
class CodexTurnResult:
    """How one turn ended.

    Attributes:
        reply_text: the thread's reply, the text of Codex's last agent message ("" on failure).
        failure_kind: None when it replied, else why not.
        failure_detail: the failure in plain words, for the person ("" on success).
        codex_session_id: the session id Codex reported (``thread.started``), "" when none.
        exit_code: Codex's exit code (negative: the signal that ended it), None when not started.
        duration_s: seconds from just before the start to the end of the run (monotonic clock).
    """

    reply_text: str
    failure_kind: FailureKind | None
    failure_detail: str
    codex_session_id: str
    exit_code: int | None
    duration_s: float

    @property
    def succeeded(self) -> bool:
        """True when the turn ended with a reply."""
        return self.failure_kind is None


class CodexThreadCreationError(Exception):
    """:func:`create_codex_thread` did not get a session; ``result`` says why."""

    def __init__(self, result: CodexTurnResult):
        super().__init__(f"Codex did not create a thread ({result.failure_kind}): {result.failure_detail}")
        self.result = result


def resume_command(codex_bin: Path, thread_ref: str, settings: CodexRunSettings) -> list[str]:
    """The argv that resumes ``thread_ref`` with the message on stdin (see the module docstring)."""
    return [str(codex_bin), "exec", "resume", *_common_options(settings), thread_ref, "-"]


def new_thread_command(codex_bin: Path, settings: CodexRunSettings) -> list[str]:
    """The argv that starts a new thread in the working folder with the message on stdin."""
    return [str(codex_bin), "exec", *_common_options(settings), "-"]


def _common_options(settings: CodexRunSettings) -> list[str]:
    options = [
        "--json",
        "--skip-git-repo-check",
        "-c",
        f"approval_policy={json.dumps(settings.approval_policy)}",
        "-c",
        f"sandbox_mode={json.dumps(settings.sandbox)}",
        "--disable",
        "unbounded_connection_retries",
    ]
    for override in settings.config_overrides:
        options += ["-c", override]
    return options


async def run_codex_turn(
    request: CodexTurnRequest,
    settings: CodexRunSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> CodexTurnResult:
    """Runs one turn of an existing thread and returns its reply or its classified failure.

    Args:
        request: the thread (session id and folder) and the message.
        settings: how to run Codex (defaults: :class:`CodexRunSettings`).
        stop: when set during the run, Codex is killed and the result is ``interrupted``.

    Returns:
        The result; never raises for a failed run (see the module docstring).

    Raises:
        asyncio.CancelledError: the calling task was cancelled (Codex's process group is killed first).
    """
    settings = settings or CodexRunSettings()
    started = time.monotonic()
    thread_ref = request.codex_thread_ref.strip()
    codex_home = settings.resolved_codex_home()
    if not _is_session_id(thread_ref):
        # Codex takes a thread *name* too, and starts a new thread when no thread has that name.
        return _refused(
            FailureKind.SESSION_NOT_FOUND,
            f"{request.codex_thread_ref!r} is not a Codex session id (a UUID)",
            started,
            thread_ref,
        )
    if stop is not None and stop.is_set():
        detail = "the run was stopped before Codex started"
        return _refused(FailureKind.INTERRUPTED, detail, started, thread_ref)
    refusal = _check_folder(request.codex_folder_ref)
    if refusal:
        return _refused(FailureKind.COULD_NOT_START, refusal, started, thread_ref)
    try:
        codex_bin = settings.codex_bin or find_codex_binary()
    except CodexNotFoundError as error:
        return _refused(FailureKind.COULD_NOT_START, str(error), started, thread_ref)
    try:
        with contextlib.ExitStack() as held:
            await _take_thread_lock(held, codex_home, thread_ref, settings.lock_wait_s)
            ensure_thread_idle(thread_ref)
            return await _run(
                resume_command(codex_bin, thread_ref, settings),
                Path(request.codex_folder_ref),
                request.message,
                settings,
                codex_home,
                thread_ref=thread_ref,
                stop=stop,
                started=started,
            )
    except ThreadBusyError as error:
        return _refused(FailureKind.THREAD_BUSY, str(error), started, thread_ref)
    except OSError as error:
        return _refused(FailureKind.COULD_NOT_START, f"cannot take the thread's lock: {error}", started, "")


async def _take_thread_lock(
    held: contextlib.ExitStack, codex_home: Path, thread_ref: str, wait_s: float
) -> None:
    """Takes the thread's lock into `held`, retrying every LOCK_RETRY_INTERVAL_S for up to `wait_s`
    seconds while another run holds it. Raises ThreadBusyError when it is still held then."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            held.enter_context(hold_thread_lock(codex_home, thread_ref))
            return
        except ThreadBusyError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(LOCK_RETRY_INTERVAL_S)


async def create_codex_thread(
    folder: Path,
    first_message: str,
    settings: CodexRunSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> str:
    """Starts a new Codex thread in ``folder`` with ``first_message`` and returns its session id.

    The turn runs like :func:`run_codex_turn`'s (``codex exec --json`` instead of ``exec resume``);
    its session file lands under the Codex home in force.

    Raises:
        CodexThreadCreationError: the turn failed or Codex reported no session; ``.result`` says why.
        asyncio.CancelledError: as :func:`run_codex_turn`.
    """
    settings = settings or CodexRunSettings()
    started = time.monotonic()
    refusal = _check_folder(str(folder))
    if refusal:
        raise CodexThreadCreationError(_refused(FailureKind.COULD_NOT_START, refusal, started, ""))
    try:
        codex_bin = settings.codex_bin or find_codex_binary()
    except CodexNotFoundError as error:
        raise CodexThreadCreationError(
            _refused(FailureKind.COULD_NOT_START, str(error), started, "")
        ) from error
    result = await _run(
        new_thread_command(codex_bin, settings),
        folder,
        first_message,
        settings,
        settings.resolved_codex_home(),
        thread_ref="",
        stop=stop,
        started=started,
    )
    if not result.succeeded or not result.codex_session_id:
        raise CodexThreadCreationError(result)
    return result.codex_session_id


def _is_session_id(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _check_folder(folder: str) -> str:
    if not folder.strip():
        return "the thread has no working folder"
    path = Path(folder)
    if not path.is_dir():
        return f"the thread's folder {folder} does not exist on this machine"
    return ""


def _refused(kind: FailureKind, detail: str, started: float, thread_ref: str) -> CodexTurnResult:
    facts = RunFacts(
        thread_ref, RunEnding.NOT_STARTED, None, CodexEvents(), start_error=detail, start_failure=kind
    )
    verdict = classify_run(facts)
    return CodexTurnResult(
        verdict.reply_text, verdict.failure_kind, verdict.failure_detail, "", None, time.monotonic() - started
    )


async def _run(
    argv: Sequence[str],
    cwd: Path,
    message: str,
    settings: CodexRunSettings,
    codex_home: Path,
    *,
    thread_ref: str,
    stop: asyncio.Event | None,
    started: float,
) -> CodexTurnResult:
    env = {**os.environ, **settings.extra_env, "CODEX_HOME": str(codex_home)}
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            limit=STDOUT_LINE_LIMIT,
        )
    except OSError as error:
        facts = RunFacts(
            thread_ref,
            RunEnding.NOT_STARTED,
            None,
            CodexEvents(),
            start_error=f"Codex could not be started ({argv[0]}): {error.strerror or error}",
        )
        return _result(facts, started)
    logger.debug("started codex pid %d for thread %s", process.pid, thread_ref or "(new)")
    stderr = StderrExcerpt()
    # The message is written while stdout is followed, so a Codex that never reads it counts as stalled.
    writer = asyncio.create_task(_send_message(process, message))
    stderr_reader = asyncio.create_task(_read_stderr(process, stderr))
    helper_groups: set[int] = set()
    try:
        ending, events = await _follow(process, settings, stop, started, helper_groups)
        if ending is RunEnding.EXITED:
            ending = await _wait_exit(process, started + settings.turn_timeout_s, stop)
    except asyncio.CancelledError:
        kill_group_now(process)
        raise
    finally:
        writer.cancel()
        if process.returncode is None or group_alive(process.pid):
            await stop_group(process, settings.kill_grace_s)
        await stop_groups(helper_groups, settings.kill_grace_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(stderr_reader), STDERR_DRAIN_TIMEOUT_S)
        stderr_reader.cancel()
    exit_code = process.returncode
    facts = RunFacts(
        thread_ref,
        ending,
        exit_code,
        events,
        stderr=stderr.text(),
        stall_timeout_s=settings.stall_timeout_s,
        turn_timeout_s=settings.turn_timeout_s,
    )
    result = _result(facts, started)
    logger.info(
        "codex run for thread %s ended %s (exit %s) in %.2f s: %s",
        thread_ref or result.codex_session_id or "(new)",
        ending,
        exit_code,
        result.duration_s,
        result.failure_kind or "reply",
    )
    return result


def _result(facts: RunFacts, started: float) -> CodexTurnResult:
    verdict = classify_run(facts)
    return CodexTurnResult(
        reply_text=verdict.reply_text,
        failure_kind=verdict.failure_kind,
        failure_detail=verdict.failure_detail,
        codex_session_id=facts.events.session_id,
        exit_code=facts.exit_code,
        duration_s=time.monotonic() - started,
    )


async def _send_message(process: asyncio.subprocess.Process, message: str) -> None:
    stdin = process.stdin
    if stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(message.encode("utf-8"))
        await stdin.drain()
    stdin.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await stdin.wait_closed()


async def _follow(
    process: asyncio.subprocess.Process,
    settings: CodexRunSettings,
    stop: asyncio.Event | None,
    started: float,
    helper_groups: set[int],
) -> tuple[RunEnding, CodexEvents]:
    """Reads stdout until EOF, a stall, the turn cap or ``stop``; returns how it ended and what was said.

    On stdout lines (at most every :data:`HELPER_SCAN_INTERVAL_S`) and at EOF, adds to
    ``helper_groups`` the process groups Codex's descendants moved to, so they can be stopped
    after Codex is gone.
    """
    assert process.stdout is not None
    events = CodexEvents()
    deadline = started + settings.turn_timeout_s
    last_line = time.monotonic()
    stop_waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
    reader: asyncio.Future[bytes] | None = None
    scanned = 0.0
    try:
        while True:
            if reader is None:
                reader = asyncio.ensure_future(process.stdout.readline())
            now = time.monotonic()
            wait_s = min(last_line + settings.stall_timeout_s, deadline) - now
            waiting: set[asyncio.Future[Any]] = {reader}
            if stop_waiter is not None:
                waiting.add(stop_waiter)
            done, _ = await asyncio.wait(waiting, timeout=max(wait_s, 0.0), return_when=FIRST_COMPLETED)
            if stop_waiter is not None and stop_waiter in done:
                return RunEnding.INTERRUPTED, events
            if reader in done:
                try:
                    line = reader.result()
                except ValueError:
                    line = b"{}\n"
                reader = None
                now = time.monotonic()
                if not line or now - scanned >= HELPER_SCAN_INTERVAL_S:
                    helper_groups |= foreign_groups(process.pid)
                    scanned = now
                if not line:
                    return RunEnding.EXITED, events
                last_line = now
                events = fold_event(events, line.decode("utf-8", "replace"))
                continue
            if time.monotonic() >= deadline:
                return RunEnding.TIMED_OUT, events
            return RunEnding.STALLED, events
    finally:
        for pending in (reader, stop_waiter):
            if pending is not None and not pending.done():
                pending.cancel()


async def _wait_exit(
    process: asyncio.subprocess.Process, deadline: float, stop: asyncio.Event | None
) -> RunEnding:
    """After stdout's EOF: EXITED when the process exits, TIMED_OUT at ``deadline``, INTERRUPTED on stop."""
    exited = asyncio.ensure_future(process.wait())
    waiting: set[asyncio.Future[Any]] = {exited}
    if stop is not None:
        waiting.add(asyncio.ensure_future(stop.wait()))
    try:
        timeout = max(deadline - time.monotonic(), 0.0)
        await asyncio.wait(waiting, timeout=timeout, return_when=FIRST_COMPLETED)
    finally:
        for pending in waiting:
            pending.cancel()
    if process.returncode is not None:
        return RunEnding.EXITED
    return RunEnding.INTERRUPTED if stop is not None and stop.is_set() else RunEnding.TIMED_OUT


class StderrExcerpt:
    """The first :data:`STDERR_HEAD_BYTES` and the last :data:`STDERR_TAIL_BYTES` of a stream."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._tail = bytearray()
        self._skipped = False

    def feed(self, chunk: bytes) -> None:
        """Adds the next bytes of the stream."""
        room = STDERR_HEAD_BYTES - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        if len(self._tail) > STDERR_TAIL_BYTES:
            del self._tail[: len(self._tail) - STDERR_TAIL_BYTES]
            self._skipped = True

    def text(self) -> str:
        """Head and tail as text ("[…]" marks bytes left out between them)."""
        text = self._head.decode("utf-8", "replace")
        if self._tail:
            text += ("\n[…]\n" if self._skipped else "") + self._tail.decode("utf-8", "replace")
        return text


async def _read_stderr(process: asyncio.subprocess.Process, excerpt: StderrExcerpt) -> None:
    assert process.stderr is not None
    while chunk := await process.stderr.read(65536):
        excerpt.feed(chunk)
