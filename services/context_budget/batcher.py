"""Group commit for ingest: snapshots arriving together share one transaction.

Every unary call and every stream message hands its validated snapshots to the one `IngestBatcher`
of the process and waits. The batcher runs one transaction at a time:

- Before each transaction it collects: it waits while submissions keep arriving, closing the window
  after `max_wait_seconds` (default 2 ms) without a new one, or once `max_items` snapshots (default
  2,000) wait, or `max_delay_seconds` (default 10 ms) after it opened. Under load the queue is
  full already and there is no wait; with closed-loop clients (a worker waits for an ack before it
  sends more) the window lets their next messages join one commit instead of trickling into many
  small ones, which costs more per snapshot than the wait.
- A submission is never split; a batch holds at least one submission.
- After the commit every waiter gets its own outcomes, in its order. If the transaction fails, every
  waiter of that batch gets the error (UNAVAILABLE for connection problems, INTERNAL otherwise) and
  nothing of the batch is stored.

Because the transactions run one after another, snapshots of one thread submitted in order are
applied in order, within and across batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from services.shared.errors import BossError

log = logging.getLogger(__name__)

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
    """

    def __init__(
        self,
        process: Callable[[list[ItemT]], Awaitable[list[ResultT]]],
        *,
        max_items: int = 2_000,
        max_wait_seconds: float = 0.002,
        max_delay_seconds: float = 0.01,
    ) -> None:
        self._process = process
        self._max_items = max_items
        self._max_wait = max_wait_seconds
        self._max_delay = max_delay_seconds
        self._pending: deque[_Submission[ItemT, ResultT]] = deque()
        self._pending_items = 0
        self._arrived = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
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
        try:
            while True:
                if not self._pending:
                    if self._closed:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._collect_window()
                await self._commit(self._take_batch())
        except asyncio.CancelledError:
            self._fail_all(StorageUnavailable("context budget service is stopping", reason="SHUTTING_DOWN"))
            raise

    async def _collect_window(self) -> None:
        """Waits while submissions keep arriving (module docstring)."""
        if self._max_wait <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_delay
        while self._pending_items < self._max_items and not self._closed:
            seen = self._arrived
            await asyncio.sleep(self._max_wait)
            if self._arrived == seen or loop.time() >= deadline:
                return

    def _take_batch(self) -> list[_Submission[ItemT, ResultT]]:
        batch = [self._pending.popleft()]
        count = len(batch[0].items)
        while self._pending and count + len(self._pending[0].items) <= self._max_items:
            submission = self._pending.popleft()
            batch.append(submission)
            count += len(submission.items)
        self._pending_items -= count
        return batch

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
