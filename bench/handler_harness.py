"""What the handler benchmarks (bench/scheduler_handler_bench.py, bench/conversations_handler_bench.py)
share: a fresh schema per run, a stream that is never opened (they feed `EventConsumer.apply`
directly), and events as the consumer hands them to a handler."""

from __future__ import annotations

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
