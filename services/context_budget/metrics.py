"""context_budget's metrics (services/shared/metrics.py): readings applied by level, threads by
their current level, and the sampled gauges of its outbox and consumers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy import func, select

from services.context_budget.adapters.tables import thread_contexts
from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import ContextBudgetLevel, Snapshot
from services.shared.db import Database
from services.shared.metrics import Probe, Reading, meter

READINGS = meter.create_counter(
    "boss.context_budget.readings",
    unit="{reading}",
    description="Readings applied as a thread's current state, by the server's level",
)

Ingest = Callable[[Sequence[Snapshot]], Awaitable[list[IngestOutcome]]]


def applied_levels(outcomes: Sequence[IngestOutcome]) -> dict[str, int]:
    """How many outcomes applied a reading, per server level (duplicates, superseded and refused
    snapshots apply none)."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.duplicate or outcome.superseded or outcome.error is not None:
            continue
        counts[str(outcome.level)] = counts.get(str(outcome.level), 0) + 1
    return counts


def counting_readings(ingest: Ingest) -> Ingest:
    """`ingest` that adds its applied readings to `boss.context_budget.readings{level}` (after the
    commit: `ingest` returns only then)."""

    async def counted(snapshots: Sequence[Snapshot]) -> list[IngestOutcome]:
        outcomes = await ingest(snapshots)
        for level, count in applied_levels(outcomes).items():
            READINGS.add(count, {"level": level})
        return outcomes

    return counted


def threads_by_level_probe(database: Database) -> Probe:
    """`boss.context_budget.threads{level}`: one GROUP BY over `thread_contexts` (one row per
    thread); every level appears, 0 when no thread is at it."""

    async def probe() -> list[Reading]:
        level = thread_contexts.c.context_budget_level
        async with database.read() as connection:
            rows = (await connection.execute(select(level, func.count()).group_by(level))).all()
        counts = {str(name): int(count) for name, count in rows}
        return [
            Reading("boss.context_budget.threads", float(counts.get(str(item), 0)), {"level": str(item)})
            for item in ContextBudgetLevel
        ]

    return probe
