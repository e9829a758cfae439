"""Values of the context budget domain (SPEC CB-6 field names).

Percentages are percent 0-100, instants are timezone-aware UTC datetimes, token figures are tokens.
Enumerations carry the lower-case names used in the database, the event payloads and the REST API
(e.g. `ContextBudgetLevel.URGENT == "urgent"`, `MasterAction.PREPARE_HANDOFF == "prepare_handoff"`).

The values made once per snapshot on the ingest path (SnapshotInput, Snapshot, ThreadHead,
ThreadState) are slotted dataclasses that are *not* frozen: a frozen dataclass of 23 fields costs
about 2.2 us to construct against 0.2 us (measured on the 2-core target), which matters at
10,000 snapshots/s. Treat them as immutable all the same: nothing assigns to their fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class ContextBudgetLevel(StrEnum):
    """How full a thread's context is, by the threshold policy (CB-7)."""

    SAFE = "safe"
    WATCH = "watch"
    URGENT = "urgent"
    CRITICAL = "critical"


class SourceKind(StrEnum):
    """Where a snapshot's figures come from (SPEC D-4)."""

    CODEX_APP_SERVER = "codex_app_server"
    CODEX_SDK = "codex_sdk"
    WORKER_ESTIMATOR = "worker_estimator"


class CompactionLimitSource(StrEnum):
    """Where a snapshot's auto-compact limit L came from (the proto's CompactionLimitSource)."""

    CONFIGURED = "configured"
    MODEL_DEFAULT = "model_default"
    ASSUMED = "assumed"


class MasterAction(StrEnum):
    """What the master agent asks of a thread at its level (CB-7, CB-10)."""

    REFRESH_STAGE_SUMMARY = "refresh_stage_summary"
    AVOID_LARGE_CONTEXT_APPEND = "avoid_large_context_append"
    PREPARE_HANDOFF = "prepare_handoff"
    FINISH_CURRENT_SUBTASK = "finish_current_subtask"
    PRECREATE_RELAY_THREAD = "precreate_relay_thread"
    RUN_PRE_COMPACTION_WRAP_UP = "run_pre_compaction_wrap_up"
    FREEZE_CONTEXT_GROWTH = "freeze_context_growth"


class AlertType(StrEnum):
    """Type of a thread alert (CB-6 `thread_context_alerts.alert_type`)."""

    CONTEXT_WATCH = "context_watch"
    CONTEXT_URGENT = "context_urgent"
    CONTEXT_CRITICAL = "context_critical"
    COMPACTION_RISK = "compaction_risk"
    # Opened by the scheduler's handoff rules (a compaction without a ready handoff package), never here.
    HANDOFF_MISSING = "handoff_missing"


class AlertStatus(StrEnum):
    """Lifecycle of an alert: opened -> acked -> resolved, or opened -> resolved."""

    OPENED = "opened"
    ACKED = "acked"
    RESOLVED = "resolved"


# A protobuf Timestamp as it arrived: (seconds since the Unix epoch, nanos). Not yet validated.
RawTimestamp = tuple[int, int]


@dataclass(slots=True)
class SnapshotInput:
    """A snapshot exactly as a worker sent it, before validation.

    Enumerations are the wire numbers (protobuf keeps unknown numbers as plain ints), timestamps are
    raw (seconds, nanos) pairs or None when unset, optional integers are None when absent.
    """

    snapshot_id: str
    project_id: str
    task_id: str
    thread_id: str
    node_id: str
    worker_id: str
    source_kind: int
    context_budget_remaining_pct: float
    context_budget_level: int
    compaction_expected_at: RawTimestamp | None
    must_finish_before_compaction: bool
    estimated_remaining_turns: int | None
    estimated_remaining_large_messages: int | None
    last_compaction_at: RawTimestamp | None
    compaction_count: int
    snapshot_version: int
    captured_at: RawTimestamp | None
    last_total_tokens: int
    model_context_window: int
    auto_compact_token_limit: int
    codex_context_left_pct: int | None
    must_finish_reason: str
    codex_folder: str
    compaction_limit_source: int = 0
    awaiting_reading_after_compaction: bool = False


@dataclass(slots=True)
class Snapshot:
    """One validated reading of one thread's context budget (CB-6 `thread_context_snapshots`).

    Attributes:
        snapshot_id: the worker's id, or the stable uuid5 the server derived (validation.py).
        context_budget_remaining_pct: percent 0-100 of the usable room left before compaction (D-1).
        reported_level: the level the worker claimed, None when it sent none (recorded, not trusted).
        compaction_expected_at / last_compaction_at / captured_at: UTC instants.
        snapshot_version: worker-side version, increasing per thread; orders readings with captured_at.
        last_total_tokens / model_context_window / auto_compact_token_limit: D-1's T, W and L, in
            tokens (0 when unknown).
        codex_context_left_pct: Codex's own displayed "% context left" (0-100), None when unknown.
        owner_id: the owner of the reporting worker, from its token (never from the request); ""
            on history rows, which do not store it.
        compaction_limit_source: where L came from, None when the worker did not say.
        awaiting_reading_after_compaction: Codex compacted after the thread's last reading and has
            not answered since ("compacted, waiting for the first reading"; T is 0 then).
        trace_context: the W3C trace context the report carried, when tracing is on (transport,
            not part of the reading: neither stored nor compared; handlers.py, "ingest snapshot").
    """

    snapshot_id: str
    project_id: str
    task_id: str
    thread_id: str
    node_id: str
    worker_id: str
    source_kind: SourceKind
    context_budget_remaining_pct: float
    reported_level: ContextBudgetLevel | None
    compaction_expected_at: datetime | None
    must_finish_before_compaction: bool
    estimated_remaining_turns: int | None
    estimated_remaining_large_messages: int | None
    last_compaction_at: datetime | None
    compaction_count: int
    snapshot_version: int
    captured_at: datetime
    last_total_tokens: int
    model_context_window: int
    auto_compact_token_limit: int
    codex_context_left_pct: int | None
    must_finish_reason: str
    codex_folder: str
    owner_id: str = ""
    compaction_limit_source: CompactionLimitSource | None = None
    awaiting_reading_after_compaction: bool = False
    trace_context: dict[str, str] | None = None

    @property
    def order_key(self) -> tuple[datetime, int]:
        """(captured_at, snapshot_version): a reading replaces the current one only when larger."""
        return (self.captured_at, self.snapshot_version)

    @property
    def device(self) -> tuple[str, str, str]:
        """(owner_id, node_id, worker_id): the device that sent this reading."""
        return (self.owner_id, self.node_id, self.worker_id)

    def same_reading_as(self, other: Snapshot) -> bool:
        """Whether `other` carries exactly this reading: every field the worker sent is equal
        (owner_id, which history rows do not keep, is left out). A re-sent snapshot is; a different
        reading reusing the snapshot_id is not."""
        return (
            self.snapshot_id == other.snapshot_id
            and self.project_id == other.project_id
            and self.task_id == other.task_id
            and self.thread_id == other.thread_id
            and self.node_id == other.node_id
            and self.worker_id == other.worker_id
            and self.source_kind == other.source_kind
            and self.context_budget_remaining_pct == other.context_budget_remaining_pct
            and self.reported_level == other.reported_level
            and self.compaction_expected_at == other.compaction_expected_at
            and self.must_finish_before_compaction == other.must_finish_before_compaction
            and self.estimated_remaining_turns == other.estimated_remaining_turns
            and self.estimated_remaining_large_messages == other.estimated_remaining_large_messages
            and self.last_compaction_at == other.last_compaction_at
            and self.compaction_count == other.compaction_count
            and self.snapshot_version == other.snapshot_version
            and self.captured_at == other.captured_at
            and self.last_total_tokens == other.last_total_tokens
            and self.model_context_window == other.model_context_window
            and self.auto_compact_token_limit == other.auto_compact_token_limit
            and self.codex_context_left_pct == other.codex_context_left_pct
            and self.must_finish_reason == other.must_finish_reason
            and self.codex_folder == other.codex_folder
            and self.compaction_limit_source == other.compaction_limit_source
            and self.awaiting_reading_after_compaction == other.awaiting_reading_after_compaction
        )


@dataclass(slots=True)
class ThreadHead:
    """What ingest needs to know of a thread's current state (a small slice of ThreadState, so a
    batch loads a few columns per thread, not whole rows).

    Attributes:
        level: the server's level of the current reading.
        captured_at / snapshot_version: the current reading's order key.
        compaction_count: the current reading's compaction count.
        level_alert_id / compaction_risk_alert_id: as in ThreadState.
        device: (owner_id, node_id, worker_id) of the device the thread belongs to.
    """

    level: ContextBudgetLevel
    captured_at: datetime
    snapshot_version: int
    compaction_count: int
    level_alert_id: str | None
    compaction_risk_alert_id: str | None
    device: tuple[str, str, str]

    @property
    def order_key(self) -> tuple[datetime, int]:
        """(captured_at, snapshot_version) of the current reading."""
        return (self.captured_at, self.snapshot_version)


@dataclass(slots=True)
class ThreadState:
    """The current budget of one thread (`thread_contexts`): its latest applied snapshot.

    Attributes:
        level: the server's classification of `snapshot`.
        level_alert_id: the alert opened when the thread entered `level` (None at safe).
        compaction_risk_alert_id: the compaction_risk alert while the risk holds, else None.
        updated_at: when the server committed the snapshot (UTC).
    """

    snapshot: Snapshot
    level: ContextBudgetLevel
    level_alert_id: str | None
    compaction_risk_alert_id: str | None
    updated_at: datetime

    @property
    def head(self) -> ThreadHead:
        """The slice of this state that ingest needs."""
        snapshot = self.snapshot
        return ThreadHead(
            self.level,
            snapshot.captured_at,
            snapshot.snapshot_version,
            snapshot.compaction_count,
            self.level_alert_id,
            self.compaction_risk_alert_id,
            snapshot.device,
        )


@dataclass(frozen=True, slots=True)
class ThresholdPolicy:
    """Level thresholds in percent 0-100 (CB-7): safe >= safe_min_pct, watch >= watch_min_pct,
    urgent >= urgent_min_pct, else critical. `project_id` is "" for the default policy;
    `updated_at` is None for the built-in default."""

    project_id: str
    safe_min_pct: float
    watch_min_pct: float
    urgent_min_pct: float
    updated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Alert:
    """An alert about one thread's context (CB-6 `thread_context_alerts`); instants are UTC."""

    alert_id: str
    thread_id: str
    project_id: str
    alert_type: AlertType
    alert_status: AlertStatus
    opened_at: datetime
    acked_at: datetime | None
    resolved_at: datetime | None
    reason: str
