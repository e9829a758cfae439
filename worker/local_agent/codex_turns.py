"""The local agent's default turn runner: one task, one real `codex exec resume` turn.

:func:`codex_run_turn` adapts :func:`~worker.local_agent.codex_exec.run_codex_turn` to the loop's
:data:`~worker.local_agent.outcomes.RunTurn`: the task's `codex_thread_ref` (Codex's session id),
`codex_folder_ref` (where Codex runs) and `instruction_text` (the message, sent on stdin) make
the request; the worker's Codex home, sandbox, stall timeout and turn cap make the run settings;
the loop's cancel event is the runner's `stop`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from boss.scheduler.v1 import scheduler_pb2

from worker.local_agent.codex_exec import CodexRunSettings, CodexTurnRequest, CodexTurnResult, run_codex_turn
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.local_agent.outcomes import RunTurn, TurnOutcome
from worker.settings import LocalAgentSettings

log = logging.getLogger(__name__)

CHAT_LOCK_WAIT_S = 15.0
"""How long a chat turn waits for its thread while another Boss run (a demo turn, a turn of
another local agent of this machine) holds it, before failing as thread_busy (seconds)."""


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


def codex_run_turn(codex_home: Path, settings: LocalAgentSettings) -> RunTurn:
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

    async def run_turn(task: scheduler_pb2.Task, cancel: asyncio.Event) -> TurnOutcome:
        request = CodexTurnRequest(
            codex_thread_ref=task.codex_thread_ref,
            codex_folder_ref=task.codex_folder_ref,
            message=task.instruction_text,
        )
        return outcome_of(await run_codex_turn(request, run_settings, stop=cancel))

    return run_turn
