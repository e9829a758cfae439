"""`run_driver_sql` on PostgreSQL: statements run on the driver's cursor inside the SQLAlchemy
transaction (committed and rolled back with it), rows come back as tuples, and driver errors reach
callers as the SQLAlchemy exceptions `exec_driver_sql` raises, so error handling (e.g. the ingest
batcher's UNAVAILABLE for a lost connection) is unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from services.shared.db import Database
from services.shared.sql_types import run_driver_sql
from tests.conftest import DatabaseTarget

pytestmark = pytest.mark.postgres


@pytest.fixture
async def database(database_target: DatabaseTarget) -> AsyncIterator[Database]:
    """A PostgreSQL schema holding an empty `items` table."""
    if database_target.backend != "postgresql":
        pytest.skip("driver SQL is the PostgreSQL path")
    database = Database.connect(database_target.url, database_target.schema)
    async with database.transaction() as connection:
        await connection.execute(
            text("CREATE TABLE items (item_id text PRIMARY KEY, amount integer NOT NULL)")
        )
    yield database
    await database.dispose()


async def stored_count(database: Database) -> int:
    async with database.read() as connection:
        return int((await connection.execute(text("SELECT count(*) FROM items"))).scalar_one())


async def test_rows_and_statements_without_rows(database: Database) -> None:
    async with database.transaction() as connection:
        written = await run_driver_sql(
            connection,
            "INSERT INTO items SELECT * FROM unnest(%(ids)s::text[], %(amounts)s::int[])",
            {"ids": ["a", "b"], "amounts": [3, 4]},
        )
        assert written == []
        rows = await run_driver_sql(
            connection, "SELECT item_id, amount FROM items WHERE amount > %s ORDER BY item_id", (3,)
        )
    assert rows == [("b", 4)]
    assert await stored_count(database) == 2, "the driver's writes commit with the SQLAlchemy transaction"


async def test_driver_writes_roll_back_with_the_transaction(database: Database) -> None:
    with pytest.raises(RuntimeError):
        async with database.transaction() as connection:
            await run_driver_sql(connection, "INSERT INTO items VALUES ('a', 1)")
            raise RuntimeError("the caller fails after the write")
    assert await stored_count(database) == 0


async def test_driver_errors_are_sqlalchemy_errors(database: Database) -> None:
    async with database.transaction() as connection:
        await run_driver_sql(connection, "INSERT INTO items VALUES ('a', 1)")
    with pytest.raises(IntegrityError) as duplicate:
        async with database.transaction() as connection:
            await run_driver_sql(connection, "INSERT INTO items VALUES ('a', 2)")
    assert "items_pkey" in str(duplicate.value)
    with pytest.raises(ProgrammingError) as missing:
        async with database.transaction() as connection:
            await run_driver_sql(connection, "SELECT no_such_column FROM items")
    assert "no_such_column" in str(missing.value)
    async with database.transaction() as connection:  # the pool's connection is usable again
        assert await run_driver_sql(connection, "SELECT amount FROM items") == [(1,)]
