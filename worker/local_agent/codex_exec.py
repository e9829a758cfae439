"""Running one turn of a Codex thread with the real Codex CLI: ``codex exec resume --json``.

The one call the local agent needs::

    result = await run_codex_turn(
        CodexTurnRequest(codex_thread_ref=task.codex_thread_ref,
                         codex_folder_ref=task.codex_folder_ref,
                         message=task.instruction_text),
        CodexRunSettings(),          # Codex found as codex_install says; CODEX_HOME or ~/.codex
        stop=cancel_event,           # set it to stop the run: the result is then `interrupted`
        cleanups=cleanups,           # optional: stop what Codex left running after returning
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
  :mod:`~worker.local_agent.codex_guard`); the lock is held until the run is over. The look for
  other Codex processes reads every process's command line; the local agent starts it early
  (:func:`look_ahead`, while its StartTask call is on its way) and the run takes what it found
  when the lock was free at once, else it looks once more after taking the lock;
- starts ``codex exec resume --json --skip-git-repo-check -c approval_policy="never"
  -c sandbox_mode="<sandbox>" --disable unbounded_connection_retries <thread ref> -`` in the
  thread's folder, in a new session (its own process group), with ``CODEX_HOME`` set. ``exec
  resume`` rejects ``-s/--sandbox``, ``-C/--cd``, ``--color``, ``-a`` and ``--full-auto`` (clap
  exit 2), hence the ``-c`` overrides and the working directory. Without
  ``--disable unbounded_connection_retries`` an unreachable model is retried for ever. On Linux
  Codex starts under ``setpriv --pdeathsig KILL`` (:func:`parent_death_prefix`): a worker killed
  outright takes its Codex runs with it;
- writes the message to stdin and closes it (an open stdin makes Codex wait for ever);
- reads stdout line by line: no line for ``stall_timeout_s`` is a stall, ``turn_timeout_s`` in
  all is the turn cap, and ``stop`` being set is an interruption; each kills the whole process
  group (SIGTERM, then SIGKILL after ``kill_grace_s``), including descendants that left the group,
  and waits until none is left, so no native ``codex`` outlives the run;
- leaves nothing running after the turn, however it ended: Codex starts some helpers in sessions
  of their own (its shell-environment snapshot runs ``bash -lc`` with the user's ``~/.bashrc``,
  which can take a minute) and does not wait for them when it exits, and a plugin sync's
  ``git-remote-https`` can outlive it in its own group; the process groups Codex's descendants
  moved to are recorded while it runs and stopped afterwards
  (:mod:`~worker.local_agent.leftovers`). So a background process a command of the turn started
  is stopped when the turn ends, too. Without ``cleanups`` that happens before the result is
  returned; with a :class:`~worker.local_agent.leftovers.LeftoverCleanups` the result is returned
  as soon as Codex's main process has exited and its output is parsed, and the leftovers are
  stopped in the background, the thread's lock held until they are gone (the thread's next run
  through the same ``cleanups`` waits for that, within its ``lock_wait_s``);
- keeps the head and tail of stderr (``no rollout found`` is printed there);
- classifies the facts with :func:`~worker.local_agent.codex_outcome.classify_run`.

:func:`start_codex_thread` starts a new thread the same way (``codex exec --json``) and returns
its first turn's result (the local agent runs a group's relay target so); :func:`create_codex_thread`
returns just its session id (tests and the demo use it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.local_agent.codex_guard import (
    CodexProcess,
    ThreadBusyError,
    codex_processes_using,
    ensure_thread_idle,
    hold_thread_lock,
)
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.local_agent.codex_outcome import (
    CodexEvents,
    FailureKind,
    RunEnding,
    RunFacts,
    classify_run,
    fold_event,
)
from worker.local_agent.descendant_watch import DescendantWatch
from worker.local_agent.leftovers import LeftoverCleanups, Leftovers
from worker.local_agent.process_group import stop_group

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
EXIT_POLL_INTERVAL_S = 0.05
"""After stdout's EOF, how often Codex's exit status is looked at besides waiting for it (seconds)."""
LOCK_RETRY_INTERVAL_S = 0.1
"""How often a run waiting for its thread's lock tries again (seconds)."""
EARLY_LOOK_MAX_AGE_S = 1.0
"""An early look for other Codex processes on the thread older than this is done again (seconds)."""
STDERR_DRAIN_TIMEOUT_S = 0.25
"""After Codex's main process has exited, how long stderr may take to reach EOF before the run
is judged on what it said so far (seconds; Codex's helpers write into pipes of their own, so
stderr is normally at EOF by then)."""


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
class EarlyLook:
    """A look for other Codex processes on a thread, started ahead of its run (:func:`look_ahead`).

    Attributes:
        thread_ref: the thread's session id.
        started_at: when the look started (monotonic seconds).
        found: what :func:`~worker.local_agent.codex_guard.codex_processes_using` found; None when
            it failed (the run looks again).
    """

    thread_ref: str
    started_at: float
    found: asyncio.Future[list[CodexProcess] | None]


def look_ahead(thread_ref: str) -> EarlyLook:
    """Starts looking, in a worker thread, for other Codex processes running ``thread_ref``, for a
    run of it about to start (:func:`run_codex_turn`'s ``early_look``): the local agent starts it
    while its StartTask call is on its way, so the look costs the turn nothing. Needs a running
    event loop."""
    thread_ref = thread_ref.strip()
    return EarlyLook(thread_ref, time.monotonic(), asyncio.ensure_future(_look(thread_ref)))


async def _look(thread_ref: str) -> list[CodexProcess] | None:
    try:
        return await asyncio.to_thread(codex_processes_using, thread_ref)
    except Exception:
        logger.exception("the early look for Codex processes on thread %s failed", thread_ref)
        return None


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


SETPRIV = "/usr/bin/setpriv"
"""util-linux's setpriv, which sets the parent-death signal and then executes the command in place."""


def parent_death_prefix(program: str, setpriv: str = SETPRIV) -> list[str]:
    """The argv prefix that makes Codex die with the worker: ``setpriv --pdeathsig KILL --``, so the
    kernel SIGKILLs Codex (the same process after the exec, same pid and process group) when the
    worker that started it dies, even by SIGKILL, instead of leaving the turn running unowned.

    Empty where that cannot work: not Linux (``prctl(PR_SET_PDEATHSIG)`` is Linux's), no setpriv,
    or `program` not an executable file (then Codex is started directly, so a missing binary
    still fails to start as could_not_start). The signal reaches the process setpriv becomes; for
    the npm wrapper (a node script) that is node, not the native binary it starts, which is why
    :func:`~worker.local_agent.codex_install.find_codex_binary` prefers the native binary.
    """
    if not sys.platform.startswith("linux") or not os.access(setpriv, os.X_OK):
        return []
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return []
    return [setpriv, "--pdeathsig", "KILL", "--"]


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
    cleanups: LeftoverCleanups | None = None,
    early_look: EarlyLook | None = None,
) -> CodexTurnResult:
    """Runs one turn of an existing thread and returns its reply or its classified failure.

    Args:
        request: the thread (session id and folder) and the message.
        settings: how to run Codex (defaults: :class:`CodexRunSettings`).
        stop: when set during the run, Codex is killed and the result is ``interrupted``.
        cleanups: where to stop what Codex left running once it has exited, in the background
            and holding the thread's lock until it is gone; None stops it before returning.
            Runs sharing one ``cleanups`` wait for a thread's cleanup as for its lock.
        early_look: a look for other Codex processes on the thread started ahead of the run
            (:func:`look_ahead`); used instead of looking once more when the thread's lock was
            free at once and the look is at most EARLY_LOOK_MAX_AGE_S old.

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
            waited = await _take_thread_lock(held, codex_home, thread_ref, settings.lock_wait_s, cleanups)
            ensure_thread_idle(thread_ref, None if waited else await _early_found(early_look, thread_ref))
            result, leftovers = await _run(
                resume_command(codex_bin, thread_ref, settings),
                Path(request.codex_folder_ref),
                request.message,
                settings,
                codex_home,
                thread_ref=thread_ref,
                stop=stop,
                started=started,
            )
            if cleanups is None:
                await leftovers.stop()
            else:
                cleanups.start(thread_ref, leftovers, held.pop_all())
            return result
    except ThreadBusyError as error:
        return _refused(FailureKind.THREAD_BUSY, str(error), started, thread_ref)
    except OSError as error:
        return _refused(FailureKind.COULD_NOT_START, f"cannot take the thread's lock: {error}", started, "")


async def _take_thread_lock(
    held: contextlib.ExitStack,
    codex_home: Path,
    thread_ref: str,
    wait_s: float,
    cleanups: LeftoverCleanups | None,
) -> bool:
    """Takes the thread's lock into `held`, for up to `wait_s` seconds waiting for a cleanup of
    the thread in `cleanups` and retrying every LOCK_RETRY_INTERVAL_S while another run holds it.
    Returns whether it had to wait. Raises ThreadBusyError when it is still held then."""
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        if cleanups is not None and not await cleanups.idle(thread_ref, 0.0):
            waited = True
            await cleanups.idle(thread_ref, deadline - time.monotonic())
        try:
            held.enter_context(hold_thread_lock(codex_home, thread_ref))
            return waited
        except ThreadBusyError:
            if time.monotonic() >= deadline:
                raise
            waited = True
            await asyncio.sleep(LOCK_RETRY_INTERVAL_S)


async def _early_found(early_look: EarlyLook | None, thread_ref: str) -> list[CodexProcess] | None:
    """What `early_look` found, when it is of this thread and fresh; None: look again now."""
    if early_look is None or early_look.thread_ref != thread_ref:
        return None
    if time.monotonic() - early_look.started_at > EARLY_LOOK_MAX_AGE_S:
        early_look.found.cancel()
        return None
    return await early_look.found


async def start_codex_thread(
    folder: Path,
    first_message: str,
    settings: CodexRunSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> CodexTurnResult:
    """Starts a new Codex thread in ``folder`` with ``first_message`` as its first turn and returns
    the turn's result (its reply, and the new thread's ``codex_session_id``), or its classified
    failure; never raises for a failed run.

    The turn runs like :func:`run_codex_turn`'s (``codex exec --json`` instead of ``exec resume``;
    no thread lock, the thread is new), what it left running stopped before returning; its session
    file lands under the Codex home in force.

    Raises:
        asyncio.CancelledError: as :func:`run_codex_turn`.
    """
    settings = settings or CodexRunSettings()
    started = time.monotonic()
    if stop is not None and stop.is_set():
        return _refused(FailureKind.INTERRUPTED, "the run was stopped before Codex started", started, "")
    refusal = _check_folder(str(folder))
    if refusal:
        return _refused(FailureKind.COULD_NOT_START, refusal, started, "")
    try:
        codex_bin = settings.codex_bin or find_codex_binary()
    except CodexNotFoundError as error:
        return _refused(FailureKind.COULD_NOT_START, str(error), started, "")
    result, leftovers = await _run(
        new_thread_command(codex_bin, settings),
        folder,
        first_message,
        settings,
        settings.resolved_codex_home(),
        thread_ref="",
        stop=stop,
        started=started,
    )
    await leftovers.stop()
    return result


async def create_codex_thread(
    folder: Path,
    first_message: str,
    settings: CodexRunSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> str:
    """Starts a new Codex thread in ``folder`` with ``first_message`` and returns its session id
    (:func:`start_codex_thread`).

    Raises:
        CodexThreadCreationError: the turn failed or Codex reported no session; ``.result`` says why.
        asyncio.CancelledError: as :func:`run_codex_turn`.
    """
    result = await start_codex_thread(folder, first_message, settings, stop=stop)
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
) -> tuple[CodexTurnResult, Leftovers]:
    """Runs Codex once; returns its result as soon as its main process has exited (stopped first
    when the run was), and what it may have left running, for the caller to stop. Cancelled, it
    kills everything and waits until it is gone before raising."""
    env = {**os.environ, **settings.extra_env, "CODEX_HOME": str(codex_home)}
    try:
        process = await asyncio.create_subprocess_exec(
            *parent_death_prefix(argv[0]),
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
        return _result(facts, started), Leftovers(None, frozenset(), settings.kill_grace_s)
    # Codex starts the turn once stdin is closed: the message goes out before anything else here,
    # and whatever the pipe does not take at once while stdout is followed, so a Codex that never
    # reads it counts as stalled.
    writer = asyncio.create_task(_send_message(process, _written(process, message)))
    logger.debug("started codex pid %d for thread %s", process.pid, thread_ref or "(new)")
    stderr = StderrExcerpt()
    stderr_reader = asyncio.create_task(_read_stderr(process, stderr))
    helper_groups: set[int] = set()
    leftovers = Leftovers(process, frozenset(), settings.kill_grace_s, (writer, stderr_reader))
    try:
        ending, events = await _follow(process, settings, stop, started, helper_groups)
        if ending is RunEnding.EXITED:
            ending = await _wait_exit(process, started + settings.turn_timeout_s, stop)
        leftovers.helper_groups = frozenset(helper_groups)
        if process.returncode is None:
            # Stalled, past the turn cap or stopped: Codex itself is gone before its result is.
            await stop_group(process, settings.kill_grace_s)
        writer.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STDERR_DRAIN_TIMEOUT_S):
                await asyncio.shield(stderr_reader)
    except BaseException:
        leftovers.helper_groups = frozenset(helper_groups)
        await leftovers.kill()
        raise
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
    return result, leftovers


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


def _written(process: asyncio.subprocess.Process, message: str) -> bool:
    """Writes the message to Codex's stdin and closes it, without waiting: the pipe takes what
    it can at once, the event loop sends the rest and then closes it. False when stdin is gone."""
    stdin = process.stdin
    if stdin is None:
        return False
    try:
        stdin.write(message.encode("utf-8"))
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


async def _send_message(process: asyncio.subprocess.Process, written: bool) -> None:
    """Waits until the stdin :func:`_written` wrote to is flushed and closed."""
    stdin = process.stdin
    if stdin is None or not written:
        return
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
    after Codex is gone (a :class:`~worker.local_agent.descendant_watch.DescendantWatch`: each
    look reads only the processes that can have changed since the previous one).
    """
    assert process.stdout is not None
    events = CodexEvents()
    deadline = started + settings.turn_timeout_s
    last_line = time.monotonic()
    stop_waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
    reader: asyncio.Future[bytes] | None = None
    watch = DescendantWatch(process.pid)
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
                    helper_groups |= watch.foreign_groups()
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
    """After stdout's EOF: EXITED when the process exits, TIMED_OUT at ``deadline``, INTERRUPTED on stop.

    ``process.wait()`` answers only once stderr is closed too, which a process Codex left behind
    could delay: its exit status is also looked at every EXIT_POLL_INTERVAL_S."""
    waiting: set[asyncio.Future[Any]] = {
        asyncio.ensure_future(process.wait()),
        asyncio.ensure_future(_returncode_set(process)),
    }
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


async def _returncode_set(process: asyncio.subprocess.Process) -> None:
    while process.returncode is None:
        await asyncio.sleep(EXIT_POLL_INTERVAL_S)


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
