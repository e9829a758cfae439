"""The local agent's decisions about leases, retries and outages, as small pure functions and values.

- The lease length comes from the scheduler's own answer (`lease_expires_at` minus the answer's
  time of the renewal, both database time), so a device whose clock is off still heartbeats in
  time; the agent heartbeats every lease/3 seconds.
- Locally the lease is tracked on the monotonic clock from the moment the renewing call was *sent*
  (the scheduler renewed it later than that, so the local deadline is never later than the real one).
- A call's gRPC status says what to do: transient codes are retried while the lease may still be
  valid, refusals (LEASE_LOST and the like) mean this agent no longer holds the task.
- :class:`Reachability` turns a stream of call results into one log line when the scheduler stops
  answering and one when it answers again, however many slots and retries see the outage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

import grpc
from boss.scheduler.v1 import scheduler_pb2

from boss_common.time import from_timestamp

DEFAULT_LEASE_S = 30.0
"""Assumed lease length (seconds) when an answer carries no usable lease_expires_at."""

MIN_HEARTBEAT_INTERVAL_S = 0.1
"""Heartbeats are never closer together than this (seconds), however short the lease."""

RETRY_FIRST_DELAY_S = 0.2
RETRY_MAX_DELAY_S = 5.0

TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)
"""Call failures worth retrying: the scheduler is unreachable, slow, busy, or stopping. A stopping
gRPC server answers CANCELLED to calls it received but had not handed to a handler yet (gRPC issue
41785): never handled, so safe to repeat. (This agent's own cancels raise CancelledError, not an
RPC error.)"""

LEASE_REFUSED_CODES = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
"""Answers to StartTask / HeartbeatTask / FinishTask saying this agent does not hold the task
(FAILED_PRECONDITION with reason LEASE_LOST above all): stop, do not finish."""


class CallVerdict(Enum):
    """What a failed task call means for the agent."""

    TRANSIENT = "transient"
    """Retry (with backoff) while the lease may still be valid."""
    LEASE_LOST = "lease_lost"
    """The scheduler refused: this agent no longer holds the task."""
    REJECTED = "rejected"
    """The request itself was refused (INVALID_ARGUMENT, UNIMPLEMENTED, ...): retrying cannot help."""


def verdict_of(code: grpc.StatusCode) -> CallVerdict:
    """How to treat a task call that failed with `code`."""
    if code in TRANSIENT_CODES:
        return CallVerdict.TRANSIENT
    if code in LEASE_REFUSED_CODES:
        return CallVerdict.LEASE_LOST
    return CallVerdict.REJECTED


def lease_seconds(task: scheduler_pb2.Task, *, now: datetime) -> float:
    """The length (seconds) of the lease an answer granted.

    `lease_expires_at` minus the latest of the answer's heartbeat_at, started_at, claimed_at and
    updated_at (database time, like the lease), or minus `now` (aware UTC, this device's clock) when
    none of those is before the expiry. DEFAULT_LEASE_S when the task carries no lease or the lease
    is already over by that reckoning.
    """
    if not task.HasField("lease_expires_at"):
        return DEFAULT_LEASE_S
    expires = from_timestamp(task.lease_expires_at)
    stamps = [
        from_timestamp(getattr(task, name))
        for name in ("heartbeat_at", "started_at", "claimed_at", "updated_at")
        if task.HasField(name)
    ]
    renewed = [stamp for stamp in stamps if stamp < expires]
    reference = max(renewed) if renewed else now
    seconds = (expires - reference).total_seconds()
    return seconds if seconds > 0 else DEFAULT_LEASE_S


def heartbeat_interval(lease_s: float) -> float:
    """Seconds between heartbeats for a lease of `lease_s` seconds: a third of it, at least
    MIN_HEARTBEAT_INTERVAL_S."""
    return max(MIN_HEARTBEAT_INTERVAL_S, lease_s / 3.0)


def retry_delay(failures: int) -> float:
    """Seconds to wait after the `failures`-th failed attempt in a row (1, 2, ...) of a task call:
    0.2 s doubling to at most 5 s."""
    return min(RETRY_FIRST_DELAY_S * 2 ** max(0, failures - 1), RETRY_MAX_DELAY_S)


@dataclass(frozen=True)
class LeaseClock:
    """The local estimate of a lease, on the monotonic clock.

    Attributes:
        lease_s: the lease's length as the scheduler granted it (seconds).
        deadline: monotonic second by which the lease has surely run out unless renewed (the
            renewing call's send time plus `lease_s`).
    """

    lease_s: float
    deadline: float

    @classmethod
    def granted(cls, sent_at: float, lease_s: float) -> LeaseClock:
        """A lease of `lease_s` seconds granted by a call sent at monotonic `sent_at`."""
        return cls(lease_s=lease_s, deadline=sent_at + lease_s)

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats for this lease (a third of it)."""
        return heartbeat_interval(self.lease_s)

    def may_be_valid(self, now: float) -> bool:
        """True while monotonic `now` is before the deadline."""
        return now < self.deadline

    def worth_retrying(self, now: float, delay: float) -> bool:
        """True when a call retried after `delay` seconds would still be sent before the deadline."""
        return now + delay < self.deadline


class Reachability:
    """Whether the scheduler answers, for logging an outage once (not once per failed call).

    Shared by every claim slot and task of one local agent. `failed()` is True exactly for the
    failure that starts an outage; `answered()` returns the outage's length (seconds) exactly for
    the first answer after one, None otherwise.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        """True during an outage."""
        return self._down_since is not None

    def failed(self) -> bool:
        """A call could not reach the scheduler. True when this starts an outage (log it now)."""
        if self._down_since is not None:
            return False
        self._down_since = self._clock()
        return True

    def answered(self) -> float | None:
        """The scheduler answered a call. The outage's length in seconds when this ends one."""
        if self._down_since is None:
            return None
        lasted = self._clock() - self._down_since
        self._down_since = None
        return lasted
