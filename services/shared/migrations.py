"""Alembic migrations, one migration folder per service, applied programmatically.

A service's `migrations/env.py` calls `run_alembic_environment(metadata)`; `upgrade_database()` runs
`alembic upgrade head` for a service (on start in local mode, or through `python -m
services.<name> migrate` in production). On PostgreSQL the tables and Alembic's version table live in
the service's own schema; on SQLite in the service's own file.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command, context, op
from alembic.config import Config
from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.engine import make_url

from services.shared.db import is_sqlite, make_sqlite_file_private
from services.shared.sql_types import UtcDateTime

OUTBOX_TABLES = ("event_cursors", "outbox_sequencer", "outbox_events")


def sync_url(url: str) -> str:
    """The synchronous-driver form of a service URL (migrations run synchronously)."""
    parsed = make_url(url)
    if parsed.drivername == "sqlite+aiosqlite":
        parsed = parsed.set(drivername="sqlite")
    return parsed.render_as_string(hide_password=False)


def upgrade_database(url: str, schema: str, migrations_dir: Path, revision: str = "head") -> None:
    """Applies a service's migrations up to `revision`. Blocking: run it in a thread from async code.

    Raises alembic / SQLAlchemy errors unchanged when a migration fails (nothing is half-applied on
    PostgreSQL, whose DDL is transactional). A SQLite file it creates is its owner's only (0600).
    """
    if is_sqlite(url):
        make_sqlite_file_private(url)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    config.attributes["url"] = sync_url(url)
    config.attributes["schema"] = schema
    command.upgrade(config, revision)


def run_alembic_environment(metadata: MetaData) -> None:
    """The body of every service's `env.py` (online mode only)."""
    config = context.config
    url: str = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or ""
    schema: str = config.attributes.get("schema") or ""
    sqlite = url.startswith("sqlite")
    engine = create_engine(url, connect_args={"timeout": 30} if sqlite else {})
    with engine.connect() as connection:
        if sqlite:
            # The file is WAL from its first write, as the services open it (db.py); the busy timeout
            # lets a migration wait for a writer instead of failing with "database is locked".
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")
            connection.commit()
        if not sqlite and schema:
            connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            connection.execute(text(f'SET search_path TO "{schema}"'))
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table_schema=None if sqlite or not schema else schema,
            render_as_batch=sqlite,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


def create_outbox_tables() -> None:
    """Creates the shared outbox tables (`outbox.define_outbox_tables`) in a service's migration:
    `outbox_events`, `outbox_sequencer` and `event_cursors`."""
    op.create_table(
        "outbox_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("sequence", sa.BigInteger(), nullable=False, unique=True),
        sa.Column("event_type", sa.String(100), nullable=False),
        sa.Column("occurred_at", UtcDateTime(), nullable=False),
        sa.Column("thread_id", sa.String(200), nullable=False),
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("trace_context_json", sa.Text(), nullable=False),
    )
    op.create_table(
        "outbox_sequencer",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("last_sequence", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "event_cursors",
        sa.Column("stream_name", sa.String(100), primary_key=True),
        sa.Column("last_sequence", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )


def drop_outbox_tables() -> None:
    """Drops what `create_outbox_tables` created."""
    for table in OUTBOX_TABLES:
        op.drop_table(table)
