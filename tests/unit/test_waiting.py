"""`wait_until_set`: a deadline on an event's wait that never loses the caller's cancellation."""

from __future__ import annotations

import asyncio

import pytest

from boss_common.waiting import wait_until_set


async def test_a_cancellation_arriving_as_the_event_is_set_still_ends_the_waiter() -> None:
    # The race that Python 3.11's wait_for loses: the event is set and the waiting task cancelled
    # in the same turn of the loop. A polling loop waiting this way must still stop.
    event = asyncio.Event()
    polls = 0

    async def poll_until_cancelled() -> None:
        nonlocal polls
        while True:
            polls += 1
            await wait_until_set(event, 10.0)
            event.clear()

    task = asyncio.ensure_future(poll_until_cancelled())
    await asyncio.sleep(0)  # the task is now waiting on the event
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2.0)
    assert polls == 1


async def test_returns_true_once_set_and_false_after_the_deadline() -> None:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, event.set)
    assert await wait_until_set(event, 5.0) is True
    assert await wait_until_set(asyncio.Event(), 0.01) is False


async def test_no_wait_at_a_deadline_of_zero_or_less_and_no_limit_at_none() -> None:
    assert await wait_until_set(asyncio.Event(), 0) is False
    assert await wait_until_set(asyncio.Event(), -1.0) is False
    already = asyncio.Event()
    already.set()
    assert await wait_until_set(already, 0) is True
    event = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_until_set(event, None) is True
