"""Threshold policy: classification at the CB-7 boundaries, custom policies, actions and cadence."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from services.context_budget.domain.model import ContextBudgetLevel, MasterAction, ThresholdPolicy
from services.context_budget.domain.policy import (
    DEFAULT_POLICY,
    classify,
    compaction_is_near,
    master_actions_of,
    report_interval_seconds,
    validate_policy,
)
from services.shared.errors import InvalidArgument
from tests.unit.context_budget.factories import make_snapshot

SAFE, WATCH, URGENT, CRITICAL = (
    ContextBudgetLevel.SAFE,
    ContextBudgetLevel.WATCH,
    ContextBudgetLevel.URGENT,
    ContextBudgetLevel.CRITICAL,
)


@pytest.mark.parametrize(
    ("pct", "level"),
    [
        (100.0, SAFE),
        (60.0, SAFE),
        (59.99, WATCH),
        (40.0, WATCH),
        (39.999, URGENT),
        (25.0, URGENT),
        (24.9, CRITICAL),
        (0.0, CRITICAL),
    ],
)
def test_default_policy_classifies_at_the_cb7_thresholds(pct: float, level: ContextBudgetLevel) -> None:
    assert classify(pct, DEFAULT_POLICY) is level


def test_custom_policy_moves_the_boundaries() -> None:
    strict = ThresholdPolicy("proj", safe_min_pct=75, watch_min_pct=50, urgent_min_pct=30)
    assert classify(74.9, strict) is WATCH
    assert classify(75, strict) is SAFE
    assert classify(49.9, strict) is URGENT
    assert classify(29.9, strict) is CRITICAL
    assert classify(65, DEFAULT_POLICY) is SAFE


def test_default_policy_is_valid_and_matches_cb7() -> None:
    validate_policy(DEFAULT_POLICY)
    assert (DEFAULT_POLICY.safe_min_pct, DEFAULT_POLICY.watch_min_pct, DEFAULT_POLICY.urgent_min_pct) == (
        60,
        40,
        25,
    )


@pytest.mark.parametrize(
    ("safe", "watch", "urgent", "fields"),
    [
        (60, 60, 25, ["policy.safe_min_pct"]),
        (60, 20, 25, ["policy.watch_min_pct"]),
        (40, 50, 60, ["policy.watch_min_pct", "policy.safe_min_pct"]),
        (101, 40, 25, ["policy.safe_min_pct"]),
        (60, 40, 0, ["policy.urgent_min_pct"]),
        (60, math.nan, 25, ["policy.watch_min_pct"]),
        (math.inf, 40, -1, ["policy.safe_min_pct", "policy.urgent_min_pct"]),
    ],
)
def test_invalid_policies_name_every_bad_threshold(
    safe: float, watch: float, urgent: float, fields: list[str]
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_policy(ThresholdPolicy("p", safe, watch, urgent))
    assert [v.field for v in raised.value.violations] == fields


def test_a_safe_threshold_of_exactly_100_is_allowed() -> None:
    policy = ThresholdPolicy("p", 100, 99.5, 0.5)
    validate_policy(policy)  # raises InvalidArgument when the policy is refused
    assert classify(100.0, policy) == SAFE
    assert classify(99.9, policy) == WATCH


def test_a_near_compaction_adds_prepare_handoff_once_after_the_levels_actions() -> None:
    assert master_actions_of(SAFE, True) == (MasterAction.REFRESH_STAGE_SUMMARY, MasterAction.PREPARE_HANDOFF)
    for level in (WATCH, URGENT, CRITICAL):  # they ask for it already
        assert master_actions_of(level, True) == master_actions_of(level, False)


def test_compaction_is_near_at_most_the_horizon_after_the_capture() -> None:
    horizon = timedelta(minutes=10)
    at = make_snapshot().captured_at
    assert not compaction_is_near(make_snapshot(), horizon), "no estimate"
    assert compaction_is_near(make_snapshot(compaction_expected_at=at + horizon), horizon)
    assert not compaction_is_near(
        make_snapshot(compaction_expected_at=at + horizon + timedelta(seconds=1)), horizon
    )


def test_master_actions_per_level_follow_cb7_and_the_seed_example() -> None:
    assert master_actions_of(SAFE, False) == (MasterAction.REFRESH_STAGE_SUMMARY,)
    assert master_actions_of(WATCH, False) == (
        MasterAction.AVOID_LARGE_CONTEXT_APPEND,
        MasterAction.PREPARE_HANDOFF,
    )
    urgent = master_actions_of(URGENT, False)
    assert [a.value for a in urgent[:2]] == ["prepare_handoff", "avoid_large_context_append"]
    assert urgent[2:] == (MasterAction.FINISH_CURRENT_SUBTASK, MasterAction.PRECREATE_RELAY_THREAD)
    assert master_actions_of(CRITICAL, False) == (
        MasterAction.RUN_PRE_COMPACTION_WRAP_UP,
        MasterAction.PREPARE_HANDOFF,
        MasterAction.FREEZE_CONTEXT_GROWTH,
        MasterAction.AVOID_LARGE_CONTEXT_APPEND,
    )


def test_report_cadence_follows_cb9() -> None:
    assert [report_interval_seconds(level) for level in (SAFE, WATCH, URGENT, CRITICAL)] == [30, 15, 5, 5]
