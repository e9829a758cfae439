"""`python -m worker run --once` as a process, and the real Codex samples reported through the agent."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path

from services.shared.time import utc_now
from tests.conftest import REPOSITORY_ROOT
from tests.integration.worker_runtime.support import (
    NODE_ID,
    WORKER_ID,
    ContextBudgetHarness,
    RecordingReporter,
    eventually,
    worker_settings,
)
from worker.agent import WorkerAgent
from worker.codex_sessions.follower import RolloutFollower
from worker.demo_sessions import write_demo_codex_home


async def start_worker(
    codex_home: Path, address: str, token: str, *options: str
) -> asyncio.subprocess.Process:
    """Start `python -m worker run <options>` as a process reporting to `address`."""
    environment = {
        **os.environ,
        "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
        "BOSS_LOG_LEVEL": "INFO",
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker",
        "run",
        "--codex-home",
        str(codex_home),
        "--context-budget-address",
        address,
        "--token",
        token,
        "--worker-id",
        WORKER_ID,
        "--node-id",
        NODE_ID,
        *options,
        cwd=codex_home,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_worker_once(codex_home: Path, address: str, token: str, timeout: float) -> tuple[int, str]:
    """Run `python -m worker run --once`; returns its exit code and stderr."""
    process = await start_worker(codex_home, address, token, "--once", "--timeout", str(timeout))
    _, stderr = await asyncio.wait_for(process.communicate(), timeout + 30)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_once_exits_0_when_every_snapshot_is_acked(
    context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    threads = write_demo_codex_home(codex_home, utc_now(), threads=2)

    code, stderr = await run_worker_once(
        codex_home, context_budget.address, context_budget.worker_token(), 15.0
    )

    assert code == 0, stderr
    assert "reported 2 thread(s); every snapshot acknowledged" in stderr
    for thread in threads:
        assert await context_budget.thread_context(thread.codex_thread_id) is not None


async def test_once_exits_1_with_a_warning_when_the_server_is_unreachable(
    context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    write_demo_codex_home(codex_home, utc_now(), threads=1)
    address = context_budget.address
    await context_budget.stop()

    code, stderr = await run_worker_once(codex_home, address, context_budget.worker_token(), 1.5)

    assert code == 1
    assert f"context_budget at {address} unreachable (UNAVAILABLE" in stderr
    assert "not every snapshot was acknowledged within 2 s" in stderr
    assert "Traceback" not in stderr


async def test_once_exits_1_when_the_server_rejects_the_token(
    context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    write_demo_codex_home(codex_home, utc_now(), threads=1)
    foreign_token = context_budget.worker_token("worker-other", "node-other")

    code, stderr = await run_worker_once(codex_home, context_budget.address, foreign_token, 10.0)

    assert code == 1
    assert "PERMISSION_DENIED" in stderr
    assert "1 snapshot(s) were rejected by context_budget" in stderr


async def test_run_reports_until_sigterm_then_exits_0(
    context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    (thread,) = write_demo_codex_home(codex_home, utc_now(), threads=1)
    process = await start_worker(
        codex_home, context_budget.address, context_budget.worker_token(), "--poll-interval", "0.1"
    )

    async def reported() -> bool:
        return await context_budget.thread_context(thread.codex_thread_id) is not None

    try:
        await eventually(reported, what="the first report")
        process.send_signal(signal.SIGTERM)
        _, stderr_bytes = await asyncio.wait_for(process.communicate(), 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    stderr = stderr_bytes.decode()
    assert process.returncode == 0, stderr
    assert "stopping: waiting up to 5 s for pending acks" in stderr
    assert "Traceback" not in stderr


def last_real_reading(path: Path) -> tuple[str, int, int]:
    """(thread id, T, W) from a rollout file: session_meta's id and the last token_count whose
    last_token_usage is a model response (not Codex's all-zero-but-total compaction estimate)."""
    thread_id = ""
    found: tuple[int, int] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        payload = record.get("payload") or {}
        if record["type"] == "session_meta" and not thread_id:
            thread_id = payload["id"]
        if record["type"] != "event_msg" or payload.get("type") != "token_count" or not payload.get("info"):
            continue
        last = payload["info"]["last_token_usage"]
        components = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens")
        if all(last[name] == 0 for name in components):
            continue
        found = (last["total_tokens"], payload["info"]["model_context_window"])
    assert thread_id and found is not None, f"no real token_count in {path}"
    return thread_id, found[0], found[1]


def d1_percent(total_tokens: int, model_context_window: int) -> float:
    """SPEC D-1 from the file's own figures: CW = ceil(W / 0.95), L = floor(0.9 * CW),
    100 * max(0, L - T) / (L - 12,000) rounded to one decimal (halves up)."""
    context_window = -(-model_context_window * 100 // 95)
    limit = context_window * 9 // 10
    share = Fraction(100 * max(0, limit - total_tokens), limit - 12_000)
    exact = Decimal(share.numerator) / Decimal(share.denominator)
    return float(exact.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


async def test_real_sample_sessions_are_stored_with_their_d1_percent(
    context_budget: ContextBudgetHarness, tmp_path: Path, samples_dir: Path
) -> None:
    codex_home = tmp_path / "codex"
    day = codex_home / "sessions" / "2026" / "02" / "23"
    day.mkdir(parents=True)
    copies = []
    for sample in sorted(samples_dir.glob("*.jsonl")):
        target = day / sample.name[sample.name.index("rollout-") :]
        shutil.copyfile(sample, target)
        copies.append(target)
    assert len(copies) == 3

    reporter = RecordingReporter(context_budget.address, context_budget.worker_token())
    reporter.start()
    try:
        agent = WorkerAgent(
            worker_settings(codex_home, context_budget), RolloutFollower(codex_home), reporter
        )
        assert await agent.run_once() is True
    finally:
        await reporter.close()

    for copy in copies:
        thread_id, total, window = last_real_reading(copy)
        context = await context_budget.thread_context(thread_id)
        assert context is not None, thread_id
        assert context.snapshot.last_total_tokens == total
        assert context.snapshot.context_budget_remaining_pct == d1_percent(total, window)
