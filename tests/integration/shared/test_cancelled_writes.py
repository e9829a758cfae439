"""Write transactions whose task is cancelled, on SQLite and PostgreSQL: cancelled while one of its
statements runs, between statements, or again while its cleanup runs, the transaction leaves nothing
written and no lock behind, so the process's next write goes through at once instead of waiting
for the busy timeout and failing with "database is locked". The scheduler's command stream and the
shared EventConsumer, whose transactions a disconnecting client or a shutdown cancels, included.

A statement is held in flight deterministically: on SQLite a trace callback of the writer's
connections sleeps on the driver's thread as the statement starts (it then goes on and returns its
first row, so the cancelled statement is left unfinished, as a real one is); on PostgreSQL another
connection holds an exclusive lock on the table the statement reads, until the cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from functools import partial
from typing import Any, cast

import pytest
from sqlalchemy import MetaData, event, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import QueuePool
from sqlalchemy.util import await_only

from services.scheduler import server as scheduler_server
from services.scheduler.adapters import tables as scheduler_tables
from services.scheduler.adapters.repository import CommandRow
from services.scheduler.domain.model import SchedulerSettings
from services.scheduler.service import SchedulerHandlers
from services.shared import db as db_module
from services.shared.db import Database
from services.shared.event_stream import EventConsumer
from services.shared.outbox import EventLog, NewEvent, StoredEvent, define_outbox_tables
from tests.conftest import DatabaseTarget

# The failing case waits this long for the lock (instead of the production 30 s), then fails with
# "database is locked"; a fixed run needs none of it.
BUSY_TIMEOUT_MS = 5_000
# How long a paused statement stays in flight on SQLite, in seconds.
PAUSE_SECONDS = 0.3
ROUNDS = 3
START = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


class StatementPause:
    """Holds the next statement that reads `table` in flight, while armed (`async with pause.armed():`).

    SQLite: the writer's connections get a trace callback (installed for connections made after
    construction) that sleeps PAUSE_SECONDS when a `SELECT ... FROM table` starts. PostgreSQL:
    while armed, another connection holds `LOCK TABLE table IN ACCESS EXCLUSIVE MODE`, so the
    statement waits for the lock until the block ends.
    """

    def __init__(self, database: Database, table: str) -> None:
        self._database = database
        self._table = table
        self._loop = asyncio.get_running_loop()
        self._reached = asyncio.Event()
        self._armed = False
        if database.dialect == "sqlite":
            event.listen(database.writer.sync_engine, "connect", self._install_trace)

    def _install_trace(self, dbapi_connection: Any, _record: Any) -> None:
        await_only(dbapi_connection.driver_connection.set_trace_callback(self._trace))

    def _trace(self, statement: str) -> None:
        """Runs on the driver's thread as each statement starts."""
        if self._armed and statement.startswith("SELECT") and f"FROM {self._table}" in statement:
            self._armed = False
            self._loop.call_soon_threadsafe(self._reached.set)
            time.sleep(PAUSE_SECONDS)

    async def reached(self) -> None:
        """Returns once a statement is held in flight (fails after 10 s)."""
        async with asyncio.timeout(10):
            if self._database.dialect == "sqlite":
                await self._reached.wait()
                return
            waiting = text(
                "SELECT count(*) FROM pg_locks WHERE relation = CAST(:t AS regclass) AND NOT granted"
            )
            while True:
                async with self._database.read() as connection:
                    if (await connection.execute(waiting, {"t": self._table})).scalar_one():
                        return
                await asyncio.sleep(0.01)

    @contextlib.asynccontextmanager
    async def armed(self) -> AsyncIterator[StatementPause]:
        """Arms the pause for the block (on PostgreSQL: holds the lock until the block ends)."""
        self._reached.clear()
        if self._database.dialect == "sqlite":
            self._armed = True
            try:
                yield self
            finally:
                self._armed = False
            return
        async with self._database.writer.connect() as holder, holder.begin():
            await holder.execute(text(f'LOCK TABLE "{self._table}" IN ACCESS EXCLUSIVE MODE'))
            yield self


async def cancel_while_in_flight(
    pause: StatementPause, work: Callable[[], Coroutine[Any, Any, Any]], *, again_during_cleanup: bool = False
) -> None:
    """Runs `work` in a task, cancels it while its paused statement is in flight (and, when
    `again_during_cleanup`, every 10 ms until it ends), and checks that it ended cancelled."""
    async with pause.armed():
        task = asyncio.create_task(work())
        reached = asyncio.create_task(pause.reached())
        await asyncio.wait({task, reached}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():  # the work ended before its statement ran: its error says why
            reached.cancel()
            await task
            pytest.fail("the work ended without running the paused statement")
        await reached
        task.cancel()
        while again_during_cleanup and not task.done():
            await asyncio.sleep(0.01)
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite engines made during the test wait BUSY_TIMEOUT_MS for a lock."""
    monkeypatch.setattr(db_module, "SQLITE_BUSY_TIMEOUT_MS", BUSY_TIMEOUT_MS)


# ---- the unit of work ----------------------------------------------------------------------------


@pytest.fixture
async def database(database_target: DatabaseTarget, short_busy_timeout: None) -> AsyncIterator[Database]:
    """Tables `items` (written by the tests) and `gate` (one row, read by the paused statement)."""
    database = Database.connect(database_target.url, database_target.schema or "unused")
    async with database.transaction() as connection:
        await connection.execute(text("CREATE TABLE items (name varchar(40) PRIMARY KEY)"))
        await connection.execute(text("CREATE TABLE gate (opened integer NOT NULL)"))
        await connection.execute(text("INSERT INTO gate VALUES (1)"))
    await database.writer.dispose()  # later connections get the pause's trace callback
    yield database
    await database.dispose()


async def insert_item(database: Database, name: str) -> None:
    async with database.transaction() as connection:
        await connection.execute(text("INSERT INTO items VALUES (:name)"), {"name": name})


async def stored_items(database: Database) -> list[str]:
    async with database.read() as connection:
        return list((await connection.execute(text("SELECT name FROM items ORDER BY name"))).scalars())


def checked_out(database: Database) -> int:
    """Connections of the writer's pool currently checked out."""
    pool = database.writer.pool
    assert isinstance(pool, QueuePool)
    return pool.checkedout()


async def write_then_read_the_gate(database: Database, name: str) -> None:
    """A write transaction: one insert, then a statement returning rows (the one cancelled)."""
    async with database.transaction() as connection:
        await connection.execute(text("INSERT INTO items VALUES (:name)"), {"name": name})
        await connection.execute(text("SELECT opened FROM gate"))


async def test_a_write_cancelled_mid_statement_leaves_no_lock(database: Database) -> None:
    pause = StatementPause(database, "gate")
    for round_ in range(ROUNDS):
        await cancel_while_in_flight(
            pause, partial(write_then_read_the_gate, database, f"cancelled-{round_}")
        )
        await insert_item(database, f"after-{round_}")
    assert await stored_items(database) == ["after-0", "after-1", "after-2"]
    assert checked_out(database) == 0, "no connection is left checked out"


async def test_a_write_cancelled_again_during_its_cleanup_leaves_no_lock(database: Database) -> None:
    pause = StatementPause(database, "gate")
    for round_ in range(ROUNDS):
        await cancel_while_in_flight(
            pause,
            partial(write_then_read_the_gate, database, f"cancelled-{round_}"),
            again_during_cleanup=True,
        )
        await insert_item(database, f"after-{round_}")
    assert await stored_items(database) == ["after-0", "after-1", "after-2"]
    assert checked_out(database) == 0


async def test_a_write_cancelled_between_statements_rolls_back(database: Database) -> None:
    holding = asyncio.Event()

    async def write_then_wait() -> None:
        async with database.transaction() as connection:
            await connection.execute(text("INSERT INTO items VALUES ('cancelled')"))
            holding.set()
            await asyncio.Event().wait()  # e.g. a call to another service, inside the transaction

    task = asyncio.create_task(write_then_wait())
    await holding.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await insert_item(database, "after")
    assert await stored_items(database) == ["after"]


# ---- callers whose writes a disconnecting client or a shutdown cancels ---------------------------


async def test_a_command_stream_cancelled_mid_read_leaves_the_scheduler_writable(
    database_target: DatabaseTarget, short_busy_timeout: None
) -> None:
    """StreamWorkerCommands' loop (follow_commands), cancelled as its worker disconnects while its
    transaction reads the due commands: the next stream gets the command, counted once."""
    name = database_target.schema or "scheduler"
    await scheduler_server.migrate(database_target.url, name)
    database = Database.connect(database_target.url, name)
    pause = StatementPause(database, "worker_commands")
    try:
        event_log = EventLog(database, scheduler_tables.metadata)
        await event_log.ensure_sequencer_row()
        handlers = SchedulerHandlers(database, event_log, SchedulerSettings())
        async with database.transaction() as connection:
            await connection.execute(
                scheduler_tables.worker_commands.insert().values(
                    command_id="command-1",
                    command_type="stop_thread",
                    thread_id="thread-1",
                    node_id="node-1",
                    worker_id="worker-1",
                    command_status="pending",
                    issued_at=START,
                )
            )

        async def first_command() -> str:
            commands = cast(AsyncGenerator[CommandRow, None], handlers.follow_commands("worker-1", "node-1"))
            try:
                return (await anext(commands)).command_id
            finally:
                await commands.aclose()

        for _ in range(ROUNDS):
            await cancel_while_in_flight(pause, first_command)
        assert await first_command() == "command-1"
        async with database.read() as connection:
            counted = (
                await connection.execute(select(scheduler_tables.worker_commands.c.delivery_count))
            ).scalar_one()
        assert counted == 1, "the cancelled streams' deliveries were rolled back"
    finally:
        await database.dispose()


async def test_an_event_consumer_cancelled_mid_batch_leaves_the_service_writable(
    database_target: DatabaseTarget, short_busy_timeout: None
) -> None:
    """EventConsumer.apply, cancelled (a shutdown) while its batch's transaction runs: nothing of
    the batch is stored, and applying it again afterwards succeeds."""
    metadata = MetaData()
    _events, _sequencer, cursors = define_outbox_tables(metadata)
    database = Database.connect(database_target.url, database_target.schema or "unused")
    pause = StatementPause(database, cursors.name)
    try:
        async with database.transaction() as connection:
            await connection.run_sync(metadata.create_all)
            await connection.execute(text("CREATE TABLE applied (n integer PRIMARY KEY)"))

        async def handle(connection: AsyncConnection, events: list[StoredEvent]) -> list[NewEvent]:
            for stored in events:
                await connection.execute(text("INSERT INTO applied VALUES (:n)"), {"n": stored.sequence})
            return []

        async def no_stream(_after: int) -> Any:  # pragma: no cover - batches are applied directly
            raise AssertionError("not opened")
            yield

        consumer = EventConsumer(
            stream_name="upstream", database=database, cursors=cursors, open_stream=no_stream, handle=handle
        )
        batches = [[StoredEvent(n, "test.happened", START, "", "", "", {"n": n}, {})] for n in (1, 2)]
        await consumer.apply(batches[0])  # the cursor row exists from here on
        for _ in range(ROUNDS):
            await cancel_while_in_flight(pause, lambda: consumer.apply(batches[1]))
        await consumer.apply(batches[1])
        async with database.read() as connection:
            applied = list((await connection.execute(text("SELECT n FROM applied ORDER BY n"))).scalars())
        assert applied == [1, 2]
        assert await consumer.load_cursor() == 2
    finally:
        await database.dispose()
