"""The conversations migrations on SQLite and PostgreSQL: the migrated schema is the table
definitions, and migration 0003 numbers the messages stored before it per conversation, in the order
they were stored, with each conversation's counter continuing after its last one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, inspect, text

from services.conversations.adapters.tables import metadata
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


async def test_messages_stored_before_chat_get_sequences_in_their_stored_order(
    database_target: DatabaseTarget,
) -> None:
    schema = _schema(database_target)
    await asyncio.to_thread(upgrade_database, database_target.url, schema, MIGRATIONS_DIR, "0002")
    engine = _sync_engine(database_target)
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
