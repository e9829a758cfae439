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

A task cancelled while a SQLite statement runs (a client disconnecting from a stream, a shutdown)
must not leave the write lock behind. SQLAlchemy treats the cancellation as a lost connection: it
discards the connection and closes it without rolling back. The driver's thread finishes the
statement meanwhile, and a statement that returns rows is then left unfinished on its cursor, which
the cancelled task's traceback keeps alive. SQLite's close of a connection with an unfinished
statement only marks it for closing once the statement is finalised, and keeps its transaction and
its lock until then (until the garbage collector frees that traceback): every other write of the
process would wait the busy timeout and fail with "database is locked". So SQLite connections are
`_SQLiteConnection`s, whose close first closes their cursors and rolls back, all in the close's one
call on the driver's thread, which runs to completion once queued, whatever happens to the caller.

A service starting before its PostgreSQL server is up (a node's boot, a rolling restart of both)
waits for it (`wait_for_database`), saying why on every try, instead of failing its migration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from services.shared.config import make_private

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000


def is_sqlite(url: str) -> bool:
    """True for SQLite URLs."""
    return make_url(url).get_backend_name() == "sqlite"


class _SQLiteConnection(sqlite3.Connection):
    """A sqlite3 connection whose `close()` cannot leave a transaction or its lock behind.

    `sqlite3.Connection.close()` of a connection whose cursor still holds an unfinished statement
    (one that returned rows not all fetched, e.g. when the task awaiting it was cancelled) does not
    close it: SQLite defers the close until the statement is finalised and keeps the open
    transaction, and with it the write lock, until then. This close closes every cursor this
    connection made (finalising their statements) and rolls back an open transaction first, then
    closes; all of it runs on the driver's thread as one queued call.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cursors: weakref.WeakSet[sqlite3.Cursor] = weakref.WeakSet()

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """`sqlite3.Connection.cursor`, remembering the cursor (weakly) for `close()`."""
        cursor = super().cursor(*args, **kwargs)
        self._cursors.add(cursor)
        return cursor

    def close(self) -> None:
        """Closes this connection's cursors, rolls back an open transaction, then closes."""
        try:
            for cursor in list(self._cursors):
                cursor.close()
            if self.in_transaction:
                self.rollback()
        finally:
            super().close()


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


def make_sqlite_file_private(url: str) -> None:
    """Creates the SQLite database file of `url` with mode 0600 when it does not exist, and narrows
    an existing one's mode to its owner: it holds every thread, message and device of the
    installation. SQLite gives its -wal and -shm files the database file's permissions. An
    in-memory database is left alone."""
    path = make_url(url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    file = Path(path)
    if file.exists():
        make_private(file)
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(file, os.O_WRONLY | os.O_CREAT, 0o600))


def create_engine(url: str, schema: str | None, *, writer: bool = True, pool_size: int = 10) -> AsyncEngine:
    """An async engine for `url`.

    Args:
        url: SQLAlchemy URL (`sqlite+aiosqlite:///path` or `postgresql+psycopg://...`).
        schema: PostgreSQL schema that holds the service's tables (ignored for SQLite).
        writer: for SQLite, whether transactions begin IMMEDIATE (writers) or DEFERRED (readers).
        pool_size: PostgreSQL connection pool size.
    """
    if is_sqlite(url):
        engine = create_async_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "factory": _SQLiteConnection}
        )
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
        """Creates the engines for a service whose tables live in `schema` (on PostgreSQL). A
        SQLite file is made readable by its owner only (`make_sqlite_file_private`)."""
        if is_sqlite(url):
            make_sqlite_file_private(url)
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


DATABASE_WAIT_FIRST_DELAY_SECONDS = 0.5
DATABASE_WAIT_MAX_DELAY_SECONDS = 10.0


async def wait_for_database(
    url: str,
    service: str,
    limit_seconds: float | None = None,
    first_delay: float = DATABASE_WAIT_FIRST_DELAY_SECONDS,
    max_delay: float = DATABASE_WAIT_MAX_DELAY_SECONDS,
) -> None:
    """Returns once the PostgreSQL server at `url` accepts a connection and answers `SELECT 1`,
    trying again with backoff (`first_delay` seconds doubling to `max_delay`) and logging why it
    waits, once per try, with the address but never the password. An embedded SQLite URL returns at
    once (the file is created on demand). `limit_seconds` (default BOSS_DATABASE_WAIT_SECONDS, or
    300): raises SystemExit naming the database and the last error once it is spent, so a process
    that can never reach its database ends with a reason instead of hanging."""
    if is_sqlite(url):
        return
    if limit_seconds is None:
        limit_seconds = float(os.environ.get("BOSS_DATABASE_WAIT_SECONDS") or 300)
    shown = make_url(url).render_as_string(hide_password=True)
    engine = create_async_engine(url, poolclass=NullPool)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_seconds
    delay = first_delay
    waited = False
    try:
        while True:
            try:
                async with engine.connect() as connection:
                    await connection.execute(text("SELECT 1"))
            except Exception as error:  # the driver's error says why: refused, unknown database, ...
                reason = " ".join(str(error).split())[:300]
                if loop.time() + delay > deadline:
                    raise SystemExit(
                        f"{service}: gave up waiting for its database at {shown} after "
                        f"{limit_seconds:.0f} s: {reason}"
                    ) from None
                log.warning(
                    "%s: waiting for its database at %s (%s); next try in %.1f s",
                    service,
                    shown,
                    reason,
                    delay,
                )
                waited = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, max_delay)
                continue
            if waited:
                log.info("%s: its database at %s answers; starting", service, shown)
            return
    finally:
        await engine.dispose()
