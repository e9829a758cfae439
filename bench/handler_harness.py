"""What the handler benchmarks (bench/scheduler_handler_bench.py, bench/conversations_handler_bench.py)
share: a fresh schema per run, a stream that is never opened (they feed `EventConsumer.apply`
directly), and events as the consumer hands them to a handler."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine, text

from services.shared.migrations import sync_url
from services.shared.outbox import StoredEvent

BUDGET_EVENT = "thread.context.updated"


def reset_schema(url: str, schema: str) -> None:
    """Drops `schema` (CASCADE), so every run starts empty."""
    engine = create_engine(sync_url(url))
    with engine.begin() as connection:
        connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


def analyze(url: str) -> None:
    """Runs `ANALYZE` on the whole database, as autovacuum does within a minute or so of a bulk load
    on a running system. A benchmark that measures right after seeding fresh tables calls it: tables
    never analyzed have no statistics, and PostgreSQL then plans joins as if they were nearly empty
    (sequential scans and hash joins instead of index lookups: twice the execution time of the
    projection's members read with 1,000 projects)."""
    engine = create_engine(sync_url(url), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("ANALYZE"))
    engine.dispose()


async def never_opened(_after: int) -> Any:  # pragma: no cover - the stream is never opened
    """An `EventConsumer` stream opener for consumers fed through `apply` only."""
    raise RuntimeError("the handler benchmarks feed EventConsumer.apply directly")
    yield


def budget_event(sequence: int, occurred_at: datetime, payload: dict[str, Any]) -> StoredEvent:
    """A `thread.context.updated` event as the consumer hands it to a handler: the payload decoded
    from its JSON text (as it would be after the stream), subject ids taken from it."""
    return StoredEvent(
        sequence=sequence,
        type=BUDGET_EVENT,
        occurred_at=occurred_at,
        thread_id=payload["thread_id"],
        project_id=payload["project_id"],
        node_id=payload["node_id"],
        payload=json.loads(json.dumps(payload)),
        trace_context={},
    )


def add_gc_argument(parser: argparse.ArgumentParser) -> None:
    """`--default-gc`: keep CPython's garbage-collection defaults instead of the services' tuning."""
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's default garbage collection (the services tune it: services/shared/runtime.py)",
    )


def add_run_arguments(parser: argparse.ArgumentParser, default_url: str) -> None:
    """What every handler benchmark takes besides its load: `--runs`, `--database-url`, `--default-gc`."""
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--database-url", default=default_url)
    add_gc_argument(parser)


def print_runs(results: list[dict[str, Any]]) -> None:
    """One line per run: `run N: name=value, ...`."""
    for number, result in enumerate(results, start=1):
        print(f"run {number}: " + ", ".join(f"{name}={value}" for name, value in result.items()))
