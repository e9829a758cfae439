"""Retention benchmark (issue 16 "History that does not grow for ever"): a month of simulated history
stays within a stated size, and ingest keeps its ack-latency budget while retention works.

For each backend (PostgreSQL: database `bench_retention`, created when missing, schema
`context_budget` **dropped first**; SQLite: bench/output/data/retention.sqlite3, deleted first):

1. `month`: `--threads` threads (default 5) report every 5 s for 30 simulated days, ending now.
   Each simulated day's readings (`thread_context_snapshots`) and their `thread.context.updated`
   outbox events (one per reading, with a production-sized payload) are written in SQL, then the
   day ends with one retention pass as the service runs it (`SnapshotRetention.thin` and
   `OutboxPruner.prune` with the simulated clock; two consumers caught up to the head, as the
   scheduler and conversations would be; batches of 2,000 rows, no pause between them, to keep
   the run short) and, on PostgreSQL, a plain VACUUM of both tables (what autovacuum does: freed
   space is reused, the files do not shrink). Recorded per day: rows and bytes of both tables
   (PostgreSQL: pg_total_relation_size, indexes included; SQLite: the pages in use). The last 3
   simulated days are written without a pass, so that phase 3 finds real work.
   Stated size: after the month, each thread keeps 7 x 17,280 readings of full history plus 24 a
   day before that, and 3 days of events (the outbox age floor); **bytes after 30 days must stay
   within 1.25x of the bytes after 10 days** (the plateau: what is freed is reused), while without
   retention they would grow 3x over the same 20 days.
2. `ingest_retention_off`: context_budget as a process (`BOSS_RETENTION_ENABLED=false`) on that
   database; open-loop load at `--rate` snapshots/s (default 2,000, the ack-latency budget's rate)
   over 8 gRPC streams for `--seconds` (default 10), as bench/ingest_bench.py's paced phase.
3. `ingest_during_retention`: the same with retention on at its defaults (2,000 rows per batch,
   50 ms pause): the process's first pass starts with it and thins and prunes the 3 days left.
   Recorded: the ack latency while the pass runs, and the pass's duration and rows deleted (from
   the service's log). Budget: p99 <= 50 ms (ARCHITECTURE "ack latency at 2,000 snapshots/s"),
   and no worse than the run without retention by more than 10 ms at p99.

Run one benchmark at a time on an otherwise idle machine (bench/README.md); waits up to 30 s for
quiet first and records what it saw, and `python_speed_reference_ms`. Results:
bench/output/retention.json; service logs in bench/output/logs/.

Run: `PYTHONPATH=.:gen .venv/bin/python -m bench.retention_bench [--quick] [--backend
postgresql|sqlite|both] [--threads N] [--rate R] [--seconds S] [--database-url URL]` (`--quick`: one
thread, 12 simulated days, a 3 s ingest phase at 500 snapshots/s: checks the harness).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Boolean, Double, Integer, String, Table, Text, update

from bench.ingest_bench import (
    OUTPUT_DIR,
    ROOT,
    CpuMeter,
    SnapshotFactory,
    StreamContext,
    ThreadCursor,
    free_port,
    libpq_url,
    machine_info,
    python_speed_reference,
    run_closed_loop_phase,
    run_paced_phase,
    start_service,
    wait_for_quiet,
    wait_grpc_serving,
)
from services.context_budget.adapters.tables import (
    event_consumers,
    outbox_events,
    outbox_sequencer,
    retention_marks,
    thread_context_snapshots,
)
from services.context_budget.retention import SnapshotRetention, floor_to_interval, thinning_cutoff
from services.context_budget.server import migrate
from services.shared.auth import TokenAuthority
from services.shared.db import Database
from services.shared.outbox import EventLog
from services.shared.retention import ConsumerPositions, OutboxPruner, RetentionSettings
from services.shared.sql_types import UtcDateTime

OUTPUT = OUTPUT_DIR / "retention.json"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/bench_retention"
SQLITE_PATH = OUTPUT_DIR / "data" / "retention.sqlite3"
SCHEMA = "context_budget"
REPORT_SECONDS = 5
DAY = timedelta(days=1)
MONTH_DAYS = 30
BACKLOG_DAYS = 3
TARGET_P99_MS = 50.0
TARGET_P99_EXTRA_MS = 10.0
PLATEAU_FACTOR = 1.25
LIVE_THREADS = 2_000
CONSUMERS = ("scheduler/context_budget", "conversations/context_budget")
# A thread.context.updated payload as context_budget publishes it (about 900 bytes).
PAYLOAD = json.dumps(
    {
        "thread_id": "sim-thread-0",
        "project_id": "proj-billing-api",
        "task_id": "task-0042",
        "node_id": "node-mac-01",
        "worker_id": "worker-mac-01",
        "owner_id": "local",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": 41.2,
        "context_budget_level": "watch",
        "previous_level": "safe",
        "reported_context_budget_level": "watch",
        "compaction_expected_at": "2026-12-01T10:41:00Z",
        "must_finish_before_compaction": True,
        "must_finish_reason": "uncommitted change to src/invoices/export.py",
        "estimated_remaining_turns": 14,
        "estimated_remaining_large_messages": 3,
        "last_compaction_at": "2026-12-01T08:02:11Z",
        "compaction_count": 2,
        "snapshot_version": 18234,
        "captured_at": "2026-12-01T10:11:05Z",
        "updated_at": "2026-12-01T10:11:05Z",
        "last_total_tokens": 143_872,
        "model_context_window": 258_400,
        "auto_compact_token_limit": 244_800,
        "codex_context_left_pct": 44,
        "codex_folder": "/Users/dev/src/billing-api",
        "compaction_limit_source": "model_default",
    },
    separators=(",", ":"),
)
# Realistic values for the reading columns whose content sets the row's size.
READING_LITERALS: dict[str, Any] = {
    "project_id": "proj-billing-api",
    "task_id": "task-0042",
    "node_id": "node-mac-01",
    "worker_id": "worker-mac-01",
    "source_kind": "worker_estimator",
    "context_budget_level": "watch",
    "reported_context_budget_level": "watch",
    "must_finish_reason": "uncommitted change to src/invoices/export.py",
    "codex_folder": "/Users/dev/src/billing-api",
    "context_budget_remaining_pct": 41.2,
    "last_total_tokens": 143_872,
    "model_context_window": 258_400,
    "auto_compact_token_limit": 244_800,
    "codex_context_left_pct": 44,
    "compaction_count": 2,
}


@dataclass
class Day:
    """One simulated day's outcome."""

    day: int
    readings: int
    events: int
    bytes_readings: int
    bytes_events: int
    deleted_readings: int
    deleted_events: int
    pass_seconds: float


@dataclass
class BackendResult:
    """Everything measured on one backend."""

    backend: str
    threads: int
    days: list[Day] = field(default_factory=list)
    expected_readings_per_thread: int = 0
    expected_events_per_thread: int = 0
    readings_without_retention: int = 0
    events_without_retention: int = 0
    plateau_ratio: float = 0.0
    growth_without_retention: float = 0.0
    phases: dict[str, Any] = field(default_factory=dict)
    retention_pass: dict[str, Any] = field(default_factory=dict)
    verdicts: dict[str, bool] = field(default_factory=dict)


# --- history generation -----------------------------------------------------------------------


def _literal(value: Any, postgres: bool) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return ("true" if value else "false") if postgres else str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _instant(seconds_expression: str, postgres: bool) -> str:
    """SQL for the instant `seconds_expression` seconds after the epoch, as UtcDateTime stores it."""
    if postgres:
        return f"to_timestamp({seconds_expression})"
    return f"strftime('%Y-%m-%d %H:%M:%S', {seconds_expression}, 'unixepoch') || '.000000'"


def reading_columns(table: Table, postgres: bool) -> tuple[list[str], list[str]]:
    """Column names and SQL expressions (over `t`, the thread, and `n`, the report number, and
    `:start`, epoch seconds) for one simulated reading of every column the table has now."""
    names, expressions = [], []
    at = _instant(f"{{start}} + n * {REPORT_SECONDS}", postgres)
    special = {
        "snapshot_id": "'sim-' || t || '-' || n",
        "thread_id": "'sim-thread-' || t",
        "captured_at": at,
        "received_at": at,
        "snapshot_version": "n",
    }
    for column in table.columns:
        names.append(column.name)
        if column.name in special:
            expressions.append(special[column.name])
        elif column.name in READING_LITERALS:
            expressions.append(_literal(READING_LITERALS[column.name], postgres))
        elif column.nullable:
            expressions.append("NULL")
        elif isinstance(column.type, Boolean):
            expressions.append(_literal(False, postgres))
        elif isinstance(column.type, Integer | Double):
            expressions.append("0")
        elif isinstance(column.type, UtcDateTime):
            expressions.append(at)
        elif isinstance(column.type, String | Text):
            expressions.append("''")
        else:
            raise RuntimeError(f"no simulated value for {table.name}.{column.name}")
    return names, expressions


def generation_statements(
    postgres: bool, threads: int, first: int, last: int, start_epoch: int, base_sequence: int
) -> list[str]:
    """SQL writing reports `first`..`last` (inclusive) of every thread and their events."""
    names, expressions = reading_columns(thread_context_snapshots, postgres)
    select_readings = ", ".join(expressions).replace("{start}", str(start_epoch))
    event_at = _instant(f"{start_epoch} + n * {REPORT_SECONDS}", postgres)
    event_values = (
        f"{base_sequence} + (n - {first}) * {threads} + t + 1, 'thread.context.updated', {event_at}, "
        f"'sim-thread-' || t, 'proj-billing-api', 'node-mac-01', {_literal(PAYLOAD, postgres)}, '{{}}'"
    )
    event_columns = (
        "sequence, event_type, occurred_at, thread_id, project_id, node_id, payload_json, trace_context_json"
    )
    if postgres:
        series = (
            f"FROM generate_series(0, {threads - 1}) AS threads(t), "
            f"generate_series({first}, {last}) AS reports(n)"
        )
        return [
            f"INSERT INTO thread_context_snapshots ({', '.join(names)}) SELECT {select_readings} {series}",
            f"INSERT INTO outbox_events ({event_columns}) SELECT {event_values} {series}",
        ]
    series = (
        "WITH RECURSIVE threads(t) AS "
        f"(SELECT 0 UNION ALL SELECT t + 1 FROM threads WHERE t < {threads - 1}), "
        f"reports(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM reports WHERE n < {last}) "
    )
    return [
        f"{series}INSERT INTO thread_context_snapshots ({', '.join(names)}) "
        f"SELECT {select_readings} FROM threads, reports",
        f"{series}INSERT INTO outbox_events ({event_columns}) SELECT {event_values} FROM threads, reports",
    ]


# --- measurements ------------------------------------------------------------------------------


def table_bytes(database_url: str, postgres: bool) -> dict[str, int]:
    """Bytes each history table takes with its indexes (PostgreSQL), or the pages in use of its
    b-trees (SQLite, from dbstat when compiled in; else the whole file's pages in use, split evenly)."""
    tables = ("thread_context_snapshots", "outbox_events")
    if postgres:
        with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
            return {
                name: int(
                    connection.execute(
                        "SELECT pg_total_relation_size(%s)", (f'"{SCHEMA}"."{name}"',)
                    ).fetchone()[0]  # type: ignore[index]
                )
                for name in tables
            }
    with sqlite3.connect(SQLITE_PATH) as connection:
        try:
            rows = connection.execute(
                "SELECT tbl_name, sum(pgsize) FROM dbstat "
                "JOIN sqlite_master ON dbstat.name = sqlite_master.name GROUP BY tbl_name"
            ).fetchall()
            sizes = {str(name): int(size) for name, size in rows}
            return {name: sizes.get(name, 0) for name in tables}
        except sqlite3.OperationalError:
            page_size = connection.execute("PRAGMA page_size").fetchone()[0]
            used = (
                connection.execute("PRAGMA page_count").fetchone()[0]
                - connection.execute("PRAGMA freelist_count").fetchone()[0]
            )
            return {name: int(used * page_size / len(tables)) for name in tables}


def vacuum(database_url: str) -> None:
    """A plain VACUUM of both tables (PostgreSQL), as autovacuum would run it."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(f'VACUUM "{SCHEMA}".thread_context_snapshots, "{SCHEMA}".outbox_events')


def reset(database_url: str, postgres: bool) -> None:
    """A clean start: the PostgreSQL database exists and has no `context_budget` schema, or the
    SQLite file is gone."""
    if not postgres:
        SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{SQLITE_PATH}{suffix}").unlink(missing_ok=True)
        return
    database = database_url.rsplit("/", 1)[1]
    with psycopg.connect(libpq_url(database_url.rsplit("/", 1)[0] + "/postgres"), autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            admin.execute(f'CREATE DATABASE "{database}"')
    with psycopg.connect(libpq_url(database_url), autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


async def simulate_month(
    database_url: str, postgres: bool, threads: int, days: int, now: datetime
) -> BackendResult:
    """Phase 1 (module docstring)."""
    result = BackendResult("postgresql" if postgres else "sqlite", threads)
    await migrate(database_url, SCHEMA)
    database = Database.connect(database_url, SCHEMA)
    event_log = EventLog(database, outbox_events.metadata)
    await event_log.ensure_sequencer_row()
    positions = ConsumerPositions(database, event_consumers)
    settings = RetentionSettings(batch_rows=2_000, pause_seconds=0)
    start = now - days * DAY
    reports_per_day = int(DAY.total_seconds()) // REPORT_SECONDS
    sequence = 0
    try:
        for day in range(days):
            first, last = day * reports_per_day, (day + 1) * reports_per_day - 1
            statements = generation_statements(
                postgres, threads, first, last, int(start.timestamp()), sequence
            )
            async with database.transaction() as connection:
                for statement in statements:
                    await connection.exec_driver_sql(statement)
                sequence += threads * reports_per_day
                await connection.execute(update(outbox_sequencer).values(last_sequence=sequence))
            simulated_now = start + (day + 1) * DAY
            for consumer in CONSUMERS:
                await positions.record(consumer, sequence, now=simulated_now)
            deleted_readings = deleted_events = 0
            began = time.perf_counter()
            if day < days - BACKLOG_DAYS:
                deleted_readings = await SnapshotRetention(
                    database,
                    thread_context_snapshots,
                    retention_marks,
                    settings,
                    clock=lambda t=simulated_now: t,
                ).thin()
                deleted_events = await OutboxPruner(
                    database,
                    outbox_events,
                    positions,
                    settings,
                    "context_budget",
                    clock=lambda t=simulated_now: t,
                ).prune()
            pass_seconds = time.perf_counter() - began
            if postgres:
                vacuum(database_url)
            async with database.read() as connection:
                readings = (
                    await connection.exec_driver_sql("SELECT count(*) FROM thread_context_snapshots")
                ).scalar()
                events = (await connection.exec_driver_sql("SELECT count(*) FROM outbox_events")).scalar()
            sizes = table_bytes(database_url, postgres)
            result.days.append(
                Day(
                    day + 1,
                    int(readings or 0),
                    int(events or 0),
                    sizes["thread_context_snapshots"],
                    sizes["outbox_events"],
                    deleted_readings,
                    deleted_events,
                    round(pass_seconds, 2),
                )
            )
            print(f"  {result.backend} day {day + 1}: {asdict(result.days[-1])}", flush=True)
    finally:
        await database.dispose()
    passes = days - BACKLOG_DAYS
    result.expected_readings_per_thread = expected_readings(
        start, start + passes * DAY, passes * reports_per_day
    )
    result.expected_events_per_thread = 3 * reports_per_day
    result.readings_without_retention = result.events_without_retention = threads * days * reports_per_day
    return result


def expected_readings(start: datetime, now: datetime, reports: int) -> int:
    """What the stated rule keeps of one thread's `reports` readings (every REPORT_SECONDS from
    `start`) at `now`: all those captured at or after the cutoff (now - 7 days, down to the hour),
    and one per hour before it."""
    rules = RetentionSettings()
    cutoff = thinning_cutoff(now, rules.full_history, rules.downsample_interval)
    times = [start + timedelta(seconds=REPORT_SECONDS * n) for n in range(reports)]
    hours = {floor_to_interval(t, rules.downsample_interval) for t in times if t < cutoff}
    return len(hours) + sum(1 for t in times if t >= cutoff)


def plateau_verdicts(result: BackendResult) -> None:
    """The size claims over the days that had a pass (the backlog days come after)."""
    with_passes = result.days[: len(result.days) - BACKLOG_DAYS]
    early = next((d for d in with_passes if d.day == 10), with_passes[min(9, len(with_passes) - 1)])
    late = with_passes[-1]
    total = lambda d: d.bytes_readings + d.bytes_events  # noqa: E731
    result.plateau_ratio = round(total(late) / max(total(early), 1), 3)
    result.growth_without_retention = round(late.day / early.day, 2)
    result.verdicts["readings_kept_as_stated"] = (
        late.readings == result.threads * result.expected_readings_per_thread
    )
    # The age floor keeps 3 days; the pass at a day's end prunes what is older.
    result.verdicts["events_kept_as_stated"] = (
        late.events == result.threads * result.expected_events_per_thread
    )
    result.verdicts["bytes_plateau"] = result.plateau_ratio <= PLATEAU_FACTOR


# --- ingest with and without retention ---------------------------------------------------------


async def ingest_phase(
    database_url: str, postgres: bool, retention: bool, rate: float, seconds: float, name: str
) -> tuple[dict[str, Any], Any]:
    """Phases 2 and 3: context_budget as a process, paced ingest; returns the phase's figures and
    the process (still running: phase 3 waits for its pass)."""
    logs = OUTPUT_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    secret = "bench-" + uuid.uuid4().hex + uuid.uuid4().hex
    address = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}",
        "BOSS_DATA_DIR": str(OUTPUT_DIR / "data"),
        "BOSS_AUTH_SECRET": secret,
        "BOSS_CONTEXT_BUDGET_DATABASE_URL": database_url,
        "BOSS_CONTEXT_BUDGET_LISTEN": address,
        "BOSS_CONVERSATIONS_ADDRESS": f"127.0.0.1:{free_port()}",
        "BOSS_MIGRATE_ON_START": "true",
        "BOSS_RETENTION_ENABLED": "true" if retention else "false",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    service = start_service(name, "services.context_budget", env, logs, None)
    await wait_grpc_serving(service, address)
    started = time.monotonic()
    # Threads of their own per phase: a thread belongs to the device that first reported it.
    factory = SnapshotFactory(8, LIVE_THREADS, seed=sum(map(ord, name)))
    authority = TokenAuthority(secret)
    tokens = [authority.issue_worker(factory.worker_ids[w], factory.node_ids[w]) for w in range(8)]
    meter = CpuMeter(service.pid, None, database_url if postgres else None)
    context = StreamContext(address, tokens, factory)
    try:
        # Not measured: the threads' first readings (inserts of new current rows), as ingest_bench.
        first_readings = ThreadCursor(factory, LIVE_THREADS, cycle=False)
        await run_closed_loop_phase(context, meter, "warmup", "", first_readings, 250, 4, 30.0, LIVE_THREADS)
        phase = await run_paced_phase(
            context,
            meter,
            ThreadCursor(factory, LIVE_THREADS, cycle=True),
            rate,
            seconds,
            0.005,
        )
    finally:
        meter.close()
    figures = asdict(phase)
    figures["measured_from_start_seconds"] = [0.0, round(time.monotonic() - started, 2)]
    return figures, service


def retention_pass_of(log_text: str) -> dict[str, Any] | None:
    """The first pass's deletions from the service log ("retention deleted {...}"), if logged."""
    match = re.search(r"retention deleted (\{[^}]*\})", log_text)
    if match is None:
        return None
    return json.loads(match.group(1).replace("'", '"'))


async def run_backend(
    backend: str, database_url: str, threads: int, days: int, rate: float, seconds: float
) -> BackendResult:
    """Every phase on one backend."""
    postgres = backend == "postgresql"
    url = database_url if postgres else f"sqlite+aiosqlite:///{SQLITE_PATH}"
    reset(url, postgres)
    now = datetime.now(UTC).replace(microsecond=0)
    result = await simulate_month(url, postgres, threads, days, now)
    plateau_verdicts(result)
    off, service = await ingest_phase(url, postgres, False, rate, seconds, f"retention_{backend}_off")
    service.stop()
    result.phases["ingest_retention_off"] = off
    began = time.monotonic()
    during, service = await ingest_phase(url, postgres, True, rate, seconds, f"retention_{backend}_on")
    try:
        deadline = time.monotonic() + 600
        while (deleted := retention_pass_of(service.log_path.read_text(errors="replace"))) is None:
            service.check_alive()
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        pass_seconds = time.monotonic() - began
    finally:
        service.stop()
    result.phases["ingest_during_retention"] = during
    result.retention_pass = {
        "deleted": deleted,
        "seconds_from_service_start_approx": round(pass_seconds, 1),
        "ran_through_the_ingest_phase": pass_seconds > during["measured_from_start_seconds"][1],
    }
    p99_off = off["latency"].get("p99_ms", float("inf"))
    p99_on = during["latency"].get("p99_ms", float("inf"))
    result.verdicts["ack_p99_within_budget_during_retention"] = p99_on <= TARGET_P99_MS
    result.verdicts["ack_p99_not_worse_by_more_than_10_ms"] = p99_on <= p99_off + TARGET_P99_EXTRA_MS
    result.verdicts["pass_overlapped_the_measurement"] = bool(
        result.retention_pass["ran_through_the_ingest_phase"]
    )
    return result


async def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark."""
    background = await wait_for_quiet(30.0)
    report: dict[str, Any] = {
        "benchmark": "retention",
        "started_at": datetime.now(UTC).isoformat(),
        "machine": machine_info(),
        "python_speed_reference_ms": round(python_speed_reference(), 1),
        "busy_cores_before": background,
        "config": vars(arguments),
        "backends": {},
    }
    backends = ("postgresql", "sqlite") if arguments.backend == "both" else (arguments.backend,)
    for backend in backends:
        result = await run_backend(
            backend,
            arguments.database_url,
            arguments.threads,
            arguments.days,
            arguments.rate,
            arguments.seconds,
        )
        report["backends"][backend] = asdict(result)
    return report


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark, prints and writes bench/output/retention.json. 0 when every verdict of
    every backend held."""
    parser = argparse.ArgumentParser(prog="python -m bench.retention_bench")
    parser.add_argument("--quick", action="store_true", help="1 thread, 12 days, 3 s at 500/s")
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--days", type=int, default=MONTH_DAYS)
    parser.add_argument("--rate", type=float, default=2_000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--database-url", default=os.environ.get("BOSS_BENCH_RETENTION_DATABASE_URL", DEFAULT_URL)
    )
    arguments = parser.parse_args(argv)
    if arguments.quick:
        arguments.threads, arguments.days, arguments.rate, arguments.seconds = 1, 12, 500.0, 3.0
    if arguments.days < 10 + BACKLOG_DAYS - 1:
        parser.error(f"--days must be at least {10 + BACKLOG_DAYS - 1}")
    report = asyncio.run(run(arguments))
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(report, indent=2) + "\n")
    for backend, result in report["backends"].items():
        print(backend, json.dumps(result["verdicts"]), "plateau", result["plateau_ratio"])
    return 0 if all(all(r["verdicts"].values()) for r in report["backends"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
