"""Real Codex rollout files (read-only samples next to the repository): formula and compaction facts."""

import json
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from itertools import pairwise
from pathlib import Path

import pytest

from worker.codex_sessions.budget import codex_context_left_percent
from worker.codex_sessions.rollout import parse_rollout_line, thread_id_from_rollout_name
from worker.codex_sessions.tracker import ThreadBudgetReading, ThreadBudgetTracker

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLES = REPO_ROOT.parent / "shared" / "samples" / "codex"
SAMPLE_FILES = sorted(SAMPLES.glob("*.jsonl")) if SAMPLES.is_dir() else []
EXCERPT = next((path for path in SAMPLE_FILES if "EXCERPT" in path.name), None)

pytestmark = pytest.mark.skipif(not SAMPLE_FILES, reason=f"real Codex samples not found at {SAMPLES}")


def reference_percent(total: int, window: int) -> int:
    """Codex's formula in exact decimal arithmetic, half-up: independent of the implementation."""
    effective = window - 12_000
    if effective <= 0:
        return 0
    remaining = max(0, effective - max(0, total - 12_000))
    value = (Decimal(remaining) * 100 / Decimal(effective)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return int(min(Decimal(100), max(Decimal(0), value)))


def token_counts_with_info(path: Path) -> list[tuple[int, int]]:
    """(last total, window) of every token_count line with info, read with plain json."""
    pairs = []
    for text in path.read_text(encoding="utf-8").splitlines():
        document = json.loads(text)
        payload = document.get("payload") or {}
        if document["type"] == "event_msg" and payload.get("type") == "token_count" and payload.get("info"):
            info = payload["info"]
            pairs.append((info["last_token_usage"]["total_tokens"], info["model_context_window"]))
    return pairs


def readings_of(path: Path) -> tuple[ThreadBudgetTracker, list[ThreadBudgetReading]]:
    tracker = ThreadBudgetTracker(thread_id_from_rollout_name(path.name))
    records = [parse_rollout_line(text) for text in path.read_text(encoding="utf-8").splitlines()]
    return tracker, tracker.feed_many(records)


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda path: path.name[:40])
def test_every_token_count_matches_codex_formula(path: Path) -> None:
    pairs = token_counts_with_info(path)
    assert pairs, "each sample has token_count lines with info"
    for total, window in pairs:
        assert codex_context_left_percent(total, window) == reference_percent(total, window), (total, window)


def test_sample_token_count_line_counts() -> None:
    counts = {path.name: len(token_counts_with_info(path)) for path in SAMPLE_FILES}
    assert sorted(counts.values()) == [1, 28, 55]


def test_short_sample_reads_91_percent() -> None:
    path = next(path for path in SAMPLE_FILES if "13-19-38" in path.name)
    _, readings = readings_of(path)
    assert [(r.last_total_tokens, r.codex_context_left_pct) for r in readings] == [(34_900, 91)]
    reading = readings[0]
    assert reading.codex_thread_id == "019c8a70-dda7-7f33-98ea-f30553347322"
    assert reading.model == "gpt-5.3-codex"
    assert (reading.model_context_window, reading.context_window, reading.auto_compact_token_limit) == (
        258_400,
        272_000,
        244_800,
    )
    assert reading.context_budget_remaining_pct == 90.2
    assert reading.estimated_remaining_turns is None
    assert reading.compaction_expected_at is None


def test_whole_session_readings_are_unique_and_ordered() -> None:
    path = next(path for path in SAMPLE_FILES if "12-41-04" in path.name)
    tracker, readings = readings_of(path)
    assert [r.reading_sequence for r in readings] == list(range(1, len(readings) + 1))
    keys = [(r.captured_at, r.last_total_tokens) for r in readings]
    assert len(set(keys)) == len(keys)
    assert all(earlier.captured_at < later.captured_at for earlier, later in pairwise(readings))
    assert tracker.compaction_count == 0
    # 56 token_count lines: 1 with info null and 55 with info, 27 of which re-emit unchanged totals.
    assert len(readings) == 28


@pytest.mark.skipif(EXCERPT is None, reason="excerpt sample missing")
def test_excerpt_compaction_is_counted_once_and_estimate_is_never_a_reading() -> None:
    assert EXCERPT is not None
    tracker, readings = readings_of(EXCERPT)
    assert tracker.compaction_count == 1
    assert all(r.last_total_tokens != 940_499 for r in readings)
    compacted_at = datetime(2026, 2, 24, 9, 51, 48, 878_000, tzinfo=UTC)
    assert tracker.last_compaction_at == compacted_at

    before = [r for r in readings if r.compaction_count == 0]
    # The compaction is reported at once, before Codex's next response: nothing measured yet.
    (awaiting,) = [r for r in readings if r.awaiting_reading_after_compaction]
    assert (awaiting.compaction_count, awaiting.last_compaction_at) == (1, compacted_at)
    assert awaiting.captured_at == compacted_at
    assert (awaiting.last_total_tokens, awaiting.codex_context_left_pct) == (0, None)
    after = [r for r in readings if r.compaction_count == 1 and not r.awaiting_reading_after_compaction]
    assert before[-1].last_total_tokens == 212_134
    assert before[-1].codex_context_left_pct == 19
    first_after = after[0]
    assert first_after.last_total_tokens == 48_687
    assert first_after.codex_context_left_pct == 85
    assert first_after.context_budget_remaining_pct == 84.2
    assert first_after.last_compaction_at == compacted_at
    assert first_after.captured_at == datetime(2026, 2, 24, 9, 52, 0, 530_000, tzinfo=UTC)
    # Growth estimates restart at the compaction: nothing to go on at the first reading after it.
    assert first_after.estimated_remaining_turns is None
    assert first_after.compaction_expected_at is None
    assert [r.last_total_tokens for r in after] == [48_687, 51_684, 54_788, 58_640]


@pytest.mark.skipif(EXCERPT is None, reason="excerpt sample missing")
def test_excerpt_growth_estimates_after_compaction() -> None:
    assert EXCERPT is not None
    _, readings = readings_of(EXCERPT)
    last = readings[-1]
    # Deltas 2,997, 3,104, 3,852: mean 3,317.67 tokens per turn; 244,800 - 58,640 = 186,160 left.
    assert last.estimated_remaining_turns == 56
    assert last.estimated_remaining_large_messages == 23
    # 9,953 tokens in 42.218 s: 186,160 tokens more take about 13.2 minutes.
    assert last.compaction_expected_at is not None
    minutes = (last.compaction_expected_at - last.captured_at).total_seconds() / 60
    assert minutes == pytest.approx(186_160 / (9_953 / (42.218 / 60)), rel=1e-6)
