"""Deliver snapshots to context_budget over one long-lived `StreamThreadContext` call, until acked.

:class:`StreamReporter` owns a grpc.aio channel and one bidirectional stream. Snapshots handed to
:meth:`StreamReporter.submit` wait in an :class:`UnackedBuffer` until the server acks them; everything
due together goes out as one `StreamThreadContextRequest` of at most MAX_BATCH snapshots (Python gRPC
pays per message, research/engineering-anchors.md §3.1). Each batch carries a `batch_id`; the server's
response echoes it with one ack per snapshot, in order.

- An accepted ack (also a duplicate or superseded one) resolves the snapshot and becomes the thread's
  :meth:`StreamReporter.last_ack` (server level, `next_required_report_in_seconds`, master actions).
- A per-item rejection (`ack.error`: INVALID_ARGUMENT, PERMISSION_DENIED...) is logged with its
  field violations and the snapshot dropped: the same bytes would be rejected again, so it is never
  retried. An item error about the server itself (UNAVAILABLE: database down or server stopping;
  INTERNAL: its transaction failed) is not a rejection: the snapshot is re-sent after a backoff.
- When the stream fails (server restart, UNAVAILABLE, GOAWAY at max connection age...), every batch
  in flight goes back to the buffer and a new stream is opened after an exponential backoff with
  jitter (:func:`backoff_delay`: 0.2 s doubling to 10 s, ±20 %); everything unacked is re-sent. Stable
  snapshot ids make a re-sent snapshot that had in fact been committed a harmless duplicate.

Bounded memory (the rule, per thread, in :class:`UnackedBuffer`): only the newest unacked snapshot of
a thread is kept, plus *milestones* (snapshots whose worker level or compaction_count differs from the
thread's previous snapshot), at most MAX_MILESTONES_PER_THREAD of them (oldest dropped first). A newer
snapshot replaces a waiting older non-milestone one; an older non-milestone already in flight is
dropped instead of re-sent if its stream fails. Memory is therefore O(threads x (1 + milestones)).

Traces: when tracing is on in the process (boss_common/tracing.py), every snapshot taken into the
buffer gets a "report thread context" span (attributes thread_id, snapshot_id), and the snapshot
carries its W3C context (`trace_context`), per snapshot because one message carries many: the
spans context_budget and the services after it make for the report join or link to its trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import grpc
from boss.context_budget.v1 import context_budget_pb2, context_budget_pb2_grpc

from boss_common.bearer import bearer_metadata
from boss_common.channels import open_channel
from boss_common.status_details import field_violations_of
from boss_common.tracing import context_of, tracing_enabled
from boss_common.waiting import wait_until_set

log = logging.getLogger(__name__)

Snapshot = context_budget_pb2.ThreadContextSnapshot
Ack = context_budget_pb2.ThreadContextAck

MAX_BATCH = 500
"""Snapshots per stream message (the server takes up to 1,000)."""

MAX_IN_FLIGHT_BATCHES = 4
"""Batches written but not yet acked; more wait, so a slow server slows the worker, not its memory."""

MAX_MILESTONES_PER_THREAD = 16
"""Unacked milestone snapshots kept per thread (see the module docstring); older ones are dropped."""

MAX_POISON_STRIKES = 5
"""A snapshot in flight when the stream failed with a POISON_CODES status this many times is dropped,
so one snapshot that makes the server fail the whole stream cannot block the worker forever. While
any waiting snapshot has a strike, snapshots go out one per message, one message at a time, so the
culprit is isolated and innocent neighbours are acked instead of sharing its strikes."""

INITIAL_BACKOFF_S = 0.2
MAX_BACKOFF_S = 10.0
BACKOFF_JITTER = 0.2
"""Reconnect backoff: 0.2 s doubling to 10 s, each delay randomised by ±20 % (as gRPC's own
connection-backoff spec does) so that many workers do not reconnect in lockstep."""

HEALTHY_STREAM_S = 10.0
"""A stream that lived this long (or got any response) resets the backoff."""

POISON_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""Server-side stream failures that may be caused by what was in flight: each earns the in-flight
snapshots a poison strike. Every other ending (UNAVAILABLE at a restart, CANCELLED, GOAWAY at max
connection age, UNAUTHENTICATED...) says nothing about the snapshots and never does."""

RETRYABLE_ITEM_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE.value[0],
        grpc.StatusCode.ABORTED.value[0],
        grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
        grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
        grpc.StatusCode.INTERNAL.value[0],
    }
)
"""Per-snapshot ack errors that are about the server, not the snapshot: context_budget answers
UNAVAILABLE when its database is unreachable or it is shutting down, INTERNAL when the batch's
transaction failed. Such snapshots are re-sent after a backoff (INTERNAL earns a poison strike);
every other ack error (INVALID_ARGUMENT, PERMISSION_DENIED...) drops the snapshot."""

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Keepalive (gRPC doc/keepalive.md): ping every 20 s, give up on the connection when a ping is not
    # answered within 10 s, so a dead server or a silently dropped NAT mapping is noticed within ~30 s
    # even while the stream is idle between heartbeats. The Boss server permits pings every 5 s
    # without calls (services/shared/grpc_server.py), so 20 s never earns a "too_many_pings" GOAWAY.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Keep pinging an idle stream (the default stops after 2 pings without data).
    ("grpc.http2.max_pings_without_data", 0),
    # The channel's own reconnect backoff follows ours (defaults are 1 s growing to 120 s), so a
    # restarted server is reached within ~10 s rather than minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 10_000),
    # No gRPC-level retries: a stream cannot be retried once the server answered; we re-send ourselves.
    ("grpc.enable_retries", 0),
)


def backoff_delay(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before reconnect attempt `attempt` (1, 2, 3...).

    `min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2 ** (attempt - 1))` times a jitter factor uniformly in
    [1 - BACKOFF_JITTER, 1 + BACKOFF_JITTER] (`rand()` returns [0, 1)): 0.2, 0.4, 0.8 ... 10 s ±20 %.
    """
    base = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2 ** max(0, attempt - 1))
    return base * (1.0 - BACKOFF_JITTER + 2.0 * BACKOFF_JITTER * rand())


@dataclass
class _Entry:
    """One unacked snapshot in the buffer."""

    snapshot: Snapshot
    order: int
    milestone: bool
    in_flight: bool = False
    superseded: bool = False
    strikes: int = 0


@dataclass
class BufferCounters:
    """What the buffer did so far (counts of snapshots)."""

    superseded: int = 0
    milestones_dropped: int = 0
    poisoned: int = 0
    resent: int = 0


class UnackedBuffer:
    """Unacked snapshots, bounded per thread (rule in the module docstring). Pure, no I/O, no asyncio.

    Snapshots leave in submission order; a snapshot handed out by :meth:`take` is *in flight* until
    :meth:`resolve` (acked or rejected) or :meth:`release` (its stream failed).
    """

    def __init__(self, max_milestones_per_thread: int = MAX_MILESTONES_PER_THREAD) -> None:
        self._max_milestones = max_milestones_per_thread
        self._entries: dict[str, _Entry] = {}
        self._by_thread: dict[str, list[str]] = {}
        self._last_marker: dict[str, tuple[int, int]] = {}
        self._order = itertools.count()
        self.counters = BufferCounters()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, snapshot_id: object) -> bool:
        return snapshot_id in self._entries

    @property
    def pending_count(self) -> int:
        """Snapshots waiting to be sent (not in flight)."""
        return sum(1 for entry in self._entries.values() if not entry.in_flight)

    def add(self, snapshot: Snapshot) -> bool:
        """Queue `snapshot` (it must have a snapshot_id). Returns False when it is already unacked.

        Applies the bounded-memory rule to its thread: waiting older non-milestones are dropped,
        in-flight older non-milestones are marked superseded, and milestones beyond the cap are
        dropped oldest first.
        """
        snapshot_id = snapshot.snapshot_id
        if not snapshot_id:
            raise ValueError("snapshot_id is required")
        if snapshot_id in self._entries:
            return False
        thread_id = snapshot.thread_id
        marker = (snapshot.context_budget_level, snapshot.compaction_count)
        previous = self._last_marker.get(thread_id)
        milestone = previous is not None and previous != marker
        self._last_marker[thread_id] = marker
        for older_id in list(self._by_thread.get(thread_id, ())):
            older = self._entries[older_id]
            if older.milestone:
                continue
            if older.in_flight:
                older.superseded = True
            else:
                self._remove(older_id)
                self.counters.superseded += 1
        self._entries[snapshot_id] = _Entry(snapshot, next(self._order), milestone)
        self._by_thread.setdefault(thread_id, []).append(snapshot_id)
        self._cap_milestones(thread_id)
        return True

    @property
    def suspect(self) -> bool:
        """True while a waiting snapshot carries a poison strike (send one at a time)."""
        return any(entry.strikes and not entry.in_flight for entry in self._entries.values())

    def take(self, max_count: int) -> list[Snapshot]:
        """Up to `max_count` waiting snapshots, oldest first, now marked in flight."""
        waiting = sorted(
            (entry for entry in self._entries.values() if not entry.in_flight), key=lambda entry: entry.order
        )[:max_count]
        for entry in waiting:
            entry.in_flight = True
        return [entry.snapshot for entry in waiting]

    def resolve(self, snapshot_id: str) -> Snapshot | None:
        """Forget an acked or rejected snapshot; returns it (None when it was not in the buffer)."""
        entry = self._entries.get(snapshot_id)
        if entry is None:
            return None
        self._remove(snapshot_id)
        return entry.snapshot

    def release(self, snapshot_ids: Iterable[str], *, poison_strike: bool) -> int:
        """Put in-flight snapshots whose stream failed back in line to be re-sent.

        Superseded ones are dropped; with `poison_strike` (a non-transient stream failure) each one
        earns a strike and is dropped at MAX_POISON_STRIKES. Returns how many will be re-sent.
        """
        requeued = 0
        for snapshot_id in snapshot_ids:
            entry = self._entries.get(snapshot_id)
            if entry is None or not entry.in_flight:
                continue
            if entry.superseded:
                self._remove(snapshot_id)
                self.counters.superseded += 1
                continue
            if poison_strike:
                entry.strikes += 1
                if entry.strikes >= MAX_POISON_STRIKES:
                    log.error(
                        "dropping snapshot %s of thread %s: the stream failed %d times with it in flight",
                        snapshot_id,
                        entry.snapshot.thread_id,
                        entry.strikes,
                    )
                    self._remove(snapshot_id)
                    self.counters.poisoned += 1
                    continue
            entry.in_flight = False
            requeued += 1
        self.counters.resent += requeued
        return requeued

    def _cap_milestones(self, thread_id: str) -> None:
        """Drop the oldest waiting milestones of a thread beyond the cap."""
        milestones = [sid for sid in self._by_thread[thread_id] if self._entries[sid].milestone]
        excess = len(milestones) - self._max_milestones
        for snapshot_id in milestones:
            if excess <= 0:
                break
            if self._entries[snapshot_id].in_flight:
                continue
            log.warning("thread %s: too many unacked milestones; dropping %s", thread_id, snapshot_id)
            self._remove(snapshot_id)
            self.counters.milestones_dropped += 1
            excess -= 1

    def _remove(self, snapshot_id: str) -> None:
        entry = self._entries.pop(snapshot_id)
        ids = self._by_thread.get(entry.snapshot.thread_id)
        if ids is not None:
            ids.remove(snapshot_id)
            if not ids:
                del self._by_thread[entry.snapshot.thread_id]


@dataclass
class ReporterStats:
    """Counts of what the reporter did (snapshots unless named otherwise)."""

    submitted: int = 0
    acked: int = 0
    duplicates: int = 0
    rejected: int = 0
    batches_sent: int = 0
    streams_opened: int = 0
    stream_failures: int = 0
    rejections: list[str] = field(default_factory=list)


class StreamReporter:
    """Holds one `StreamThreadContext` call to context_budget and delivers every snapshot until acked.

    Use: `start()` inside a running event loop, `submit(...)` from the same loop, `await flush(t)`
    to wait for acks, `await close()` at the end. The channel and call live on the loop that called
    `start()` (grpc.aio objects are not thread-safe).
    """

    def __init__(
        self,
        target: str,
        token: str | Callable[[], str],
        *,
        max_batch: int = MAX_BATCH,
        max_in_flight_batches: int = MAX_IN_FLIGHT_BATCHES,
        channel_options: Sequence[tuple[str, Any]] = CHANNEL_OPTIONS,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """Prepare a reporter for the gRPC `target` (host:port or a gRPC target URI).

        Args:
            target: where context_budget listens.
            token: a worker bearer token (sent as `authorization: Bearer <token>` metadata), or a
                function returning one, called each time a stream opens (so a renewed token is used
                from the next stream on).
            max_batch: snapshots per stream message (1..1000).
            max_in_flight_batches: batches sent but not acked before sending pauses.
            channel_options: gRPC channel arguments (see CHANNEL_OPTIONS).
            rand: random source for the backoff jitter (injectable for tests).
        """
        if not 1 <= max_batch <= 1000:
            raise ValueError(f"max_batch must be in 1..1000, got {max_batch}")
        self._target = target
        self._token = token if callable(token) else (lambda: token)
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight_batches
        self._channel_options = tuple(channel_options)
        self._rand = rand
        self._buffer = UnackedBuffer()
        self._in_flight: dict[int, list[str]] = {}
        self._batch_ids = itertools.count(1)
        self._last_acks: dict[str, Ack] = {}
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._connected = asyncio.Event()
        # When the stream stopped answering (monotonic seconds), None while it answers.
        self._unreachable_since: float | None = None
        self._item_retries = 0
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.stats = ReporterStats()

    @property
    def target(self) -> str:
        """The gRPC target snapshots go to."""
        return self._target

    @property
    def unacked_count(self) -> int:
        """Snapshots submitted and not yet acked, rejected or dropped."""
        return len(self._buffer)

    @property
    def rejected_count(self) -> int:
        """Snapshots the server rejected so far (each logged and dropped)."""
        return self.stats.rejected

    @property
    def buffer_counters(self) -> BufferCounters:
        """What the bounded buffer dropped or re-sent."""
        return self._buffer.counters

    @property
    def connected(self) -> bool:
        """True while a stream is open and has answered at least once since it opened."""
        return self._connected.is_set()

    def last_ack(self, thread_id: str) -> Ack | None:
        """The latest accepted ack of a thread (server level, cadence, master actions), or None."""
        return self._last_acks.get(thread_id)

    def start(self) -> None:
        """Open the channel and start the stream task (idempotent). Needs a running event loop."""
        if self._task is not None:
            return
        self._channel = open_channel(self._target, self._channel_options, for_worker=True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-reporter")

    def submit(self, snapshots: Iterable[Snapshot]) -> int:
        """Queue snapshots for delivery; returns how many were new (already unacked ones are skipped).
        Each new one gets its report span when tracing is on (module docstring)."""
        added = 0
        tracing = tracing_enabled()
        for snapshot in snapshots:
            if self._buffer.add(snapshot):
                added += 1
                if tracing:
                    trace_report(snapshot)
        if added:
            self.stats.submitted += added
            self._drained.clear()
            self._wake.set()
        return added

    async def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every submitted snapshot is acked, rejected or dropped.

        Returns True when nothing is left unacked.
        """
        self._check_drained()
        return await wait_until_set(self._drained, timeout)

    async def close(self) -> None:
        """Stop the stream task and close the channel (unacked snapshots are abandoned)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _run(self) -> None:
        """Open streams forever: on failure re-queue what was in flight, back off, reconnect."""
        assert self._channel is not None
        stub = context_budget_pb2_grpc.ContextBudgetServiceStub(self._channel)
        failures = 0
        while not self._closing:
            opened_at = monotonic()
            answered = asyncio.Event()
            code, details = await self._stream_once(stub, answered)
            requeued = self._release_in_flight(poison_strike=code in POISON_CODES)
            if self._closing:
                return
            self.stats.stream_failures += 1
            healthy = answered.is_set() or monotonic() - opened_at >= HEALTHY_STREAM_S
            failures = 1 if healthy else failures + 1
            if not healthy and self._unreachable_since is None:
                self._unreachable_since = opened_at  # said again when a stream answers
            delay = backoff_delay(failures, self._rand)
            self._log_failure(failures, code, details, delay, requeued, healthy=healthy)
            await asyncio.sleep(delay)

    async def _stream_once(
        self, stub: context_budget_pb2_grpc.ContextBudgetServiceStub, answered: asyncio.Event
    ) -> tuple[grpc.StatusCode, str]:
        """Run one stream until it ends; returns its final status code and details."""
        call = stub.StreamThreadContext(metadata=bearer_metadata(self._token()))
        self.stats.streams_opened += 1
        reader = asyncio.create_task(self._read_acks(call, answered), name="stream-reporter-read")
        writer = asyncio.create_task(self._write_batches(call), name="stream-reporter-write")
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                # The writer failed first: the call's final status arrives through the reader.
                await asyncio.wait({reader}, timeout=1.0)
        finally:
            writer.cancel()
            reader.cancel()
            call.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._connected.clear()
        return self._status_of(reader, writer)

    @staticmethod
    def _status_of(reader: asyncio.Task[None], writer: asyncio.Task[None]) -> tuple[grpc.StatusCode, str]:
        """Final status of a stream from its reader (or, failing that, its writer) task."""
        for task in (reader, writer):
            if task.cancelled():
                continue
            error = task.exception()
            if isinstance(error, grpc.aio.AioRpcError):
                return error.code(), error.details() or ""
            if error is not None:
                log.error("stream task failed", exc_info=error)
                return grpc.StatusCode.CANCELLED, f"{type(error).__name__}: {error}"
            if task is reader:
                return grpc.StatusCode.OK, "stream ended by the server"
        return grpc.StatusCode.CANCELLED, "stream abandoned"

    async def _read_acks(self, call: Any, answered: asyncio.Event) -> None:
        """Resolve batches as their responses arrive; returns when the server ends the stream."""
        async for response in call:
            if not answered.is_set():
                answered.set()
                self._connected.set()
                if self._unreachable_since is not None:
                    log.info(
                        "context_budget at %s answers again (after %.1f s); reporting resumes",
                        self._target,
                        monotonic() - self._unreachable_since,
                    )
                    self._unreachable_since = None
            self._on_response(response)

    async def _write_batches(self, call: Any) -> None:
        """Send waiting snapshots in batches while fewer than MAX_IN_FLIGHT_BATCHES are unacked."""
        while True:
            while len(self._in_flight) < self._max_in_flight:
                careful = self._buffer.suspect
                if careful and self._in_flight:
                    break
                snapshots = self._buffer.take(1 if careful else self._max_batch)
                if not snapshots:
                    break
                batch_id = next(self._batch_ids)
                self._in_flight[batch_id] = [snapshot.snapshot_id for snapshot in snapshots]
                await call.write(
                    context_budget_pb2.StreamThreadContextRequest(batch_id=batch_id, snapshots=snapshots)
                )
                self.stats.batches_sent += 1
            self._wake.clear()
            await self._wake.wait()

    def _on_response(self, response: context_budget_pb2.StreamThreadContextResponse) -> None:
        """Match a response to its batch and apply each ack in order."""
        sent = self._in_flight.pop(response.batch_id, None)
        if sent is None:
            log.debug("ignoring a response for unknown batch %d", response.batch_id)
            return
        if len(response.acks) != len(sent):
            log.warning(
                "batch %d: %d acks for %d snapshots; the unanswered ones will be re-sent",
                response.batch_id,
                len(response.acks),
                len(sent),
            )
        retry: list[str] = []
        strike: list[str] = []
        first_error = None
        for snapshot_id, ack in zip(sent, response.acks, strict=False):
            if ack.snapshot_id and ack.snapshot_id != snapshot_id:
                log.warning(
                    "batch %d: ack for %s where %s was sent", response.batch_id, ack.snapshot_id, snapshot_id
                )
            if not ack.accepted and ack.error.code in RETRYABLE_ITEM_CODES:
                internal = ack.error.code == grpc.StatusCode.INTERNAL.value[0]
                (strike if internal else retry).append(snapshot_id)
                first_error = first_error or ack.error
                continue
            self._on_ack(snapshot_id, ack)
        if first_error is not None:
            self._park(retry, strike, first_error)
        else:
            self._item_retries = 0
        self._buffer.release(sent[len(response.acks) :], poison_strike=False)
        self._check_drained()
        self._wake.set()

    def _on_ack(self, snapshot_id: str, ack: Ack) -> None:
        """Resolve one snapshot: remember an accepted ack, log and drop a rejected one."""
        snapshot = self._buffer.resolve(snapshot_id)
        if ack.accepted and not ack.HasField("error"):
            self.stats.acked += 1
            if ack.duplicate:
                self.stats.duplicates += 1
            thread_id = ack.thread_id or (snapshot.thread_id if snapshot is not None else "")
            if thread_id:
                self._last_acks[thread_id] = ack
            return
        self.stats.rejected += 1
        violations = field_violations_of(ack.error)
        detail = "; ".join(f"{v.field}: {v.description}" for v in violations) or ack.error.message
        thread_id = snapshot.thread_id if snapshot is not None else ack.thread_id
        if len(self.stats.rejections) < 100:
            self.stats.rejections.append(f"{snapshot_id}: {detail}")
        log.warning(
            "snapshot %s of thread %s rejected (%s): %s; dropped",
            snapshot_id,
            thread_id,
            grpc_code_name(ack.error.code),
            detail,
        )

    def _park(self, retry: list[str], strike: list[str], example: Any) -> None:
        """Hold snapshots the server could not store for a backoff delay, then re-send them.

        They stay in flight meanwhile (a newer snapshot of their thread still supersedes them).
        """
        self._item_retries += 1
        delay = backoff_delay(self._item_retries, self._rand)
        log.warning(
            "context_budget could not store %d snapshot(s) (%s); re-sending in %.1f s",
            len(retry) + len(strike),
            example.message if example is not None else "no detail",
            delay,
        )
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._unpark, retry, strike)

    def _unpark(self, retry: list[str], strike: list[str]) -> None:
        """Return parked snapshots to the line (after :meth:`_park`'s delay)."""
        self._buffer.release(retry, poison_strike=False)
        self._buffer.release(strike, poison_strike=True)
        self._check_drained()
        self._wake.set()

    def _release_in_flight(self, *, poison_strike: bool) -> int:
        """Return every in-flight batch to the buffer after a stream failure."""
        requeued = 0
        for snapshot_ids in self._in_flight.values():
            requeued += self._buffer.release(snapshot_ids, poison_strike=poison_strike)
        self._in_flight.clear()
        self._check_drained()
        return requeued

    def _check_drained(self) -> None:
        if len(self._buffer) == 0:
            self._drained.set()
        else:
            self._drained.clear()

    def _log_failure(
        self,
        failures: int,
        code: grpc.StatusCode,
        details: str,
        delay: float,
        requeued: int,
        *,
        healthy: bool,
    ) -> None:
        """One line per failed attempt, never a traceback: INFO when a healthy stream ended (servers
        end streams normally, e.g. at their max connection age), ERROR when the token is refused,
        WARNING when the server cannot be reached."""
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            log.error(
                "context_budget at %s refuses this worker's credential (%s: %s): a revoked device "
                "enrolls again with a new pairing code (boss-worker enroll CODE) and restarts; a "
                "--token / BOSS_WORKER_TOKEN must be valid; retrying in %.1f s",
                self._target,
                code.name,
                details,
                delay,
            )
        elif healthy or code is grpc.StatusCode.OK:
            log.info(
                "stream to context_budget at %s ended (%s: %s); reconnecting in %.1f s%s",
                self._target,
                code.name,
                details,
                delay,
                f"; {requeued} snapshot(s) will be re-sent" if requeued else "",
            )
        else:
            log.warning(
                "context_budget at %s unreachable (%s: %s); retrying in %.1f s (attempt %d, %d unacked)",
                self._target,
                code.name,
                details,
                delay,
                failures,
                len(self._buffer),
            )


def trace_report(snapshot: Snapshot) -> None:
    """Records the "report thread context" span of `snapshot` and writes its W3C context into the
    snapshot's `trace_context` (replacing the one of an earlier report of the same snapshot)."""
    from opentelemetry import trace

    span = trace.get_tracer("boss.worker").start_span(
        "report thread context",
        attributes={"thread_id": snapshot.thread_id, "snapshot_id": snapshot.snapshot_id},
    )
    snapshot.trace_context.clear()
    context_of(span, snapshot.trace_context)
    span.end()


def grpc_code_name(code: int) -> str:
    """The name of a numeric gRPC status code, e.g. 3 -> "INVALID_ARGUMENT"."""
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status.name
    return str(code)
