"""Mapping between the gRPC contract (boss.context_budget.v1) and the domain values.

Incoming snapshots become `SnapshotInput` untouched (unknown enum numbers and absurd timestamps are
kept for validation to report); outgoing values are built from validated domain objects.
"""

from __future__ import annotations

from datetime import timedelta

from boss.context_budget.v1 import context_budget_pb2 as pb
from google.rpc import status_pb2

from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import (
    Alert,
    AlertStatus,
    AlertType,
    CompactionLimitSource,
    ContextBudgetLevel,
    MasterAction,
    Snapshot,
    SnapshotInput,
    SourceKind,
    ThreadState,
    ThresholdPolicy,
)
from services.context_budget.domain.policy import (
    compaction_is_near,
    master_actions_of,
    report_interval_seconds,
)

LEVEL_NUMBERS: dict[ContextBudgetLevel, pb.ContextBudgetLevel] = {
    ContextBudgetLevel.SAFE: pb.CONTEXT_BUDGET_LEVEL_SAFE,
    ContextBudgetLevel.WATCH: pb.CONTEXT_BUDGET_LEVEL_WATCH,
    ContextBudgetLevel.URGENT: pb.CONTEXT_BUDGET_LEVEL_URGENT,
    ContextBudgetLevel.CRITICAL: pb.CONTEXT_BUDGET_LEVEL_CRITICAL,
}
SOURCE_KIND_NUMBERS: dict[SourceKind, pb.SourceKind] = {
    SourceKind.CODEX_APP_SERVER: pb.SOURCE_KIND_CODEX_APP_SERVER,
    SourceKind.CODEX_SDK: pb.SOURCE_KIND_CODEX_SDK,
    SourceKind.WORKER_ESTIMATOR: pb.SOURCE_KIND_WORKER_ESTIMATOR,
}
LIMIT_SOURCE_NUMBERS: dict[CompactionLimitSource, pb.CompactionLimitSource] = {
    CompactionLimitSource.CONFIGURED: pb.COMPACTION_LIMIT_SOURCE_CONFIGURED,
    CompactionLimitSource.MODEL_DEFAULT: pb.COMPACTION_LIMIT_SOURCE_MODEL_DEFAULT,
    CompactionLimitSource.ASSUMED: pb.COMPACTION_LIMIT_SOURCE_ASSUMED,
}
MASTER_ACTION_NUMBERS: dict[MasterAction, pb.MasterAction] = {
    MasterAction.REFRESH_STAGE_SUMMARY: pb.MASTER_ACTION_REFRESH_STAGE_SUMMARY,
    MasterAction.AVOID_LARGE_CONTEXT_APPEND: pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND,
    MasterAction.PREPARE_HANDOFF: pb.MASTER_ACTION_PREPARE_HANDOFF,
    MasterAction.FINISH_CURRENT_SUBTASK: pb.MASTER_ACTION_FINISH_CURRENT_SUBTASK,
    MasterAction.PRECREATE_RELAY_THREAD: pb.MASTER_ACTION_PRECREATE_RELAY_THREAD,
    MasterAction.RUN_PRE_COMPACTION_WRAP_UP: pb.MASTER_ACTION_RUN_PRE_COMPACTION_WRAP_UP,
    MasterAction.FREEZE_CONTEXT_GROWTH: pb.MASTER_ACTION_FREEZE_CONTEXT_GROWTH,
}
ALERT_TYPE_NUMBERS: dict[AlertType, pb.AlertType] = {
    AlertType.CONTEXT_WATCH: pb.ALERT_TYPE_CONTEXT_WATCH,
    AlertType.CONTEXT_URGENT: pb.ALERT_TYPE_CONTEXT_URGENT,
    AlertType.CONTEXT_CRITICAL: pb.ALERT_TYPE_CONTEXT_CRITICAL,
    AlertType.COMPACTION_RISK: pb.ALERT_TYPE_COMPACTION_RISK,
    AlertType.HANDOFF_MISSING: pb.ALERT_TYPE_HANDOFF_MISSING,
}
ALERT_STATUS_NUMBERS: dict[AlertStatus, pb.AlertStatus] = {
    AlertStatus.OPENED: pb.ALERT_STATUS_OPENED,
    AlertStatus.ACKED: pb.ALERT_STATUS_ACKED,
    AlertStatus.RESOLVED: pb.ALERT_STATUS_RESOLVED,
}
ALERT_STATUSES_BY_NUMBER: dict[int, AlertStatus] = {
    number: status for status, number in ALERT_STATUS_NUMBERS.items()
}

# Computed once: per level, (wire level, cadence); per (level, compaction near), the wire master
# actions (`master_actions_of`).
_LEVEL_PARTS: dict[ContextBudgetLevel, tuple[pb.ContextBudgetLevel, int]] = {
    level: (LEVEL_NUMBERS[level], report_interval_seconds(level)) for level in ContextBudgetLevel
}
_WIRE_ACTIONS: dict[tuple[ContextBudgetLevel, bool], list[pb.MasterAction]] = {
    (level, near): [MASTER_ACTION_NUMBERS[action] for action in master_actions_of(level, near)]
    for level in ContextBudgetLevel
    for near in (False, True)
}


def snapshot_input_of(message: pb.ThreadContextSnapshot) -> SnapshotInput:
    """The snapshot as sent, for validation (timestamps as raw (seconds, nanos), None when unset)."""
    has = message.HasField
    captured = message.captured_at
    expected = message.compaction_expected_at
    last_compaction = message.last_compaction_at
    return SnapshotInput(
        snapshot_id=message.snapshot_id,
        project_id=message.project_id,
        task_id=message.task_id,
        thread_id=message.thread_id,
        node_id=message.node_id,
        worker_id=message.worker_id,
        source_kind=message.source_kind,
        context_budget_remaining_pct=message.context_budget_remaining_pct,
        context_budget_level=message.context_budget_level,
        compaction_expected_at=(expected.seconds, expected.nanos) if has("compaction_expected_at") else None,
        must_finish_before_compaction=message.must_finish_before_compaction,
        estimated_remaining_turns=(
            message.estimated_remaining_turns if has("estimated_remaining_turns") else None
        ),
        estimated_remaining_large_messages=(
            message.estimated_remaining_large_messages if has("estimated_remaining_large_messages") else None
        ),
        last_compaction_at=(
            (last_compaction.seconds, last_compaction.nanos) if has("last_compaction_at") else None
        ),
        compaction_count=message.compaction_count,
        snapshot_version=message.snapshot_version,
        captured_at=(captured.seconds, captured.nanos) if has("captured_at") else None,
        last_total_tokens=message.last_total_tokens,
        model_context_window=message.model_context_window,
        auto_compact_token_limit=message.auto_compact_token_limit,
        codex_context_left_pct=message.codex_context_left_pct if has("codex_context_left_pct") else None,
        must_finish_reason=message.must_finish_reason,
        codex_folder=message.codex_folder,
        compaction_limit_source=message.compaction_limit_source,
        awaiting_reading_after_compaction=message.awaiting_reading_after_compaction,
    )


def snapshot_message(snapshot: Snapshot) -> pb.ThreadContextSnapshot:
    """The wire form of a stored snapshot (context_budget_level is the worker's own claim)."""
    message = pb.ThreadContextSnapshot(
        snapshot_id=snapshot.snapshot_id,
        project_id=snapshot.project_id,
        task_id=snapshot.task_id,
        thread_id=snapshot.thread_id,
        node_id=snapshot.node_id,
        worker_id=snapshot.worker_id,
        source_kind=SOURCE_KIND_NUMBERS[snapshot.source_kind],
        context_budget_remaining_pct=snapshot.context_budget_remaining_pct,
        context_budget_level=(
            pb.CONTEXT_BUDGET_LEVEL_UNSPECIFIED
            if snapshot.reported_level is None
            else LEVEL_NUMBERS[snapshot.reported_level]
        ),
        must_finish_before_compaction=snapshot.must_finish_before_compaction,
        estimated_remaining_turns=snapshot.estimated_remaining_turns,
        estimated_remaining_large_messages=snapshot.estimated_remaining_large_messages,
        compaction_count=snapshot.compaction_count,
        snapshot_version=snapshot.snapshot_version,
        last_total_tokens=snapshot.last_total_tokens,
        model_context_window=snapshot.model_context_window,
        auto_compact_token_limit=snapshot.auto_compact_token_limit,
        codex_context_left_pct=snapshot.codex_context_left_pct,
        must_finish_reason=snapshot.must_finish_reason,
        codex_folder=snapshot.codex_folder,
        compaction_limit_source=(
            pb.COMPACTION_LIMIT_SOURCE_UNSPECIFIED
            if snapshot.compaction_limit_source is None
            else LIMIT_SOURCE_NUMBERS[snapshot.compaction_limit_source]
        ),
        awaiting_reading_after_compaction=snapshot.awaiting_reading_after_compaction,
    )
    message.captured_at.FromDatetime(snapshot.captured_at)
    if snapshot.compaction_expected_at is not None:
        message.compaction_expected_at.FromDatetime(snapshot.compaction_expected_at)
    if snapshot.last_compaction_at is not None:
        message.last_compaction_at.FromDatetime(snapshot.last_compaction_at)
    return message


def alert_message(alert: Alert) -> pb.ThreadContextAlert:
    """The wire form of an alert."""
    message = pb.ThreadContextAlert(
        alert_id=alert.alert_id,
        thread_id=alert.thread_id,
        project_id=alert.project_id,
        alert_type=ALERT_TYPE_NUMBERS[alert.alert_type],
        alert_status=ALERT_STATUS_NUMBERS[alert.alert_status],
        reason=alert.reason,
    )
    message.opened_at.FromDatetime(alert.opened_at)
    if alert.acked_at is not None:
        message.acked_at.FromDatetime(alert.acked_at)
    if alert.resolved_at is not None:
        message.resolved_at.FromDatetime(alert.resolved_at)
    return message


def thread_context_message(
    state: ThreadState, open_alerts: list[Alert], horizon: timedelta
) -> pb.ThreadContext:
    """The wire form of a thread's current state; reported_context_budget_level is set only when
    the worker's claim disagreed with the server's level. Its master actions are the ones its
    reading's ack listed (`master_actions_of`: prepare_handoff added when the reading expects its
    compaction within `horizon`)."""
    level, cadence = _LEVEL_PARTS[state.level]
    actions = _WIRE_ACTIONS[state.level, compaction_is_near(state.snapshot, horizon)]
    reported = state.snapshot.reported_level
    message = pb.ThreadContext(
        snapshot=snapshot_message(state.snapshot),
        context_budget_level=level,
        reported_context_budget_level=(
            LEVEL_NUMBERS[reported]
            if reported is not None and reported is not state.level
            else pb.CONTEXT_BUDGET_LEVEL_UNSPECIFIED
        ),
        open_alerts=[alert_message(alert) for alert in open_alerts],
        next_required_report_in_seconds=cadence,
        master_actions=actions,
    )
    message.updated_at.FromDatetime(state.updated_at)
    return message


def policy_message(policy: ThresholdPolicy) -> pb.ThresholdPolicy:
    """The wire form of a threshold policy (updated_at unset for the built-in default)."""
    message = pb.ThresholdPolicy(
        project_id=policy.project_id,
        safe_min_pct=policy.safe_min_pct,
        watch_min_pct=policy.watch_min_pct,
        urgent_min_pct=policy.urgent_min_pct,
    )
    if policy.updated_at is not None:
        message.updated_at.FromDatetime(policy.updated_at)
    return message


def policy_of(message: pb.ThresholdPolicy) -> ThresholdPolicy:
    """A policy from the wire (validated by the handler)."""
    return ThresholdPolicy(
        project_id=message.project_id,
        safe_min_pct=message.safe_min_pct,
        watch_min_pct=message.watch_min_pct,
        urgent_min_pct=message.urgent_min_pct,
    )


def ack_message(outcome: IngestOutcome) -> pb.ThreadContextAck:
    """The ack of an accepted snapshot (CB-10); its master actions are `outcome.master_actions` (the
    level's, plus prepare_handoff when the snapshot expects its compaction within the horizon)."""
    level, cadence = _LEVEL_PARTS[outcome.level]
    actions = _WIRE_ACTIONS[outcome.level, outcome.compaction_near]
    return pb.ThreadContextAck(
        accepted=True,
        thread_id=outcome.thread_id,
        snapshot_id=outcome.snapshot_id,
        context_budget_level=level,
        next_required_report_in_seconds=cadence,
        master_actions=actions,
        duplicate=outcome.duplicate,
        superseded=outcome.superseded,
    )


def rejected_ack(message: pb.ThreadContextSnapshot, status: status_pb2.Status) -> pb.ThreadContextAck:
    """The ack of a rejected snapshot: accepted false, the ids as sent, and the error."""
    return pb.ThreadContextAck(
        accepted=False, thread_id=message.thread_id, snapshot_id=message.snapshot_id, error=status
    )
