"""The hand-written migration matches the table definitions; the CLI migrates; restart keeps state."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from sqlalchemy import create_engine, inspect, text

from services.context_budget.__main__ import main
from services.context_budget.adapters.tables import metadata
from services.context_budget.server import build_service, migrate
from services.shared.config import ServiceSettings
from services.shared.migrations import sync_url
from tests.conftest import DatabaseTarget
from tests.integration.context_budget.conftest import SECRET
from tests.integration.context_budget.support import NODE_ID, WORKER_ID, auth, report, snapshot


async def test_migrated_schema_matches_the_table_definitions(database_target: DatabaseTarget) -> None:
    schema = database_target.schema or "context_budget"
    await migrate(database_target.url, schema)
    engine = create_engine(sync_url(database_target.url))
    try:
        with engine.connect() as connection:
            if database_target.backend == "postgresql":
                connection.execute(text(f'SET search_path TO "{schema}"'))
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
            tables = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert differences == []
    assert {
        "thread_context_snapshots",
        "thread_contexts",
        "thread_context_threshold_policies",
        "thread_context_alerts",
        "outbox_events",
        "outbox_sequencer",
        "event_cursors",
    } <= tables


def test_cli_migrate_creates_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    database = tmp_path / "cb.sqlite3"
    monkeypatch.setenv("BOSS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    monkeypatch.setenv("BOSS_CONTEXT_BUDGET_DATABASE_URL", f"sqlite+aiosqlite:///{database}")
    main(["migrate"])
    engine = create_engine(f"sqlite:///{database}")
    try:
        assert "thread_contexts" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


async def test_state_and_event_sequence_survive_a_restart(database_target: DatabaseTarget) -> None:
    settings = ServiceSettings(
        service="context_budget",
        database_url=database_target.url,
        listen="127.0.0.1:0",
        migrate_on_start=True,
        auth_secret=SECRET,
    )
    schema = database_target.schema or "context_budget"
    first = build_service(settings, schema=schema)
    await first.start()
    token = first.authority.issue_worker(WORKER_ID, NODE_ID)
    async with grpc.aio.insecure_channel(first.address) as channel:
        await report(pb_grpc.ContextBudgetServiceStub(channel), token, snapshot(pct=45, snapshot_id="s1"))
    await first.stop(grace=0.2)

    second = build_service(settings, schema=schema)
    await second.start()
    try:
        async with grpc.aio.insecure_channel(second.address) as channel:
            stub = pb_grpc.ContextBudgetServiceStub(channel)
            again = await report(stub, token, snapshot(pct=45, snapshot_id="s1"))
            assert again.duplicate
            newer = await report(stub, token, snapshot(pct=80, version=2, snapshot_id="s2"))
            assert newer.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE
            reader = first.authority.issue_service("scheduler")
            call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=3), metadata=auth(reader))
            resumed = (await call.read()).events[0]
            call.cancel()
    finally:
        await second.stop(grace=0.2)
    # Before the restart: updated, level_changed, alert opened (1-3); after: the safe update is 4.
    assert (resumed.sequence, resumed.type) == (4, "thread.context.updated")
