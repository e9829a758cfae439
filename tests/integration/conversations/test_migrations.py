"""The conversations migrations on SQLite and PostgreSQL: the migrated schema is the table
definitions, migration 0003 numbers the messages stored before it per conversation, in the order
they were stored, with each conversation's counter continuing after its last one, and migration 0008
marks the home-list rings whose thread is "compacted, waiting for the first reading" already."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, insert, inspect, text

from services.conversations.adapters.tables import metadata, threads
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.server import MIGRATIONS_DIR, migrate
from services.shared.db import Database
from services.shared.migrations import sync_url, upgrade_database
from tests.conftest import DatabaseTarget

T0 = datetime(2026, 5, 30, 8, 0, tzinfo=UTC)


def _schema(target: DatabaseTarget) -> str:
    return target.schema or "conversations"


def _sync_engine(target: DatabaseTarget) -> Engine:
    """A synchronous engine on the target whose connections see the service's schema."""
    engine = create_engine(sync_url(target.url))
    if target.backend == "postgresql":
        schema = _schema(target)

        @event.listens_for(engine, "connect")
        def _search_path(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute(f'SET search_path TO "{schema}"')
            cursor.close()

    return engine


async def test_migrated_schema_matches_the_table_definitions(database_target: DatabaseTarget) -> None:
    await migrate(database_target.url, _schema(database_target))
    engine = _sync_engine(database_target)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, metadata)
            tables = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    assert differences == []
    assert {"messages", "message_sequences", "chat_tasks", "projects", "threads"} <= tables


async def _migrated_to(target: DatabaseTarget, revision: str) -> tuple[str, Engine]:
    """The target's schema upgraded to `revision` only, and a synchronous engine on it."""
    schema = _schema(target)
    await asyncio.to_thread(upgrade_database, target.url, schema, MIGRATIONS_DIR, revision)
    return schema, _sync_engine(target)


async def test_messages_stored_before_chat_get_sequences_in_their_stored_order(
    database_target: DatabaseTarget,
) -> None:
    schema, engine = await _migrated_to(database_target, "0002")
    stored = [
        ("proj-a", "msg-1"),
        ("proj-b", "msg-2"),
        ("proj-a", "msg-3"),
        ("proj-a", "msg-4"),
        ("proj-b", "msg-5"),
    ]
    try:
        with engine.begin() as connection:
            for index, (project_id, message_id) in enumerate(stored):
                connection.execute(
                    text(
                        "INSERT INTO messages (message_id, project_id, author_kind, thread_id, text, "
                        "created_at) VALUES (:message_id, :project_id, 'user', '', :text, :created_at)"
                    ),
                    {
                        "message_id": message_id,
                        "project_id": project_id,
                        "text": f"message {index}",
                        # Stored order, not time order, decides: the clock went back once.
                        "created_at": (T0 - timedelta(minutes=index)).replace(tzinfo=None),
                    },
                )
        await migrate(database_target.url, schema)
        with engine.connect() as connection:
            numbered = connection.execute(
                text("SELECT message_id, sequence, client_message_id, task_id FROM messages ORDER BY id")
            ).all()
            counters = {
                str(project_id): int(last)
                for project_id, last in connection.execute(
                    text("SELECT project_id, last_sequence FROM message_sequences")
                )
            }
    finally:
        engine.dispose()
    assert [tuple(row) for row in numbered] == [
        ("msg-1", 1, None, ""),
        ("msg-2", 1, None, ""),
        ("msg-3", 2, None, ""),
        ("msg-4", 3, None, ""),
        ("msg-5", 2, None, ""),
    ]
    assert counters == {"proj-a": 3, "proj-b": 2}

    database = Database.connect(database_target.url, schema)
    try:
        async with database.transaction() as connection:
            chat = SqlAlchemyChatRepository(connection)
            assert [await chat.next_sequence("proj-a"), await chat.next_sequence("proj-new")] == [4, 1]
    finally:
        await database.dispose()


async def test_rings_of_threads_awaiting_their_first_reading_say_so_after_the_upgrade(
    database_target: DatabaseTarget,
) -> None:
    schema, engine = await _migrated_to(database_target, "0007_devices")
    # (project, the thread its ring shows, ring visible); th-compacted awaits its first reading
    rows = [
        ("proj-compacted", "th-compacted", True),
        ("proj-measured", "th-measured", True),
        ("proj-group", "th-compacted", False),  # a group shows no ring
        ("proj-new", "", False),
    ]
    try:
        with engine.begin() as connection:
            for thread_id, awaiting in (("th-compacted", True), ("th-measured", False)):
                connection.execute(
                    insert(threads).values(
                        thread_id=thread_id,
                        owner_id="local",
                        node_id="node-a",
                        worker_id="worker-a",
                        title=thread_id,
                        registered_at=T0,
                        remaining_pct=100.0 if awaiting else 41.0,
                        level="safe" if awaiting else "watch",
                        captured_at=T0,
                        awaiting_reading_after_compaction=awaiting,
                    )
                )
            for project_id, thread_id, visible in rows:
                connection.execute(
                    text(
                        "INSERT INTO projects (project_id, owner_id, conversation_type, title, "
                        "manual_pinned, sort_at, created_at, updated_at, indicator_thread_id, "
                        "indicator_visible, indicator_percent, indicator_level, indicator_source_node_id, "
                        "indicator_must_finish, strategy_summary) VALUES (:project_id, 'local', "
                        "'single_device', :project_id, false, :at, :at, :at, :thread_id, :visible, 0, '', "
                        "'', false, '')"
                    ),
                    {
                        "project_id": project_id,
                        "thread_id": thread_id,
                        "visible": visible,
                        "at": T0.replace(tzinfo=None),
                    },
                )
        await migrate(database_target.url, schema)
        with engine.connect() as connection:
            query = text("SELECT project_id, indicator_awaiting_reading FROM projects")
            flags = dict(connection.execute(query).all())
    finally:
        engine.dispose()
    seeded = {
        project_id for project_id, _thread_id, _visible in rows
    }  # besides them: the master conversation
    assert {project_id: bool(flag) for project_id, flag in flags.items() if project_id in seeded} == {
        "proj-compacted": True,
        "proj-measured": False,
        "proj-group": False,
        "proj-new": False,
    }
