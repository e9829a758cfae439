"""Threshold policy, level classification, master actions and report cadence (CB-7, CB-9, CB-10)."""

from __future__ import annotations

import math
from datetime import timedelta

from services.context_budget.domain.model import ContextBudgetLevel, MasterAction, Snapshot, ThresholdPolicy
from services.shared.errors import FieldViolation, InvalidArgument

# CB-7 defaults: safe >= 60 %, watch 40-59 %, urgent 25-39 %, critical < 25 %.
DEFAULT_POLICY = ThresholdPolicy(project_id="", safe_min_pct=60.0, watch_min_pct=40.0, urgent_min_pct=25.0)

# CB-7 actions per level, as CB-10 names them. At urgent the seed's own example answer
# (["prepare_handoff", "avoid_large_context_append"], seed §5.2) comes first.
MASTER_ACTIONS: dict[ContextBudgetLevel, tuple[MasterAction, ...]] = {
    ContextBudgetLevel.SAFE: (MasterAction.REFRESH_STAGE_SUMMARY,),
    ContextBudgetLevel.WATCH: (MasterAction.AVOID_LARGE_CONTEXT_APPEND, MasterAction.PREPARE_HANDOFF),
    ContextBudgetLevel.URGENT: (
        MasterAction.PREPARE_HANDOFF,
        MasterAction.AVOID_LARGE_CONTEXT_APPEND,
        MasterAction.FINISH_CURRENT_SUBTASK,
        MasterAction.PRECREATE_RELAY_THREAD,
    ),
    ContextBudgetLevel.CRITICAL: (
        MasterAction.RUN_PRE_COMPACTION_WRAP_UP,
        MasterAction.PREPARE_HANDOFF,
        MasterAction.FREEZE_CONTEXT_GROWTH,
        MasterAction.AVOID_LARGE_CONTEXT_APPEND,
    ),
}

# CB-9: report every 30 s normally, every 15 s at watch, every 5 s at urgent or critical.
REPORT_INTERVAL_SECONDS: dict[ContextBudgetLevel, int] = {
    ContextBudgetLevel.SAFE: 30,
    ContextBudgetLevel.WATCH: 15,
    ContextBudgetLevel.URGENT: 5,
    ContextBudgetLevel.CRITICAL: 5,
}


def classify(remaining_pct: float, policy: ThresholdPolicy) -> ContextBudgetLevel:
    """The level of a budget of `remaining_pct` percent (0-100) under `policy` (CB-7): safe when
    >= safe_min_pct, watch when >= watch_min_pct, urgent when >= urgent_min_pct, else critical."""
    if remaining_pct >= policy.safe_min_pct:
        return ContextBudgetLevel.SAFE
    if remaining_pct >= policy.watch_min_pct:
        return ContextBudgetLevel.WATCH
    if remaining_pct >= policy.urgent_min_pct:
        return ContextBudgetLevel.URGENT
    return ContextBudgetLevel.CRITICAL


def master_actions_of(level: ContextBudgetLevel, compaction_near: bool) -> tuple[MasterAction, ...]:
    """The actions a reading asks of the master agent, in the order they are sent: CB-7's at
    `level` (`MASTER_ACTIONS`), with `prepare_handoff`
    added (after them) when its compaction is expected within the risk horizon
    (`compaction_is_near`), as the scheduler's CB-19 rule then sends prepare_handoff whatever the
    level (services/scheduler/domain/guarantee.py). The ingest ack, the `thread.context.updated`
    event and the thread's current context all list these."""
    actions = MASTER_ACTIONS[level]
    if compaction_near and MasterAction.PREPARE_HANDOFF not in actions:
        return (*actions, MasterAction.PREPARE_HANDOFF)
    return actions


def compaction_is_near(snapshot: Snapshot, horizon: timedelta) -> bool:
    """Whether a reading expects its compaction at most `horizon` after it was captured."""
    expected = snapshot.compaction_expected_at
    return expected is not None and expected - snapshot.captured_at <= horizon


def report_interval_seconds(level: ContextBudgetLevel) -> int:
    """CB-9's `next_required_report_in_seconds` at `level`."""
    return REPORT_INTERVAL_SECONDS[level]


def validate_policy(policy: ThresholdPolicy, prefix: str = "policy") -> None:
    """Checks a policy: every threshold finite, and 0 < urgent < watch < safe <= 100 (percent).

    Raises:
        InvalidArgument: with one violation per bad field, e.g. `policy.watch_min_pct`.
    """
    violations: list[FieldViolation] = []
    values = {
        "safe_min_pct": policy.safe_min_pct,
        "watch_min_pct": policy.watch_min_pct,
        "urgent_min_pct": policy.urgent_min_pct,
    }
    for name, value in values.items():
        if not math.isfinite(value) or not 0 < value <= 100:
            violations.append(FieldViolation(f"{prefix}.{name}", "must be a percentage in (0, 100]"))
    if not violations:
        if not policy.urgent_min_pct < policy.watch_min_pct:
            violations.append(
                FieldViolation(f"{prefix}.watch_min_pct", "must be greater than urgent_min_pct")
            )
        if not policy.watch_min_pct < policy.safe_min_pct:
            violations.append(FieldViolation(f"{prefix}.safe_min_pct", "must be greater than watch_min_pct"))
    if violations:
        raise InvalidArgument(violations)
