"""Revoked devices in one process: a revocation tells the calls watching the device at once, ends a
guarded stream after what it had in hand, and cancels a guarded call; callers without a device are
never affected."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest

from services.shared.auth import Principal
from services.shared.devices import DeviceRevocations
from services.shared.errors import Unauthenticated

DEVICE = Principal(subject="worker:w", kind="worker", owner_id="alice", device_id="dev-1")
AUTOMATION = Principal(subject="worker:w", kind="worker", owner_id="alice")


async def endless(first: list[str], ticks: asyncio.Queue[str]) -> AsyncIterator[str]:
    """Yields `first`, then whatever `ticks` brings, for ever."""
    for item in first:
        yield item
    while True:
        yield await ticks.get()


async def test_a_guarded_stream_ends_with_device_revoked_when_its_device_is_revoked() -> None:
    revocations = DeviceRevocations()
    ticks: asyncio.Queue[str] = asyncio.Queue()
    stream = revocations.guard_stream(DEVICE, endless(["a", "b"], ticks))
    assert [await anext(stream), await anext(stream)] == ["a", "b"]
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    revocations.revoke(["dev-1"])
    with pytest.raises(Unauthenticated) as ended:
        await waiting
    assert ended.value.reason == "DEVICE_REVOKED"
    assert "dev-1" in revocations and len(revocations) == 1


async def test_a_stream_whose_call_ends_while_it_waits_leaves_no_stray_task() -> None:
    revocations = DeviceRevocations()
    stray: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: stray.append(context))
    stream = revocations.guard_stream(DEVICE, endless(["a"], asyncio.Queue()))
    assert await anext(stream) == "a"
    # The call ends (the worker went away, or the server stops) while the next item is awaited.
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()  # an unretrieved task's exception is reported when the task is collected
    await asyncio.sleep(0)
    assert stray == []


async def test_a_stream_of_a_device_revoked_before_it_opened_ends_at_once() -> None:
    revocations = DeviceRevocations(["dev-1"])
    stream = revocations.guard_stream(DEVICE, endless(["a"], asyncio.Queue()))
    with pytest.raises(Unauthenticated):
        await anext(stream)


async def test_a_guarded_call_is_cancelled_by_its_devices_revocation() -> None:
    revocations = DeviceRevocations()
    cancelled = asyncio.Event()

    async def long_poll() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    guarded = asyncio.ensure_future(revocations.guard(DEVICE, long_poll()))
    await asyncio.sleep(0)
    revocations.revoke(["other-device"])
    await asyncio.sleep(0)
    assert not guarded.done()
    revocations.revoke(["dev-1"])
    with pytest.raises(Unauthenticated):
        await guarded
    assert cancelled.is_set()


async def test_callers_without_a_device_and_finished_calls_are_untouched() -> None:
    revocations = DeviceRevocations(["dev-1"])

    async def answer() -> str:
        return "done"

    assert await revocations.guard(AUTOMATION, answer()) == "done"
    assert await DeviceRevocations().guard(DEVICE, answer()) == "done"
    items = [item async for item in revocations.guard_stream(AUTOMATION, endless_limited(["x", "y"]))]
    assert items == ["x", "y"]
    with revocations.watch("") as never:
        revocations.revoke([""])
        assert not never.is_set()


async def endless_limited(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item
