"""CB-9 cadence: significant changes, report intervals, when the next heartbeat is due."""

from __future__ import annotations

import pytest
from boss.context_budget.v1 import context_budget_pb2

from worker.snapshots import (
    CRITICAL,
    SAFE,
    URGENT,
    WATCH,
    Level,
    next_report_due,
    report_interval_seconds,
    significant_change,
)


def snapshot(
    percent: float = 70.0,
    *,
    level: Level = SAFE,
    compactions: int = 0,
    must_finish: bool = False,
) -> context_budget_pb2.ThreadContextSnapshot:
    return context_budget_pb2.ThreadContextSnapshot(
        thread_id="t1",
        context_budget_remaining_pct=percent,
        context_budget_level=level,
        compaction_count=compactions,
        must_finish_before_compaction=must_finish,
    )


def test_first_report_is_significant() -> None:
    assert significant_change(None, snapshot()) == "first report"


def test_level_change_is_significant_even_for_a_small_move() -> None:
    assert (
        significant_change(snapshot(60.3, level=SAFE), snapshot(59.9, level=WATCH)) == "level safe -> watch"
    )


def test_compaction_count_change_is_significant() -> None:
    assert significant_change(snapshot(70.0), snapshot(70.0, compactions=1)) == "compaction count 0 -> 1"


def test_the_first_reading_after_a_compaction_is_significant_however_close_to_the_placeholder() -> None:
    waiting = snapshot(100.0, compactions=1)
    waiting.awaiting_reading_after_compaction = True
    reading = snapshot(98.8, compactions=1)  # Codex's first answer after the compaction
    assert significant_change(waiting, reading) == "first reading after the compaction"
    assert significant_change(reading, snapshot(98.0, compactions=1)) is None  # then as usual


def test_must_finish_flip_is_significant_both_ways() -> None:
    assert significant_change(snapshot(), snapshot(must_finish=True)) == "must finish before compaction set"
    assert (
        significant_change(snapshot(must_finish=True), snapshot()) == "must finish before compaction cleared"
    )


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (80.0, 78.0, "moved -2.0 points"),
        (78.0, 80.5, "moved +2.5 points"),
        (80.0, 78.1, None),
        (80.0, 81.9, None),
        (80.0, 80.0, None),
    ],
)
def test_percent_moves_of_two_points_or_more_are_significant(
    before: float, after: float, expected: str | None
) -> None:
    assert significant_change(snapshot(before), snapshot(after)) == expected


@pytest.mark.parametrize(
    ("level", "seconds"),
    [
        (SAFE, 30),
        (WATCH, 15),
        (URGENT, 5),
        (CRITICAL, 5),
        (context_budget_pb2.CONTEXT_BUDGET_LEVEL_UNSPECIFIED, 30),
    ],
)
def test_default_interval_follows_the_level(level: Level, seconds: int) -> None:
    assert report_interval_seconds(None, level) == seconds


def test_the_servers_interval_wins_over_the_level_default() -> None:
    assert report_interval_seconds(5, SAFE) == 5
    assert report_interval_seconds(30, CRITICAL) == 30
    assert report_interval_seconds(0, WATCH) == 15


def test_next_report_due_adds_the_interval_to_the_last_send() -> None:
    assert next_report_due(1_000.0, None, SAFE) == 1_030.0
    assert next_report_due(1_000.0, None, WATCH) == 1_015.0
    assert next_report_due(1_000.0, 5, SAFE) == 1_005.0
    assert next_report_due(1_000.0, None, CRITICAL) == 1_005.0
