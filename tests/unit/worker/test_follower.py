"""RolloutFollower on real temporary files: appends, partial lines, malformed lines, truncation."""

import json
import logging
from pathlib import Path

import pytest
import zstandard

from worker.codex_sessions.codex_config import LimitSource
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


COMPRESSED_NAME = "rollout-2026-02-01T10-00-00-0195f0aa-0000-7222-8333-444455556666.jsonl.zst"


def archived_file(codex_home: Path, name: str) -> Path:
    folder = codex_home / "archived_sessions"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def test_discovery_finds_plain_compressed_and_archived_rollouts(tmp_path: Path) -> None:
    plain = rollout_file(tmp_path)
    plain.write_text("")
    compressed = rollout_file(tmp_path, COMPRESSED_NAME)
    compressed.write_bytes(b"")
    archived = archived_file(
        tmp_path, "rollout-2026-01-05T08-00-00-0195f0aa-2222-7222-8333-444455556666.jsonl"
    )
    archived.write_text("")
    rollout_file(tmp_path, "notes.jsonl").write_text("")
    assert discover_rollout_files(tmp_path) == sorted([plain, compressed, archived])
    assert discover_rollout_files(tmp_path / "missing") == []


def test_a_compressed_copy_of_a_plain_rollout_is_left_to_the_plain_one(tmp_path: Path) -> None:
    plain = rollout_file(tmp_path)
    plain.write_text("")
    rollout_file(tmp_path, plain.name + ".zst").write_bytes(b"")
    assert discover_rollout_files(tmp_path) == [plain]


def test_a_compressed_rollout_is_read_whole_once(tmp_path: Path) -> None:
    text = meta_line() + token_line(10, 30_000, 30_000) + token_line(20, 41_000, 71_000)
    path = rollout_file(tmp_path, COMPRESSED_NAME)
    path.write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    watcher = follower(tmp_path)
    (update,) = watcher.poll()
    assert update.path == path
    assert update.codex_thread_id == THREAD_ID
    assert [r.last_total_tokens for r in update.readings] == [30_000, 41_000]
    assert watcher.poll() == []


def test_an_archived_compressed_rollout_is_read(tmp_path: Path) -> None:
    text = meta_line() + token_line(10, 52_000, 52_000)
    archived_file(tmp_path, COMPRESSED_NAME).write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    (update,) = follower(tmp_path).poll()
    assert [r.last_total_tokens for r in update.readings] == [52_000]


def test_a_broken_compressed_rollout_is_logged_and_not_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rollout_file(tmp_path, COMPRESSED_NAME).write_bytes(b"not zstd at all")
    watcher = follower(tmp_path)
    with caplog.at_level(logging.WARNING, logger="worker.codex_sessions.follower"):
        assert watcher.poll() == []
        assert watcher.poll() == []
    warnings = [record for record in caplog.records if "not valid zstd" in record.getMessage()]
    assert len(warnings) == 1


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
    # The compaction is reported at once ("compacted, waiting for the first reading"), then the
    # first real reading after it.
    assert [
        (r.last_total_tokens, r.compaction_count, r.awaiting_reading_after_compaction)
        for r in update.readings
    ] == [(0, 1, True), (40_000, 1, False)]


def test_a_compaction_after_the_last_reading_is_reported_by_the_next_poll(tmp_path: Path) -> None:
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 230_000, 230_000))
    watcher = follower(tmp_path)
    watcher.poll()
    append(path, json.dumps({"timestamp": stamp(20), "type": "compacted", "payload": {"message": ""}}) + "\n")
    (update,) = watcher.poll()
    (reading,) = update.readings
    assert reading.awaiting_reading_after_compaction
    assert (reading.compaction_count, reading.context_budget_remaining_pct) == (1, 100.0)
    assert reading.codex_context_left_pct is None


def test_the_configuration_of_the_codex_home_decides_l_and_is_read_again_when_edited(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("model_auto_compact_token_limit = 200000\n")
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 106_000, 106_000))
    watcher = follower(tmp_path)
    (first,) = watcher.poll()[0].readings
    assert (first.auto_compact_token_limit, first.compaction_limit_source) == (
        200_000,
        LimitSource.CONFIGURED,
    )
    assert first.context_budget_remaining_pct == 50.0
    (tmp_path / "config.toml").write_text("model_auto_compact_token_limit = 150000 # lowered\n")
    append(path, token_line(20, 107_000, 213_000))
    (second,) = watcher.poll()[0].readings
    assert second.auto_compact_token_limit == 150_000


def test_an_assumed_limit_is_said_once_with_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "config.toml").write_text("model_auto_compact_token_limit = [\n")
    path = rollout_file(tmp_path)
    path.write_text(meta_line() + token_line(10, 106_000, 106_000) + token_line(20, 107_000, 213_000))
    with caplog.at_level(logging.INFO, logger="worker.codex_sessions.follower"):
        (update,) = follower(tmp_path).poll()
    assert {reading.compaction_limit_source for reading in update.readings} == {LimitSource.ASSUMED}
    said = [record for record in caplog.records if "Codex compacts at" in record.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "244800 tokens (assumed:" in said[0].getMessage() and "not valid TOML" in said[0].getMessage()
