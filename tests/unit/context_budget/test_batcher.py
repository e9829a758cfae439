"""Group commit: concurrent submissions share one process call; failures reach every waiter."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from services.context_budget.batcher import IngestBatcher, StorageFailed, StorageUnavailable


class Recorder:
    """A process function that records its batches and returns each item doubled."""

    def __init__(self, fail_with: Exception | None = None, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.fail_with = fail_with
        self.delay = delay

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        return [item * 2 for item in items]


async def test_concurrent_submissions_share_one_batch_and_get_their_own_results() -> None:
    recorder = Recorder()
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder)
    results = await asyncio.gather(batcher.submit([1, 2]), batcher.submit([3]), batcher.submit([4, 5, 6]))
    assert results == [[2, 4], [6], [8, 10, 12]]
    assert recorder.batches == [[1, 2, 3, 4, 5, 6]]
    await batcher.close()


async def test_submissions_arriving_during_a_commit_form_the_next_batch() -> None:
    recorder = Recorder(delay=0.05)
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder)
    first = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0.02)
    later = [asyncio.ensure_future(batcher.submit([n])) for n in (2, 3, 4)]
    assert await first == [2]
    assert [await f for f in later] == [[4], [6], [8]]
    assert recorder.batches == [[1], [2, 3, 4]]
    await batcher.close()


async def test_an_idle_batcher_commits_a_lone_submission_without_waiting_for_the_window() -> None:
    """A submission that finds nothing in flight is not held for the collection window (here a
    whole second long); submissions arriving during that commit are, to share the next one."""
    recorder = Recorder(delay=0.05)
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder, max_wait_seconds=1.0, max_delay_seconds=1.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0.02)
    later = [asyncio.ensure_future(batcher.submit([n])) for n in (2, 3)]
    assert await first == [2]
    assert loop.time() - started < 0.5, "the lone submission waited for the window"
    assert [await f for f in later] == [[4], [6]]
    assert loop.time() - started >= 1.0, "the busy batcher lingered for more"
    assert recorder.batches == [[1], [2, 3]]
    await batcher.close()


async def test_an_idle_batcher_that_sees_a_burst_collects_it_with_the_window() -> None:
    """More arriving while the idle batcher yields is a burst: it then waits out the window, so a
    submission 20 ms later (inside the 50 ms gap) still shares the commit."""
    recorder = Recorder()
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder, max_wait_seconds=0.05, max_delay_seconds=1.0)

    async def submit_after(item: int, delay: float) -> list[int]:
        await asyncio.sleep(delay)
        return await batcher.submit([item])

    results = await asyncio.gather(batcher.submit([1]), submit_after(2, 0), submit_after(3, 0.02))
    assert results == [[2], [4], [6]]
    assert recorder.batches == [[1, 2, 3]]
    await batcher.close()


async def test_max_items_splits_batches_without_splitting_a_submission() -> None:
    recorder = Recorder()
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder, max_items=4)
    await asyncio.gather(batcher.submit([1, 2, 3]), batcher.submit([4, 5]), batcher.submit([6]))
    assert recorder.batches == [[1, 2, 3], [4, 5, 6]]
    await batcher.close()


@pytest.mark.parametrize(
    ("failure", "error_type", "code"),
    [
        (
            OperationalError("SELECT 1", {}, Exception("connection refused")),
            StorageUnavailable,
            grpc.StatusCode.UNAVAILABLE,
        ),
        (IntegrityError("INSERT", {}, Exception("duplicate key")), StorageFailed, grpc.StatusCode.INTERNAL),
    ],
)
async def test_a_failed_transaction_fails_every_waiter_of_its_batch(
    failure: Exception, error_type: type[Exception], code: grpc.StatusCode
) -> None:
    recorder = Recorder(fail_with=failure)
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder)
    outcomes = await asyncio.gather(batcher.submit([1]), batcher.submit([2]), return_exceptions=True)
    assert all(isinstance(outcome, error_type) for outcome in outcomes)
    assert all(outcome.code == code for outcome in outcomes)  # type: ignore[union-attr]
    recorder.fail_with = None
    assert await batcher.submit([7]) == [14]
    await batcher.close()


async def test_close_commits_queued_work_then_refuses_new_submissions() -> None:
    recorder = Recorder(delay=0.01)
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder)
    pending = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0)
    await batcher.close()
    assert await pending == [2]
    with pytest.raises(StorageUnavailable):
        batcher.enqueue([2])


async def test_a_cancelled_waiter_does_not_disturb_the_others() -> None:
    recorder = Recorder(delay=0.02)
    batcher: IngestBatcher[int, int] = IngestBatcher(recorder)
    cancelled = asyncio.ensure_future(batcher.submit([1]))
    kept = asyncio.ensure_future(batcher.submit([2]))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    assert await kept == [4]
    assert recorder.batches == [[1, 2]]
    await batcher.close()


class Gate:
    """A process function whose batches stay open until released, recording starts and finishes."""

    def __init__(self) -> None:
        self.started: list[list[int]] = []
        self.finished: list[list[int]] = []
        self.release = asyncio.Event()

    async def __call__(self, items: list[int]) -> list[int]:
        self.started.append(list(items))
        await self.release.wait()
        self.finished.append(list(items))
        return [item * 2 for item in items]


async def test_pipelining_runs_a_second_batch_while_the_first_is_in_flight() -> None:
    gate = Gate()
    batcher: IngestBatcher[int, int] = IngestBatcher(
        gate, max_in_flight=2, conflict_keys=lambda item: (item % 10,), max_wait_seconds=0
    )
    first = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(batcher.submit([2, 3]))
    third = asyncio.ensure_future(batcher.submit([4]))
    await asyncio.sleep(0.01)
    assert gate.started == [[1], [2, 3, 4]]
    assert gate.finished == []
    gate.release.set()
    assert [await first, await second, await third] == [[2], [4, 6], [8]]
    await batcher.close()


async def test_pipelining_holds_a_conflicting_submission_and_everything_after_it() -> None:
    gate = Gate()
    batcher: IngestBatcher[int, int] = IngestBatcher(
        gate, max_in_flight=2, conflict_keys=lambda item: (item % 10,), max_wait_seconds=0
    )
    first = asyncio.ensure_future(batcher.submit([1]))
    await asyncio.sleep(0.01)
    conflicting = asyncio.ensure_future(batcher.submit([11]))
    later = asyncio.ensure_future(batcher.submit([2]))
    await asyncio.sleep(0.01)
    assert gate.started == [[1]]
    gate.release.set()
    assert [await first, await conflicting, await later] == [[2], [22], [4]]
    assert gate.finished == [[1], [11, 2]]
    await batcher.close()


def test_pipelining_needs_conflict_keys() -> None:
    with pytest.raises(ValueError, match="conflict_keys"):
        IngestBatcher(Recorder(), max_in_flight=2)
