"""Column types shared by every service's tables, the upsert both backends run, and the driver-SQL
helpers of the hot paths."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.pq import ExecStatus
from sqlalchemy import DateTime, Insert, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import TypeDecorator


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC instant on every backend.

    PostgreSQL stores `timestamptz`; SQLite stores the UTC wall time as text. Naive datetimes are
    refused (ValueError) so a local time can never be stored by mistake; values read back are always
    aware and in UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def upsert(dialect: str, table: Table, columns: Iterable[str], keys: Sequence[str]) -> Insert:
    """INSERT ... ON CONFLICT (keys) DO UPDATE on SQLite or PostgreSQL (`dialect`, the dialect's
    name): the row is inserted, or the stored row with its keys gets the row's other `columns`. One
    statement, so two writers of a key not stored yet never both insert (the second waits for the
    first and updates). The rows are passed when it runs, one or many (executemany)."""
    insert = (postgresql if dialect == "postgresql" else sqlite).insert(table)
    return insert.on_conflict_do_update(
        index_elements=list(keys),
        set_={name: insert.excluded[name] for name in columns if name not in keys},
    )


async def fetch_driver_rows(
    connection: AsyncConnection, table: Table, sql: str, parameters: Mapping[str, Any], *lead: str
) -> list[dict[str, Any]]:
    """Rows of a hot read run as driver SQL (PostgreSQL; `sql` uses `%(name)s` parameters): no
    statement compilation and no per-column result processing, which cost more client CPU than such
    a query itself. `sql` selects the `lead` columns first, then every column of `table` in table
    order; each row comes back as a dict by column name, UtcDateTime columns in UTC as
    `UtcDateTime.process_result_value` would return them."""
    names = [*lead, *(column.name for column in table.columns)]
    times = [column.name for column in table.columns if isinstance(column.type, UtcDateTime)]
    rows: list[dict[str, Any]] = []
    for values in await run_driver_sql(connection, sql, dict(parameters)):
        row = dict(zip(names, values, strict=True))
        _in_utc(row, times)
        rows.append(row)
    return rows


async def fetch_driver_row_pairs(
    connection: AsyncConnection, first: Table, second: Table, sql: str, parameters: Mapping[str, Any]
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Rows of a hot read of two joined tables as driver SQL (as `fetch_driver_rows`): `sql` selects
    every column of `first`, then every column of `second` (each in table order, e.g. with
    `column_list`); each row comes back as a pair of dicts by column name, the second None when its
    first column is NULL (an outer join found no row there)."""
    first_names = [column.name for column in first.columns]
    second_names = [column.name for column in second.columns]
    first_times = [column.name for column in first.columns if isinstance(column.type, UtcDateTime)]
    second_times = [column.name for column in second.columns if isinstance(column.type, UtcDateTime)]
    split = len(first_names)
    pairs: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for values in await run_driver_sql(connection, sql, dict(parameters)):
        left = dict(zip(first_names, values[:split], strict=True))
        _in_utc(left, first_times)
        right = None
        if values[split] is not None:
            right = dict(zip(second_names, values[split:], strict=True))
            _in_utc(right, second_times)
        pairs.append((left, right))
    return pairs


def _in_utc(row: dict[str, Any], names: Sequence[str]) -> None:
    """Converts the named datetime values of `row` to UTC in place."""
    for name in names:
        if row[name] is not None:
            row[name] = row[name].astimezone(UTC)


async def driver_connection(connection: AsyncConnection) -> Any:
    """The driver's own connection (psycopg's `AsyncConnection` on PostgreSQL) under a SQLAlchemy
    connection, in the same transaction: for COPY and for hot reads whose rows are cheaper as the
    driver's tuples than as SQLAlchemy rows."""
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None
    return driver


async def run_driver_sql(
    connection: AsyncConnection, sql: str, parameters: Mapping[str, Any] | Sequence[Any] | None = None
) -> list[tuple[Any, ...]]:
    """Runs one driver SQL statement (PostgreSQL; psycopg placeholders `%(name)s`, `%s`, or `%b` /
    `%(name)b` for binary parameters) on the driver's own cursor in the connection's transaction,
    and returns its rows as tuples of driver values (empty for a statement that returns none).

    For the statements every ingest and projection transaction runs: SQLAlchemy's
    `exec_driver_sql` sends the same statement but sets up an execution context and a result
    around it, ~120 us of client CPU per statement measured here (a third of a trivial
    statement's cost), and a transaction runs five to seven of them.

    Raises:
        sqlalchemy.exc.DBAPIError: as `exec_driver_sql` raises it (OperationalError for a lost
            connection, IntegrityError, ...), wrapping psycopg's error.
    """
    driver = await driver_connection(connection)
    try:
        cursor = driver.cursor()
        await cursor.execute(sql, parameters)
        # The result's status, not `cursor.description`: that builds a Column object per column.
        result = cursor.pgresult
        return await cursor.fetchall() if result is not None and result.status == ExecStatus.TUPLES_OK else []
    except psycopg.Error as error:
        raise DBAPIError.instance(sql, parameters, error, psycopg.Error) from error


@dataclass(frozen=True)
class CarriedWrites:
    """Writes for another statement to carry (PostgreSQL), so that they cost no round trip of their
    own: a transaction's last writes ride on its outbox append (`EventLog.append(carrying=...)`).

    `clauses` are (name, statement) pairs for one WITH clause, in order: plain SELECTs that later
    clauses read, and the data-modifying statements named in `writes`, each with a RETURNING clause
    (which `completed_first` counts). Placeholders are named (`%(name)s` / `%(name)b`) and, with the
    clause names, must not collide with the carrier's own (`EventLog.append` uses `count`, `trace`,
    `items`, `cursor_*`; `advanced`, `previous`, `moved`).
    """

    clauses: tuple[tuple[str, str], ...]
    writes: tuple[str, ...]
    parameters: Mapping[str, Any]

    def with_clauses(self) -> str:
        """The clauses as they go into a WITH clause: `name AS (statement), ...`."""
        return ", ".join(f"{name} AS ({statement})" for name, statement in self.clauses)

    def completed_first(self) -> str:
        """A condition, always true, that runs every write to completion where it is evaluated.

        PostgreSQL runs a data-modifying clause that nothing reads only after the main statement
        (docs: "WITH Queries", data-modifying statements); a carrier that must take its own locks
        after these writes' row locks (the outbox's sequencer lock is the last lock of every
        transaction, so two transactions never wait for each other's) puts this in the WHERE of
        the statement that takes them: an uncorrelated subquery, evaluated once before any row."""
        counted = " + ".join(f"(SELECT count(*) FROM {name})" for name in self.writes)
        return f"{counted} >= 0" if counted else "TRUE"

    async def run(self, connection: AsyncConnection) -> None:
        """Makes the writes with a statement of their own (when there is nothing to carry them)."""
        await run_driver_sql(
            connection, f"WITH {self.with_clauses()} SELECT {self.completed_first()}", dict(self.parameters)
        )


def column_list(table: Table, qualifier: str = "") -> str:
    """Every column of `table`, quoted, in table order (what `fetch_driver_rows` expects), each
    prefixed with `qualifier.` when given: the select list of a driver SQL statement."""
    prefix = f"{qualifier}." if qualifier else ""
    return ", ".join(f'{prefix}"{column.name}"' for column in table.columns)
