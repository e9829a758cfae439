"""Database access: one async SQLAlchemy engine pair per service, and the unit of work.

Two backends, one code path:

- **SQLite** (the embedded default): WAL journal, `busy_timeout`, and write transactions that take the
  write lock up front with `BEGIN IMMEDIATE`. A deferred transaction that upgrades from read to write
  fails at once with SQLITE_BUSY and ignores `busy_timeout`, so every write transaction here begins
  immediate; reads use a second engine whose transactions begin deferred and never block writers.
- **PostgreSQL** through psycopg 3: each service lives in its own schema (its name), selected with
  `search_path` on every connection, so services never read each other's tables.

Services write through `Database.transaction()`: one transaction, committed when the block exits
normally and rolled back on any exception (including cancellation), so nothing half-written is stored
and nothing is acknowledged before it commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000


def is_sqlite(url: str) -> bool:
    """True for SQLite URLs."""
    return make_url(url).get_backend_name() == "sqlite"


def _configure_sqlite(engine: AsyncEngine, begin_statement: str) -> None:
    """Takes transaction control away from the driver so we emit our own BEGIN (SQLAlchemy's
    documented recipe for SQLite transactions), and sets WAL and the busy timeout."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # The busy timeout first: switching a fresh file to WAL needs a lock another process may hold.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql(begin_statement)


def create_engine(url: str, schema: str | None, *, writer: bool = True, pool_size: int = 10) -> AsyncEngine:
    """An async engine for `url`.

    Args:
        url: SQLAlchemy URL (`sqlite+aiosqlite:///path` or `postgresql+psycopg://...`).
        schema: PostgreSQL schema that holds the service's tables (ignored for SQLite).
        writer: for SQLite, whether transactions begin IMMEDIATE (writers) or DEFERRED (readers).
        pool_size: PostgreSQL connection pool size.
    """
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine, "BEGIN IMMEDIATE" if writer else "BEGIN")
        return engine
    connect_args: dict[str, Any] = {}
    if schema:
        connect_args["options"] = f"-c search_path={schema}"
    # No pool_pre_ping: it costs a round trip per transaction on the ingest path. After a database
    # restart the first transaction on a dead connection fails (callers answer UNAVAILABLE and
    # clients retry) and SQLAlchemy then discards the whole pool; pool_recycle replaces connections
    # that idled long enough for a firewall to drop them.
    return create_async_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800, connect_args=connect_args
    )


@dataclass
class Database:
    """A service's database: a writer engine and a reader engine (the same engine on PostgreSQL).

    Attributes:
        url: the SQLAlchemy URL.
        schema: the PostgreSQL schema (the service's name), or None on SQLite.
    """

    url: str
    schema: str | None
    writer: AsyncEngine
    reader: AsyncEngine

    @classmethod
    def connect(cls, url: str, schema: str) -> Database:
        """Creates the engines for a service whose tables live in `schema` (on PostgreSQL)."""
        if is_sqlite(url):
            return cls(url, None, create_engine(url, None), create_engine(url, None, writer=False))
        engine = create_engine(url, schema)
        return cls(url, schema, engine, engine)

    @property
    def dialect(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self.writer.dialect.name

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """One write transaction: commits when the block ends, rolls back on any exception."""
        async with self.writer.begin() as connection:
            yield connection

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """One read-only transaction (never takes SQLite's write lock)."""
        async with self.reader.begin() as connection:
            yield connection

    async def ping(self) -> None:
        """Runs `SELECT 1` (on the reader engine: it never takes SQLite's write lock); raises the
        driver's error when the database is unreachable (used by readiness checks)."""
        async with self.reader.connect() as connection:
            await connection.execute(text("SELECT 1"))

    async def ensure_schema(self) -> None:
        """Creates the PostgreSQL schema if missing (no-op on SQLite)."""
        if self.schema is None:
            return
        async with self.writer.begin() as connection:
            await connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))

    async def dispose(self) -> None:
        """Closes every pooled connection."""
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()
