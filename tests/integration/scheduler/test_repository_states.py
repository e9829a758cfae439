"""The scheduler repository's thread states on SQLite and PostgreSQL: every field of a state
survives a write and a read by another repository (on PostgreSQL the one-statement JSON upsert),
and a repository's kept copy of a state it wrote is returned only while it is still the row (on
PostgreSQL it compares the row's transaction id): a write by anyone else is read back."""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import text

from services.scheduler import server as scheduler_server
from services.scheduler.adapters.repository import SqlAlchemySchedulerRepository, utc_state
from services.shared.db import Database
from tests.conftest import DatabaseTarget
from tests.unit.scheduler.factories import NOW, full_state


async def open_database(target: DatabaseTarget) -> Database:
    await scheduler_server.migrate(target.url, target.schema or "scheduler")
    return Database.connect(target.url, target.schema or "scheduler")


async def test_a_state_survives_a_write_and_a_read_by_another_repository(
    database_target: DatabaseTarget,
) -> None:
    database = await open_database(database_target)
    state = full_state()
    writer = SqlAlchemySchedulerRepository(database.dialect)
    try:
        async with database.transaction() as connection:
            await writer.save_threads(connection, [state, replace(state, thread_id="t2", level=None)], NOW)
        async with database.read() as connection:
            read = await SqlAlchemySchedulerRepository(database.dialect).threads_by_id(
                connection, ["t1", "t2", "unknown"]
            )
    finally:
        await database.dispose()

    assert sorted(read) == ["t1", "t2"]
    assert read["t1"] == utc_state(state)
    assert read["t2"].level is None and read["t2"].relay_thread_id == "relay-1"


async def test_a_kept_state_is_returned_only_while_it_is_the_row(database_target: DatabaseTarget) -> None:
    database = await open_database(database_target)
    repository = SqlAlchemySchedulerRepository(database.dialect)
    try:
        async with database.transaction() as connection:
            await repository.save_threads(connection, [full_state()], NOW)
        async with database.read() as connection:
            before = (await repository.threads_by_id(connection, ["t1"]))["t1"]
        async with database.transaction() as connection:  # another writer changes the row
            await connection.execute(text("UPDATE scheduled_threads SET remaining_pct = 12.5"))
        async with database.read() as connection:
            after = (await repository.threads_by_id(connection, ["t1"]))["t1"]
    finally:
        await database.dispose()

    assert before.remaining_pct == 31.5
    assert after.remaining_pct == 12.5
