"""CB-3 / CB-19 on real Codex 0.169 sessions: context_budget and scheduler run as processes, the real
Codex CLI grows a thread against the demo model, and the real worker code (follower, agent, stream
reporter, handoff worker) reads what Codex writes. With a configured auto-compact limit (local
compaction) and without one (the built-in provider, remote compaction), the thread reaches urgent and
critical before Codex compacts, a ready handoff package exists before the compaction, the report that
shows the compaction closes the handoff cycle, and no handoff_missing or critical alert stays open."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as budget_pb
from boss.context_budget.v1 import context_budget_pb2_grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc

from demo_model import DemoModelServer, UsageModel, demo_model_environment, write_codex_home
from demo_model.codex_home import openai_provider_environment
from services.shared.auth import DEFAULT_OWNER_ID, TokenAuthority, bearer_metadata
from tests.codex_support import codex_bin  # noqa: F401  (fixture, found by name)
from tests.e2e.test_handoff_before_compaction import ROOT, SECRET, free_port, service, wait_until
from worker.agent import WorkerAgent
from worker.codex_sessions.follower import RolloutFollower
from worker.handoff import HandoffWorker, lookup_from_agent
from worker.local_agent.codex_exec import (
    CodexRunSettings,
    CodexTurnRequest,
    create_codex_thread,
    run_codex_turn,
)
from worker.reporter import StreamReporter
from worker.settings import WorkerSettings

WINDOW = 32_000
CASES = {
    # name: (provider, configured limit, tokens per user turn, turns before the compacting one)
    "configured-limit-local": ("demo", 20_000, 1_000, 8),
    "default-limit-remote": ("openai", None, 2_000, 9),
}


def git_workspace(folder: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.x"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e.x"}
    folder.mkdir()
    (folder / "app.py").write_text("def total(items):\n    return sum(items)\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(folder)], check=True, env=env)
    subprocess.run(["git", "-C", str(folder), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(folder), "commit", "-q", "-m", "start"], check=True, env=env)
    (folder / "app.py").write_text("def total(items):\n    return sum(items, 0)\n")


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_ready_handoff_precedes_a_real_compaction(case: str, codex_bin: Path, tmp_path: Path) -> None:  # noqa: F811
    provider, limit, turn_tokens, turns_before = CASES[case]
    data_dir, codex_home, repo = tmp_path / "var", tmp_path / "codex", tmp_path / "repo"
    git_workspace(repo)
    budget_port, scheduler_port = free_port(), free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}:{ROOT / 'gen'}",
        "BOSS_DATA_DIR": str(data_dir),
        "BOSS_AUTH_SECRET": SECRET,
        "BOSS_CONTEXT_BUDGET_LISTEN": f"127.0.0.1:{budget_port}",
        "BOSS_CONTEXT_BUDGET_ADDRESS": f"127.0.0.1:{budget_port}",
        "BOSS_SCHEDULER_LISTEN": f"127.0.0.1:{scheduler_port}",
        "BOSS_LOG_LEVEL": "WARNING",
    }
    env.pop("BOSS_DATABASE_URL", None)
    authority = TokenAuthority(SECRET)
    worker_token = authority.issue_worker("w-e2e", "node-e2e")
    model = DemoModelServer(usage_model=UsageModel(turn_tokens=turn_tokens))
    model.start()
    write_codex_home(
        codex_home, model.base_url, context_window=WINDOW, auto_compact_token_limit=limit, provider=provider
    )
    codex = CodexRunSettings(
        codex_bin=codex_bin,
        codex_home=codex_home,
        extra_env=demo_model_environment() if provider == "demo" else openai_provider_environment(),
        stall_timeout_s=20,
        turn_timeout_s=60,
    )
    async with (
        service("services.context_budget", env, budget_port),
        service("services.scheduler", env, scheduler_port),
    ):
        settings = WorkerSettings(
            codex_home=codex_home,
            worker_id="w-e2e",
            node_id="node-e2e",
            context_budget_address=f"127.0.0.1:{budget_port}",
            token=worker_token,
            poll_interval_s=0.1,
        )
        reporter = StreamReporter(settings.context_budget_address, worker_token)
        reporter.start()
        agent = WorkerAgent(settings, RolloutFollower(codex_home, rediscover_interval_s=0), reporter)
        handoff = HandoffWorker(
            f"127.0.0.1:{scheduler_port}", worker_token, "w-e2e", "node-e2e", lookup_from_agent(agent)
        )
        stop = asyncio.Event()
        tasks = [asyncio.create_task(agent.run(stop)), asyncio.create_task(handoff.run())]
        scheduler_channel = grpc.aio.insecure_channel(f"127.0.0.1:{scheduler_port}")
        budget_channel = grpc.aio.insecure_channel(f"127.0.0.1:{budget_port}")
        scheduler = scheduler_pb2_grpc.SchedulerServiceStub(scheduler_channel)
        budget = context_budget_pb2_grpc.ContextBudgetServiceStub(budget_channel)
        service_token = bearer_metadata(authority.issue_service("e2e"))
        client_token = bearer_metadata(authority.issue_client(DEFAULT_OWNER_ID))

        async def schedule(thread_id: str) -> pb.ThreadSchedule | None:
            try:
                response = await scheduler.GetThreadSchedule(
                    pb.GetThreadScheduleRequest(thread_id=thread_id), metadata=service_token
                )
            except grpc.aio.AioRpcError:
                return None
            return response.thread_schedule

        async def settled(thread_id: str, previous: pb.ThreadSchedule | None = None) -> pb.ThreadSchedule:
            """The schedule once it shows the worker's latest reading of the thread, and that
            reading is not `previous` (the one before the turn just run: every turn adds tokens, so
            its reading differs, and the follower may not have read the turn yet)."""
            for _ in range(300):
                state = agent.threads.get(thread_id)
                current = await schedule(thread_id)
                if (
                    state is not None
                    and (
                        previous is None
                        or state.reading.context_budget_remaining_pct != previous.context_budget_remaining_pct
                        or state.reading.compaction_count != previous.compaction_count
                    )
                    and state.last_sent is not None
                    and state.last_sent.snapshot_id == (state.latest.snapshot_id if state.latest else "")
                    and current is not None
                    and current.compaction_count == state.reading.compaction_count
                    and current.context_budget_remaining_pct == state.reading.context_budget_remaining_pct
                ):
                    return current
                await asyncio.sleep(0.1)
            raise AssertionError(f"the scheduler never showed the latest reading of {thread_id}")

        try:
            thread_id = await create_codex_thread(repo, "turn 1", codex)
            previous = await settled(thread_id)
            levels = [previous.context_budget_level]
            for n in range(2, turns_before + 1):
                result = await run_codex_turn(CodexTurnRequest(thread_id, str(repo), f"turn {n}"), codex)
                assert result.succeeded, result.failure_detail
                previous = await settled(thread_id, previous)
                levels.append(previous.context_budget_level)
            assert pb.BUDGET_LEVEL_URGENT in levels and pb.BUDGET_LEVEL_CRITICAL in levels
            await wait_until(
                lambda: handoff.uploaded, what="prepare_handoff to reach the worker and an upload"
            )
            before = await schedule(thread_id)
            assert before is not None and before.compaction_count == 0
            assert before.current_package.package_status == pb.PACKAGE_STATUS_READY
            assert list(before.current_package.critical_files) == ["app.py"]

            result = await run_codex_turn(
                CodexTurnRequest(thread_id, str(repo), f"turn {turns_before + 1}"), codex
            )
            assert result.succeeded, result.failure_detail
            assert [r.kind.value for r in model.requests_of(thread_id)][-2][-10:] == "compaction"
            after = await settled(thread_id, before)
            assert after.compaction_count == 1
            assert after.context_budget_level == pb.BUDGET_LEVEL_SAFE
            # The compaction closed the handoff cycle; its package was ready, so nothing is missing.
            assert after.current_package.handoff_package_id == ""
            alerts = await scheduler.ListHandoffAlerts(
                pb.ListHandoffAlertsRequest(thread_id=thread_id), metadata=service_token
            )
            assert list(alerts.alerts) == []
            open_alerts = await budget.ListAlerts(
                budget_pb.ListAlertsRequest(
                    thread_id=thread_id,
                    alert_statuses=[budget_pb.ALERT_STATUS_OPENED, budget_pb.ALERT_STATUS_ACKED],
                ),
                metadata=client_token,
            )
            assert [alert.alert_type for alert in open_alerts.alerts] == []
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await reporter.close()
            await scheduler_channel.close()
            await budget_channel.close()
            model.stop()
