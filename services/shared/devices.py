"""Devices across services: revoked devices (the tokens every service refuses at once, and the open
calls they end) and the event that moves a thread to another device.

A thread belongs to one device (owner, node, worker): the first to report or register it. Its owner
may move it to another of their devices (conversations' `MoveThread`), which publishes
`thread.moved` {owner_id, thread_id, from_node_id, from_worker_id, node_id, worker_id}; context_budget
and the scheduler follow it, so only the new device may report the thread or receive its commands.

A device enrolled by pairing code holds a worker token naming its `device_id` (services/shared/auth.py).
When its owner revokes it, the conversations service (which keeps the device registry) stores the
revocation and publishes `device.revoked` {owner_id, device_id, node_id, worker_id, revoked_at}.
Every service that takes worker tokens keeps its own copy:

- conversations adds the device to its `DeviceRevocations` right after the revoking transaction
  commits;
- context_budget and the scheduler follow conversations' stream (an `EventConsumer`) and store
  each revocation in their own `revoked_devices` table in the consumer's transaction, then add it
  to their `DeviceRevocations` after the commit (`RevocationStore`); at start they load the table.

`TokenAuthority.verify` refuses a revoked device's token (UNAUTHENTICATED, reason DEVICE_REVOKED),
so its next call fails; calls already open (the ingest stream, the command stream, a claim's long
poll) are ended by `guard_stream` / `guard` with the same error as soon as the revocation arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from boss.common.v1 import events_pb2
from sqlalchemy import Column, MetaData, String, Table, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.channels import open_channel
from services.shared.errors import Unauthenticated
from services.shared.sql_types import UtcDateTime
from services.shared.time import utc_now

if TYPE_CHECKING:
    from services.shared.auth import Principal
    from services.shared.db import Database
    from services.shared.event_stream import StreamOpener
    from services.shared.outbox import StoredEvent

DEVICE_REVOKED_EVENT = "device.revoked"
THREAD_MOVED_EVENT = "thread.moved"
DEVICE_EVENT_TYPES = (THREAD_MOVED_EVENT, DEVICE_REVOKED_EVENT)
DEVICE_EVENTS_STREAM = "conversations_devices"
"""The cursor name (in `event_cursors`) of a service's stream of conversations' device events."""

T = TypeVar("T")


def revoked_error(device_id: str) -> Unauthenticated:
    """The error a revoked device's calls end with (reason DEVICE_REVOKED)."""
    return Unauthenticated(
        f"device {device_id!r} was revoked by its owner: enroll it again with a new pairing code",
        reason="DEVICE_REVOKED",
    )


class DeviceRevocations:
    """The revoked device ids of one process, and the open calls waiting to hear of a revocation.

    Not thread-safe: used from the event loop only."""

    def __init__(self, revoked: Iterable[str] = ()) -> None:
        self._revoked: set[str] = set(revoked)
        self._watchers: dict[str, set[asyncio.Event]] = {}

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._revoked

    def __len__(self) -> int:
        return len(self._revoked)

    def revoke(self, device_ids: Iterable[str]) -> None:
        """Adds `device_ids`; every call watching one of them is told at once."""
        for device_id in device_ids:
            self._revoked.add(device_id)
            for event in self._watchers.pop(device_id, set()):
                event.set()

    @contextlib.contextmanager
    def watch(self, device_id: str) -> Iterator[asyncio.Event]:
        """An event set when `device_id` is revoked (already set when it is); "" is never revoked."""
        event = asyncio.Event()
        if device_id in self._revoked:
            event.set()
        if not device_id or event.is_set():
            yield event
            return
        watchers = self._watchers.setdefault(device_id, set())
        watchers.add(event)
        try:
            yield event
        finally:
            watchers.discard(event)
            if not watchers:
                self._watchers.pop(device_id, None)

    async def guard(self, principal: Principal, call: Awaitable[T]) -> T:
        """Awaits `call`, cancelling it when the caller's device is revoked meanwhile. Raises
        Unauthenticated (DEVICE_REVOKED) then; a caller without a device just awaits `call`."""
        if not principal.device_id:
            return await call
        with self.watch(principal.device_id) as revoked:
            if revoked.is_set():
                if asyncio.iscoroutine(call):
                    call.close()
                raise revoked_error(principal.device_id)
            work = asyncio.ensure_future(call)
            waiter = asyncio.ensure_future(revoked.wait())
            try:
                await asyncio.wait((work, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if not work.done():
                    work.cancel()
            if work.done() and not work.cancelled():
                return work.result()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            raise revoked_error(principal.device_id)

    async def guard_stream(self, principal: Principal, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """Yields what `items` yields until the caller's device is revoked, then raises
        Unauthenticated (DEVICE_REVOKED); `items` is closed either way."""
        if not principal.device_id:
            async for item in items:
                yield item
            return
        with self.watch(principal.device_id) as revoked:
            waiter = asyncio.ensure_future(revoked.wait())
            step: asyncio.Future[T] | None = None
            try:
                while True:
                    if revoked.is_set():
                        raise revoked_error(principal.device_id)
                    step = asyncio.ensure_future(anext(items))
                    await asyncio.wait((step, waiter), return_when=asyncio.FIRST_COMPLETED)
                    if not step.done():
                        step.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                            await step
                        raise revoked_error(principal.device_id)
                    try:
                        item = step.result()
                    except StopAsyncIteration:
                        return
                    yield item
            finally:
                waiter.cancel()
                if step is not None and not step.done():
                    # The call ended (the client went away, the server stops) while the next item was
                    # awaited: that wait is ours to end and collect, or its end (StopAsyncIteration
                    # once `items` is closed) would be logged as an exception never retrieved.
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                        await step
                closer = getattr(items, "aclose", None)
                if closer is not None:
                    with contextlib.suppress(Exception):
                        await closer()


def device_events_opener(address: str, token: str, consumer: str = "") -> StreamOpener:
    """An EventConsumer's StreamOpener of the conversations service's `thread.moved` and
    `device.revoked` events (every owner's: `token` is a service token), one channel per
    connection. `consumer` names the durable consumer (e.g. "scheduler/devices") so that retention
    keeps what it has not committed (services/shared/retention.py)."""
    from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc

    async def open_stream(after: int) -> AsyncIterator[Sequence[events_pb2.EventEnvelope]]:
        async with open_channel(address) as channel:
            stub = conversations_pb2_grpc.ConversationsServiceStub(channel)
            call = stub.WatchEvents(
                conversations_pb2.WatchEventsRequest(
                    after_sequence=after, types=list(DEVICE_EVENT_TYPES), consumer=consumer
                ),
                metadata=(("authorization", f"Bearer {token}"),),
            )
            async for response in call:
                yield response.events

    return open_stream


def define_revoked_devices_table(metadata: MetaData) -> Table:
    """`revoked_devices` (device_id, owner_id, revoked_at UTC) on `metadata`: a service's own copy of
    the conversations service's revocations."""
    return Table(
        "revoked_devices",
        metadata,
        Column("device_id", String(64), primary_key=True),
        Column("owner_id", String(200), nullable=False),
        Column("revoked_at", UtcDateTime, nullable=False),
    )


class RevocationStore:
    """A service's `revoked_devices` table and its in-memory `DeviceRevocations`.

    Use: `await store.load(database)` before serving; `await store.apply(connection, batch)` inside
    the consumer's transaction of conversations' events (returns the device ids it stored), then
    `store.committed()` once that transaction committed."""

    def __init__(self, table: Table, revocations: DeviceRevocations, dialect: str) -> None:
        self.table = table
        self.revocations = revocations
        self._insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
        self._pending: list[str] = []

    async def load(self, database: Database) -> int:
        """Loads every stored revocation into memory; returns how many."""
        async with database.read() as connection:
            device_ids = list((await connection.execute(select(self.table.c.device_id))).scalars())
        self.revocations.revoke(device_ids)
        return len(device_ids)

    async def apply(self, connection: AsyncConnection, batch: Sequence[StoredEvent]) -> list[str]:
        """Stores the `device.revoked` events of `batch` (idempotent: a repeat changes nothing);
        returns their device ids. Events without a device id are skipped. Call it once per batch:
        what `committed` makes effective is what the last call stored."""
        self._pending = []
        rows: list[dict[str, Any]] = []
        device_ids: list[str] = []
        for event in batch:
            if event.type != DEVICE_REVOKED_EVENT:
                continue
            device_id = str(event.payload.get("device_id") or "")
            if not device_id:
                continue
            device_ids.append(device_id)
            rows.append(
                {
                    "device_id": device_id,
                    "owner_id": str(event.payload.get("owner_id") or ""),
                    "revoked_at": event.occurred_at or utc_now(),
                }
            )
        if not rows:
            return []
        await connection.execute(self._insert.on_conflict_do_nothing(index_elements=["device_id"]), rows)
        self._pending = device_ids
        return device_ids

    def committed(self) -> None:
        """Makes the revocations stored by the committed batch effective in this process."""
        pending, self._pending = self._pending, []
        self.revocations.revoke(pending)
