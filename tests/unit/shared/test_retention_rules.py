"""The pure rules of retention: which readings a window keeps, which consumers hold the outbox
back, consumer names, and the settings' validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.context_budget.retention import HistoryThinner, floor_to_interval, thinning_cutoff
from services.shared.retention import (
    ConsumerPosition,
    RetentionSettings,
    prune_bound,
    valid_consumer_name,
)

NOW = datetime(2026, 12, 1, 12, 34, 56, tzinfo=UTC)
HOUR = timedelta(hours=1)


def at(hours: float) -> datetime:
    return datetime(2026, 11, 1, tzinfo=UTC) + timedelta(hours=hours)


def test_the_thinner_keeps_the_latest_reading_per_thread_and_hour_across_pages() -> None:
    thinner = HistoryThinner(HOUR)
    rows = [
        ("a1", "thread-a", at(0.1)),
        ("b1", "thread-b", at(0.2)),
        ("a2", "thread-a", at(0.5)),
        ("a3", "thread-a", at(0.9)),
        ("a4", "thread-a", at(1.0)),  # a new hour starts exactly on the boundary
        ("b2", "thread-b", at(1.5)),
    ]

    dropped = thinner.feed(rows[:3]) + thinner.feed(rows[3:])  # one window, two pages

    assert dropped == ["a1", "a2"]


def test_the_cutoff_is_a_whole_interval_full_history_ago() -> None:
    assert thinning_cutoff(NOW, timedelta(days=7), HOUR) == datetime(2026, 11, 24, 12, tzinfo=UTC)
    assert floor_to_interval(NOW, timedelta(minutes=15)) == datetime(2026, 12, 1, 12, 30, tzinfo=UTC)


def test_prune_bound_is_the_slowest_live_consumer() -> None:
    positions = [
        ConsumerPosition("scheduler/context_budget", 900, NOW - timedelta(minutes=3)),
        ConsumerPosition("conversations/context_budget", 750, NOW - timedelta(minutes=1)),
        ConsumerPosition("retired/context_budget", 10, NOW - timedelta(days=8)),
    ]

    assert prune_bound(positions, NOW, timedelta(days=7)) == 750
    assert prune_bound(positions[2:], NOW, timedelta(days=7)) is None


def test_consumer_names_are_short_printable_keys() -> None:
    assert valid_consumer_name("scheduler/context_budget")
    assert not valid_consumer_name("")
    assert not valid_consumer_name("x" * 201)
    assert not valid_consumer_name("bad\x00name")


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENABLED", "FULL_HISTORY_DAYS", "DOWNSAMPLE_SECONDS", "OUTBOX_MIN_AGE_DAYS", "BATCH_ROWS"):
        monkeypatch.delenv(f"BOSS_RETENTION_{name}", raising=False)
    assert RetentionSettings.from_environment() == RetentionSettings()
    monkeypatch.setenv("BOSS_RETENTION_FULL_HISTORY_DAYS", "14")
    monkeypatch.setenv("BOSS_RETENTION_DOWNSAMPLE_SECONDS", "900")
    settings = RetentionSettings.from_environment()
    assert (settings.full_history, settings.downsample_interval) == (
        timedelta(days=14),
        timedelta(minutes=15),
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("FULL_HISTORY_DAYS", "a week", "BOSS_RETENTION_FULL_HISTORY_DAYS must be a number"),
        ("FULL_HISTORY_DAYS", "0", "BOSS_RETENTION_FULL_HISTORY_DAYS out of range"),
        ("BATCH_ROWS", "0", "BOSS_RETENTION_BATCH_ROWS out of range"),
        ("ENABLED", "maybe", "BOSS_RETENTION_ENABLED must be true or false"),
    ],
)
def test_bad_settings_name_their_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(f"BOSS_RETENTION_{name}", value)
    with pytest.raises(ValueError, match=message):
        RetentionSettings.from_environment()
