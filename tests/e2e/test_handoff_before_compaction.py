"""CB-19 end to end: context_budget and scheduler run as processes; the real worker code (session
follower, agent, stream reporter, handoff worker) reads a Codex session file in a temporary
CODEX_HOME that grows from safe to urgent and then into a compaction. Before the compaction lines are
written, `prepare_handoff` has reached the worker and a ready package built from the session's real
files (git state of its folder, its last test run, its last message) is stored; the compaction then
opens no handoff_missing alert."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc

from services.shared.auth import TokenAuthority, bearer_metadata
from worker.agent import WorkerAgent
from worker.codex_sessions.budget import auto_compact_token_limit
from worker.codex_sessions.follower import RolloutFollower
from worker.demo_sessions import rollout_line, rollout_path
from worker.handoff import HandoffWorker, lookup_from_agent
from worker.reporter import StreamReporter
from worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
SECRET = "e2e-secret-for-handoff-0123456789abcdef"
WINDOW = 258_400  # W reported by Codex (95 % of a 272,000-token window)
LIMIT = auto_compact_token_limit(272_000)
BASELINE = 12_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tokens_for(percent: float) -> int:
    """T giving `percent` of budget left (SPEC D-1: 100 * (L - T) / (L - B))."""
    return int(LIMIT - percent / 100 * (LIMIT - BASELINE))


async def wait_until(condition: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def service(module: str, env: dict[str, str], port: int) -> AsyncIterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-m", module, "serve"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


class Session:
    """Writes a Codex rollout file line by line, as Codex does."""

    def __init__(self, codex_home: Path, cwd: Path) -> None:
        self.started = datetime.now(UTC) - timedelta(minutes=2)
        self.thread_id = str(uuid.uuid4())
        self.path = rollout_path(codex_home, self.started, self.thread_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.cwd = cwd
        self.cumulative = 0
        self.write(
            "session_meta",
            {
                "id": self.thread_id,
                "timestamp": self.started.isoformat(),
                "cwd": str(cwd),
                "originator": "codex_cli_rs",
                "cli_version": "0.104.0",
                "source": "cli",
                "model_provider": "openai",
            },
        )
        self.write("turn_context", {"turn_id": "turn-1", "cwd": str(cwd), "model": "gpt-5.1-codex"})

    def write(self, record_type: str, payload: dict) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(rollout_line(datetime.now(UTC), record_type, payload))

    def tokens(self, total: int, estimate: bool = False) -> None:
        self.cumulative += total
        last = {
            "input_tokens": 0 if estimate else total - 500,
            "cached_input_tokens": 0,
            "output_tokens": 0 if estimate else 500,
            "reasoning_output_tokens": 0,
            "total_tokens": total,
        }
        info = {
            "total_token_usage": {**last, "total_tokens": self.cumulative},
            "last_token_usage": last,
            "model_context_window": WINDOW,
        }
        self.write("event_msg", {"type": "token_count", "info": info, "rate_limits": None})

    def shell(self, command: str, output: str) -> None:
        call_id = f"call_{uuid.uuid4().hex}"
        self.write(
            "response_item",
            {
                "type": "function_call",
                "name": "exec_command",
                "call_id": call_id,
                "arguments": f'{{"cmd": "{command}", "workdir": "{self.cwd}"}}',
            },
        )
        self.write("response_item", {"type": "function_call_output", "call_id": call_id, "output": output})

    def message(self, text: str) -> None:
        self.write("event_msg", {"type": "agent_message", "message": text})

    def compaction(self) -> None:
        self.tokens(LIMIT * 3, estimate=True)
        self.write("compacted", {"message": "", "replacement_history": []})
        self.write("event_msg", {"type": "context_compacted"})


def git_repo(folder: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    folder.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(folder)], check=True, env=env)
    (folder / "parser.py").write_text("def parse(text):\n    return text\n")
    subprocess.run(["git", "-C", str(folder), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(folder), "commit", "-q", "-m", "start"], check=True, env=env)
    (folder / "parser.py").write_text("def parse(text):\n    return text.strip()\n")
    (folder / "pytest-report.log").write_text("1 passed\n")


async def test_prepare_handoff_reaches_the_worker_before_the_compaction(tmp_path: Path) -> None:
    data_dir, codex_home, repo = tmp_path / "var", tmp_path / "codex", tmp_path / "repo"
    git_repo(repo)
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
    session = Session(codex_home, repo)
    session.shell("pytest -q", "Exit code: 0\nWall time: 0.4 seconds\nOutput:\n...\n3 passed in 0.21s\n")
    session.message(
        "Parser now strips input.\n\nOpen questions:\n- Keep trailing tabs?\n\nNext steps:\n- Add a test"
    )
    session.tokens(tokens_for(80))

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
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{scheduler_port}")
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        client = bearer_metadata(authority.issue_service("e2e"))
        schedules: list[pb.ThreadSchedule] = []

        async def poll_schedule() -> pb.ThreadSchedule | None:
            try:
                response = await stub.GetThreadSchedule(
                    pb.GetThreadScheduleRequest(thread_id=session.thread_id), metadata=client
                )
            except grpc.aio.AioRpcError:
                return None
            schedules.append(response.thread_schedule)
            return response.thread_schedule

        async def level_is(level: int, compactions: int = 0) -> None:
            for _ in range(300):
                current = await poll_schedule()
                if (
                    current is not None
                    and current.context_budget_level == level
                    and current.compaction_count == compactions
                ):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"scheduler never saw level {level}: {schedules[-1:] or 'nothing'}")

        try:
            await level_is(pb.BUDGET_LEVEL_SAFE)
            session.tokens(tokens_for(30))
            await level_is(pb.BUDGET_LEVEL_URGENT)
            await wait_until(
                lambda: handoff.uploaded, what="prepare_handoff to reach the worker and an upload"
            )

            before = await poll_schedule()
            assert before is not None and before.relay_thread_id.startswith("relay-")
            package = before.current_package
            assert package.package_status == pb.PACKAGE_STATUS_READY
            assert handoff.uploaded == [package.handoff_package_id]
            assert package.to_thread_id == before.relay_thread_id
            assert list(package.critical_files) == ["parser.py", "pytest-report.log"]
            assert package.critical_tests[0].outcome == "passed"
            assert package.critical_tests[0].summary == "3 passed in 0.21s"
            assert list(package.open_questions) == ["Keep trailing tabs?"]
            assert list(package.suggested_next_actions) == ["Add a test"]
            assert str(session.path) in package.critical_artifacts
            statuses = {item.item: item.status for item in package.checklist}
            assert statuses["files_touched"] == pb.CHECKLIST_ITEM_STATUS_DONE
            assert statuses["last_test_run"] == pb.CHECKLIST_ITEM_STATUS_DONE
            assert "finish_current_subtask" in handoff.directives[session.thread_id]

            session.compaction()
            session.tokens(tokens_for(92))
            await level_is(pb.BUDGET_LEVEL_SAFE, compactions=1)
            alerts = await stub.ListHandoffAlerts(
                pb.ListHandoffAlertsRequest(thread_id=session.thread_id), metadata=client
            )
            assert list(alerts.alerts) == []
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await reporter.close()
            await channel.close()
