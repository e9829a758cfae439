"""Parity with the Codex people run today: the real Codex CLI 0.169 drives threads against the demo
model with a small window, with and without a configured auto-compact limit, through local pre-turn,
local mid-turn and remote compactions; Boss reads the rollout files Codex wrote.

The oracle is independent of Boss's reader: the demo model's own log of what it answered (each turn
request's usage, each compaction request), the rollout read with plain ``json``, Codex's formulas in
exact decimal arithmetic, and what Codex itself reports in ``codex exec --json``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from demo_model import DemoModelServer, UsageModel, demo_model_environment, write_codex_home
from demo_model.codex_home import openai_provider_environment
from demo_model.conversation import RequestKind
from worker.codex_sessions.codex_config import LimitSource
from worker.codex_sessions.follower import RolloutFollower
from worker.codex_sessions.tracker import ThreadBudgetReading
from worker.handoff.builder import SessionFacts, build_package
from worker.snapshots import CRITICAL, URGENT, level_for_percent

WINDOW = 32_000
W = WINDOW * 95 // 100
CONFIGURED_LIMIT = 20_000
BASELINE = 12_000
TEST_COMMAND = "python3 -m unittest discover -s tests"
TURN_TIMEOUT_S = 60


def d1_percent(total: int, limit: int) -> float:
    """SPEC D-1: 100 * max(0, L - T) / (L - B), one decimal, halves up, in exact arithmetic."""
    share = Fraction(100 * max(0, limit - total), limit - BASELINE)
    share = min(Fraction(100), share)
    return float(
        (Decimal(share.numerator) / Decimal(share.denominator)).quantize(Decimal("0.1"), ROUND_HALF_UP)
    )


def codex_percent(total: int, window: int) -> int:
    """Codex's "% context left" in exact decimal arithmetic (protocol.rs:2242-2288)."""
    effective = window - BASELINE
    remaining = max(0, effective - max(0, total - BASELINE))
    value = (Decimal(remaining) * 100 / Decimal(effective)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return int(min(Decimal(100), max(Decimal(0), value)))


@dataclass
class CodexRun:
    """Runs ``codex exec --json`` turns of one thread in one Codex home and reads it like the worker."""

    codex_bin: Path
    home: Path
    folder: Path
    env: dict[str, str]
    session_id: str = ""

    def __post_init__(self) -> None:
        self.follower = RolloutFollower(self.home, rediscover_interval_s=0)
        self.readings: list[ThreadBudgetReading] = []

    async def turn(self, prompt: str) -> tuple[int, list[dict[str, Any]]]:
        """One turn (the first creates the thread); Codex's exit code and its JSON events."""
        base = [str(self.codex_bin), "exec"]
        if self.session_id:
            arguments = [*base, "resume", "--skip-git-repo-check", "--json", self.session_id, prompt]
        else:
            arguments = [*base, "--skip-git-repo-check", "--json", prompt]
        process = await asyncio.create_subprocess_exec(
            *arguments,
            cwd=self.folder,
            env={**os.environ, **self.env, "CODEX_HOME": str(self.home)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), TURN_TIMEOUT_S)
        events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
        if not self.session_id:
            assert events and events[0]["type"] == "thread.started", stderr.decode()[-2000:]
            self.session_id = events[0]["thread_id"]
        assert process.returncode is not None
        return process.returncode, events

    def poll(self) -> list[ThreadBudgetReading]:
        """One follower poll, as the worker makes every second: the readings it produced."""
        new = [reading for update in self.follower.poll() for reading in update.readings]
        self.readings.extend(new)
        return new

    def tracker(self) -> Any:
        (path,) = self.follower.followed_files
        return self.follower.tracker(path)

    def rollout(self) -> list[dict[str, Any]]:
        """The rollout Codex wrote, read with plain json."""
        (path,) = self.follower.followed_files
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def workspace(tmp_path: Path) -> Path:
    """A folder with one passing unittest test, for the thread to run."""
    folder = tmp_path / "work"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test_sum.py").write_text(
        "import unittest\n\n\nclass SumTest(unittest.TestCase):\n"
        "    def test_sum(self):\n        self.assertEqual(sum([1, 2]), 3)\n"
    )
    return folder


@pytest.fixture(scope="module")
def fine_model() -> Iterator[DemoModelServer]:
    """The demo model growing the context by 1,000 tokens a user turn (L - B is 8,000 at L = 20,000)."""
    with DemoModelServer(usage_model=UsageModel(turn_tokens=1_000)) as server:
        yield server


def turn_usages(model: DemoModelServer, session_id: str) -> list[int]:
    """The oracle: the usage the model reported for every answered turn request, in order."""
    return [
        request.total_tokens
        for request in model.requests_of(session_id)
        if request.kind is RequestKind.TURN and request.failure is None
    ]


def compaction_requests(model: DemoModelServer, session_id: str) -> list[RequestKind]:
    return [request.kind for request in model.requests_of(session_id) if request.kind is not RequestKind.TURN]


def check_readings_line_by_line(run: CodexRun, model: DemoModelServer, limit: int) -> None:
    """Boss's readings against the rollout and the model's log, line by line."""
    lines = run.rollout()
    token_counts = {
        line["timestamp"]: line["payload"]["info"]["last_token_usage"]["total_tokens"]
        for line in lines
        if line["type"] == "event_msg"
        and line["payload"].get("type") == "token_count"
        and line["payload"]["info"]
    }
    compacted_at = [line["timestamp"] for line in lines if line["type"] == "compacted"]
    real = [reading for reading in run.readings if not reading.awaiting_reading_after_compaction]
    awaiting = [reading for reading in run.readings if reading.awaiting_reading_after_compaction]
    # Every response the model gave to a turn is one reading, in order, and nothing else is.
    assert [reading.last_total_tokens for reading in real] == turn_usages(model, run.session_id)
    for reading in real:
        stamp = (
            reading.captured_at.strftime("%Y-%m-%dT%H:%M:%S.")
            + f"{reading.captured_at.microsecond // 1000:03d}Z"
        )
        assert token_counts[stamp] == reading.last_total_tokens
        assert reading.model_context_window == W
        assert (reading.auto_compact_token_limit, reading.context_window) == (limit, WINDOW)
        assert reading.context_budget_remaining_pct == d1_percent(reading.last_total_tokens, limit)
        assert reading.codex_context_left_pct == codex_percent(reading.last_total_tokens, W)
    # Every compaction Codex made is reported once, at the `compacted` line, before the next reading.
    assert len(awaiting) == len(compacted_at) == len(compaction_requests(model, run.session_id))
    for index, reading in enumerate(awaiting, start=1):
        assert reading.compaction_count == index
        stamp = (
            reading.captured_at.strftime("%Y-%m-%dT%H:%M:%S.")
            + f"{reading.captured_at.microsecond // 1000:03d}Z"
        )
        assert stamp == compacted_at[index - 1]
        assert (reading.last_total_tokens, reading.codex_context_left_pct) == (0, None)
    assert [reading.reading_sequence for reading in run.readings] == list(range(1, len(run.readings) + 1))
    # Before the first compaction the thread went through urgent and critical.
    first_compaction = run.readings.index(awaiting[0])
    levels = {
        level_for_percent(reading.context_budget_remaining_pct) for reading in run.readings[:first_compaction]
    }
    assert {URGENT, CRITICAL} <= levels


def check_usage_agrees_with_exec_json(run: CodexRun, events: list[dict[str, Any]]) -> None:
    """`turn.completed.usage` is the thread's running total as Codex counts it for its clients:
    Boss's reading of the rollout says the same."""
    completed = [event for event in events if event["type"] == "turn.completed"]
    if not completed:
        return
    usage = completed[-1]["usage"]
    total = run.tracker().total_token_usage
    assert total is not None
    assert (
        total.input_tokens,
        total.cached_input_tokens,
        total.output_tokens,
        total.reasoning_output_tokens,
    ) == (
        usage["input_tokens"],
        usage["cached_input_tokens"],
        usage["output_tokens"],
        usage["reasoning_output_tokens"],
    )


def last_command_execution(run: CodexRun) -> dict[str, Any]:
    items = [
        line["payload"]["item"]
        for line in run.rollout()
        if line["payload"].get("type") == "item_completed"
        and line["payload"]["item"]["type"] == "CommandExecution"
    ]
    return items[-1]


async def test_configured_limit_local_pre_turn_compaction(
    codex_bin: Path, fine_model: DemoModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "codex-home"
    write_codex_home(
        home, fine_model.base_url, context_window=WINDOW, auto_compact_token_limit=CONFIGURED_LIMIT
    )
    run = CodexRun(codex_bin, home, workspace(tmp_path), demo_model_environment())
    prompts = [f"turn {n}" for n in range(1, 9)]
    prompts[2] = f"turn 3: run the tests [[demo:shell={TEST_COMMAND}]]"
    for prompt in prompts:
        code, events = await run.turn(prompt)
        assert code == 0, events
        run.poll()
        check_usage_agrees_with_exec_json(run, events)
    assert compaction_requests(fine_model, run.session_id) == []
    # Turn 9 compacts before it starts (T = 20,100 >= L = 20,000), then fails: Codex writes the
    # compaction and no reading after it. The next poll reports it: compacted, waiting.
    code, _ = await run.turn("turn 9 [[demo:http500]]")
    assert code == 1
    new = run.poll()
    assert [(r.awaiting_reading_after_compaction, r.compaction_count) for r in new] == [(True, 1)]
    assert new[0].context_budget_remaining_pct == 100.0
    assert new[0].compaction_limit_source is LimitSource.CONFIGURED
    code, events = await run.turn("turn 10: Should we keep the retry cap?")
    assert code == 0
    run.poll()
    check_usage_agrees_with_exec_json(run, events)
    assert compaction_requests(fine_model, run.session_id) == [RequestKind.LOCAL_COMPACTION]
    check_readings_line_by_line(run, fine_model, CONFIGURED_LIMIT)
    assert all(r.compaction_limit_source is LimitSource.CONFIGURED for r in run.readings)

    # The handoff facts are what real Codex ran and said.
    tracker = run.tracker()
    package = build_package(SessionFacts(run.session_id, str(run.folder), None, tracker.last_activity, None))
    executed = last_command_execution(run)
    (command,) = package.critical_commands
    assert (command.command, command.exit_code) == (TEST_COMMAND, executed["exit_code"]) == (TEST_COMMAND, 0)
    (test,) = package.critical_tests
    assert (test.command, test.outcome, test.summary) == (TEST_COMMAND, "passed", "OK")
    assert package.open_questions == (
        "Demo model (not a real model): you said: turn 10: Should we keep the retry cap?",
    )


async def test_configured_limit_local_mid_turn_compaction(
    codex_bin: Path, fine_model: DemoModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "codex-home"
    write_codex_home(
        home, fine_model.base_url, context_window=WINDOW, auto_compact_token_limit=CONFIGURED_LIMIT
    )
    run = CodexRun(codex_bin, home, workspace(tmp_path), demo_model_environment())
    for n in range(1, 8):
        code, _ = await run.turn(f"turn {n}")
        assert code == 0
        run.poll()
    # Turn 8's tool call response reports 20,100 >= L: Codex compacts in the middle of the turn,
    # drops the pending call and runs it again.
    code, events = await run.turn(f"turn 8: run the tests [[demo:shell={TEST_COMMAND}]]")
    assert code == 0
    run.poll()
    check_usage_agrees_with_exec_json(run, events)
    kinds = [request.kind for request in fine_model.requests_of(run.session_id)]
    assert kinds[-4:] == [RequestKind.TURN, RequestKind.LOCAL_COMPACTION, RequestKind.TURN, RequestKind.TURN]
    code, _ = await run.turn("turn 9")
    assert code == 0
    run.poll()
    check_readings_line_by_line(run, fine_model, CONFIGURED_LIMIT)
    tracker = run.tracker()
    assert tracker.compaction_count == 1
    package = build_package(SessionFacts(run.session_id, str(run.folder), None, tracker.last_activity, None))
    executed = last_command_execution(run)
    assert executed["command"][-1] == TEST_COMMAND
    (command,) = package.critical_commands
    assert (command.command, command.exit_code) == (TEST_COMMAND, executed["exit_code"])
    assert package.critical_tests[0].outcome == "passed"


async def test_remote_compaction_without_a_configured_limit(
    codex_bin: Path, demo_model: DemoModelServer, tmp_path: Path
) -> None:
    # Codex's built-in provider pointed at the demo model compacts remotely. No limit is configured:
    # L is 90 % of the configured 32,000-token window, 28,800 (real-codex.md §5).
    home = tmp_path / "codex-home"
    write_codex_home(home, demo_model.base_url, context_window=WINDOW, provider="openai")
    run = CodexRun(codex_bin, home, workspace(tmp_path), openai_provider_environment())
    compaction_polls = []
    for n in range(1, 12):
        code, events = await run.turn(f"turn {n}")
        assert code == 0
        new = run.poll()
        check_usage_agrees_with_exec_json(run, events)
        if any(reading.awaiting_reading_after_compaction for reading in new):
            compaction_polls.append(n)
    # The compaction shows in the poll right after the turn in which Codex made it.
    assert compaction_polls == [10]
    assert compaction_requests(demo_model, run.session_id) == [RequestKind.REMOTE_COMPACTION]
    check_readings_line_by_line(run, demo_model, 28_800)
    assert {reading.compaction_limit_source for reading in run.readings} == {LimitSource.CONFIGURED}
    remote = [line for line in run.rollout() if line["type"] == "compacted"]
    assert remote[0]["payload"]["message"] == ""
    # Codex's own two running totals part at a remote compaction: the token_usage_record's counts
    # its request (real-codex.md §5), the total its clients see does not.
    tracker = run.tracker()
    (request,) = [
        r for r in demo_model.requests_of(run.session_id) if r.kind is RequestKind.REMOTE_COMPACTION
    ]
    assert (
        tracker.thread_token_usage.total_tokens - tracker.total_token_usage.total_tokens
        == request.total_tokens
    )
