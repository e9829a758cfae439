"""RolloutFollower on real temporary files: appends, partial lines, malformed lines, truncation."""

import json
import logging
from pathlib import Path

import pytest

from worker.codex_sessions.follower import RolloutFollower, discover_rollout_files

THREAD_ID = "0195f0aa-1111-7222-8333-444455556666"
W = 258_400


def stamp(second: int) -> str:
    return f"2026-03-02T09:{second // 60:02d}:{second % 60:02d}.000Z"


def meta_line() -> str:
    payload = {"id": THREAD_ID, "timestamp": stamp(0), "cwd": "/w", "cli_version": "0.128.0"}
    return json.dumps({"timestamp": stamp(0), "type": "session_meta", "payload": payload}) + "\n"


def token_line(second: int, total: int, cumulative: int) -> str:
    def usage(value: int) -> dict[str, int]:
        return {
            "input_tokens": value - 100,
            "cached_input_tokens": 0,
            "output_tokens": 100,
            "reasoning_output_tokens": 0,
            "total_tokens": value,
        }

    info = {
        "total_token_usage": usage(cumulative),
        "last_token_usage": usage(total),
        "model_context_window": W,
    }
    payload = {"type": "token_count", "info": info, "rate_limits": None}
    return json.dumps({"timestamp": stamp(second), "type": "event_msg", "payload": payload}) + "\n"


def rollout_file(codex_home: Path, name: str = f"rollout-2026-03-02T09-00-00-{THREAD_ID}.jsonl") -> Path:
    folder = codex_home / "sessions" / "2026" / "03" / "02"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)


def follower(codex_home: Path) -> RolloutFollower:
    return RolloutFollower(codex_home, rediscover_interval_s=0)


def test_discovery_finds_plain_rollouts_and_skips_compressed(tmp_path: Path) -> None:
    plain = rollout_file(tmp_path)
    plain.write_text("")
    rollout_file(
        tmp_path, "rollout-2026-02-01T10-00-00-0195f0aa-0000-7222-8333-444455556666.jsonl.zst"
    ).write_bytes(b"")
    rollout_file(tmp_path, "notes.jsonl").write_text("")
    assert discover_rollout_files(tmp_path) == [plain]
    assert discover_rollout_files(tmp_path / "missing") == []


def test_compressed_rollouts_are_noted_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rollout_file(
        tmp_path, "rollout-2026-02-01T10-00-00-0195f0aa-0000-7222-8333-444455556666.jsonl.zst"
    ).write_bytes(b"")
    watcher = follower(tmp_path)
    with caplog.at_level(logging.INFO, logger="worker.codex_sessions.follower"):
        watcher.poll()
        watcher.poll()
    notes = [record for record in caplog.records if "compressed" in record.getMessage()]
    assert len(notes) == 1
    assert watcher.followed_files == []


def test_reads_existing_lines_then_only_appended_ones(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 30_000, 30_000))
    watcher = follower(tmp_path)

    first = watcher.poll()
    assert len(first) == 1
    assert first[0].path == path
    assert first[0].codex_thread_id == THREAD_ID
    assert [r.last_total_tokens for r in first[0].readings] == [30_000]
    assert first[0].restarted is False

    assert watcher.poll() == []

    append(path, token_line(20, 30_000, 30_000) + token_line(30, 42_000, 72_000))
    second = watcher.poll()
    assert [(r.last_total_tokens, r.reading_sequence) for r in second[0].readings] == [(42_000, 2)]


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    complete = token_line(10, 30_000, 30_000)
    path.write_text(meta_line() + complete[:40])
    watcher = follower(tmp_path)
    assert [update.readings for update in watcher.poll()] == [()]

    append(path, complete[40:-1])
    assert watcher.poll() == []

    append(path, "\n")
    updates = watcher.poll()
    assert [r.last_total_tokens for r in updates[0].readings] == [30_000]


def test_malformed_and_unknown_lines_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = rollout_file(tmp_path)
    unknown = json.dumps({"timestamp": stamp(5), "type": "world_state", "payload": {"v": 2}}) + "\n"
    path.write_text(meta_line() + "{not json\n" + unknown + "\n" + token_line(10, 30_000, 30_000))
    watcher = follower(tmp_path)
    with caplog.at_level(logging.WARNING, logger="worker.codex_sessions.follower"):
        updates = watcher.poll()
    assert [r.last_total_tokens for r in updates[0].readings] == [30_000]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "line 2" in warnings[0] and "not valid JSON" in warnings[0]


def test_truncated_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 30_000, 30_000) + token_line(20, 40_000, 70_000))
    watcher = follower(tmp_path)
    watcher.poll()

    path.write_text(meta_line() + token_line(10, 25_000, 25_000))
    updates = watcher.poll()
    assert updates[0].restarted is True
    assert [(r.last_total_tokens, r.reading_sequence) for r in updates[0].readings] == [(25_000, 1)]


def test_replaced_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 30_000, 30_000))
    watcher = follower(tmp_path)
    watcher.poll()

    replacement = path.with_suffix(".tmp")
    replacement.write_text(meta_line() + token_line(10, 31_000, 31_000) + token_line(20, 35_000, 66_000))
    replacement.replace(path)
    updates = watcher.poll()
    assert updates[0].restarted is True
    assert [r.last_total_tokens for r in updates[0].readings] == [31_000, 35_000]


def test_vanished_file_is_forgotten_and_new_files_are_picked_up(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line())
    watcher = follower(tmp_path)
    watcher.poll()
    assert watcher.followed_files == [path]

    path.unlink()
    other = rollout_file(tmp_path, "rollout-2026-03-02T10-00-00-0195f0aa-9999-7222-8333-444455556666.jsonl")
    other.write_text(token_line(10, 20_000, 20_000))
    updates = watcher.poll()
    assert watcher.followed_files == [other]
    assert updates[0].codex_thread_id == "0195f0aa-9999-7222-8333-444455556666"


def test_rediscovery_waits_for_its_interval(tmp_path: Path) -> None:
    now = [0.0]
    watcher = RolloutFollower(tmp_path, rediscover_interval_s=10, clock=lambda: now[0])
    assert watcher.poll() == []
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 30_000, 30_000))
    now[0] = 5.0
    assert watcher.poll() == []
    now[0] = 10.0
    assert len(watcher.poll()) == 1
    assert watcher.tracker(path) is not None


def test_compactions_are_reported_per_poll(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 230_000, 230_000))
    watcher = follower(tmp_path)
    watcher.poll()
    compacted = json.dumps({"timestamp": stamp(20), "type": "compacted", "payload": {"message": ""}}) + "\n"
    event = (
        json.dumps({"timestamp": stamp(21), "type": "event_msg", "payload": {"type": "context_compacted"}})
        + "\n"
    )
    append(path, compacted + event + token_line(30, 40_000, 270_000))
    update = watcher.poll()[0]
    assert update.new_compactions == 1
    assert [(r.last_total_tokens, r.compaction_count) for r in update.readings] == [(40_000, 1)]
