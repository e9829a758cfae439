"""The local agent with its real Codex runner, end to end through the real scheduler.

A task requested on conversations' stream is claimed by the worker's local agent, which runs the
REAL Codex CLI (`codex exec resume`) against Boss's built-in demo model (not a real model; fixtures
in tests/codex_support.py), heartbeats, and finishes the task with Codex's reply or its classified
failure, on SQLite and PostgreSQL. The last test runs `python -m worker run` as a process and
stops it mid-turn: with SIGTERM the task ends interrupted, with SIGKILL the scheduler fails it as
device_lost once its lease runs out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import BinaryIO

import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb

from demo_model import reply_text
from demo_model.codex_home import ENV_KEY, demo_model_environment
from services.scheduler.tasks.model import TaskSettings
from tests.codex_support import NewCodexThread
from tests.conftest import REPOSITORY_ROOT, DatabaseTarget
from tests.integration.local_agent.test_codex_leftovers import process_runs, running_with, stubborn_bashrc
from tests.integration.worker_runtime.support import eventually
from tests.integration.worker_runtime.test_local_agent_loop import (
    NODE,
    WORKER,
    SchedulerUnderTest,
    free_port,
    scheduler_for,
)
from worker.local_agent.agent_loop import LocalAgent
from worker.local_agent.codex_guard import codex_processes_using
from worker.local_agent.codex_turns import codex_run_turn
from worker.settings import LocalAgentSettings

LEASES = TaskSettings(
    claim_lease=timedelta(seconds=5), run_lease=timedelta(seconds=15), sweep_interval=timedelta(seconds=0.2)
)
"""Leases long enough that a loaded machine never loses a live agent's run (a turn ends by its own
outcome in these tests, not by the sweeper)."""
SHORT_LEASES = TaskSettings(
    claim_lease=timedelta(seconds=5), run_lease=timedelta(seconds=3), sweep_interval=timedelta(seconds=0.2)
)
"""Leases for the test whose killed worker's run must be failed as device_lost soon."""


@pytest.fixture(autouse=True)
def _demo_model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment carries the demo model's key, as `make run` gives it."""
    monkeypatch.setenv(ENV_KEY, demo_model_environment()[ENV_KEY])


def codex_agent(
    scheduler: SchedulerUnderTest,
    codex_home: Path,
    codex_bin: Path,
    *,
    stall_timeout_s: float = 10.0,
    kill_grace_s: float | None = None,
    close_timeout_s: float | None = None,
) -> LocalAgent:
    """The worker's local agent as `python -m worker run` builds it, Codex runner included (each
    turn prepared while its task is started; the cleanups of what Codex left running completed
    when the agent stops)."""
    settings = LocalAgentSettings(
        scheduler_address=scheduler.address,
        codex_bin=codex_bin,
        stall_timeout_s=stall_timeout_s,
        turn_cap_s=30.0,
        max_concurrent_tasks=2,
    )
    runner = codex_run_turn(codex_home, settings)
    if kill_grace_s is not None:
        runner.run_settings = replace(runner.run_settings, kill_grace_s=kill_grace_s)
    return LocalAgent(
        scheduler_address=scheduler.address,
        token=scheduler.token,
        worker_id=WORKER,
        node_id=NODE,
        run_turn=runner,
        claim_wait_s=5.0,
        on_stopped=partial(runner.close, close_timeout_s),
        prepare_turn=runner.prepare,
    )


async def run_until_finished(
    scheduler: SchedulerUnderTest, agent: LocalAgent, *task_ids: str
) -> list[pb.Task]:
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        for task_id in task_ids:
            await eventually(partial(scheduler.is_terminal, task_id), timeout=40, what=f"{task_id} to end")
    finally:
        stop.set()
        await asyncio.wait_for(running, 20)
    return [await scheduler.get(task_id) for task_id in task_ids]


async def test_a_message_is_answered_by_real_codex_through_the_scheduler(
    database_target: DatabaseTarget, new_codex_thread: NewCodexThread, codex_home: Path, codex_bin: Path
) -> None:
    thread = await new_codex_thread("start the work")
    async with scheduler_for(database_target, LEASES) as scheduler:
        await scheduler.request(
            "task-codex-1",
            "what is left to do?",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        await scheduler.request(
            "task-codex-2",
            "and after that?",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        first, second = await run_until_finished(
            scheduler, codex_agent(scheduler, codex_home, codex_bin), "task-codex-1", "task-codex-2"
        )

    assert (first.status, first.reply_text, first.codex_session_id) == (
        pb.TASK_STATUS_COMPLETED,
        "Demo model (not a real model): you said: what is left to do?",
        thread.session_id,
    )
    assert (second.status, second.reply_text) == (pb.TASK_STATUS_COMPLETED, reply_text("and after that?"))
    assert second.started_at.ToDatetime() >= first.finished_at.ToDatetime()


async def test_a_model_error_ends_the_task_as_failed_model_error(
    database_target: DatabaseTarget, new_codex_thread: NewCodexThread, codex_home: Path, codex_bin: Path
) -> None:
    thread = await new_codex_thread("one")
    async with scheduler_for(database_target, LEASES) as scheduler:
        await scheduler.request(
            "task-500",
            "[[demo:http500]] run it",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        (failed,) = await run_until_finished(
            scheduler, codex_agent(scheduler, codex_home, codex_bin), "task-500"
        )

    assert (failed.status, failed.failure_kind) == (pb.TASK_STATUS_FAILED, pb.FAILURE_KIND_MODEL_ERROR)
    assert failed.status_detail and failed.codex_session_id == thread.session_id


async def test_a_stalled_codex_ends_the_task_as_timed_out_stalled(
    database_target: DatabaseTarget, new_codex_thread: NewCodexThread, codex_home: Path, codex_bin: Path
) -> None:
    thread = await new_codex_thread("two")
    async with scheduler_for(database_target, LEASES) as scheduler:
        await scheduler.request(
            "task-stall",
            "[[demo:stall]] run it",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        agent = codex_agent(scheduler, codex_home, codex_bin, stall_timeout_s=2.0)
        (stalled,) = await run_until_finished(scheduler, agent, "task-stall")

    assert (stalled.status, stalled.failure_kind) == (pb.TASK_STATUS_TIMED_OUT, pb.FAILURE_KIND_STALLED)
    assert stalled.status_detail
    assert codex_processes_using(thread.session_id) == []


async def test_stopping_the_agent_mid_turn_kills_codex_and_reports_interrupted(
    database_target: DatabaseTarget, new_codex_thread: NewCodexThread, codex_home: Path, codex_bin: Path
) -> None:
    thread = await new_codex_thread("start")
    async with scheduler_for(database_target, LEASES) as scheduler:
        await scheduler.request(
            "task-slow",
            "[[demo:slow=30]] take long",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        agent = codex_agent(scheduler, codex_home, codex_bin)
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        await eventually(lambda: codex_processes_using(thread.session_id) != [], what="Codex to run the turn")
        stop.set()
        await asyncio.wait_for(running, 20)
        stopped = await scheduler.get("task-slow")

    assert (stopped.status, stopped.failure_kind, stopped.status_detail) == (
        pb.TASK_STATUS_FAILED,
        pb.FAILURE_KIND_INTERRUPTED,
        f"the worker on {NODE} was stopped while running this message",
    )
    assert codex_processes_using(thread.session_id) == []


async def test_the_task_completes_before_codexs_helpers_are_stopped_and_the_stopped_agent_leaves_none(
    database_target: DatabaseTarget,
    new_codex_thread: NewCodexThread,
    codex_home: Path,
    codex_bin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex's shell snapshot sources a ~/.bashrc whose process ignores SIGTERM: it outlives the
    turn by the kill grace (60 s here, so a loaded machine still sees it). The task is finished
    with the reply meanwhile; stopping the agent (its close waits 2 s, then SIGKILLs) leaves none."""
    thread = await new_codex_thread("start")
    marker, environment = stubborn_bashrc(tmp_path)
    monkeypatch.setenv("HOME", environment["HOME"])
    async with scheduler_for(database_target, LEASES) as scheduler:
        await scheduler.request(
            "task-helpers",
            "hello",
            thread=thread.session_id,
            codex_thread_ref=thread.session_id,
            codex_folder_ref=str(thread.folder),
        )
        agent = codex_agent(scheduler, codex_home, codex_bin, kill_grace_s=60.0, close_timeout_s=2.0)
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        try:
            await eventually(partial(scheduler.is_terminal, "task-helpers"), timeout=30, what="the end")
            finished = await scheduler.get("task-helpers")
            await eventually(lambda: running_with(marker) != [], timeout=10, what="the shell helper")
            helpers = running_with(marker)
            stopping_began = asyncio.get_running_loop().time()
        finally:
            stop.set()
            await asyncio.wait_for(running, 20)

    assert (finished.status, finished.reply_text) == (pb.TASK_STATUS_COMPLETED, reply_text("hello"))
    assert helpers != [], "the shell snapshot should outlive the finished task"
    assert [pid for pid in helpers if process_runs(pid)] == []
    assert running_with(marker) == []
    assert asyncio.get_running_loop().time() - stopping_began < 30, "close() should not wait the grace"


async def start_worker_process(
    scheduler: SchedulerUnderTest, codex_home: Path, codex_bin: Path, data_dir: Path, log: BinaryIO
) -> asyncio.subprocess.Process:
    """`python -m worker run` as its own process logging to `log`, its local agent claiming from
    `scheduler` (its context_budget and conversations addresses lead nowhere: this test is about
    tasks)."""
    environment = {
        **os.environ,
        "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
        "BOSS_SCHEDULER_ADDRESS": scheduler.address,
        "BOSS_CONVERSATIONS_ADDRESS": f"127.0.0.1:{free_port()}",
        "BOSS_DATA_DIR": str(data_dir),
        "BOSS_LOG_LEVEL": "INFO",
        **demo_model_environment(),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "run",
        "--codex-home",
        str(codex_home),
        "--context-budget-address",
        f"127.0.0.1:{free_port()}",
        "--token",
        scheduler.token(),
        "--worker-id",
        WORKER,
        "--node-id",
        NODE,
        "--codex-bin",
        str(codex_bin),
        "--max-concurrent-tasks",
        "1",
        cwd=data_dir,
        env=environment,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
    )


def codex_runs(session_id: str) -> bool:
    """True while a Codex process runs the thread."""
    return codex_processes_using(session_id) != []


async def is_running(scheduler: SchedulerUnderTest, task_id: str) -> bool:
    return (await scheduler.get(task_id)).status == pb.TASK_STATUS_RUNNING


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_a_worker_process_stopped_mid_turn_ends_its_task_in_a_failure(
    database_target: DatabaseTarget,
    new_codex_thread: NewCodexThread,
    codex_home: Path,
    codex_bin: Path,
    tmp_path: Path,
    signal_number: signal.Signals,
) -> None:
    thread = await new_codex_thread("start")
    data_dir = tmp_path / "worker-data"
    data_dir.mkdir()
    with (data_dir / "worker.log").open("ab") as log:
        async with scheduler_for(database_target, SHORT_LEASES) as scheduler:
            worker = await start_worker_process(scheduler, codex_home, codex_bin, data_dir, log)
            try:
                await scheduler.request(
                    "task-killed",
                    "[[demo:slow=8]] take long",
                    thread=thread.session_id,
                    codex_thread_ref=thread.session_id,
                    codex_folder_ref=str(thread.folder),
                )
                await eventually(
                    partial(is_running, scheduler, "task-killed"), timeout=30, what="the turn to run"
                )
                await eventually(partial(codex_runs, thread.session_id), what="Codex to start")
                worker.send_signal(signal_number)
                code = await asyncio.wait_for(worker.wait(), 30)
                await eventually(
                    partial(scheduler.is_terminal, "task-killed"), timeout=30, what="the task to end"
                )
                ended = await scheduler.get("task-killed")
            finally:
                if worker.returncode is None:
                    worker.kill()
                    await worker.wait()
                for left in codex_processes_using(thread.session_id):
                    os.kill(left.pid, signal.SIGKILL)

    if signal_number is signal.SIGTERM:
        assert code == 0
        assert (ended.failure_kind, ended.status_detail) == (
            pb.FAILURE_KIND_INTERRUPTED,
            f"the worker on {NODE} was stopped while running this message",
        )
    else:
        assert code == -signal.SIGKILL
        assert ended.failure_kind == pb.FAILURE_KIND_DEVICE_LOST
        assert ended.status_detail.startswith(f"the device {NODE} stopped answering at ")
    assert ended.status == pb.TASK_STATUS_FAILED
