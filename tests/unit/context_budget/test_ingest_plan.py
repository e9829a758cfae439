"""The ingest plan: duplicates, ordering, classification, alert transitions and events."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from services.context_budget.domain import events as ev
from services.context_budget.domain.ingest import ExistingAlertResolved, IngestPlan, plan_ingest
from services.context_budget.domain.model import (
    AlertStatus,
    AlertType,
    ContextBudgetLevel,
    Snapshot,
    SourceKind,
    ThreadState,
    ThresholdPolicy,
)
from services.shared.errors import field_violations_of
from tests.unit.context_budget.factories import NOW, make_snapshot, make_state

SAFE, WATCH, URGENT, CRITICAL = (
    ContextBudgetLevel.SAFE,
    ContextBudgetLevel.WATCH,
    ContextBudgetLevel.URGENT,
    ContextBudgetLevel.CRITICAL,
)


def plan(
    snapshots: Sequence[Snapshot],
    current: Mapping[str, ThreadState] | None = None,
    existing: Sequence[Snapshot] = (),
    policies: Mapping[str, ThresholdPolicy] | None = None,
    **kwargs: Any,
) -> IngestPlan:
    counter = itertools.count(1)
    return plan_ingest(
        snapshots,
        current={thread_id: state.head for thread_id, state in (current or {}).items()},
        existing_snapshots={stored.snapshot_id: stored for stored in existing},
        policies=policies or {},
        now=NOW,
        new_alert_id=lambda: f"alert-{next(counter)}",
        **kwargs,
    )


def event_types(result: IngestPlan) -> list[str]:
    return [e.type if isinstance(e, ev.EventDraft) else "existing-resolved" for e in result.events]


def at(seconds: int) -> Any:
    return NOW - timedelta(seconds=100 - seconds)


def test_first_safe_snapshot_creates_state_and_events_without_alerts() -> None:
    result = plan([make_snapshot(context_budget_remaining_pct=80)])
    assert [(o.level, o.duplicate, o.superseded) for o in result.outcomes] == [(SAFE, False, False)]
    assert result.outcomes[0].next_required_report_in_seconds == 30
    assert [s.superseded for s in result.snapshots] == [False]
    (state,) = result.states
    assert (state.level, state.level_alert_id, state.compaction_risk_alert_id, state.updated_at) == (
        SAFE,
        None,
        None,
        NOW,
    )
    assert result.new_alerts == []
    assert event_types(result) == [ev.THREAD_CONTEXT_UPDATED, ev.THREAD_CONTEXT_LEVEL_CHANGED]
    updated = result.events[0]
    assert isinstance(updated, ev.EventDraft)
    assert updated.payload["previous_level"] is None
    assert updated.payload["master_actions"] == ["refresh_stage_summary"]
    assert updated.payload["captured_at"] == "2026-03-25T07:59:55Z"
    assert (updated.thread_id, updated.project_id, updated.node_id) == ("thread-abc", "proj-001", "mac-01")


def test_the_worker_level_is_recorded_but_the_server_classifies() -> None:
    result = plan([make_snapshot(context_budget_remaining_pct=10, reported_level=SAFE)])
    assert result.outcomes[0].level is CRITICAL
    assert result.snapshots[0].level is CRITICAL
    updated = result.events[0]
    assert isinstance(updated, ev.EventDraft)
    assert updated.payload["context_budget_level"] == "critical"
    assert updated.payload["reported_context_budget_level"] == "safe"


def test_entering_watch_opens_its_alert_and_stays_quiet_while_at_watch() -> None:
    first = plan([make_snapshot(context_budget_remaining_pct=45)])
    (alert,) = first.new_alerts
    assert (alert.alert_type, alert.alert_status, alert.opened_at) == (
        AlertType.CONTEXT_WATCH,
        AlertStatus.OPENED,
        NOW,
    )
    assert first.states[0].level_alert_id == alert.alert_id
    assert event_types(first) == [
        ev.THREAD_CONTEXT_UPDATED,
        ev.THREAD_CONTEXT_LEVEL_CHANGED,
        ev.THREAD_CONTEXT_ALERT_CHANGED,
    ]
    state = first.states[0]
    second = plan(
        [make_snapshot(snapshot_id="snap-2", snapshot_version=2, context_budget_remaining_pct=42)],
        current={"thread-abc": state},
    )
    assert second.new_alerts == [] and second.resolve_alert_ids == []
    assert second.states[0].level_alert_id == alert.alert_id
    assert event_types(second) == [ev.THREAD_CONTEXT_UPDATED]


def test_level_change_resolves_the_stored_alert_and_opens_the_new_one() -> None:
    previous = make_state(
        make_snapshot(context_budget_remaining_pct=45), WATCH, level_alert_id="stored-watch"
    )
    result = plan(
        [make_snapshot(snapshot_id="snap-2", snapshot_version=2, context_budget_remaining_pct=30)],
        current={"thread-abc": previous},
    )
    assert result.resolve_alert_ids == ["stored-watch"]
    (opened,) = result.new_alerts
    assert opened.alert_type is AlertType.CONTEXT_URGENT
    assert result.states[0].level_alert_id == opened.alert_id
    assert event_types(result) == [
        ev.THREAD_CONTEXT_UPDATED,
        ev.THREAD_CONTEXT_LEVEL_CHANGED,
        "existing-resolved",
        ev.THREAD_CONTEXT_ALERT_CHANGED,
    ]
    level_changed = result.events[1]
    assert isinstance(level_changed, ev.EventDraft)
    assert (level_changed.payload["from_level"], level_changed.payload["to_level"]) == ("watch", "urgent")
    placeholder = result.events[2]
    assert placeholder == ExistingAlertResolved("stored-watch", "mac-01")


def test_back_to_safe_resolves_the_level_alert() -> None:
    previous = make_state(
        make_snapshot(context_budget_remaining_pct=20), CRITICAL, level_alert_id="stored-crit"
    )
    result = plan([make_snapshot(snapshot_version=2, snapshot_id="s2")], current={"thread-abc": previous})
    assert result.resolve_alert_ids == ["stored-crit"]
    assert result.new_alerts == []
    assert result.states[0].level_alert_id is None
    assert result.outcomes[0].level is SAFE


def test_several_snapshots_of_one_thread_apply_in_order_within_a_batch() -> None:
    snapshots = [
        make_snapshot(
            snapshot_id="a", snapshot_version=1, captured_at=at(1), context_budget_remaining_pct=80
        ),
        make_snapshot(
            snapshot_id="b", snapshot_version=2, captured_at=at(2), context_budget_remaining_pct=50
        ),
        make_snapshot(
            snapshot_id="c", snapshot_version=3, captured_at=at(3), context_budget_remaining_pct=20
        ),
    ]
    result = plan(snapshots)
    assert [o.level for o in result.outcomes] == [SAFE, WATCH, CRITICAL]
    assert len(result.states) == 1 and result.states[0].snapshot.snapshot_id == "c"
    changes = [
        (e.payload["from_level"], e.payload["to_level"])
        for e in result.events
        if isinstance(e, ev.EventDraft) and e.type == ev.THREAD_CONTEXT_LEVEL_CHANGED
    ]
    assert changes == [(None, "safe"), ("safe", "watch"), ("watch", "critical")]
    # The watch alert was opened and resolved inside the batch: it is inserted already resolved.
    statuses = {(a.alert_type, a.alert_status) for a in result.new_alerts}
    assert statuses == {
        (AlertType.CONTEXT_WATCH, AlertStatus.RESOLVED),
        (AlertType.CONTEXT_CRITICAL, AlertStatus.OPENED),
    }
    assert result.resolve_alert_ids == []


def test_duplicates_are_answered_and_not_stored() -> None:
    state = make_state(make_snapshot(context_budget_remaining_pct=45), WATCH)
    old = make_snapshot(snapshot_id="old", snapshot_version=5, context_budget_remaining_pct=10)
    result = plan(
        [
            replace(old),
            make_snapshot(snapshot_id="new", snapshot_version=6, context_budget_remaining_pct=30),
            make_snapshot(snapshot_id="new", snapshot_version=6, context_budget_remaining_pct=30),
        ],
        current={"thread-abc": state},
        existing=[old],
    )
    assert [(o.snapshot_id, o.duplicate, o.level) for o in result.outcomes] == [
        ("old", True, WATCH),
        ("new", False, URGENT),
        ("new", True, URGENT),
    ]
    assert [s.snapshot.snapshot_id for s in result.snapshots] == ["new"]


def test_older_or_equal_readings_are_kept_in_history_only() -> None:
    current = make_state(
        make_snapshot(snapshot_version=5, captured_at=at(50), context_budget_remaining_pct=45), WATCH
    )
    older_time = make_snapshot(
        snapshot_id="x", snapshot_version=9, captured_at=at(40), context_budget_remaining_pct=5
    )
    same_time_lower_version = make_snapshot(
        snapshot_id="y", snapshot_version=4, captured_at=at(50), context_budget_remaining_pct=5
    )
    same_key = make_snapshot(
        snapshot_id="z", snapshot_version=5, captured_at=at(50), context_budget_remaining_pct=5
    )
    result = plan([older_time, same_time_lower_version, same_key], current={"thread-abc": current})
    assert [(o.superseded, o.level) for o in result.outcomes] == [(True, WATCH)] * 3
    assert [(s.superseded, s.level) for s in result.snapshots] == [(True, CRITICAL)] * 3
    assert result.states == [] and result.events == [] and result.new_alerts == []


def test_same_captured_at_with_a_higher_version_applies() -> None:
    current = make_state(make_snapshot(snapshot_version=5, captured_at=at(50)), SAFE)
    newer = make_snapshot(
        snapshot_id="n", snapshot_version=6, captured_at=at(50), context_budget_remaining_pct=45
    )
    result = plan([newer], current={"thread-abc": current})
    assert result.outcomes[0].superseded is False and result.outcomes[0].level is WATCH


def test_project_policy_overrides_the_default() -> None:
    policies = {
        "": ThresholdPolicy("", 60, 40, 25),
        "strict": ThresholdPolicy("strict", 80, 60, 40),
    }
    result = plan(
        [
            make_snapshot(
                snapshot_id="a", thread_id="t1", project_id="strict", context_budget_remaining_pct=70
            ),
            make_snapshot(
                snapshot_id="b", thread_id="t2", project_id="other", context_budget_remaining_pct=70
            ),
        ],
        policies=policies,
    )
    assert [o.level for o in result.outcomes] == [WATCH, SAFE]


def test_stored_default_policy_replaces_the_built_in_one() -> None:
    result = plan(
        [make_snapshot(context_budget_remaining_pct=65)], policies={"": ThresholdPolicy("", 70, 50, 30)}
    )
    assert result.outcomes[0].level is WATCH


def test_compaction_risk_opens_and_resolves() -> None:
    risky = make_snapshot(
        snapshot_id="r",
        context_budget_remaining_pct=30,
        must_finish_before_compaction=True,
        must_finish_reason="patch",
    )
    opened = plan([risky])
    risk_alerts = [a for a in opened.new_alerts if a.alert_type is AlertType.COMPACTION_RISK]
    assert len(risk_alerts) == 1
    state = opened.states[0]
    assert state.compaction_risk_alert_id == risk_alerts[0].alert_id
    risk_event = next(
        e
        for e in opened.events
        if isinstance(e, ev.EventDraft) and e.type == ev.THREAD_CONTEXT_COMPACTION_RISK_OPENED
    )
    assert risk_event.payload == {
        "thread_id": "thread-abc",
        "project_id": "proj-001",
        "owner_id": "",
        "alert_id": risk_alerts[0].alert_id,
        "reason": "level urgent and must finish before compaction: patch",
        "compaction_expected_at": None,
    }
    still = plan(
        [
            make_snapshot(
                snapshot_id="s",
                snapshot_version=2,
                context_budget_remaining_pct=28,
                must_finish_before_compaction=True,
            )
        ],
        current={"thread-abc": state},
    )
    assert not any(
        isinstance(e, ev.EventDraft) and e.type.startswith("thread.context.compaction_risk")
        for e in still.events
    )
    cleared = plan(
        [make_snapshot(snapshot_id="c", snapshot_version=3, context_budget_remaining_pct=28)],
        current={"thread-abc": still.states[0]},
    )
    assert cleared.resolve_alert_ids == [risk_alerts[0].alert_id]
    assert cleared.states[0].compaction_risk_alert_id is None
    assert ev.THREAD_CONTEXT_COMPACTION_RISK_RESOLVED in event_types(cleared)


def test_compaction_expected_soon_opens_risk_even_when_safe() -> None:
    snapshot = make_snapshot(
        context_budget_remaining_pct=70, compaction_expected_at=NOW + timedelta(minutes=3), captured_at=NOW
    )
    result = plan([snapshot])
    assert [a.alert_type for a in result.new_alerts] == [AlertType.COMPACTION_RISK]
    horizon_short = plan([snapshot], horizon=timedelta(minutes=1))
    assert horizon_short.new_alerts == []


def test_the_ack_asks_for_a_handoff_when_compaction_is_near_at_any_level() -> None:
    near = make_snapshot(
        context_budget_remaining_pct=70, compaction_expected_at=NOW + timedelta(minutes=3), captured_at=NOW
    )
    far = make_snapshot(
        snapshot_id="far",
        context_budget_remaining_pct=70,
        compaction_expected_at=NOW + timedelta(minutes=30),
        captured_at=NOW,
    )
    assert [a.value for a in plan([near]).outcomes[0].master_actions] == [
        "refresh_stage_summary",
        "prepare_handoff",
    ]
    assert [a.value for a in plan([far]).outcomes[0].master_actions] == ["refresh_stage_summary"]
    for reading in (near, far):  # the thread.context.updated event lists the ack's actions too
        planned = plan([reading])
        updated = next(e for e in planned.events if e.type == "thread.context.updated")
        assert updated.payload["master_actions"] == [a.value for a in planned.outcomes[0].master_actions]
    urgent = replace(near, context_budget_remaining_pct=30)
    assert [a.value for a in plan([urgent]).outcomes[0].master_actions].count("prepare_handoff") == 1
    assert [a.value for a in plan([near], horizon=timedelta(minutes=1)).outcomes[0].master_actions] == [
        "refresh_stage_summary"
    ]


def test_compaction_count_increase_is_observed() -> None:
    previous = make_state(make_snapshot(compaction_count=1), SAFE)
    later = make_snapshot(snapshot_id="n", snapshot_version=2, compaction_count=2, last_compaction_at=NOW)
    result = plan([later], current={"thread-abc": previous})
    observed = [
        e
        for e in result.events
        if isinstance(e, ev.EventDraft) and e.type == ev.THREAD_CONTEXT_COMPACTION_OBSERVED
    ]
    assert [e.payload for e in observed] == [
        {
            "thread_id": "thread-abc",
            "project_id": "proj-001",
            "node_id": "mac-01",
            "owner_id": "",
            "compaction_count": 2,
            "previous_compaction_count": 1,
            "last_compaction_at": "2026-03-25T08:00:00Z",
        }
    ]
    first_report = plan([make_snapshot(compaction_count=3)])
    assert ev.THREAD_CONTEXT_COMPACTION_OBSERVED not in event_types(first_report)


def test_updated_payload_carries_every_documented_field() -> None:
    result = plan([make_snapshot(context_budget_remaining_pct=30, estimated_remaining_turns=4)])
    updated = result.events[0]
    assert isinstance(updated, ev.EventDraft)
    assert set(updated.payload) == {
        "thread_id", "project_id", "task_id", "node_id", "worker_id", "owner_id", "snapshot_id",
        "source_kind", "context_budget_remaining_pct", "context_budget_level", "previous_level",
        "reported_context_budget_level", "compaction_expected_at", "must_finish_before_compaction",
        "must_finish_reason", "estimated_remaining_turns", "estimated_remaining_large_messages",
        "last_compaction_at", "compaction_count", "snapshot_version", "captured_at", "updated_at",
        "codex_context_left_pct", "last_total_tokens", "model_context_window", "auto_compact_token_limit",
        "codex_folder", "compaction_limit_source", "awaiting_reading_after_compaction", "master_actions",
        "next_required_report_in_seconds",
    }  # fmt: skip
    assert updated.payload["master_actions"] == [
        "prepare_handoff",
        "avoid_large_context_append",
        "finish_current_subtask",
        "precreate_relay_thread",
    ]
    assert updated.payload["next_required_report_in_seconds"] == 5
    assert updated.payload["source_kind"] == "worker_estimator"
    assert updated.payload["estimated_remaining_turns"] == 4


def test_a_different_reading_under_a_stored_snapshot_id_is_refused_naming_the_field() -> None:
    state = make_state(make_snapshot(context_budget_remaining_pct=45), WATCH)
    stored = make_snapshot(snapshot_id="old", snapshot_version=5, context_budget_remaining_pct=10)
    result = plan(
        [
            make_snapshot(snapshot_id="old", snapshot_version=5, context_budget_remaining_pct=12.5),
            make_snapshot(snapshot_id="new", snapshot_version=6, context_budget_remaining_pct=30),
            make_snapshot(snapshot_id="new", snapshot_version=6, context_budget_remaining_pct=31),
        ],
        current={"thread-abc": state},
        existing=[stored],
    )
    first, applied, reused = result.outcomes
    assert first.error is not None and reused.error is not None
    for refused in (first, reused):
        assert refused.error is not None
        status = refused.error.to_status()
        assert status.code == 6  # ALREADY_EXISTS
        assert refused.error.reason == "SNAPSHOT_ID_REUSED"
        assert [v.field for v in field_violations_of(status)] == ["snapshot_id"]
        assert not refused.duplicate
    assert applied.error is None and applied.level == URGENT
    assert [s.snapshot.snapshot_id for s in result.snapshots] == ["new"]
    assert [state.snapshot.context_budget_remaining_pct for state in result.states] == [30]


def test_every_field_of_a_reading_tells_a_repeat_from_a_different_reading() -> None:
    stored = make_snapshot(snapshot_id="kept", compaction_expected_at=NOW, must_finish_reason="tests")
    assert stored.same_reading_as(replace(stored))
    assert stored.same_reading_as(replace(stored, owner_id="someone"))  # history keeps no owner
    changes: dict[str, Any] = {
        "project_id": "proj-002",
        "task_id": "task-2",
        "thread_id": "thread-other",
        "node_id": "node-other",
        "worker_id": "worker-other",
        "source_kind": SourceKind.CODEX_SDK,
        "context_budget_remaining_pct": 80.5,
        "reported_level": ContextBudgetLevel.WATCH,
        "compaction_expected_at": NOW + timedelta(seconds=1),
        "must_finish_before_compaction": True,
        "estimated_remaining_turns": 3,
        "estimated_remaining_large_messages": 1,
        "last_compaction_at": NOW,
        "compaction_count": 4,
        "snapshot_version": 99,
        "captured_at": NOW - timedelta(seconds=1),
        "last_total_tokens": 1,
        "model_context_window": 2,
        "auto_compact_token_limit": 3,
        "codex_context_left_pct": 1,
        "must_finish_reason": "other",
        "codex_folder": "/other",
    }
    for name, value in changes.items():
        assert not stored.same_reading_as(replace(stored, **{name: value})), name


def test_a_thread_is_refused_to_any_device_but_its_own() -> None:
    mine = make_state(make_snapshot(owner_id="owner-a", context_budget_remaining_pct=45), WATCH)
    result = plan(
        [
            make_snapshot(
                snapshot_id="s1", snapshot_version=6, owner_id="owner-b", context_budget_remaining_pct=12.5
            ),
            make_snapshot(
                snapshot_id="s2",
                snapshot_version=7,
                owner_id="owner-a",
                node_id="win-02",
                context_budget_remaining_pct=12.5,
            ),
            make_snapshot(
                snapshot_id="s3", snapshot_version=8, owner_id="owner-a", context_budget_remaining_pct=40
            ),
        ],
        current={"thread-abc": mine},
    )
    other_owner, other_node, own = result.outcomes
    for refused in (other_owner, other_node):
        assert refused.error is not None
        assert refused.error.reason == "THREAD_BOUND_TO_OTHER_DEVICE"
        assert refused.error.to_status().code == 7  # PERMISSION_DENIED
        assert "owner-a" not in refused.error.message and "mac-01" not in refused.error.message
    assert own.error is None and own.level == WATCH
    assert [s.snapshot.snapshot_id for s in result.snapshots] == ["s3"]


def test_a_new_thread_belongs_to_the_first_device_of_the_batch() -> None:
    result = plan(
        [
            make_snapshot(snapshot_id="a1", snapshot_version=1, owner_id="owner-a"),
            make_snapshot(
                snapshot_id="b1", snapshot_version=2, owner_id="owner-b", context_budget_remaining_pct=5
            ),
        ]
    )
    first, second = result.outcomes
    assert first.error is None
    assert second.error is not None and second.error.reason == "THREAD_BOUND_TO_OTHER_DEVICE"
    assert [state.snapshot.owner_id for state in result.states] == ["owner-a"]
    assert [state.snapshot.context_budget_remaining_pct for state in result.states] == [80.0]


def test_a_compaction_awaiting_its_first_reading_resolves_the_critical_alert_and_is_observed() -> None:
    critical = make_snapshot(context_budget_remaining_pct=8, compaction_count=1, captured_at=at(10))
    state = make_state(critical, CRITICAL, level_alert_id="alert-critical")
    awaiting = make_snapshot(
        snapshot_id="snap-2",
        snapshot_version=critical.snapshot_version + 1,
        captured_at=at(20),
        context_budget_remaining_pct=100.0,
        last_total_tokens=0,
        codex_context_left_pct=None,
        compaction_count=2,
        last_compaction_at=at(20),
        awaiting_reading_after_compaction=True,
    )
    result = plan([awaiting], current={"thread-abc": state})
    (new_state,) = result.states
    assert (new_state.level, new_state.level_alert_id) == (SAFE, None)
    assert result.resolve_alert_ids == ["alert-critical"]
    assert ev.THREAD_CONTEXT_COMPACTION_OBSERVED in event_types(result)
    updated = result.events[0]
    assert isinstance(updated, ev.EventDraft)
    assert updated.payload["awaiting_reading_after_compaction"] is True
    assert updated.payload["master_actions"] == ["refresh_stage_summary"]


def test_every_planned_event_names_the_snapshot_it_follows_from() -> None:
    """`event_sources` (where the writer takes each event's trace context from) pairs every event
    with its snapshot, across threads and several snapshots of one thread in a batch."""
    first = make_snapshot(snapshot_id="a1", thread_id="thread-a", context_budget_remaining_pct=80)
    second = make_snapshot(snapshot_id="b1", thread_id="thread-b", context_budget_remaining_pct=30)
    third = make_snapshot(
        snapshot_id="a2", thread_id="thread-a", snapshot_version=2, context_budget_remaining_pct=50
    )
    duplicate = make_snapshot(snapshot_id="a1", thread_id="thread-a", context_budget_remaining_pct=80)
    result = plan([first, second, third, duplicate])

    assert len(result.event_sources) == len(result.events)
    assert [
        (source.snapshot_id, event.type)
        for source, event in zip(result.event_sources, result.events, strict=True)
        if isinstance(event, ev.EventDraft)
    ] == [
        ("a1", ev.THREAD_CONTEXT_UPDATED),
        ("a1", ev.THREAD_CONTEXT_LEVEL_CHANGED),
        ("b1", ev.THREAD_CONTEXT_UPDATED),
        ("b1", ev.THREAD_CONTEXT_LEVEL_CHANGED),
        ("b1", ev.THREAD_CONTEXT_ALERT_CHANGED),
        ("a2", ev.THREAD_CONTEXT_UPDATED),
        ("a2", ev.THREAD_CONTEXT_LEVEL_CHANGED),
        ("a2", ev.THREAD_CONTEXT_ALERT_CHANGED),
    ]
