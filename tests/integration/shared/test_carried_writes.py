"""Writes carried by the outbox append on PostgreSQL (`CarriedWrites`, `EventLog.append(carrying=)`):
made with the events in one statement, or on their own when the append has no statement to carry
them (no events, or a COPY-sized batch), rolled back with the transaction, and made *before* the
append takes the sequencer's lock, so a transaction that waits on one of their rows never holds up
every other appender of the service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import MetaData, text

from services.shared.db import Database
from services.shared.outbox import COPY_THRESHOLD, EventLog, NewEvent, define_outbox_tables
from services.shared.sql_types import CarriedWrites
from tests.conftest import DatabaseTarget

pytestmark = pytest.mark.postgres


@pytest.fixture
async def stack(database_target: DatabaseTarget) -> AsyncIterator[tuple[Database, EventLog]]:
    """A PostgreSQL schema with the outbox tables and a `notes` table (note_id 'a' and 'b', 0)."""
    if database_target.backend != "postgresql":
        pytest.skip("carried writes are the PostgreSQL path")
    metadata = MetaData()
    define_outbox_tables(metadata)
    database = Database.connect(database_target.url, database_target.schema)
    async with database.transaction() as connection:
        await connection.run_sync(metadata.create_all)
        await connection.execute(
            text("CREATE TABLE notes (note_id text PRIMARY KEY, amount integer NOT NULL)")
        )
        await connection.execute(text("INSERT INTO notes VALUES ('a', 0), ('b', 0)"))
    event_log = EventLog(database, metadata)
    await event_log.ensure_sequencer_row()
    yield database, event_log
    await database.dispose()


def set_amounts(**amounts: int) -> CarriedWrites:
    """Sets the amount of each named note: one UPDATE per note, as separate WITH clauses."""
    clauses = tuple(
        (f"set_{note}", f"UPDATE notes SET amount = %(amount_{note})s WHERE note_id = '{note}' RETURNING 1")
        for note in amounts
    )
    return CarriedWrites(
        clauses,
        tuple(name for name, _statement in clauses),
        {f"amount_{note}": amount for note, amount in amounts.items()},
    )


async def amounts(database: Database) -> dict[str, int]:
    async with database.read() as connection:
        rows = await connection.execute(text("SELECT note_id, amount FROM notes ORDER BY note_id"))
        return {note: amount for note, amount in rows}


def events(count: int) -> list[NewEvent]:
    return [NewEvent("test.happened", {"n": n}) for n in range(count)]


async def test_carried_writes_are_made_with_small_and_copied_appends_and_alone(
    stack: tuple[Database, EventLog],
) -> None:
    database, event_log = stack
    async with database.transaction() as connection:
        appended = await event_log.append(connection, events(2), carrying=set_amounts(a=5, b=7))
    assert [event.sequence for event in appended] == [1, 2]
    assert await amounts(database) == {"a": 5, "b": 7}

    async with database.transaction() as connection:
        assert await event_log.append(connection, [], carrying=set_amounts(a=11)) == []
    assert await amounts(database) == {"a": 11, "b": 7}

    async with database.transaction() as connection:
        copied = await event_log.append(connection, events(COPY_THRESHOLD), carrying=set_amounts(b=13))
    assert (copied[0].sequence, copied[-1].sequence) == (3, 2 + COPY_THRESHOLD)
    assert await amounts(database) == {"a": 11, "b": 13}
    assert [event.sequence for event in await event_log.read_after(0, limit=1_000)] == list(
        range(1, 3 + COPY_THRESHOLD)
    )


async def test_carried_writes_roll_back_with_the_transaction(stack: tuple[Database, EventLog]) -> None:
    database, event_log = stack
    with pytest.raises(RuntimeError, match="after the append"):
        async with database.transaction() as connection:
            await event_log.append(connection, events(1), carrying=set_amounts(a=99))
            raise RuntimeError("after the append")
    assert await amounts(database) == {"a": 0, "b": 0}
    assert await event_log.read_after(0) == []


async def test_a_carried_write_waiting_on_a_row_does_not_hold_the_sequencer(
    stack: tuple[Database, EventLog],
) -> None:
    database, event_log = stack
    async with database.transaction() as holder:
        await holder.execute(text("UPDATE notes SET amount = 1 WHERE note_id = 'b'"))  # row lock on b

        async def carried_append() -> None:
            async with database.transaction() as connection:
                await event_log.append(connection, events(1), carrying=set_amounts(a=2, b=3))

        waiting = asyncio.create_task(carried_append())
        await asyncio.sleep(0.3)
        assert not waiting.done(), "the carried write on note b waits for the holder's row lock"
        async with database.transaction() as connection:  # another appender of the same outbox
            other = await asyncio.wait_for(event_log.append(connection, events(1)), timeout=5)
        assert [event.sequence for event in other] == [1], "the waiting append had not taken a sequence"
    await asyncio.wait_for(waiting, timeout=5)
    assert await amounts(database) == {"a": 2, "b": 3}
    assert [event.sequence for event in await event_log.read_after(0)] == [1, 2]
