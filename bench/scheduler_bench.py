"""Scheduler benchmark (issue 3 "Performance"): ranking 10,000 threads, and event consumption.

Phases:

1. `rank_10k`: `rank_threads` over 10,000 generated thread states (mixed levels, must-finish flags,
   compaction times, importance), 100 runs after 3 warm-up runs; also the full RPC-side work
   (ranking + `strategy_summary` + `choose_thread_for_work`). Target: ranking <= 50 ms at the median
   (min, p50, p99 and max reported with the machine's load average: on a shared machine the max is
   noise).
2. `consume_backlog`: a context_budget stand-in serves N (default 20,000) `thread.context.updated`
   events over real gRPC (WatchEvents) from its own process (as context_budget is in production, so
   serving the stream does not take the consumer's CPU); the scheduler's real `EventConsumer` with
   the real handler applies them into PostgreSQL (schema `scheduler_bench`, dropped first) with its
   durable cursor.
   The scheduler's `StrategyPublisher` runs as in production (project.context_strategy.updated in
   the background; its recomputations and published events are reported).
   Reported: events/s from the first to the last applied event, and events per consumer
   transaction. Target: at least the ingest rate, 10,000 events/s (batched ingest).
3. `consume_paced`: events published at a fixed rate (`--paced-rate`, default 10,000/s: the ingest
   rate) for 5 s; lag per event from publish to "applied and committed" (the consumer's cursor
   passing it). Reported: p50 / p99 / max.

Before the consumption phases it waits (up to 30 s) for an idle machine and records the busy cores
it saw (`background_busy_cores_before_run`).

Threads rotate over 2,000 ids and levels move so that the level actions, packages and commands are
exercised (about one command per 10 events). Results go to bench/output/scheduler.json.

Run: `PYTHONPATH=.:gen .venv/bin/python -m bench.scheduler_bench [--quick] [--paced-rate N]
[--database-url URL]`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from boss.common.v1 import events_pb2
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc
from sqlalchemy import create_engine, text

from bench import handler_harness
from bench.ingest_bench import (
    postgres_cpu_seconds,
    process_cpu_seconds,
    python_speed_reference,
    wait_for_quiet,
)
from services.scheduler import server as scheduler_server
from services.scheduler.domain.model import Level, ThreadState
from services.scheduler.domain.ranking import choose_thread_for_work, rank_threads, strategy_summary
from services.shared.migrations import sync_url
from services.shared.runtime import tune_garbage_collection
from services.shared.time import isoformat_utc, to_timestamp

OUTPUT = Path(__file__).resolve().parent / "output" / "scheduler.json"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SCHEMA = "scheduler_bench"
SECRET = "bench-secret-for-the-scheduler-0123456789"
NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def generated_threads(count: int, seed: int = 7) -> list[ThreadState]:
    """`count` thread states with a realistic mix of levels and ranking facts."""
    rng = random.Random(seed)
    levels = [Level.SAFE] * 6 + [Level.WATCH] * 2 + [Level.URGENT, Level.CRITICAL]
    states = []
    for index in range(count):
        level = rng.choice(levels)
        states.append(
            ThreadState(
                thread_id=f"thread-{index:05d}",
                project_id=f"project-{index % 200:03d}",
                level=level,
                remaining_pct=rng.uniform(0, 100),
                reported_must_finish=rng.random() < 0.1,
                reported_must_finish_reason=rng.choice(["uncommitted changes in 2 files", "test results"]),
                compaction_expected_at=NOW + timedelta(minutes=rng.uniform(1, 600))
                if rng.random() < 0.5
                else None,
                task_importance=rng.randint(0, 100),
                hardware_test_in_progress=rng.random() < 0.05,
                last_activity_at=NOW - timedelta(seconds=rng.uniform(0, 600)),
            )
        )
    return states


def bench_ranking(runs: int) -> dict[str, Any]:
    """Phase 1: ranking (and the RPC-side extras) over 10,000 threads, milliseconds."""
    states = generated_threads(10_000)
    for _ in range(3):
        rank_threads(states)
    rank_ms, full_ms = [], []
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        ranked = rank_threads(states)
        rank_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        ranked = rank_threads(states)
        strategy_summary(ranked, choose_thread_for_work(states, NOW, timedelta(minutes=2)))
        full_ms.append((time.perf_counter() - started) * 1000)
    return {
        "threads": len(states),
        "runs": runs,
        "rank_ms_min": round(min(rank_ms), 2),
        "rank_ms_p50": round(statistics.median(rank_ms), 2),
        "rank_ms_p99": round(sorted(rank_ms)[max(0, int(len(rank_ms) * 0.99) - 1)], 2),
        "rank_ms_max": round(max(rank_ms), 2),
        "rank_summary_choice_ms_p50": round(statistics.median(full_ms), 2),
        "target_ms": 50,
        "met": statistics.median(rank_ms) <= 50,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def budget_payload(sequence: int, threads: int, rng: random.Random) -> dict[str, Any]:
    """The payload of one `thread.context.updated` event as context_budget publishes it: thread
    `sequence % threads` (in 200 projects), its budget falling about 7 points per pass over the
    threads, so threads move through every level."""
    thread = sequence % threads
    step = sequence // threads
    pct = max(0.0, 95 - 7 * step + rng.uniform(-3, 3))
    level = "safe" if pct >= 60 else "watch" if pct >= 40 else "urgent" if pct >= 25 else "critical"
    return {
        "thread_id": f"thread-{thread:05d}",
        "project_id": f"project-{thread % 200:03d}",
        "task_id": "",
        "node_id": f"node-{thread % 20}",
        "worker_id": f"worker-{thread % 20}",
        "context_budget_remaining_pct": pct,
        "context_budget_level": level,
        "compaction_expected_at": None,
        "must_finish_before_compaction": False,
        "must_finish_reason": "",
        "compaction_count": 0,
        "last_compaction_at": None,
        "snapshot_version": step + 1,
        "captured_at": isoformat_utc(NOW + timedelta(seconds=sequence)),
        "last_total_tokens": 1000 * (step + 1),
        "codex_folder": "/repo",
    }


def budget_event(sequence: int, rng: random.Random) -> events_pb2.EventEnvelope:
    """One `thread.context.updated` envelope over 2,000 threads (`budget_payload`)."""
    payload = budget_payload(sequence, 2_000, rng)
    return events_pb2.EventEnvelope(
        sequence=sequence,
        type="thread.context.updated",
        occurred_at=to_timestamp(NOW + timedelta(seconds=sequence)),
        thread_id=payload["thread_id"],
        project_id=payload["project_id"],
        node_id=payload["node_id"],
        payload_json=json.dumps(payload),
    )


class Upstream(context_budget_pb2_grpc.ContextBudgetServiceServicer):
    """Serves a growing list of envelopes on WatchEvents (runs in the upstream process)."""

    def __init__(self) -> None:
        self.events: list[events_pb2.EventEnvelope] = []
        self._grown = asyncio.Event()

    def publish(self, envelopes: list[events_pb2.EventEnvelope]) -> None:
        self.events.extend(envelopes)
        self._grown.set()

    async def WatchEvents(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        cursor = request.after_sequence
        while True:
            if cursor < len(self.events):
                # Runs of up to 500, as services/shared/outbox.py FOLLOW_BATCH_LIMIT serves them.
                run = self.events[cursor : cursor + 500]
                yield context_budget_pb2.WatchEventsResponse(events=run)
                cursor += len(run)
                continue
            self._grown.clear()
            await self._grown.wait()


def serve_upstream(control: Connection) -> None:
    """Entry point of the upstream process: serves WatchEvents on a free loopback port (sent back
    over `control`), then appends every list of serialized envelopes received; None stops it."""

    async def serve() -> None:
        upstream = Upstream()
        server = grpc.aio.server()
        context_budget_pb2_grpc.add_ContextBudgetServiceServicer_to_server(upstream, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        control.send(port)
        loop = asyncio.get_running_loop()
        while (message := await loop.run_in_executor(None, control.recv)) is not None:
            upstream.publish([events_pb2.EventEnvelope.FromString(raw) for raw in message])
        await server.stop(0)

    asyncio.run(serve())


class RemoteUpstream:
    """The parent's handle on the upstream process; records when each event was published."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._control, child = context.Pipe()
        self._process = context.Process(target=serve_upstream, args=(child,), daemon=True)
        self._process.start()
        self.port = int(self._control.recv())
        self.pid = int(self._process.pid or 0)
        self.published_at: list[float] = []

    def publish(self, envelopes: list[events_pb2.EventEnvelope]) -> None:
        self.publish_serialized([envelope.SerializeToString() for envelope in envelopes])

    def publish_serialized(self, envelopes: list[bytes]) -> None:
        """Publishes already serialized envelopes (the paced phase builds them up front, so the
        consumer's process does not pay for generating the load)."""
        now = time.perf_counter()
        self.published_at.extend(now for _ in envelopes)
        self._control.send(envelopes)

    def stop(self) -> None:
        self._control.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def reset_schema(url: str) -> None:
    """Drops the benchmark schema (PostgreSQL), so every run starts empty."""
    engine = create_engine(sync_url(url))
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE'))
    engine.dispose()


def _cpu_seconds(upstream_pid: int) -> dict[str, float]:
    """CPU seconds so far of the scheduler (this process), the upstream stand-in and PostgreSQL."""
    return {
        "scheduler": process_cpu_seconds(os.getpid()),
        "upstream": process_cpu_seconds(upstream_pid),
        "postgres": postgres_cpu_seconds(),
    }


async def bench_consumption(
    url: str, backlog: int, rate: int, seconds: float, tuned_gc: bool = True
) -> dict[str, Any]:
    """Phases 2 and 3 over one scheduler consumer. With `tuned_gc`, the garbage collector is tuned
    once the scheduler is built, as its host does once started (services/shared/runtime.py)."""
    background = await wait_for_quiet(30.0)
    reset_schema(url)
    upstream = RemoteUpstream()
    port = upstream.port
    await scheduler_server.migrate(url, SCHEMA)
    app = scheduler_server.build(
        database_url=url,
        listen="127.0.0.1:0",
        auth_secret=SECRET,
        context_budget_address=f"127.0.0.1:{port}",
        schema=SCHEMA,
    )
    await app.event_log.ensure_sequencer_row()
    if tuned_gc:
        tune_garbage_collection()
    rng = random.Random(11)
    upstream.publish([budget_event(sequence, rng) for sequence in range(1, backlog + 1)])
    tasks = [
        asyncio.create_task(app.event_log.run_notifier()),
        asyncio.create_task(app.consumer.run()),
        asyncio.create_task(app.handlers.strategies.run()),
    ]
    try:
        cpu_before = _cpu_seconds(upstream.pid)
        started = time.perf_counter()
        await app.consumer.wait_for(backlog, timeout=600)
        backlog_seconds = time.perf_counter() - started
        backlog_cores = {
            name: round((after - cpu_before[name]) / backlog_seconds, 2)
            for name, after in _cpu_seconds(upstream.pid).items()
        }
        backlog_batches = app.consumer.batches_applied

        lags: list[float] = []
        applied_seen = backlog
        next_sequence = backlog + 1
        paced = [
            budget_event(sequence, rng).SerializeToString()
            for sequence in range(next_sequence, next_sequence + int(rate * seconds) + rate)
        ]
        paced_start = time.perf_counter()
        tick = 0.005
        while time.perf_counter() - paced_start < seconds:
            due = int((time.perf_counter() - paced_start) * rate) - (next_sequence - backlog - 1)
            if due > 0:
                upstream.publish_serialized(
                    paced[next_sequence - backlog - 1 : next_sequence - backlog - 1 + due]
                )
                next_sequence += due
            await asyncio.sleep(tick)
            now = time.perf_counter()
            applied = app.consumer.last_sequence
            lags.extend(now - upstream.published_at[s - 1] for s in range(applied_seen + 1, applied + 1))
            applied_seen = max(applied_seen, applied)
        await app.consumer.wait_for(next_sequence - 1, timeout=120)
        now = time.perf_counter()
        lags.extend(now - upstream.published_at[s - 1] for s in range(applied_seen + 1, next_sequence))
        async with app.database.read() as connection:
            commands = (await connection.execute(text("SELECT count(*) FROM worker_commands"))).scalar_one()
            threads = (await connection.execute(text("SELECT count(*) FROM scheduled_threads"))).scalar_one()
            strategy_events = (
                await connection.execute(
                    text(
                        "SELECT count(*) FROM outbox_events "
                        "WHERE event_type = 'project.context_strategy.updated'"
                    )
                )
            ).scalar_one()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        upstream.stop()
        await app.database.dispose()
    lags_ms = sorted(lag * 1000 for lag in lags)
    return {
        "database": url.split("@")[-1],
        "background_busy_cores_before_run": background,
        "python_speed_reference_ms": python_speed_reference(),
        "backlog_events": backlog,
        "backlog_events_per_second": round(backlog / backlog_seconds),
        "backlog_events_per_transaction": round(backlog / max(1, backlog_batches), 1),
        "backlog_cores_scheduler": backlog_cores["scheduler"],
        "backlog_cores_upstream": backlog_cores["upstream"],
        "backlog_cores_postgres": backlog_cores["postgres"],
        "paced_rate_per_second": rate,
        "paced_events": len(lags_ms),
        "paced_events_per_transaction": round(
            len(lags_ms) / max(1, app.consumer.batches_applied - backlog_batches), 1
        ),
        "lag_ms_p50": round(lags_ms[len(lags_ms) // 2], 1),
        "lag_ms_p99": round(lags_ms[int(len(lags_ms) * 0.99) - 1], 1),
        "lag_ms_max": round(lags_ms[-1], 1),
        "threads_stored": threads,
        "commands_issued": commands,
        "batches_decided_ahead": app.handlers.batches_decided_ahead,
        "batches_redecided": app.handlers.batches_redecided,
        "strategy_recomputations": app.handlers.strategies.publications,
        "strategy_events_published": strategy_events,
    }


def main(argv: list[str] | None = None) -> int:
    """Runs every phase, prints the results, writes bench/output/scheduler.json. 0 when ranking met
    its target."""
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_bench")
    parser.add_argument("--quick", action="store_true", help="smaller backlog and a shorter paced phase")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument(
        "--paced-rate", type=int, default=10_000, help="events/s of the paced phase (the ingest target)"
    )
    handler_harness.add_gc_argument(parser)
    arguments = parser.parse_args(argv)
    ranking = bench_ranking(100)
    backlog, seconds = (5_000, 2.0) if arguments.quick else (20_000, 5.0)
    consumption = asyncio.run(
        bench_consumption(
            arguments.database_url, backlog, arguments.paced_rate, seconds, tuned_gc=not arguments.default_gc
        )
    )
    results = {"rank_10k": ranking, "consumption": consumption}
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(results, indent=2) + "\n")
    for phase, values in results.items():
        print(phase)
        for name, value in values.items():
            print(f"  {name:32} {value}")
    return 0 if ranking["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
