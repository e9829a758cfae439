"""Scheduler handler benchmark: the scheduler's own CPU per consumed event, without the transport.

Applies realistic `thread.context.updated` events in batches through the real `EventConsumer.apply`
(cursor row, outbox and `after_commit` included) and `SchedulerHandlers.apply_budget_events`, on
PostgreSQL in its own schema (`bench_scheduler_handler`, **dropped first**), while the scheduler's
`StrategyPublisher` and the outbox notifier run in the same event loop as in production, so their
work (strategy recomputations over every thread of the changed projects) takes from the same CPU.
No gRPC: the events are built before the timed phase, so decoding the stream is not measured
(bench/scheduler_bench.py measures the whole path).

Load: threads rotate over `--threads` ids (default 2,000) in 200 projects and drift down in budget
(the same shape as bench/scheduler_bench.py), so levels change, packages open and commands are
issued. One pass of one event per thread seeds the threads (not timed); then `--events` events
(default 20,000) are applied in batches of `--batch` (default 500), `--runs` times (default 1).
Printed: events/s per run (first batch start to last batch commit), strategy recomputations and
`project.context_strategy.updated` events, commands issued.

Run (from the project root):
`PYTHONPATH=.:gen .venv/bin/python -m bench.scheduler_handler_bench [--events N] [--batch N]
[--threads N] [--runs N] [--database-url URL]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import text

from bench import handler_harness
from bench.scheduler_bench import NOW, budget_payload
from services.scheduler import server as scheduler_server
from services.scheduler.adapters import tables
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.service import SchedulerHandlers
from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.outbox import EventLog, StoredEvent
from services.shared.runtime import tune_garbage_collection

DEFAULT_URL = os.environ.get("BOSS_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_scheduler_handler"


def budget_event(sequence: int, threads: int, rng: random.Random) -> StoredEvent:
    """One `thread.context.updated` event as the consumer hands it to the handler (payload decoded;
    `bench.scheduler_bench.budget_payload`)."""
    return handler_harness.budget_event(
        sequence, NOW + timedelta(seconds=sequence), budget_payload(sequence, threads, rng)
    )


async def bench(
    url: str, events: int, batch: int, threads: int, runs: int, tuned_gc: bool = True
) -> list[dict[str, Any]]:
    """Seeds `threads` threads, then applies `events` events `runs` times; one result per run. With
    `tuned_gc`, the garbage collector is tuned after seeding, as a service tunes it once started."""
    handler_harness.reset_schema(url, SCHEMA)
    await scheduler_server.migrate(url, SCHEMA)
    database = Database.connect(url, SCHEMA)
    event_log = EventLog(database, tables.metadata)
    await event_log.ensure_sequencer_row()
    handlers = SchedulerHandlers(database, event_log, SchedulerSettings())
    consumer = EventConsumer(
        stream_name="context_budget",
        database=database,
        cursors=tables.event_cursors,
        open_stream=handler_harness.never_opened,
        handle=handlers.apply_budget_events,
        event_log=event_log,
        batch_size=batch,
        after_commit=handlers.budget_batch_committed,
    )
    rng = random.Random(11)
    tasks = [
        asyncio.create_task(event_log.run_notifier()),
        asyncio.create_task(handlers.strategies.run()),
    ]
    results = []
    try:
        sequence = 1
        seed = [budget_event(s, threads, rng) for s in range(sequence, sequence + threads)]
        sequence += threads
        for start in range(0, len(seed), batch):
            await consumer.apply(seed[start : start + batch])
        await handlers.strategies.flush()
        if tuned_gc:
            tune_garbage_collection()
        for _ in range(runs):
            load = [budget_event(s, threads, rng) for s in range(sequence, sequence + events)]
            sequence += events
            batches = [load[start : start + batch] for start in range(0, len(load), batch)]
            publications = handlers.strategies.publications
            await asyncio.sleep(0.2)
            started = time.perf_counter()
            cpu = time.process_time()
            for items in batches:
                await consumer.apply(items)
            seconds = time.perf_counter() - started
            cpu_seconds = time.process_time() - cpu
            async with database.read() as connection:
                commands = (
                    await connection.execute(text("SELECT count(*) FROM worker_commands"))
                ).scalar_one()
                strategy_events = (
                    await connection.execute(
                        text(
                            "SELECT count(*) FROM outbox_events "
                            "WHERE event_type = 'project.context_strategy.updated'"
                        )
                    )
                ).scalar_one()
            results.append(
                {
                    "events": events,
                    "batch": batch,
                    "threads": threads,
                    "events_per_second": round(events / seconds),
                    "process_cpu_us_per_event": round(cpu_seconds / events * 1e6, 1),
                    "strategy_recomputations": handlers.strategies.publications - publications,
                    "strategy_events_total": strategy_events,
                    "commands_total": commands,
                    "load_average_1m": round(os.getloadavg()[0], 2),
                }
            )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await database.dispose()
    return results


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints one line per run."""
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_handler_bench")
    parser.add_argument("--events", type=int, default=20_000, help="timed events per run")
    parser.add_argument("--batch", type=int, default=500, help="events per consumer transaction")
    parser.add_argument("--threads", type=int, default=2_000, help="distinct threads (200 projects)")
    handler_harness.add_run_arguments(parser, DEFAULT_URL)
    arguments = parser.parse_args(argv)
    results = asyncio.run(
        bench(
            arguments.database_url,
            arguments.events,
            arguments.batch,
            arguments.threads,
            arguments.runs,
            tuned_gc=not arguments.default_gc,
        )
    )
    handler_harness.print_runs(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
