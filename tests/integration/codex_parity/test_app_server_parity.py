"""Parity with what Codex itself tells its own clients: the real ``codex app-server`` (0.169, stdio,
one JSON-RPC object per line: real-codex.md §7) runs a thread of three turns against the demo model
(one turn with a shell call, so two model responses), with a small window and a configured limit.
Every ``thread/tokenUsage/updated`` notification Codex sends is captured, and the rollout Codex wrote
is read by the worker's own follower and tracker after each turn, as the worker reads it.

Turn by turn, Boss's readings say what Codex said: one reading per notification, its T (the last
response's total), its W (``modelContextWindow``) and its "% context left" (Codex's own formula on
Codex's figures), and after each turn the thread's running total (every component). ``codex exec
--json``'s ``turn.completed.usage`` is checked the same way in test_codex_parity.py.

Compactions are left out on purpose: around one Codex notifies its compaction request's usage and its
post-compaction estimate, neither of which Boss counts as a reading (SPEC D-3; real-codex.md §5, §7).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from demo_model import DemoModelServer, demo_model_environment, write_codex_home
from demo_model.conversation import RequestKind
from tests.integration.codex_parity.test_codex_parity import codex_percent
from worker.codex_sessions.codex_config import LimitSource
from worker.codex_sessions.follower import RolloutFollower
from worker.codex_sessions.tracker import ThreadBudgetReading

WINDOW = 32_000
CONFIGURED_LIMIT = 20_000
ANSWER_TIMEOUT_S = 30
READING_TIMEOUT_S = 5
PROMPTS = ("turn 1", "turn 2: list the folder [[demo:shell=ls]]", "turn 3")


@dataclass
class AppServer:
    """A running ``codex app-server``: requests by id, notifications kept in arrival order."""

    process: asyncio.subprocess.Process
    notifications: list[dict[str, Any]] = field(default_factory=list)
    _answers: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _next_id: int = 1

    async def read_forever(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            if not line.startswith(b"{"):
                continue
            message = json.loads(line)
            if "id" in message and ("result" in message or "error" in message):
                self._answers.pop(message["id"]).set_result(message)
            elif "method" in message:
                self.notifications.append(message)
                self._arrived.set()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Sends a request and returns its result; fails on an error answer."""
        request_id, self._next_id = self._next_id, self._next_id + 1
        answer = self._answers[request_id] = asyncio.get_running_loop().create_future()
        await self.send({"id": request_id, "method": method, "params": params})
        message = await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
        assert "error" not in message, f"{method}: {message['error']}"
        return dict(message["result"])

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def turn_completed(self, turn_id: str) -> dict[str, Any]:
        """The `turn/completed` notification of the turn, waiting for it."""

        async def first() -> dict[str, Any]:
            while True:
                for message in self.notifications:
                    if message["method"] == "turn/completed" and message["params"]["turn"]["id"] == turn_id:
                        return message
                self._arrived.clear()
                await self._arrived.wait()

        return await asyncio.wait_for(first(), ANSWER_TIMEOUT_S)


@contextlib.asynccontextmanager
async def app_server(codex_bin: Path, home: Path, folder: Path) -> AsyncIterator[AppServer]:
    """``codex app-server`` in `folder` with CODEX_HOME `home`, initialized; ended on exit by closing
    its stdin (it exits 0), its process group killed if it has not within 10 s."""
    process = await asyncio.create_subprocess_exec(
        str(codex_bin),
        "app-server",
        cwd=folder,
        env={**os.environ, **demo_model_environment(), "CODEX_HOME": str(home)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        limit=16 * 1024 * 1024,
    )
    server = AppServer(process)
    reader = asyncio.create_task(server.read_forever())
    try:
        await server.request(
            "initialize",
            {"clientInfo": {"name": "boss_parity", "title": "Boss parity test", "version": "0.1.0"}},
        )
        await server.send({"method": "initialized"})
        yield server
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        await reader


def poll(follower: RolloutFollower) -> list[ThreadBudgetReading]:
    """One follower poll, as the worker makes every second: the readings it produced."""
    return [reading for update in follower.poll() for reading in update.readings]


async def poll_until(follower: RolloutFollower, count: int) -> list[ThreadBudgetReading]:
    """Polls until `count` new readings came (Codex may write a rollout line just after it notified
    its client), or READING_TIMEOUT_S passed."""
    readings = poll(follower)
    deadline = asyncio.get_running_loop().time() + READING_TIMEOUT_S
    while len(readings) < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
        readings += poll(follower)
    return readings


async def test_boss_reads_the_token_usage_codex_app_server_reports(
    codex_bin: Path, demo_model: DemoModelServer, tmp_path: Path
) -> None:
    home, folder = tmp_path / "codex-home", tmp_path / "work"
    folder.mkdir()
    write_codex_home(
        home, demo_model.base_url, context_window=WINDOW, auto_compact_token_limit=CONFIGURED_LIMIT
    )
    follower = RolloutFollower(home, rediscover_interval_s=0)
    notified: list[dict[str, Any]] = []
    async with app_server(codex_bin, home, folder) as server:
        thread = (
            await server.request(
                "thread/start", {"cwd": str(folder), "approvalPolicy": "never", "sandbox": "read-only"}
            )
        )["thread"]
        for prompt in PROMPTS:
            turn = (
                await server.request(
                    "turn/start", {"threadId": thread["id"], "input": [{"type": "text", "text": prompt}]}
                )
            )["turn"]
            completed = await server.turn_completed(turn["id"])
            assert completed["params"]["turn"]["status"] == "completed", completed
            usages = [
                message["params"]["tokenUsage"]
                for message in server.notifications
                if message["method"] == "thread/tokenUsage/updated"
                and message["params"]["turnId"] == turn["id"]
            ]
            readings = await poll_until(follower, len(usages))

            # One reading per model response Codex reported, with Codex's own figures.
            assert [r.last_total_tokens for r in readings] == [u["last"]["totalTokens"] for u in usages]
            for reading, usage in zip(readings, usages, strict=True):
                assert reading.model_context_window == usage["modelContextWindow"]
                assert reading.codex_context_left_pct == codex_percent(
                    usage["last"]["totalTokens"], usage["modelContextWindow"]
                )
                assert not reading.awaiting_reading_after_compaction
                assert (reading.auto_compact_token_limit, reading.compaction_limit_source) == (
                    CONFIGURED_LIMIT,
                    LimitSource.CONFIGURED,
                )
            # The thread's running total, every component, as Codex counts it for its clients.
            (path,) = follower.followed_files
            tracker = follower.tracker(path)
            assert tracker is not None and tracker.total_token_usage is not None
            total, codex_total = tracker.total_token_usage, usages[-1]["total"]
            assert (
                total.input_tokens,
                total.cached_input_tokens,
                total.output_tokens,
                total.reasoning_output_tokens,
                total.total_tokens,
            ) == (
                codex_total["inputTokens"],
                codex_total["cachedInputTokens"],
                codex_total["outputTokens"],
                codex_total["reasoningOutputTokens"],
                codex_total["totalTokens"],
            )
            notified += usages
    # Nothing more once Codex has exited (all it wrote is read); the file is the thread's.
    assert poll(follower) == []
    assert tracker.codex_thread_id == thread["id"] and path == Path(thread["path"])
    assert tracker.compaction_count == 0
    # What Codex notified is what the demo model answered: one response per turn, two for the shell
    # call, each with the usage the model reported (the oracle independent of Codex and Boss).
    answered = [r for r in demo_model.requests_of(thread["id"]) if r.kind is RequestKind.TURN]
    assert [u["last"]["totalTokens"] for u in notified] == [r.total_tokens for r in answered]
    assert len(notified) == len(PROMPTS) + 1
    assert {u["modelContextWindow"] for u in notified} == {WINDOW * 95 // 100}
