"""The real Codex CLI against the demo model: the rollout Codex writes carries the demo model's usage,
and with the defaults a thread compacts for real before its tenth turn, then carries on."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from demo_model import DemoModelServer, demo_model_environment, reply_text
from tests.codex_support import NewCodexThread
from worker.local_agent.codex_exec import CodexRunSettings, CodexTurnRequest, run_codex_turn


def _rollout_records(codex_home: Path, session_id: str) -> list[dict[str, Any]]:
    (path,) = (codex_home / "sessions").rglob(f"rollout-*-{session_id}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _last_totals(records: list[dict[str, Any]]) -> list[int]:
    return [
        record["payload"]["info"]["last_token_usage"]["total_tokens"]
        for record in records
        if record["type"] == "event_msg"
        and record["payload"].get("type") == "token_count"
        and record["payload"].get("info")
    ]


def test_codex_exec_json_reports_the_demo_reply(
    codex_bin: Path, codex_home: Path, tmp_path: Path, demo_model: DemoModelServer
) -> None:
    done = subprocess.run(
        [str(codex_bin), "exec", "--json", "--skip-git-repo-check", "--strict-config", "-"],
        input="hello from the test",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **demo_model_environment(), "CODEX_HOME": str(codex_home)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    session_id = events[0]["thread_id"]
    messages = [e["item"]["text"] for e in events if e["type"] == "item.completed"]
    assert messages == ["Demo model (not a real model): you said: hello from the test"]
    assert events[-1]["type"] == "turn.completed"
    assert _last_totals(_rollout_records(codex_home, session_id)) == [14_100]
    assert demo_model.requests_of(session_id)[0].user_text == "hello from the test"


async def test_a_thread_compacts_for_real_before_turn_ten_and_resumes(
    new_codex_thread: NewCodexThread,
    codex_settings: CodexRunSettings,
    codex_home: Path,
    demo_model: DemoModelServer,
) -> None:
    thread = await new_codex_thread("turn 1")
    for turn in range(2, 11):
        request = CodexTurnRequest(thread.session_id, str(thread.folder), f"turn {turn}")
        result = await run_codex_turn(request, codex_settings)
        assert result.reply_text == reply_text(f"turn {turn}")
    kinds = [record.kind.value for record in demo_model.requests_of(thread.session_id)]
    assert kinds == ["turn"] * 9 + ["local_compaction", "turn"]
    records = _rollout_records(codex_home, thread.session_id)
    compacted = [record for record in records if record["type"] == "compacted"]
    assert len(compacted) == 1
    assert "Demo model summary (not a real model): 9 user turns so far" in compacted[0]["payload"]["message"]
    totals = _last_totals(records)
    # Turns 1-9 grow by 2,000 tokens; then Codex repeats the last reading, records the compaction
    # request's own usage and its post-compaction estimate; turn 10 counts one user turn again.
    assert totals[:9] == [14_100 + 2_000 * turn for turn in range(9)]
    assert totals[9:11] == [30_100, 30_100]
    assert totals[11] < 14_100
    assert totals[12:] == [14_100]
