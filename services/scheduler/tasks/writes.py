"""Group commit of the local agents' writes: claims, starts, heartbeats and finishes that arrive
together run in one transaction with one outbox append and one commit.

Every transaction that publishes takes the outbox sequencer's row lock and holds it until its
commit (services/shared/outbox.py), so appending transactions of one service commit one at a time;
with one transaction per RPC the agents' calls queue behind each other's commits (each lock hold
also spans the event loop's turn between the append and the COMMIT). Batching them pays that once
per batch: a batch is every write queued when the previous batch finished, plus those that arrive
while the event loop is yielded to a few times (as the event consumer settles its batches), at most
`MAX_BATCH`. A lone write runs at once, as a batch of one.

A write is a function of the batch's connection returning `Written` (its result, the tasks whose
`task.status_changed` it publishes, the nodes whose waiting claims it may let in), or a `Grouped`
request of a `WriteGroup`: the batch hands all its requests of one group to the group at once,
which applies them together (the agents' claims, starts, heartbeats and finishes: one statement
per kind on PostgreSQL, services/scheduler/tasks/agent_writes.py). The batch runs its plain writes
in arrival order, then each group's requests in the groups' `order`. A write (or a group, for one
of its requests) may refuse with a BossError only before it changed anything (the refusals of
fenced calls do): that write alone fails and the batch goes on. Any other error (a database error,
such as the unique index refusing a claim another process made first) rolls the batch back, and
each of its writes is then run again alone, so one write's failure is never another's.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.tasks.model import Task
from services.scheduler.tasks.repository import SqlAlchemyTaskRepository
from services.scheduler.tasks.rules import status_changed_payload
from services.scheduler.tasks.wakeups import TaskWakeups
from services.shared.db import Database
from services.shared.errors import BossError
from services.shared.outbox import EventLog, NewEvent

log = logging.getLogger(__name__)

T = TypeVar("T")

STATUS_CHANGED = "task.status_changed"
MAX_BATCH = 128
SETTLE_YIELDS = 4


def status_changed_event(task: Task) -> NewEvent:
    """The `task.status_changed` event of `task` as it is now."""
    return NewEvent(
        STATUS_CHANGED,
        status_changed_payload(task),
        thread_id=task.target_thread_id,
        project_id=task.target_project_id,
        node_id=task.device_id,
        occurred_at=task.updated_at,
    )


@dataclass
class Written(Generic[T]):
    """What one write did: its `value` (the RPC's answer), the tasks it changed whose
    `task.status_changed` it publishes, and the nodes to wake after the commit (on PostgreSQL also
    notified in the transaction)."""

    value: T
    published: list[Task] = field(default_factory=list)
    wake: list[str] = field(default_factory=list)


Write = Callable[[AsyncConnection], Awaitable[Written[T]]]

R = TypeVar("R")


class WriteGroup(ABC, Generic[R, T]):
    """A kind of write whose requests a batch applies together (module docstring); groups with a
    lower `order` go first."""

    order: int = 0

    @abstractmethod
    async def apply(self, connection: AsyncConnection, requests: Sequence[R]) -> list[Written[T] | BossError]:
        """Applies `requests` (in arrival order) in the batch's transaction; returns, for each in
        its place, what it wrote or the BossError refusing it (nothing written for it). Any other
        exception fails the batch."""


@dataclass(frozen=True)
class Grouped(Generic[R, T]):
    """A write that is one `request` of `group`."""

    group: WriteGroup[R, T]
    request: R


@dataclass
class _Pending:
    write: Write[Any] | Grouped[Any, Any]
    future: asyncio.Future[Any]


class TaskWrites:
    """Runs writes in batches (module docstring); one instance per process.

    Attributes:
        batches: how many batch transactions committed.
        writes: how many writes they held.
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        repository: SqlAlchemyTaskRepository,
        wakeups: TaskWakeups,
        channel: str,
    ) -> None:
        self._database = database
        self._event_log = event_log
        self._repository = repository
        self._wakeups = wakeups
        self._channel = channel
        self._queue: list[_Pending] = []
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0
        self.writes = 0

    async def run(self, write: Write[T] | Grouped[Any, T]) -> T:
        """Runs `write` in the next batch and returns its value once the batch committed; raises
        what the write raised (a BossError), or the database error of running it alone."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(write, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        """Applies batches until nothing is queued (a background task, so that a caller that goes
        away never cancels the others' batch)."""
        while self._queue:
            for _ in range(SETTLE_YIELDS):
                queued = len(self._queue)
                if queued >= MAX_BATCH:
                    break
                await asyncio.sleep(0)
                if len(self._queue) == queued:
                    break
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            await self._apply(batch)

    async def _apply(self, batch: list[_Pending]) -> None:
        """One batch; on a failure of the whole transaction, each write alone."""
        try:
            outcomes = await self._in_one_transaction(batch)
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0].future, error)
                return
            log.info("a batch of %d task writes failed (%s); running each alone", len(batch), error)
            for pending in batch:
                await self._apply([pending])
            return
        for pending, outcome in zip(batch, outcomes, strict=True):
            _settle(pending.future, outcome)

    async def _in_one_transaction(self, batch: list[_Pending]) -> list[Any]:
        """Runs the batch's writes, publishes their events and notifies their nodes in one
        transaction; returns each write's value or BossError. Wakes the nodes after the commit."""
        outcomes: list[Any] = [None] * len(batch)
        written: list[Written[Any]] = []
        groups: dict[WriteGroup[Any, Any], list[tuple[int, Any]]] = {}
        async with self._database.transaction() as connection:
            for index, pending in enumerate(batch):
                write = pending.write
                if isinstance(write, Grouped):
                    groups.setdefault(write.group, []).append((index, write.request))
                    continue
                try:
                    done = await write(connection)
                except BossError as refused:
                    outcomes[index] = refused
                    continue
                written.append(done)
                outcomes[index] = done.value
            for group, members in sorted(groups.items(), key=lambda item: item[0].order):
                results = await group.apply(connection, [request for _, request in members])
                for (place, _), result in zip(members, results, strict=True):
                    if isinstance(result, BossError):
                        outcomes[place] = result
                    else:
                        written.append(result)
                        outcomes[place] = result.value
            wake = sorted({node for done in written for node in done.wake})
            events = [status_changed_event(task) for done in written for task in done.published]
            notification = self._repository.notification(self._channel, wake)
            if events:
                stored = await self._event_log.append(connection, events, carrying=notification)
            else:
                stored = []
                await self._repository.notify(connection, self._channel, wake)
        if stored:
            self._event_log.kick(stored)
        self._wakeups.wake_nodes(wake)
        self.batches += 1
        self.writes += len(batch)
        return outcomes


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """Hands a write's value or exception to its caller (unless the caller went away)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
