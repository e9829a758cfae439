"""`make run` end to end, in demo mode: the launcher starts every service, the built-in demo model
(not a real model), real Codex threads driven against it and a worker, on the embedded SQLite
default. The demo threads are real Codex threads (their session files were written by the pinned
Codex CLI), the gateway answers each one's context budget, and a chat message sent to one through
the gateway is answered by real Codex (`codex exec resume` run by the worker's local agent) with the
demo model's reply. Runs on free loopback ports and a temporary data folder, so it never meets a
running stack; needs the real Codex CLI (`make codex`)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo_model import reply_text
from demo_model.threads import DemoThread, read_demo_threads, rollout_file
from tests.codex_support import codex_bin  # noqa: F401  (fixture, found by name)
from tests.conftest import REPOSITORY_ROOT

SERVICES = ("CONTEXT_BUDGET", "SCHEDULER", "CONVERSATIONS", "GATEWAY")
STARTUP_SECONDS = 240.0
REPLY_SECONDS = 60.0
# A demo turn holds its thread for about a second; a chat message that arrives meanwhile is
# refused as thread_busy by the local agent. The stack runs with no live demo turns here, so the
# round trip below is never such a collision.
NO_LIVE_TURNS_INTERVAL = "3600"
EXPECTED_LEVELS = {"billing-api": "safe", "ios-sync-client": "watch", "firmware-flasher": "critical"}
"""Levels after the initial turns (2, 8 and 13 user turns in a 48,000-token window)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pinned_codex_version() -> str:
    """The Codex version `make codex` installs (the Makefile's CODEX_VERSION)."""
    makefile = (REPOSITORY_ROOT / "Makefile").read_text()
    match = re.search(r"^CODEX_VERSION\s*:?=\s*(\S+)", makefile, re.MULTILINE)
    assert match, "the Makefile pins no CODEX_VERSION"
    return match.group(1)


@dataclass(frozen=True)
class RunningStack:
    """The launcher's process, its output file, the data folder and the gateway's address."""

    process: subprocess.Popen[bytes]
    output: Path
    data: Path
    gateway: str

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def token(self) -> str:
        return (self.data / "client-token").read_text().strip()

    def diagnosis(self, reason: str) -> str:
        logs = [
            f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}"
            for log in self.data.glob("logs/*.log")
        ]
        return "\n".join([reason, self.text()[-3000:], *logs])


@pytest.fixture
def stack(tmp_path: Path, codex_bin: Path) -> Iterator[RunningStack]:  # noqa: F811
    """`python -m services.local_stack` with no Codex home of its own (HOME is empty), until its
    "Ready:" line; stopped with SIGINT (Ctrl-C) at the end unless the test stopped it."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("BOSS_") and key != "CODEX_HOME"
    }
    data = tmp_path / "var"
    environment["BOSS_DATA_DIR"] = str(data)
    environment["HOME"] = str(tmp_path)  # no ~/.codex: the launcher must fall back to the demo
    for service in SERVICES:
        address = f"127.0.0.1:{free_port()}"
        environment[f"BOSS_{service}_LISTEN"] = address
        environment[f"BOSS_{service}_ADDRESS"] = address
    output = tmp_path / "local-stack.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.local_stack",
                "--refresh",
                "1",
                "--demo-interval",
                NO_LIVE_TURNS_INTERVAL,
            ],
            cwd=REPOSITORY_ROOT,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    running = RunningStack(process, output, data, f"http://{environment['BOSS_GATEWAY_ADDRESS']}")
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while "Ready: every thread has a budget" not in running.text():
            if process.poll() is not None:
                pytest.fail(running.diagnosis("the local stack exited during start-up"), pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(running.diagnosis("the stack was not ready in time"), pytrace=False)
            time.sleep(0.5)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def session_meta(path: Path) -> dict[str, Any]:
    """The payload of a rollout file's first line (Codex writes `session_meta` there)."""
    with path.open(encoding="utf-8") as handle:
        first = json.loads(handle.readline())
    assert first["type"] == "session_meta"
    payload: dict[str, Any] = first["payload"]
    return payload


def demo_threads(stack: RunningStack) -> dict[str, DemoThread]:
    threads = read_demo_threads(stack.data / "demo-codex-home")
    assert threads is not None, stack.diagnosis("the demo threads were not listed")
    return {thread.name: thread for thread in threads}


def chat_project_of(client: httpx.Client, thread_id: str) -> str:
    """The project id of the thread's conversation once its Codex metadata is registered."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page = client.get(f"/api/v1/threads/{thread_id}/context-summary")
        if page.status_code == 200 and page.json()["codex_thread_ref"] and page.json()["codex_folder"]:
            rows = client.get("/api/v1/conversations").json()["conversations"]
            for row in rows:
                if (
                    row["context_budget_thread_id"] == thread_id
                    and row["conversation_type"] == "single_device"
                ):
                    return str(row["project_id"])
        time.sleep(0.3)
    raise AssertionError(f"thread {thread_id} never got a chat-ready conversation")


@pytest.mark.timeout(STARTUP_SECONDS + 120)
def test_demo_threads_are_real_codex_threads_with_budgets_and_answer_a_chat(stack: RunningStack) -> None:
    version = pinned_codex_version()
    printed = stack.text()
    assert (
        f"Chat: demo threads answer through real Codex {version} against the built-in demo model "
        "(not a real model)"
    ) in printed
    assert "Demo mode (no Codex sessions" in printed
    assert (
        "Master agent: the built-in demo model (not a real model) answers from Boss's real state" in printed
    )
    threads = demo_threads(stack)
    assert sorted(threads) == sorted(EXPECTED_LEVELS)
    codex_home = stack.data / "demo-codex-home"

    # Every demo session file was written by the pinned Codex itself, in the thread's workspace.
    for thread in threads.values():
        path = rollout_file(codex_home, thread.session_id)
        assert path is not None, f"no session file for {thread.name}"
        meta = session_meta(path)
        assert meta["cli_version"] == version
        assert meta["id"] == thread.session_id
        assert Path(meta["cwd"]) == thread.folder

    with httpx.Client(
        base_url=stack.gateway, headers={"Authorization": f"Bearer {stack.token()}"}, timeout=10
    ) as client:
        percents: dict[str, int] = {}
        for name, level in EXPECTED_LEVELS.items():
            budget = client.get(f"/api/v1/threads/{threads[name].session_id}/context-budget")
            assert budget.status_code == 200, budget.text
            assert budget.json()["context_budget_level"] == level, (name, budget.json())
            percents[name] = math.floor(budget.json()["context_budget_remaining_pct"])

        # The master agent, answered by the demo model from Boss's real state: the true answer.
        asked = client.post(
            "/api/v1/projects/master-agent/messages",
            json={"text": "Which thread is close to compaction?", "client_message_id": "e2e-master-1"},
        )
        assert asked.status_code == 201, asked.text
        critical = threads["firmware-flasher"]
        assert (
            f'The thread closest to compaction is "firmware-flasher" ({critical.session_id}) with '
            f"{percents['firmware-flasher']} % of its context budget left (critical)"
        ) in asked.json()["masterReply"], asked.json()

        # A chat message to a demo thread, answered by real Codex through the demo model.
        thread = threads["billing-api"]
        project_id = chat_project_of(client, thread.session_id)
        text = "Which file holds the invoice total?"
        sent = client.post(
            f"/api/v1/projects/{project_id}/messages", json={"text": text, "client_message_id": "e2e-chat-1"}
        )
        assert sent.status_code == 201, sent.text
        task = sent.json()["task"]
        assert task["targetThreadId"] == thread.session_id
        assert task["codexThreadRef"] == thread.session_id
        assert task["codexFolderRef"] == str(thread.folder)

        deadline = time.monotonic() + REPLY_SECONDS
        replies: list[dict[str, Any]] = []
        while not replies and time.monotonic() < deadline:
            messages = client.get(f"/api/v1/projects/{project_id}/messages").json()["messages"]
            replies = [m for m in messages if m["taskId"] == task["taskId"] and m["authorKind"] != "user"]
            if not replies:
                time.sleep(0.3)
        assert replies, stack.diagnosis("no reply within the time limit")
        assert [(m["authorKind"], m["text"]) for m in replies] == [("thread", reply_text(text))]
        finished = client.get(f"/api/v1/tasks/{task['taskId']}").json()["task"]
        assert finished["status"] == "completed"
        assert finished["resultMessageId"] == replies[0]["messageId"]

    # The reply came from a real turn of that thread: Codex appended the message to its session file.
    path = rollout_file(codex_home, thread.session_id)
    assert path is not None and text in path.read_text(encoding="utf-8")

    stack.process.send_signal(signal.SIGINT)
    assert stack.process.wait(60) == 0
    assert "Stopped: every service and the worker have exited." in stack.text()
