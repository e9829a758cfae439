"""The pure parts of the metrics: which outcomes count as applied readings, the task-queue
readings, ages, the sample interval setting and a sampler whose probe fails."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import ContextBudgetLevel
from services.context_budget.metrics import applied_levels
from services.scheduler.metrics import task_queue_readings
from services.shared.errors import FieldViolation, InvalidArgument
from services.shared.metrics import GaugeSampler, Reading, age_seconds, sample_interval_seconds

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def outcome(level: ContextBudgetLevel, **flags: object) -> IngestOutcome:
    return IngestOutcome(snapshot_id="s", thread_id="t", level=level, **flags)  # type: ignore[arg-type]


def test_only_applied_readings_count_by_level() -> None:
    outcomes = [
        outcome(ContextBudgetLevel.URGENT),
        outcome(ContextBudgetLevel.URGENT),
        outcome(ContextBudgetLevel.SAFE),
        outcome(ContextBudgetLevel.SAFE, duplicate=True),
        outcome(ContextBudgetLevel.WATCH, superseded=True),
        outcome(
            ContextBudgetLevel.CRITICAL, error=InvalidArgument([FieldViolation("snapshot_id", "reused")])
        ),
    ]

    assert applied_levels(outcomes) == {"urgent": 2, "safe": 1}


def test_task_queue_readings_name_every_unfinished_status_and_the_oldest_age() -> None:
    readings = task_queue_readings({"queued": 4, "running": 1}, NOW - timedelta(seconds=90), NOW)

    assert [(r.gauge, r.value, dict(r.attributes)) for r in readings] == [
        ("boss.scheduler.tasks", 4.0, {"status": "queued"}),
        ("boss.scheduler.tasks", 0.0, {"status": "claimed"}),
        ("boss.scheduler.tasks", 1.0, {"status": "running"}),
        ("boss.scheduler.task_queue.oldest_age", 90.0, {}),
    ]


def test_an_empty_queue_has_no_age() -> None:
    assert task_queue_readings({}, None, NOW)[-1].value == 0.0


def test_ages_are_never_negative() -> None:
    assert age_seconds(NOW - timedelta(minutes=2), NOW) == 120.0
    assert age_seconds(NOW + timedelta(seconds=5), NOW) == 0.0
    assert age_seconds(None, NOW) == 0.0


def test_sample_interval_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOSS_METRICS_SAMPLE_SECONDS", raising=False)
    assert sample_interval_seconds() == 15.0
    monkeypatch.setenv("BOSS_METRICS_SAMPLE_SECONDS", "2.5")
    assert sample_interval_seconds() == 2.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv("BOSS_METRICS_SAMPLE_SECONDS", bad)
        with pytest.raises(ValueError, match="BOSS_METRICS_SAMPLE_SECONDS"):
            sample_interval_seconds()


async def test_a_failing_probe_keeps_its_last_readings_and_the_others_move_on() -> None:
    calls = {"count": 0}

    async def flaky() -> list[Reading]:
        calls["count"] += 1
        if calls["count"] > 1:
            raise ConnectionError("database unreachable")
        return [Reading("boss.outbox.head_sequence", 7.0)]

    async def steady() -> list[Reading]:
        return [Reading("boss.gateway.sse_clients", float(calls["count"]))]

    sampler = GaugeSampler("unit", [flaky, steady], interval_seconds=60)
    try:
        await sampler.sample()
        await sampler.sample()
        latest = {gauge: [r.value for r in readings] for gauge, readings in sampler.latest.items()}
    finally:
        sampler.close()

    assert latest == {"boss.outbox.head_sequence": [7.0], "boss.gateway.sse_clients": [2.0]}
    assert sampler.latest == {}
