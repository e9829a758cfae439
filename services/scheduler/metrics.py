"""The scheduler's metrics (services/shared/metrics.py): the task queue (depth by status, age of
the oldest queued task) and compactions by whether their handoff package was ready."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy import func, select, text

from services.scheduler.tasks.model import TaskStatus
from services.scheduler.tasks.tables import OPEN_ONLY, tasks
from services.shared.db import Database
from services.shared.metrics import Probe, Reading, age_seconds, meter
from services.shared.time import utc_now

COMPACTIONS = meter.create_counter(
    "boss.scheduler.compactions",
    unit="{compaction}",
    description="Compactions seen, by whether the thread's handoff package was ready before (ready|missing)",
)
UNFINISHED = (TaskStatus.QUEUED, TaskStatus.CLAIMED, TaskStatus.RUNNING)


def count_compactions(package_ready: Iterable[bool]) -> None:
    """Adds committed compactions to `boss.scheduler.compactions{handoff}`: one per item, True
    when the package was ready (or already consumed) when the compaction showed."""
    ready = missing = 0
    for item in package_ready:
        ready, missing = (ready + 1, missing) if item else (ready, missing + 1)
    if ready:
        COMPACTIONS.add(ready, {"handoff": "ready"})
    if missing:
        COMPACTIONS.add(missing, {"handoff": "missing"})


def task_queue_readings(
    counts: dict[str, int], oldest_queued_at: datetime | None, now: datetime
) -> list[Reading]:
    """The readings of the task queue: unfinished tasks per status (every one, 0 when none) and the
    oldest queued task's age in seconds (0 when none waits)."""
    readings = [
        Reading("boss.scheduler.tasks", float(counts.get(str(status), 0)), {"status": str(status)})
        for status in UNFINISHED
    ]
    readings.append(Reading("boss.scheduler.task_queue.oldest_age", age_seconds(oldest_queued_at, now)))
    return readings


def task_queue_probe(database: Database, clock: Callable[[], datetime] = utc_now) -> Probe:
    """Samples the task queue with one statement over the unfinished tasks (the partial index of
    open tasks keeps it to those rows)."""

    async def probe() -> list[Reading]:
        status, created_at = tasks.c.status, tasks.c.created_at
        query = select(status, func.count(), func.min(created_at)).where(text(OPEN_ONLY)).group_by(status)
        async with database.read() as connection:
            rows = (await connection.execute(query)).all()
        counts = {str(name): int(count) for name, count, _oldest in rows}
        oldest = next((first for name, _count, first in rows if name == TaskStatus.QUEUED), None)
        return task_queue_readings(counts, oldest, clock())

    return probe
