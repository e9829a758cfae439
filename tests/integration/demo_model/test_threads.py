"""The demo threads with the real Codex CLI against the demo model: created in real git workspaces,
listed, resumed, grown one real turn at a time, left alone while a chat turn holds them or after one
wrote to them, and every failure said in words (fixtures in tests/codex_support.py)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from demo_model import DemoModelServer, write_codex_home
from demo_model.threads import (
    CHAT_QUIET_S,
    DEMO_CONTEXT_WINDOW,
    DEMO_PLANS,
    DemoThreadError,
    GrowerSettings,
    LiveThread,
    grow_once,
    grower_settings,
    main,
    prepare_demo,
    read_demo_threads,
    rollout_file,
)
from tests.conftest import REPOSITORY_ROOT
from worker.local_agent.codex_exec import CodexTurnRequest, run_codex_turn
from worker.local_agent.codex_guard import hold_thread_lock

# ios-sync-client keeps an uncommitted change, and its second prompt runs `git diff --stat`.
SYNC_PLAN = replace(DEMO_PLANS[1], initial_turns=2)


@pytest.fixture
def settings(tmp_path: Path, codex_bin: Path, demo_model: DemoModelServer) -> GrowerSettings:
    home = tmp_path / "demo-codex-home"
    write_codex_home(home, demo_model.base_url, context_window=DEMO_CONTEXT_WINDOW)
    return grower_settings(home, demo_model.base_url, codex_bin)


def user_texts(demo_model: DemoModelServer, session_id: str) -> list[str]:
    """The person's messages the demo model was asked about for one thread, each once, in order."""
    texts: list[str] = []
    for record in demo_model.requests_of(session_id):
        if record.user_text and (not texts or texts[-1] != record.user_text):
            texts.append(record.user_text)
    return texts


def codex_version(codex_bin: Path) -> str:
    return subprocess.run(
        [str(codex_bin), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]


async def test_threads_are_real_codex_threads_in_git_workspaces_and_are_listed(
    settings: GrowerSettings, demo_model: DemoModelServer, codex_bin: Path
) -> None:
    [thread] = await prepare_demo([SYNC_PLAN], settings)

    assert thread.name == "ios-sync-client" and thread.turns == 2
    assert thread.folder == settings.codex_home / "workspaces" / "ios-sync-client"
    assert read_demo_threads(settings.codex_home) == [thread]
    path = rollout_file(settings.codex_home, thread.session_id)
    assert path is not None
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    meta = lines[0]["payload"]
    assert (meta["cli_version"], meta["id"], meta["cwd"]) == (
        codex_version(codex_bin),
        thread.session_id,
        str(thread.folder),
    )
    assert user_texts(demo_model, thread.session_id) == [SYNC_PLAN.prompt(0), SYNC_PLAN.prompt(1)]
    # Codex really ran the prompt's command in the workspace, which has one uncommitted change.
    calls = [line["payload"] for line in lines if line["payload"].get("type") == "function_call"]
    assert [json.loads(call["arguments"])["cmd"] for call in calls] == ["git diff --stat"]
    status = subprocess.run(
        ["git", "-C", str(thread.folder), "status", "--porcelain"], capture_output=True, text=True, check=True
    )
    assert status.stdout == " M src/sync_queue.py\n"
    tests = subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", "tests"],
        cwd=thread.folder,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0 and "Ran 3 tests" in tests.stderr

    # Listed threads that still exist are resumed, not created again.
    assert await prepare_demo([SYNC_PLAN], settings) == [thread]
    assert len(user_texts(demo_model, thread.session_id)) == 2


async def test_a_due_thread_gets_one_real_turn_with_its_next_prompt(
    settings: GrowerSettings, demo_model: DemoModelServer
) -> None:
    plan = replace(DEMO_PLANS[0], initial_turns=1)
    [thread] = await prepare_demo([plan], settings)
    path = rollout_file(settings.codex_home, thread.session_id)
    live = LiveThread(thread, plan, known_size=path.stat().st_size if path else 0)

    grown = await grow_once(live, settings, asyncio.Event())

    assert grown.thread.turns == 2
    assert grown.quiet_until == 0.0
    assert path is not None and grown.known_size == path.stat().st_size > live.known_size
    assert user_texts(demo_model, thread.session_id) == [plan.prompt(0), plan.prompt(1)]


async def test_a_thread_a_chat_turn_holds_is_skipped_and_then_left_alone(
    settings: GrowerSettings, demo_model: DemoModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = replace(DEMO_PLANS[0], initial_turns=1)
    [thread] = await prepare_demo([plan], settings)
    path = rollout_file(settings.codex_home, thread.session_id)
    live = LiveThread(thread, plan, known_size=path.stat().st_size if path else 0)

    before = time.monotonic()
    with hold_thread_lock(settings.codex_home, thread.session_id):
        skipped = await grow_once(live, settings, asyncio.Event())

    assert skipped.thread.turns == 1
    assert skipped.quiet_until >= before + CHAT_QUIET_S
    assert "billing-api: skipped, the thread is busy in another Codex run" in capsys.readouterr().out
    assert user_texts(demo_model, thread.session_id) == [plan.prompt(0)]
    # Still quiet on the next tick, with the lock free again.
    again = await grow_once(skipped, settings, asyncio.Event())
    assert again.thread.turns == 1
    assert user_texts(demo_model, thread.session_id) == [plan.prompt(0)]


async def test_a_thread_somebody_else_wrote_to_is_left_alone(
    settings: GrowerSettings, demo_model: DemoModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = replace(DEMO_PLANS[0], initial_turns=1)
    [thread] = await prepare_demo([plan], settings)
    path = rollout_file(settings.codex_home, thread.session_id)
    live = LiveThread(thread, plan, known_size=path.stat().st_size if path else 0)
    chat = CodexTurnRequest(thread.session_id, str(thread.folder), "a chat message")
    assert (await run_codex_turn(chat, settings.codex)).succeeded

    left_alone = await grow_once(live, settings, asyncio.Event())

    assert left_alone.thread.turns == 1
    assert left_alone.quiet_until > time.monotonic() + CHAT_QUIET_S - 5
    assert "billing-api: somebody else wrote to the thread" in capsys.readouterr().out
    assert user_texts(demo_model, thread.session_id) == [plan.prompt(0), "a chat message"]


async def test_a_codex_failure_while_creating_is_said_in_words(settings: GrowerSettings) -> None:
    failing = replace(DEMO_PLANS[0], prompts=("Start. [[demo:http500]]",), initial_turns=1)

    with pytest.raises(DemoThreadError) as raised:
        await prepare_demo([failing], settings)

    message = str(raised.value)
    assert message.startswith("billing-api: Codex did not create the thread: model error: ")
    assert read_demo_threads(settings.codex_home) is None


def test_an_unreachable_model_is_said_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    code = main(["--codex-home", str(tmp_path / "home"), "--model-url", f"http://127.0.0.1:{port}/v1"])

    output = capsys.readouterr().out
    assert code == 1
    assert (
        f"cannot run the demo threads: the demo model does not answer at http://127.0.0.1:{port}/healthz"
        in (output)
    )
    assert "Traceback" not in output


def test_live_mode_grows_the_threads_until_sigterm(
    tmp_path: Path, codex_bin: Path, demo_model: DemoModelServer
) -> None:
    home = tmp_path / "demo-codex-home"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo_model.threads",
            "--codex-home",
            str(home),
            "--model-url",
            demo_model.base_url,
            "--threads",
            "1",
            "--live",
            "--interval",
            "0.05",  # billing-api, the calm thread, takes a live turn every 150 ticks: 7.5 s
        ],
        cwd=REPOSITORY_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("billing-api: turn 2 done" in line for line in seen) and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = "".join(seen) + rest
    assert process.returncode == 0, output
    assert "ready: 1 demo threads listed" in output
    assert "billing-api: turn 2 done" in output  # its starting turn, then a live one
    assert output.rstrip().endswith("stopped")
    [thread] = read_demo_threads(home) or []
    assert user_texts(demo_model, thread.session_id)[:2] == [DEMO_PLANS[0].prompt(i) for i in range(2)]
