"""The two upstream consumers of conversations (context_budget's stream and the scheduler's) take
their locks in one order on PostgreSQL: each batch first takes the projection's advisory lock, so
a scheduler batch waits for a budget batch that holds it, instead of the two locking thread and
project rows in opposite orders and deadlocking (the trial saw a dozen deadlocks within seconds of
a restart, when both consumers catch up at once)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from services.conversations import server as conversations_server
from services.conversations.domain.model import Registration
from services.conversations.service import STRATEGY_UPDATED_EVENT, ConversationsHandlers
from services.shared.auth import TokenAuthority
from services.shared.db import Database
from services.shared.outbox import StoredEvent
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget
from tests.integration.conversations.stack import SECRET, budget_payload
from tests.integration.trust_stack import eventually


def event(sequence: int, event_type: str, payload: dict[str, object]) -> StoredEvent:
    return StoredEvent(
        sequence=sequence,
        type=event_type,
        occurred_at=utc_now(),
        thread_id=str(payload.get("thread_id") or ""),
        project_id=str(payload.get("project_id") or ""),
        node_id=str(payload.get("node_id") or ""),
        payload=payload,
        trace_context={},
    )


async def test_a_scheduler_batch_waits_for_a_budget_batch_on_the_projection_lock(
    database_target: DatabaseTarget,
) -> None:
    if database_target.backend != "postgresql":
        pytest.skip("SQLite runs one write transaction at a time: nothing to order")
    await conversations_server.migrate(database_target.url, database_target.schema)
    database = Database.connect(database_target.url, database_target.schema)
    app = conversations_server.build_app(database, TokenAuthority(SECRET))
    await app.event_log.ensure_sequencer_row()
    handlers = app.handlers
    try:
        thread, _created, project_id = await handlers.register_thread(
            Registration(thread_id="th-1", node_id="node-a", worker_id="worker-a", owner_id="local")
        )
        assert thread["thread_id"] == "th-1"
        budget_batch = [event(1, "thread.context.updated", budget_payload("th-1", 30.0, "urgent"))]
        strategy_batch = [
            event(
                1,
                STRATEGY_UPDATED_EVENT,
                {"project_id": project_id, "master_context_strategy_summary": "wrap up"},
            )
        ]

        async def waiting_for_the_projection_lock() -> int:
            async with database.read() as connection:
                rows = await connection.execute(
                    text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                )
                return int(rows.scalar_one())

        async with database.transaction() as budget_connection:
            await handlers.apply_budget_events(budget_connection, budget_batch)
            scheduler_batch = asyncio.ensure_future(
                apply_in_own_transaction(database, handlers, strategy_batch)
            )
            await eventually(
                waiting_for_the_projection_lock, lambda waiting: waiting == 1, "the scheduler batch waits"
            )
            assert not scheduler_batch.done()
        await asyncio.wait_for(scheduler_batch, 10)
        async with database.read() as connection:
            summary = await connection.execute(
                text("SELECT strategy_summary FROM projects WHERE project_id = :id"), {"id": project_id}
            )
            assert summary.scalar_one() == "wrap up"
    finally:
        await database.dispose()


async def apply_in_own_transaction(
    database: Database, handlers: ConversationsHandlers, batch: list[StoredEvent]
) -> None:
    """The scheduler consumer's batch, in a transaction of its own."""
    async with database.transaction() as connection:
        await handlers.apply_scheduler_events(connection, batch)
