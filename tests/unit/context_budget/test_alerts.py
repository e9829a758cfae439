"""Alert rules: compaction risk conditions and the opened -> acked -> resolved lifecycle."""

from __future__ import annotations

from datetime import timedelta

import pytest

from services.context_budget.domain.alerts import (
    acknowledge,
    compaction_risk_reason,
    level_alert_type,
    open_alert,
    resolve,
)
from services.context_budget.domain.model import AlertStatus, AlertType, ContextBudgetLevel
from services.shared.errors import FailedPrecondition
from tests.unit.context_budget.factories import NOW, make_snapshot

URGENT, CRITICAL, WATCH, SAFE = (
    ContextBudgetLevel.URGENT,
    ContextBudgetLevel.CRITICAL,
    ContextBudgetLevel.WATCH,
    ContextBudgetLevel.SAFE,
)


def test_level_alert_types() -> None:
    assert level_alert_type(SAFE) is None
    assert level_alert_type(WATCH) is AlertType.CONTEXT_WATCH
    assert level_alert_type(URGENT) is AlertType.CONTEXT_URGENT
    assert level_alert_type(CRITICAL) is AlertType.CONTEXT_CRITICAL


@pytest.mark.parametrize("level", [URGENT, CRITICAL])
def test_risk_holds_at_urgent_or_critical_with_must_finish(level: ContextBudgetLevel) -> None:
    snapshot = make_snapshot(must_finish_before_compaction=True, must_finish_reason="uncommitted patch")
    reason = compaction_risk_reason(snapshot, level)
    assert reason == f"level {level.value} and must finish before compaction: uncommitted patch"


@pytest.mark.parametrize("level", [SAFE, WATCH])
def test_must_finish_alone_is_no_risk_at_safe_or_watch(level: ContextBudgetLevel) -> None:
    assert compaction_risk_reason(make_snapshot(must_finish_before_compaction=True), level) is None


def test_urgent_without_must_finish_and_no_expectation_is_no_risk() -> None:
    assert compaction_risk_reason(make_snapshot(), URGENT) is None


def test_expected_compaction_within_the_horizon_is_a_risk_at_any_level() -> None:
    captured = NOW
    near = make_snapshot(captured_at=captured, compaction_expected_at=captured + timedelta(minutes=10))
    far = make_snapshot(
        captured_at=captured, compaction_expected_at=captured + timedelta(minutes=10, seconds=1)
    )
    overdue = make_snapshot(captured_at=captured, compaction_expected_at=captured - timedelta(minutes=1))
    assert (
        compaction_risk_reason(near, SAFE) == "compaction expected at 2026-03-25T08:10:00Z, within 10 minutes"
    )
    assert compaction_risk_reason(far, SAFE) is None
    assert compaction_risk_reason(overdue, WATCH) is not None
    assert compaction_risk_reason(far, SAFE, horizon=timedelta(minutes=30)) is not None


def test_both_conditions_are_named() -> None:
    snapshot = make_snapshot(
        must_finish_before_compaction=True, captured_at=NOW, compaction_expected_at=NOW + timedelta(minutes=2)
    )
    reason = compaction_risk_reason(snapshot, CRITICAL)
    assert reason is not None and "must finish" in reason and "within 10 minutes" in reason


def test_lifecycle_opened_acked_resolved() -> None:
    alert = open_alert("a1", "t1", "p1", AlertType.CONTEXT_WATCH, "why", NOW)
    assert alert.alert_status is AlertStatus.OPENED and alert.opened_at == NOW
    acked = acknowledge(alert, NOW + timedelta(seconds=1))
    assert acked.alert_status is AlertStatus.ACKED and acked.acked_at == NOW + timedelta(seconds=1)
    resolved = resolve(acked, NOW + timedelta(seconds=2))
    assert resolved.alert_status is AlertStatus.RESOLVED and resolved.resolved_at == NOW + timedelta(
        seconds=2
    )
    assert resolved.acked_at == acked.acked_at


def test_opened_can_be_resolved_directly() -> None:
    alert = open_alert("a1", "t1", "p1", AlertType.COMPACTION_RISK, "why", NOW)
    assert resolve(alert, NOW).alert_status is AlertStatus.RESOLVED


def test_illegal_transitions_are_failed_preconditions() -> None:
    alert = open_alert("a1", "t1", "p1", AlertType.CONTEXT_WATCH, "why", NOW)
    acked = acknowledge(alert, NOW)
    resolved = resolve(acked, NOW)
    with pytest.raises(FailedPrecondition):
        acknowledge(acked, NOW)
    with pytest.raises(FailedPrecondition):
        acknowledge(resolved, NOW)
    with pytest.raises(FailedPrecondition):
        resolve(resolved, NOW)
