"""Demo sessions: generated rollouts parse, hold a compaction, and move when played."""

import json
import shutil
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from worker.codex_sessions.follower import RolloutFollower, discover_rollout_files
from worker.codex_sessions.git_state import read_git_state
from worker.codex_sessions.rollout import (
    CompactedRecord,
    CompactionSummaryRecord,
    ContextCompactedRecord,
    ContextCompactionItemRecord,
    parse_rollout_line,
)
from worker.codex_sessions.tracker import ThreadBudgetReading, ThreadBudgetTracker
from worker.demo_sessions import DemoSessionPlayer, main, write_demo_codex_home

NOW = datetime(2026, 3, 2, 15, 30, tzinfo=UTC)


def readings_by_thread(follower: RolloutFollower) -> dict[str, list[ThreadBudgetReading]]:
    result: dict[str, list[ThreadBudgetReading]] = {}
    for update in follower.poll():
        assert update.codex_thread_id is not None
        result.setdefault(update.codex_thread_id, []).extend(update.readings)
    return result


def test_generated_files_parse_and_hold_a_compaction(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    assert sorted(discover_rollout_files(tmp_path)) == sorted(thread.path for thread in threads)
    compactions = 0
    for thread in threads:
        assert thread.path.relative_to(tmp_path).parts[:4] == ("sessions", "2026", "03", "02")
        assert (
            thread.path.name.startswith("rollout-2026-03-02T") and thread.codex_thread_id in thread.path.name
        )
        records = [parse_rollout_line(text) for text in thread.path.read_text(encoding="utf-8").splitlines()]
        assert all(record.timestamp <= NOW for record in records)
        assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)
        tracker = ThreadBudgetTracker()
        readings = tracker.feed_many(records)
        assert readings, thread.plan.name
        assert tracker.codex_thread_id == thread.codex_thread_id
        assert readings[-1].cwd == str(thread.cwd)
        assert readings[-1].last_total_tokens == thread.last_total_tokens
        test_run = tracker.last_activity.last_test_run
        assert test_run is not None
        assert (test_run.run.command, test_run.outcome) == ("pytest -q", "passed")
        assert test_run.summary is not None and test_run.summary.startswith("3 passed")
        compactions += tracker.compaction_count
        if tracker.compaction_count:
            kinds = [type(record) for record in records]
            assert CompactedRecord in kinds and ContextCompactionItemRecord in kinds
            assert CompactionSummaryRecord in kinds
            assert max(r.last_total_tokens for r in readings) <= 244_800
            after = [r for r in readings if r.compaction_count == 1]
            assert after and after[0].last_total_tokens < 60_000
    assert compactions == 1


def test_lines_are_in_codex_0_169s_vocabulary(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    for thread in threads:
        lines = [json.loads(text) for text in thread.path.read_text(encoding="utf-8").splitlines()]
        assert [line["ordinal"] for line in lines] == list(range(len(lines)))
        assert lines[0]["payload"]["cli_version"] == "0.169.0"
        events = {line["payload"].get("type") for line in lines if line["type"] == "event_msg"}
        assert not events & {"user_message", "agent_message", "context_compacted"}
        items = {
            line["payload"]["item"]["type"]
            for line in lines
            if line["payload"].get("type") == "item_completed"
        }
        assert {"UserMessage", "AgentMessage", "CommandExecution"} <= items
        kinds = {line["type"] for line in lines}
        assert {"token_usage_record", "world_state", "turn_context"} <= kinds
        records = [parse_rollout_line(json.dumps(line)) for line in lines]
        assert not any(isinstance(record, ContextCompactedRecord) for record in records)


def test_compaction_thread_writes_the_codex_estimate_line(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    compacting = next(thread for thread in threads if thread.compactions)
    estimates = []
    for text in compacting.path.read_text(encoding="utf-8").splitlines():
        payload = json.loads(text)["payload"]
        if payload.get("type") == "token_count" and payload.get("info"):
            last = payload["info"]["last_token_usage"]
            if last["input_tokens"] == 0 and last["output_tokens"] == 0 and last["total_tokens"] > 0:
                estimates.append(last["total_tokens"])
    # 0.169 writes one estimate, after `compacted`: the size of the summarised history.
    assert len(estimates) == 1
    assert 6_000 <= estimates[0] <= 9_000


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_workspaces_are_git_repositories_with_one_dirty(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    states = {thread.plan.name: read_git_state(thread.cwd) for thread in threads}
    assert all(state is not None and state.branch == "main" for state in states.values())
    dirty = {name for name, state in states.items() if state is not None and state.has_uncommitted_changes}
    assert dirty == {"ios-sync-client"}
    first_line = json.loads(threads[0].path.read_text(encoding="utf-8").splitlines()[0])
    first_state = states[threads[0].plan.name]
    assert first_state is not None
    assert first_line["payload"]["git"]["commit_hash"] == first_state.head_commit


def test_player_moves_budgets_down_then_up_after_a_compaction(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    follower = RolloutFollower(tmp_path, rediscover_interval_s=0)
    history = readings_by_thread(follower)
    player = DemoSessionPlayer(threads)
    compacting_id = next(
        thread.codex_thread_id for thread in threads if thread.plan.name == "firmware-flasher"
    )
    start = len(history[compacting_id])
    for step in range(1, 9):
        player.advance(NOW + timedelta(minutes=2 * step))
        for thread_id, readings in readings_by_thread(follower).items():
            history[thread_id].extend(readings)

    played = history[compacting_id][start:]
    budgets = [reading.context_budget_remaining_pct for reading in played]
    jump = next(index for index, reading in enumerate(played) if reading.compaction_count == 2)
    assert jump > 2
    assert all(earlier > later for earlier, later in pairwise(budgets[:jump]))
    assert budgets[jump] > budgets[jump - 1] + 50
    for thread in player.threads:
        assert thread.turns_written > 0
        readings = history[thread.codex_thread_id]
        assert [r.reading_sequence for r in readings] == list(range(1, len(readings) + 1))


def test_cli_writes_a_codex_home(tmp_path: Path) -> None:
    assert main(["--codex-home", str(tmp_path), "--threads", "4"]) == 0
    files = discover_rollout_files(tmp_path)
    assert len(files) == 4
    assert (tmp_path / "workspaces" / "billing-api-2").is_dir()


def test_threads_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="threads"):
        write_demo_codex_home(tmp_path, NOW, threads=0)


def test_player_never_writes_lines_after_now(tmp_path: Path) -> None:
    threads = write_demo_codex_home(tmp_path, NOW, threads=3)
    player = DemoSessionPlayer(threads)
    now = NOW
    for _ in range(12):
        now += timedelta(seconds=2)
        player.advance(now)
    for thread in player.threads:
        stamps = [
            parse_rollout_line(text).timestamp
            for text in thread.path.read_text(encoding="utf-8").splitlines()
        ]
        assert max(stamps) <= now
        assert stamps == sorted(stamps)
