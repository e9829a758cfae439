"""The local agent's default turn runner: one task, one real `codex exec resume` turn.

:func:`codex_run_turn` adapts :func:`~worker.local_agent.codex_exec.run_codex_turn` to the loop's
:data:`~worker.local_agent.outcomes.RunTurn`: the task's `codex_thread_ref` (Codex's session id),
`codex_folder_ref` (where Codex runs) and `instruction_text` (the message, sent on stdin) make
the request; the worker's Codex home, sandbox, stall timeout and turn cap make the run settings;
the loop's cancel event is the runner's `stop`.

The turn is reported as soon as Codex's main process has exited: what Codex left running (its
shell snapshot, a plugin sync) is stopped afterwards in the background, the thread's lock held
until it is gone (:mod:`~worker.local_agent.leftovers`), so the thread's next turn waits for it
(within CHAT_LOCK_WAIT_S). :meth:`CodexTurnRunner.close`, awaited when the local agent stops,
completes those cleanups or kills what is left.

:meth:`CodexTurnRunner.prepare`, which the local agent calls with a claimed task as it sends the
task's StartTask, starts the run's look for other Codex processes on the thread in a worker
thread, so that look overlaps the call instead of delaying Codex's start. Codex itself is only
started by the run, once StartTask has succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from boss.scheduler.v1 import scheduler_pb2

from worker.local_agent.codex_exec import (
    CodexRunSettings,
    CodexTurnRequest,
    CodexTurnResult,
    EarlyLook,
    look_ahead,
    run_codex_turn,
    start_codex_thread,
)
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.local_agent.leftovers import LeftoverCleanups
from worker.local_agent.outcomes import TurnOutcome
from worker.settings import LocalAgentSettings

log = logging.getLogger(__name__)

CHAT_LOCK_WAIT_S = 15.0
"""How long a chat turn waits for its thread while another Boss run (a demo turn, a turn of
another local agent of this machine) holds it, before failing as thread_busy (seconds)."""
EARLY_LOOKS_KEPT_S = 60.0
"""An early look whose task never ran (its StartTask was refused) is dropped after this (seconds)."""
CLEANUP_CLOSE_MARGIN_S = 2.0
"""On stop, how much longer than the kill grace the runs' cleanups may take before what they
stop is SIGKILLed (seconds)."""


def codex_run_settings(codex_home: Path, settings: LocalAgentSettings) -> CodexRunSettings:
    """How the worker runs Codex: its Codex home (`--codex-home`), `--codex-bin` (None: the
        runner's discovery at each run), `--codex-sandbox`, `--task-stall-timeout` and
        `--task-turn-cap` (seconds); approvals never prompt; a thread held by another Boss run is waited
    for up to CHAT_LOCK_WAIT_S."""
    return CodexRunSettings(
        codex_bin=settings.codex_bin,
        codex_home=codex_home,
        sandbox=settings.codex_sandbox,
        stall_timeout_s=settings.stall_timeout_s,
        turn_timeout_s=settings.turn_cap_s,
        lock_wait_s=CHAT_LOCK_WAIT_S,
    )


def outcome_of(result: CodexTurnResult) -> TurnOutcome:
    """The loop's outcome of a Codex run: its reply, or its failure kind and words."""
    if result.succeeded:
        return TurnOutcome.replied(result.reply_text, result.codex_session_id)
    kind = result.failure_kind.value if result.failure_kind is not None else "other"
    return TurnOutcome.failed(kind, result.failure_detail, result.codex_session_id)


class CodexTurnRunner:
    """The local agent's RunTurn: `await runner(task, cancel)` runs one `codex exec resume` turn.

    Args:
        run_settings: how Codex is run (:func:`codex_run_settings`).

    Attributes:
        cleanups: the background stops of what its finished runs left running.
    """

    def __init__(self, run_settings: CodexRunSettings) -> None:
        self.run_settings = run_settings
        self.cleanups = LeftoverCleanups()
        self._early_looks: dict[str, EarlyLook] = {}

    def prepare(self, task: scheduler_pb2.Task) -> None:
        """Starts the look for other Codex processes on the task's thread for its coming run
        (codex_exec.look_ahead); starts nothing else. Call it from the event loop."""
        now = time.monotonic()
        for task_id, look in list(self._early_looks.items()):
            if now - look.started_at > EARLY_LOOKS_KEPT_S:
                del self._early_looks[task_id]
                look.found.cancel()
        if task.codex_thread_ref.strip():
            self._early_looks[task.task_id] = look_ahead(task.codex_thread_ref)

    async def __call__(self, task: scheduler_pb2.Task, cancel: asyncio.Event) -> TurnOutcome:
        """Runs the task's turn (see the module docstring); `cancel` set stops it (interrupted). A
        group's relay target (a dispatch_execution task without codex_thread_ref) starts a new
        Codex thread in the task's folder instead; its outcome carries the new session id."""
        if task.task_type == scheduler_pb2.TASK_TYPE_DISPATCH_EXECUTION and not task.codex_thread_ref.strip():
            started = await start_codex_thread(
                Path(task.codex_folder_ref), task.instruction_text, self.run_settings, stop=cancel
            )
            return outcome_of(started)
        request = CodexTurnRequest(
            codex_thread_ref=task.codex_thread_ref,
            codex_folder_ref=task.codex_folder_ref,
            message=task.instruction_text,
        )
        result = await run_codex_turn(
            request,
            self.run_settings,
            stop=cancel,
            cleanups=self.cleanups,
            early_look=self._early_looks.pop(task.task_id, None),
        )
        return outcome_of(result)

    async def close(self, timeout_s: float | None = None) -> None:
        """Waits for the cleanups still running, at most `timeout_s` seconds (default: the kill
        grace plus CLEANUP_CLOSE_MARGIN_S), then SIGKILLs what they have not stopped yet and waits
        until it is gone (see LeftoverCleanups.close)."""
        if timeout_s is None:
            timeout_s = self.run_settings.kill_grace_s + CLEANUP_CLOSE_MARGIN_S
        await self.cleanups.close(timeout_s)


def codex_run_turn(codex_home: Path, settings: LocalAgentSettings) -> CodexTurnRunner:
    """A RunTurn running each task as one `codex exec resume` turn (see the module docstring).

    Logs once which Codex will run, or, when none is found, that this node's chat tasks will fail
    as could_not_start until Codex is installed (the runner looks again at every turn).
    """
    run_settings = codex_run_settings(codex_home, settings)
    if run_settings.codex_bin is not None:
        log.info("local agent runs Codex at %s (Codex home %s)", run_settings.codex_bin, codex_home)
    else:
        try:
            log.info("local agent runs Codex at %s (Codex home %s)", find_codex_binary(), codex_home)
        except CodexNotFoundError as error:
            log.warning("local agent: %s; chat tasks on this node fail until Codex is installed", error)
    return CodexTurnRunner(run_settings)
