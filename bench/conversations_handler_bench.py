"""Conversations projection benchmark: the projection's own cost per batch, without the transport.

Applies `thread.context.updated` events (payloads as context_budget publishes them) through the real
`EventConsumer.apply` (cursor row and outbox included) and `ConversationsHandlers.apply_budget_events`,
on PostgreSQL in its own schema (`bench_conversations_handler`, **dropped first**), with the outbox
notifier running in the same event loop as in production. No gRPC: events are built before the timed
phase (bench/conversations_bench.py measures the whole path).

Load: `--threads` threads (default 1,000), each registered with its own single_device project, whose
percents drift down (as a working Codex thread's do), in batches of `--batch` events (default 10:
what the projection applies per transaction at 1,000 snapshots/s, one context_budget commit per
worker message of 10). `--batches` batches per run (default 2,000), `--runs` runs (default 1).

Printed per run: batches/s, events/s, wall time per batch (p50/p99, ms: the projection's share of
the report -> SSE latency) and process CPU per event (us).

Run (from the project root):
`PYTHONPATH=.:gen .venv/bin/python -m bench.conversations_handler_bench [--batch N] [--batches N]
[--threads N] [--runs N] [--database-url URL]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import handler_harness
from bench.ingest_bench import python_speed_reference
from services.context_budget.domain.policy import DEFAULT_POLICY, classify
from services.conversations import server as conversations_server
from services.conversations.adapters.tables import event_cursors
from services.conversations.domain.model import Registration
from services.shared.auth import TokenAuthority
from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.outbox import StoredEvent
from services.shared.runtime import tune_garbage_collection

DEFAULT_URL = os.environ.get("BOSS_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_conversations_handler"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NODE, WORKER = "node-bench", "worker-bench"


def budget_event(sequence: int, thread_id: str, percent: float) -> StoredEvent:
    """One `thread.context.updated` event as the consumer hands it to the handler (payload decoded;
    the fields context_budget's `updated_event` writes)."""
    at = NOW + timedelta(milliseconds=sequence)
    level = classify(percent, DEFAULT_POLICY).value
    payload = {
        "thread_id": thread_id,
        "project_id": "",
        "task_id": "",
        "node_id": NODE,
        "worker_id": WORKER,
        "snapshot_id": f"snapshot-{sequence}",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": percent,
        "context_budget_level": level,
        "previous_level": level,
        "reported_context_budget_level": None,
        "compaction_expected_at": None,
        "must_finish_before_compaction": False,
        "must_finish_reason": "",
        "estimated_remaining_turns": None,
        "estimated_remaining_large_messages": None,
        "last_compaction_at": None,
        "compaction_count": 0,
        "snapshot_version": sequence,
        "captured_at": at.isoformat().replace("+00:00", "Z"),
        "updated_at": at.isoformat().replace("+00:00", "Z"),
        "codex_context_left_pct": None,
        "last_total_tokens": 0,
        "model_context_window": 0,
        "auto_compact_token_limit": 0,
        "codex_folder": "",
        "master_actions": [],
        "next_required_report_in_seconds": 15,
    }
    return handler_harness.budget_event(sequence, at, payload)


async def bench(
    url: str, batch: int, batches: int, threads: int, runs: int, tuned_gc: bool = True
) -> list[dict[str, Any]]:
    """Registers `threads` threads, then applies `batches` batches `runs` times; one result per run.
    With `tuned_gc`, the garbage collector is tuned after registration, as a service tunes it once
    started."""
    handler_harness.reset_schema(url, SCHEMA)
    await conversations_server.migrate(url, SCHEMA)
    database = Database.connect(url, SCHEMA)
    app = conversations_server.build_app(database, TokenAuthority("x" * 64))
    event_log, handlers = app.event_log, app.handlers
    await event_log.ensure_sequencer_row()
    consumer = EventConsumer(
        stream_name="context_budget",
        database=database,
        cursors=event_cursors,
        open_stream=handler_harness.never_opened,
        handle=handlers.apply_budget_events,
        event_log=event_log,
        batch_size=max(batch, 500),
    )
    notifier = asyncio.create_task(event_log.run_notifier())
    thread_ids = [f"thread-{index:05d}" for index in range(threads)]
    percents = {thread_id: 95.0 - (index % 50) for index, thread_id in enumerate(thread_ids)}
    results = []
    try:
        for thread_id in thread_ids:
            await handlers.register_thread(Registration(thread_id, NODE, WORKER, "local"))
        sequence = 1
        turn = 0

        def next_batch() -> list[StoredEvent]:
            nonlocal sequence, turn
            items = []
            for _ in range(batch):
                thread_id = thread_ids[turn % threads]
                turn += 1
                percent = percents[thread_id] - 0.3
                percents[thread_id] = percent if percent > 5 else 90.0
                items.append(budget_event(sequence, thread_id, round(percents[thread_id], 1)))
                sequence += 1
            return items

        for _ in range(max(1, threads // batch)):  # every thread once: not timed
            await consumer.apply(next_batch())
        handler_harness.analyze(url)
        if tuned_gc:
            tune_garbage_collection()
        for _ in range(runs):
            load = [next_batch() for _ in range(batches)]
            await asyncio.sleep(0.2)
            walls = []
            started = time.perf_counter()
            cpu = time.process_time()
            for items in load:
                began = time.perf_counter()
                await consumer.apply(items)
                walls.append((time.perf_counter() - began) * 1000)
            seconds = time.perf_counter() - started
            cpu_seconds = time.process_time() - cpu
            walls.sort()
            results.append(
                {
                    "batch": batch,
                    "batches": batches,
                    "threads": threads,
                    "batches_per_second": round(batches / seconds),
                    "events_per_second": round(batches * batch / seconds),
                    "batch_wall_p50_ms": round(statistics.median(walls), 2),
                    "batch_wall_p99_ms": round(walls[int(len(walls) * 0.99)], 2),
                    "process_cpu_us_per_event": round(cpu_seconds / (batches * batch) * 1e6, 1),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                }
            )
    finally:
        notifier.cancel()
        await asyncio.gather(notifier, return_exceptions=True)
        await database.dispose()
    return results


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints one line per run."""
    parser = argparse.ArgumentParser(prog="python -m bench.conversations_handler_bench")
    parser.add_argument("--batch", type=int, default=10, help="events per consumer transaction")
    parser.add_argument("--batches", type=int, default=2_000, help="timed batches per run")
    parser.add_argument("--threads", type=int, default=1_000, help="threads, one project each")
    handler_harness.add_run_arguments(parser, DEFAULT_URL)
    arguments = parser.parse_args(argv)
    print(f"python_speed_reference_ms={python_speed_reference()}")
    results = asyncio.run(
        bench(
            arguments.database_url,
            arguments.batch,
            arguments.batches,
            arguments.threads,
            arguments.runs,
            tuned_gc=not arguments.default_gc,
        )
    )
    handler_harness.print_runs(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
