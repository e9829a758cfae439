"""Group commit for ingest: snapshots arriving together share one transaction.

Every unary call and every stream message hands its validated snapshots to the one `IngestBatcher`
of the process and waits. The batcher runs up to `max_in_flight` transactions at once (default 1,
which the service uses):

- Before each transaction it collects. When submissions arrived while the previous batch was being
  processed (the batcher is busy), it waits while more keep arriving, closing the window after
  `max_wait_seconds` (default 2 ms) without a new one, or once `max_items` snapshots (default
  2,000) wait, or `max_delay_seconds` (default 10 ms) after it opened: with closed-loop clients (a
  worker waits for an ack before it sends more) the window lets their next messages join one commit
  instead of trickling into many small ones, which costs more per snapshot than the wait. When a
  submission finds the batcher idle, it first yields to the event loop `SETTLE_YIELDS` times
  (messages the server has already read join): if nothing else arrived meanwhile it commits at
  once, so a lone report is not held for a window nobody else will use; if more arrived (a burst,
  e.g. closed-loop clients answering their acks) it collects with the window as above.
- A submission is never split; a batch holds at least one submission.
- After the commit every waiter gets its own outcomes, in its order. If the transaction fails, every
  waiter of that batch gets the error (UNAVAILABLE for connection problems, INTERNAL otherwise) and
  nothing of the batch is stored.

Pipelining (`max_in_flight` > 1, which needs a `conflict_keys` function): while one batch commits,
the next is collected and run, so the service prepares batch N+1 while PostgreSQL flushes batch N,
and closed-loop clients whose acks went out are not held until a whole cohort commits. Order per key
(thread and snapshot id for ingest) is kept: a batch takes submissions in arrival order and stops at
the first one that shares a key with a batch still in flight; that one waits until the conflicting
batch has finished. So two transactions in flight never touch the same thread, and snapshots of one
thread submitted in order are applied in order, within and across batches. (The outbox sequencer
lock still serialises the two commits at their tail; the work before it overlaps.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from services.shared.errors import BossError

log = logging.getLogger(__name__)

# How many times a batch started by a submission to an idle batcher yields to the event loop while
# that still brings more submissions (module docstring).
SETTLE_YIELDS = 8

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class StorageUnavailable(BossError):
    """The database could not be reached or the service is stopping (UNAVAILABLE): retry later."""

    code = grpc.StatusCode.UNAVAILABLE
    reason = "STORAGE_UNAVAILABLE"


class StorageFailed(BossError):
    """The ingest transaction failed for another reason (INTERNAL); nothing was stored."""

    code = grpc.StatusCode.INTERNAL
    reason = "STORAGE_FAILED"


def storage_error_of(error: Exception) -> BossError:
    """The error a waiter gets when its batch's transaction raised `error`."""
    if isinstance(error, (OperationalError, PoolTimeoutError, ConnectionError, OSError)) or (
        isinstance(error, DBAPIError) and error.connection_invalidated
    ):
        return StorageUnavailable(f"storage unavailable, nothing stored: {type(error).__name__}")
    return StorageFailed(f"ingest transaction failed, nothing stored: {type(error).__name__}")


@dataclass
class _Submission(Generic[ItemT, ResultT]):
    items: Sequence[ItemT]
    future: asyncio.Future[list[ResultT]]


class IngestBatcher(Generic[ItemT, ResultT]):
    """Collects submissions from concurrent callers and processes them in shared transactions.

    Args:
        process: runs one transaction over all items of a batch and returns one result per item,
            in order (ContextBudgetHandlers.ingest). It must not return before its commit.
        max_items: a batch stops growing once it holds this many items.
        max_wait_seconds: idle gap that closes the collection window.
        max_delay_seconds: the longest a window stays open.
        max_in_flight: most batches being processed at once (module docstring, "Pipelining").
        conflict_keys: the keys an item touches (e.g. its thread id); batches in flight at the same
            time never share a key. Required when max_in_flight > 1.

    Raises:
        ValueError: max_in_flight < 1, or > 1 without conflict_keys.
    """

    def __init__(
        self,
        process: Callable[[list[ItemT]], Awaitable[list[ResultT]]],
        *,
        max_items: int = 2_000,
        max_wait_seconds: float = 0.002,
        max_delay_seconds: float = 0.01,
        max_in_flight: int = 1,
        conflict_keys: Callable[[ItemT], Iterable[Hashable]] | None = None,
    ) -> None:
        if max_in_flight < 1 or (max_in_flight > 1 and conflict_keys is None):
            raise ValueError("max_in_flight must be 1, or more with a conflict_keys function")
        self._process = process
        self._max_items = max_items
        self._max_wait = max_wait_seconds
        self._max_delay = max_delay_seconds
        self._pending: deque[_Submission[ItemT, ResultT]] = deque()
        self._pending_items = 0
        self._arrived = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._max_in_flight = max_in_flight
        self._conflict_keys = conflict_keys
        self._in_flight: dict[asyncio.Task[None], set[Hashable]] = {}
        self._finished = asyncio.Event()
        self._closed = False
        self.batches_committed = 0

    def enqueue(self, items: Sequence[ItemT]) -> asyncio.Future[list[ResultT]]:
        """Queues `items`; the future resolves to their results after their batch commits.

        Raises:
            StorageUnavailable: the batcher is closed (the service is stopping).
        """
        if self._closed:
            raise StorageUnavailable("context budget service is stopping", reason="SHUTTING_DOWN")
        future: asyncio.Future[list[ResultT]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Submission(items, future))
        self._pending_items += len(items)
        self._arrived += 1
        self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="context-budget-ingest-batcher")
        return future

    async def submit(self, items: Sequence[ItemT]) -> list[ResultT]:
        """Queues `items` and waits for their results (after commit).

        Raises:
            StorageUnavailable / StorageFailed: the batch's transaction failed; nothing was stored.
        """
        return await self.enqueue(items)

    async def close(self) -> None:
        """Refuses new submissions, processes the queued ones, then stops."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        idle = True
        try:
            while True:
                if not self._pending:
                    if self._closed:
                        await self._drain()
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    idle = True
                    continue
                await self._collect_window(idle)
                idle = False
                batch = self._take_batch()
                if batch is None:
                    await self._wait_for_a_finished_batch()
                    continue
                submissions, keys = batch
                if self._max_in_flight == 1:
                    await self._commit(submissions)
                    continue
                task = asyncio.create_task(self._commit(submissions), name="context-budget-ingest-batch")
                self._in_flight[task] = keys
                task.add_done_callback(self._batch_done)
        except asyncio.CancelledError:
            for task in list(self._in_flight):
                task.cancel()
            self._fail_all(StorageUnavailable("context budget service is stopping", reason="SHUTTING_DOWN"))
            raise

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._finished.set()

    async def _wait_for_a_finished_batch(self) -> None:
        self._finished.clear()
        if self._in_flight:
            await self._finished.wait()

    async def _drain(self) -> None:
        while self._in_flight:
            await self._wait_for_a_finished_batch()

    async def _collect_window(self, idle: bool) -> None:
        """Waits while submissions keep arriving (module docstring): yields only when the batcher was
        `idle`, else lingers up to `max_wait_seconds` per gap."""
        if self._max_wait <= 0:
            return
        if idle:
            seen = self._arrived
            for _ in range(SETTLE_YIELDS):
                await asyncio.sleep(0)
            if self._arrived == seen or self._pending_items >= self._max_items:
                return
            # More arrived meanwhile: a burst (closed-loop clients answering their acks); collect
            # it as a busy batcher does.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_delay
        while self._pending_items < self._max_items and not self._closed:
            seen = self._arrived
            await asyncio.sleep(self._max_wait)
            if self._arrived == seen or loop.time() >= deadline:
                return

    def _keys_of(self, submission: _Submission[ItemT, ResultT]) -> set[Hashable]:
        if self._conflict_keys is None:
            return set()
        return {key for item in submission.items for key in self._conflict_keys(item)}

    def _take_batch(self) -> tuple[list[_Submission[ItemT, ResultT]], set[Hashable]] | None:
        """The next batch in arrival order and its keys, or None when no batch may start now (as
        many in flight as allowed, or the oldest submission conflicts with one in flight)."""
        if len(self._in_flight) >= self._max_in_flight:
            return None
        busy: set[Hashable] = set().union(*self._in_flight.values()) if self._in_flight else set()
        batch: list[_Submission[ItemT, ResultT]] = []
        keys: set[Hashable] = set()
        count = 0
        while self._pending:
            submission = self._pending[0]
            if batch and count + len(submission.items) > self._max_items:
                break
            submission_keys = self._keys_of(submission) if busy or self._max_in_flight > 1 else set()
            if busy and not busy.isdisjoint(submission_keys):
                break
            self._pending.popleft()
            batch.append(submission)
            keys |= submission_keys
            count += len(submission.items)
        if not batch:
            return None
        self._pending_items -= count
        return batch, keys

    async def _commit(self, batch: list[_Submission[ItemT, ResultT]]) -> None:
        items = [item for submission in batch for item in submission.items]
        try:
            results = await self._process(items)
        except asyncio.CancelledError:
            error: BossError = StorageUnavailable(
                "context budget service is stopping", reason="SHUTTING_DOWN"
            )
            for submission in batch:
                if not submission.future.done():
                    submission.future.set_exception(error)
            raise
        except Exception as failure:
            log.exception("ingest batch of %d snapshots failed; nothing stored", len(items))
            error = storage_error_of(failure)
            for submission in batch:
                if not submission.future.done():
                    submission.future.set_exception(error)
            return
        self.batches_committed += 1
        offset = 0
        for submission in batch:
            count = len(submission.items)
            if not submission.future.done():
                submission.future.set_result(results[offset : offset + count])
            offset += count

    def _fail_all(self, error: BossError) -> None:
        while self._pending:
            submission = self._pending.popleft()
            if not submission.future.done():
                submission.future.set_exception(error)
        self._pending_items = 0
