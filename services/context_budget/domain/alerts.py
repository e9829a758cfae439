"""Alert rules of a thread's context (CB-6 `thread_context_alerts`).

- Level alerts: entering watch, urgent or critical opens context_watch / context_urgent /
  context_critical and resolves the thread's previous level alert; returning to safe resolves it.
  Staying at a level opens nothing new (even when its alert was resolved by hand).
- compaction_risk: holds while (level is urgent or critical AND must_finish_before_compaction) OR
  compaction_expected_at is at most `horizon` (default 10 minutes) after captured_at (an overdue
  expectation counts too); opened when it starts to hold, resolved when it stops.
- handoff_missing: opened by the scheduler's handoff rules, never here.
- Lifecycle: opened -> acked -> resolved, or opened -> resolved; anything else is FAILED_PRECONDITION.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from services.context_budget.domain.model import (
    Alert,
    AlertStatus,
    AlertType,
    ContextBudgetLevel,
    Snapshot,
)
from services.context_budget.domain.policy import compaction_is_near
from services.shared.errors import FailedPrecondition
from services.shared.time import isoformat_utc

DEFAULT_COMPACTION_RISK_HORIZON = timedelta(minutes=10)

LEVEL_ALERT_TYPES: dict[ContextBudgetLevel, AlertType] = {
    ContextBudgetLevel.WATCH: AlertType.CONTEXT_WATCH,
    ContextBudgetLevel.URGENT: AlertType.CONTEXT_URGENT,
    ContextBudgetLevel.CRITICAL: AlertType.CONTEXT_CRITICAL,
}
LEVEL_ALERT_TYPE_SET = frozenset(LEVEL_ALERT_TYPES.values())
_RISKY_LEVELS = frozenset({ContextBudgetLevel.URGENT, ContextBudgetLevel.CRITICAL})


def level_alert_type(level: ContextBudgetLevel) -> AlertType | None:
    """The alert type opened on entering `level` (None for safe)."""
    return LEVEL_ALERT_TYPES.get(level)


def level_alert_reason(snapshot: Snapshot, level: ContextBudgetLevel) -> str:
    """Why a level alert was opened, in words."""
    return f"context budget {snapshot.context_budget_remaining_pct:g}% is at level {level.value}"


def compaction_risk_reason(
    snapshot: Snapshot, level: ContextBudgetLevel, horizon: timedelta = DEFAULT_COMPACTION_RISK_HORIZON
) -> str | None:
    """Why the thread is at risk of compacting with work not yet made durable, or None when it is not.

    The risk holds when the level is urgent or critical and must_finish_before_compaction is set
    (CB-8), or when compaction_expected_at is at most `horizon` after captured_at.
    """
    reasons: list[str] = []
    if level in _RISKY_LEVELS and snapshot.must_finish_before_compaction:
        detail = f": {snapshot.must_finish_reason}" if snapshot.must_finish_reason else ""
        reasons.append(f"level {level.value} and must finish before compaction{detail}")
    if compaction_is_near(snapshot, horizon):
        minutes = horizon.total_seconds() / 60
        expected = isoformat_utc(snapshot.compaction_expected_at)
        reasons.append(f"compaction expected at {expected}, within {minutes:g} minutes")
    return "; ".join(reasons) if reasons else None


def open_alert(
    alert_id: str, thread_id: str, project_id: str, alert_type: AlertType, reason: str, now: datetime
) -> Alert:
    """A new alert in status opened at `now`."""
    return Alert(
        alert_id=alert_id,
        thread_id=thread_id,
        project_id=project_id,
        alert_type=alert_type,
        alert_status=AlertStatus.OPENED,
        opened_at=now,
        acked_at=None,
        resolved_at=None,
        reason=reason,
    )


def acknowledge(alert: Alert, now: datetime) -> Alert:
    """opened -> acked at `now`. Raises FailedPrecondition from any other status."""
    if alert.alert_status is not AlertStatus.OPENED:
        raise FailedPrecondition(
            f"alert {alert.alert_id} is {alert.alert_status.value}: only an opened alert can be acknowledged",
            reason="ALERT_NOT_OPENED",
        )
    return replace(alert, alert_status=AlertStatus.ACKED, acked_at=now)


def resolve(alert: Alert, now: datetime) -> Alert:
    """opened|acked -> resolved at `now`. Raises FailedPrecondition when already resolved."""
    if alert.alert_status is AlertStatus.RESOLVED:
        raise FailedPrecondition(f"alert {alert.alert_id} is already resolved", reason="ALERT_RESOLVED")
    return replace(alert, alert_status=AlertStatus.RESOLVED, resolved_at=now)
