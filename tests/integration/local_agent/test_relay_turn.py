"""A group's relay target through the local agent's turn runner, with the real Codex CLI against
the demo model: a dispatch_execution task without a codex_thread_ref starts a new Codex thread in
the task's folder (`codex exec`, not `exec resume`) and answers its reply with the new session id;
a conversation_reply without one is still refused as session_not_found, starting nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

from boss.scheduler.v1 import scheduler_pb2

from demo_model import DemoModelServer, reply_text
from worker.local_agent.codex_exec import CodexRunSettings
from worker.local_agent.codex_turns import CodexTurnRunner


def task(kind: int, folder: Path, text: str, codex_thread_ref: str = "") -> scheduler_pb2.Task:
    return scheduler_pb2.Task(
        task_id="task-relay-1",
        task_type=kind,  # type: ignore[arg-type]
        codex_folder_ref=str(folder),
        codex_thread_ref=codex_thread_ref,
        instruction_text=text,
        dispatch_plan_id="plan-1",
    )


async def test_a_relay_task_starts_a_new_thread_in_its_folder_and_answers_its_reply(
    tmp_path: Path, codex_settings: CodexRunSettings, codex_home: Path, demo_model: DemoModelServer
) -> None:
    folder = tmp_path / "release-notes"
    folder.mkdir()
    runner = CodexTurnRunner(codex_settings)
    text = "write the release notes"
    try:
        outcome = await runner(
            task(scheduler_pb2.TASK_TYPE_DISPATCH_EXECUTION, folder, text), asyncio.Event()
        )
    finally:
        await runner.close()

    assert outcome.completed and outcome.reply_text == reply_text(text)
    assert outcome.codex_session_id
    [rollout] = sorted((codex_home / "sessions").rglob(f"rollout-*{outcome.codex_session_id}.jsonl"))
    assert str(folder) in rollout.read_text().splitlines()[0]  # the session's cwd: the task's folder
    assert demo_model.requests_of(outcome.codex_session_id)


async def test_a_reply_task_without_a_session_is_still_session_not_found(
    tmp_path: Path, codex_settings: CodexRunSettings, codex_home: Path
) -> None:
    runner = CodexTurnRunner(codex_settings)
    try:
        outcome = await runner(
            task(scheduler_pb2.TASK_TYPE_CONVERSATION_REPLY, tmp_path, "hello"), asyncio.Event()
        )
    finally:
        await runner.close()

    assert outcome.failure_kind == "session_not_found"
    assert not (codex_home / "sessions").exists() or not list(
        (codex_home / "sessions").rglob("rollout-*.jsonl")
    )
