"""The scheduler's plain data: budget levels, a thread's scheduling view, reports, settings.

Percentages are 0-100, durations in seconds, datetimes aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum


class Level(StrEnum):
    """A thread's context budget level (CB-7), as context_budget classified it."""

    SAFE = "safe"
    WATCH = "watch"
    URGENT = "urgent"
    CRITICAL = "critical"

    @property
    def severity(self) -> int:
        """1 (safe) to 4 (critical): higher needs the master's attention first."""
        return _SEVERITY[self]


_SEVERITY = {Level.SAFE: 1, Level.WATCH: 2, Level.URGENT: 3, Level.CRITICAL: 4}


def parse_level(value: object) -> Level | None:
    """The Level named by `value` ("safe" | "watch" | "urgent" | "critical"), None for anything else."""
    try:
        return Level(str(value))
    except ValueError:
        return None


class PackageStatus(StrEnum):
    """Lifecycle of a handoff package (CB-6)."""

    DRAFT = "draft"
    READY = "ready"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class CommandType(StrEnum):
    """Commands sent to a worker over its command stream."""

    PREPARE_HANDOFF = "prepare_handoff"
    AVOID_LARGE_CONTEXT_APPEND = "avoid_large_context_append"
    FINISH_CURRENT_SUBTASK = "finish_current_subtask"
    FREEZE_CONTEXT_GROWTH = "freeze_context_growth"


@dataclass(frozen=True)
class SchedulerSettings:
    """Tunable rules of the scheduler.

    Attributes:
        compaction_horizon: a thread whose `compaction_expected_at` is at most this far after its
            report's `captured_at` is at risk (CB-19), whatever its level. Default 10 minutes.
        handoff_ttl: a draft or ready package expires this long after it was created or last made
            ready, unless consumed. Default 24 hours.
        idle_after: a thread whose context has not grown for this long counts as idle (CB-17
            "idle threads" for new work). Default 2 minutes.
        redeliver_after: an unacknowledged command is re-sent on a live stream after this long.
        strategy_interval: a project whose threads changed gets its strategy summary recomputed
            (and published when its text changed) at most this long after the previous
            recomputation. Default 1 second.
        strategy_urgent_interval: the same when a level, a must-finish flag, work facts or a
            thread's project changed: recomputed as soon as the previous recomputation is this old.
            Default 0.1 seconds.
    """

    compaction_horizon: timedelta = timedelta(minutes=10)
    handoff_ttl: timedelta = timedelta(hours=24)
    idle_after: timedelta = timedelta(minutes=2)
    redeliver_after: timedelta = timedelta(seconds=30)
    strategy_interval: timedelta = timedelta(seconds=1)
    strategy_urgent_interval: timedelta = timedelta(seconds=0.1)


@dataclass(frozen=True)
class BudgetReport:
    """One applied budget update of a thread, from context_budget's `thread.context.updated` event.

    Attributes:
        level: the server's classification; None when the event names no known level.
        remaining_pct: `context_budget_remaining_pct`, 0-100.
        must_finish: the worker's `must_finish_before_compaction` (CB-8), with `must_finish_reason`.
        compaction_count: compactions seen in the thread so far; an increase is a compaction.
        captured_at: when the worker took the reading (orders reports).
        last_total_tokens: T of SPEC D-1 (tokens); a change means the thread was active.
        owner_id: the owner of the reporting device (from its token, via context_budget).
    """

    thread_id: str
    project_id: str
    task_id: str
    node_id: str
    worker_id: str
    codex_folder: str
    level: Level | None
    remaining_pct: float
    must_finish: bool
    must_finish_reason: str
    compaction_expected_at: datetime | None
    compaction_count: int
    last_compaction_at: datetime | None
    snapshot_version: int
    captured_at: datetime
    last_total_tokens: int = 0
    owner_id: str = ""


# The `commands_sent` marker of an epoch in which a report was at risk (CB-19).
AT_RISK_MARKER = "at_risk"


@dataclass(frozen=True)
class ThreadState:
    """The scheduler's view of one thread (the `scheduled_threads` row).

    Budget fields mirror the latest applied report. `master_must_finish` is the master agent's own
    CB-8 flag (SetMustFinishBeforeCompaction); the effective flag is the worker's OR the master's.
    `epoch` is the compaction_count the handoff bookkeeping belongs to: it restarts at each
    compaction. `commands_sent` lists command types already issued in this epoch (at most once each,
    except the critical re-issue of prepare_handoff, tracked by `prepare_issued_at_critical`) and the
    marker AT_RISK_MARKER once a report of the epoch was at risk (CB-19). `owner_id` is the owner of
    the device the thread belongs to: client tokens of other owners never see the thread.
    """

    thread_id: str
    project_id: str = ""
    task_id: str = ""
    node_id: str = ""
    worker_id: str = ""
    codex_folder: str = ""
    level: Level | None = None
    remaining_pct: float = 100.0
    reported_must_finish: bool = False
    reported_must_finish_reason: str = ""
    master_must_finish: bool = False
    master_must_finish_reason: str = ""
    compaction_expected_at: datetime | None = None
    compaction_count: int = 0
    last_compaction_at: datetime | None = None
    snapshot_version: int = 0
    captured_at: datetime | None = None
    last_total_tokens: int = 0
    last_activity_at: datetime | None = None
    task_importance: int = 0
    unsolidified_patch: bool = False
    unsolidified_test_results: bool = False
    hardware_test_in_progress: bool = False
    busy: bool = False
    no_large_context_appends: bool = False
    finish_current_subtask: bool = False
    context_growth_frozen: bool = False
    relay_thread_id: str = ""
    current_package_id: str = ""
    current_package_status: PackageStatus | None = None
    package_epoch: int = -1
    epoch: int = 0
    prepare_issued_at: datetime | None = None
    prepare_issued_at_critical: bool = False
    commands_sent: frozenset[str] = field(default_factory=frozenset)
    owner_id: str = ""

    @property
    def wrapping_up(self) -> bool:
        """A report of the current epoch was at risk (CB-19: urgent, critical or compaction near), so
        the thread is wrapping up for a handoff until its next compaction starts a new epoch."""
        return AT_RISK_MARKER in self.commands_sent

    @property
    def must_finish(self) -> bool:
        """CB-8 effective flag: set by the worker's rules or by the master agent."""
        return self.reported_must_finish or self.master_must_finish

    @property
    def must_finish_reason(self) -> str:
        """The reasons behind `must_finish`, joined with "; " (empty when not set)."""
        reasons = []
        if self.reported_must_finish and self.reported_must_finish_reason:
            reasons.append(self.reported_must_finish_reason)
        if self.master_must_finish and self.master_must_finish_reason:
            reasons.append(self.master_must_finish_reason)
        return "; ".join(reasons)

    def has_unsolidified_patch(self) -> bool:
        """The master's fact, or the worker's must-finish reason naming uncommitted changes or a patch."""
        return self.unsolidified_patch or _mentions(
            self.reported_must_finish, self.reported_must_finish_reason, ("uncommitted", "patch", "diff")
        )

    def has_unsolidified_test_results(self) -> bool:
        """The master's fact, or the worker's must-finish reason naming test results."""
        return self.unsolidified_test_results or _mentions(
            self.reported_must_finish, self.reported_must_finish_reason, ("test",)
        )

    def has_hardware_test_in_progress(self) -> bool:
        """The master's fact, or the worker's must-finish reason naming a hardware step."""
        return self.hardware_test_in_progress or _mentions(
            self.reported_must_finish, self.reported_must_finish_reason, ("hardware",)
        )

    def is_busy(self, now: datetime, idle_after: timedelta) -> bool:
        """Busy when the master says so or the context grew within `idle_after` of `now`."""
        if self.busy:
            return True
        return self.last_activity_at is not None and now - self.last_activity_at < idle_after


def _mentions(flag: bool, reason: str, words: tuple[str, ...]) -> bool:
    """True when `flag` is set and `reason` contains one of `words` (case-insensitive)."""
    if not flag:
        return False
    lowered = reason.lower()
    return any(word in lowered for word in words)
