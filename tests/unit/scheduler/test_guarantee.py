"""The CB-19 guarantee and CB-7 level actions of `apply_report`, on plain values, plus a
property test over generated report sequences."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.domain.guarantee import Decision, apply_report, apply_reports
from services.scheduler.domain.model import (
    BudgetReport,
    CommandType,
    Level,
    PackageStatus,
    SchedulerSettings,
    ThreadState,
)

START = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
SETTINGS = SchedulerSettings(compaction_horizon=timedelta(minutes=10))


def ids() -> itertools.count:
    return itertools.count(1)


def report(
    version: int,
    level: Level,
    pct: float,
    *,
    compactions: int = 0,
    expected_in: timedelta | None = None,
    tokens: int | None = None,
) -> BudgetReport:
    captured = START + timedelta(seconds=30 * version)
    return BudgetReport(
        thread_id="t1",
        project_id="p1",
        task_id="",
        node_id="n1",
        worker_id="w1",
        codex_folder="/repo",
        level=level,
        remaining_pct=pct,
        must_finish=False,
        must_finish_reason="",
        compaction_expected_at=captured + expected_in if expected_in is not None else None,
        compaction_count=compactions,
        last_compaction_at=None,
        snapshot_version=version,
        captured_at=captured,
        last_total_tokens=tokens if tokens is not None else version * 1000,
    )


def run(reports: list[BudgetReport]) -> tuple[ThreadState | None, list[Decision]]:
    counter = ids()
    state: ThreadState | None = None
    decisions = []
    for item in reports:
        decision = apply_report(state, item, SETTINGS, lambda: f"id{next(counter)}")
        decisions.append(decision)
        state = decision.state
    return state, decisions


def types(decision: Decision) -> list[str]:
    return [command.command_type.value for command in decision.commands]


def test_watch_opens_a_draft_and_asks_for_no_large_appends() -> None:
    state, decisions = run([report(1, Level.SAFE, 80), report(2, Level.WATCH, 50)])
    assert types(decisions[0]) == [] and decisions[0].new_package is None
    assert types(decisions[1]) == ["avoid_large_context_append"]
    assert decisions[1].new_package is not None and decisions[1].new_package.to_thread_id == ""
    assert state is not None and state.no_large_context_appends and not state.finish_current_subtask
    assert state.current_package_status is PackageStatus.DRAFT and state.prepare_issued_at is None


def test_urgent_precreates_relay_finishes_subtask_and_prepares_handoff_once() -> None:
    state, decisions = run(
        [report(1, Level.WATCH, 50), report(2, Level.URGENT, 30), report(3, Level.URGENT, 28)]
    )
    urgent = decisions[1]
    assert types(urgent) == ["finish_current_subtask", "prepare_handoff"]
    assert urgent.relay_thread_id.startswith("relay-")
    prepare = urgent.commands[-1]
    assert prepare.handoff_package_id == decisions[0].new_package.handoff_package_id  # type: ignore[union-attr]
    assert prepare.to_thread_id == urgent.relay_thread_id
    assert urgent.handoff_required_reason == "context_urgent"
    assert types(decisions[2]) == []
    assert (
        state is not None and state.finish_current_subtask and state.relay_thread_id == urgent.relay_thread_id
    )


def test_critical_sends_prepare_again_and_freezes() -> None:
    state, decisions = run([report(1, Level.URGENT, 30), report(2, Level.CRITICAL, 20)])
    assert types(decisions[1]) == ["freeze_context_growth", "prepare_handoff"]
    assert state is not None and state.context_growth_frozen
    assert decisions[1].handoff_required_reason == "context_critical"


def test_a_package_ready_before_critical_is_made_again_at_critical_and_stays_ready() -> None:
    ready = replace(
        run([report(1, Level.URGENT, 30)])[1][0].state, current_package_status=PackageStatus.READY
    )
    counter = ids()
    decision = apply_report(ready, report(2, Level.CRITICAL, 20), SETTINGS, lambda: f"x{next(counter)}")
    assert types(decision) == ["freeze_context_growth", "prepare_handoff"]
    [refresh] = [c for c in decision.commands if c.command_type is CommandType.PREPARE_HANDOFF]
    assert refresh.handoff_package_id == ready.current_package_id
    assert refresh.reason.startswith("refresh the ready package at critical")
    # Still ready (no "required" again), and made again once per cycle, not at every critical report.
    assert decision.handoff_required_reason == ""
    assert decision.state.current_package_status is PackageStatus.READY
    again = apply_report(decision.state, report(3, Level.CRITICAL, 10), SETTINGS, lambda: f"y{next(counter)}")
    assert types(again) == []


def test_compaction_near_triggers_prepare_at_safe_level() -> None:
    _, decisions = run([report(1, Level.SAFE, 70, expected_in=timedelta(minutes=5))])
    assert types(decisions[0]) == ["prepare_handoff"]
    assert decisions[0].handoff_required_reason == "compaction_near"
    assert decisions[0].new_package is not None


def test_compaction_without_ready_package_is_handoff_missing_and_starts_a_new_epoch() -> None:
    state, decisions = run(
        [
            report(1, Level.URGENT, 30),
            report(2, Level.SAFE, 95, compactions=1),
            report(3, Level.URGENT, 30, compactions=1),
        ]
    )
    assert decisions[1].compaction is not None and decisions[1].handoff_missing
    assert decisions[1].compaction.prepare_issued and decisions[1].compaction.was_at_risk
    assert state is not None and state.relay_thread_id != decisions[0].relay_thread_id
    assert "prepare_handoff" in types(decisions[2])


def test_compaction_with_ready_package_is_not_missing() -> None:
    first = run([report(1, Level.URGENT, 30)])[1][0]
    ready = replace(first.state, current_package_status=PackageStatus.READY)
    decision = apply_report(ready, report(2, Level.SAFE, 95, compactions=1), SETTINGS, lambda: "z")
    assert decision.compaction is not None and decision.compaction.package_ready
    assert not decision.handoff_missing


def test_a_compaction_ends_the_handoff_cycle_the_ready_package_is_no_longer_the_threads() -> None:
    urgent = run([report(1, Level.URGENT, 30)])[1][0]
    ready = replace(urgent.state, current_package_status=PackageStatus.READY)
    package_id = ready.current_package_id

    decision = apply_report(ready, report(2, Level.SAFE, 95, compactions=1), SETTINGS, lambda: "z")

    assert decision.compaction is not None and decision.compaction.package_ready
    assert not decision.handoff_missing
    assert (decision.compaction.closed_package_id, decision.compaction.closed_package_status) == (
        package_id,
        PackageStatus.READY,
    )
    state = decision.state
    assert (state.current_package_id, state.current_package_status) == ("", None)
    assert state.epoch == 1 and state.relay_thread_id == "" and decision.new_package is None


def test_a_draft_closed_by_a_compaction_is_missing_and_the_next_risk_opens_a_new_package() -> None:
    state, decisions = run(
        [
            report(1, Level.URGENT, 30),
            report(2, Level.WATCH, 55, compactions=1),
            report(3, Level.URGENT, 30, compactions=1),
        ]
    )
    draft_id = decisions[0].state.current_package_id
    compaction = decisions[1].compaction

    assert compaction is not None and decisions[1].handoff_missing
    assert compaction.handoff_package_id == draft_id  # the package the alert is about
    assert (compaction.closed_package_id, compaction.closed_package_status) == (draft_id, PackageStatus.DRAFT)
    # At watch the new epoch opens its own draft: never the closed one again.
    assert decisions[1].new_package is not None
    assert decisions[1].state.current_package_id == decisions[1].new_package.handoff_package_id != draft_id
    assert decisions[1].state.package_epoch == 1
    prepare = [c for c in decisions[2].commands if c.command_type is CommandType.PREPARE_HANDOFF]
    assert state is not None and [c.handoff_package_id for c in prepare] == [state.current_package_id]


def test_a_compaction_without_any_package_closes_nothing() -> None:
    state, decisions = run([report(1, Level.SAFE, 80), report(2, Level.SAFE, 95, compactions=1)])

    compaction = decisions[1].compaction
    assert compaction is not None
    assert (compaction.closed_package_id, compaction.closed_package_status) == ("", None)
    assert state is not None and state.current_package_id == ""


def test_stale_and_repeated_reports_change_nothing() -> None:
    state, decisions = run(
        [report(2, Level.URGENT, 30), report(1, Level.CRITICAL, 10), report(2, Level.URGENT, 30)]
    )
    assert decisions[1].ignored and decisions[2].ignored
    assert decisions[1].commands == () and state is not None and state.level is Level.URGENT


LEVEL_FOR = [(Level.SAFE, 80.0), (Level.WATCH, 50.0), (Level.URGENT, 30.0), (Level.CRITICAL, 10.0)]

step = st.tuples(
    st.integers(min_value=0, max_value=3),  # level index
    st.booleans(),  # compaction before this report
    st.one_of(st.none(), st.integers(min_value=0, max_value=60)),  # minutes to expected compaction
    st.booleans(),  # the package became ready before this report (the worker uploaded)
    st.booleans(),  # a delayed duplicate of the previous report is replayed first
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, min_size=1, max_size=40))
def test_every_compaction_after_risk_had_a_prepare_handoff_before_it(steps: list[tuple]) -> None:
    """CB-19: for any report sequence, whenever a report shows a compaction and the epoch it ends had
    a report at urgent/critical or with the compaction within the horizon, a prepare_handoff was
    issued while applying an earlier report of that epoch."""
    counter = ids()
    state: ThreadState | None = None
    compactions = 0
    previous_report: BudgetReport | None = None
    epoch_at_risk = False
    epoch_prepares = 0
    for version, (level_index, compacted, minutes, uploaded, replay) in enumerate(steps, start=1):
        if replay and previous_report is not None and state is not None:
            assert apply_report(state, previous_report, SETTINGS, lambda: "dup").ignored
        if uploaded and state is not None and state.current_package_status is PackageStatus.DRAFT:
            state = replace(state, current_package_status=PackageStatus.READY)
        compactions += int(compacted)
        level, pct = LEVEL_FOR[level_index]
        expected = timedelta(minutes=minutes) if minutes is not None else None
        item = report(version, level, pct, compactions=compactions, expected_in=expected)
        decision = apply_report(state, item, SETTINGS, lambda: f"id{next(counter)}")
        assert not decision.ignored
        if decision.compaction is not None:
            if epoch_at_risk:
                assert epoch_prepares >= 1, "compaction after risk with no prepare_handoff before it"
                assert decision.compaction.prepare_issued
            assert decision.handoff_missing == (not decision.compaction.package_ready)
            epoch_at_risk, epoch_prepares = False, 0
        at_risk = level in (Level.URGENT, Level.CRITICAL) or (minutes is not None and minutes <= 10)
        epoch_at_risk = epoch_at_risk or at_risk
        prepares = [c for c in decision.commands if c.command_type is CommandType.PREPARE_HANDOFF]
        epoch_prepares += len(prepares)
        if at_risk:
            assert epoch_prepares >= 1
            assert all(c.handoff_package_id == decision.state.current_package_id for c in prepares)
        assert epoch_prepares <= 2
        # The thread only ever presents a package of its current epoch (a compaction closes it).
        assert decision.state.current_package_id == "" or decision.state.package_epoch == decision.state.epoch
        if decision.compaction is not None and decision.new_package is None:
            assert decision.state.current_package_id == ""
        sent = [
            c.command_type for c in decision.commands if c.command_type is not CommandType.PREPARE_HANDOFF
        ]
        assert len(sent) == len(set(sent))
        state = decision.state
        previous_report = item


def test_apply_reports_applies_each_report_to_its_threads_latest_state() -> None:
    counter = ids()
    states: dict[str, ThreadState] = {}
    other_thread = replace(report(1, Level.SAFE, 90.0), thread_id="t2")
    applied = apply_reports(
        [
            report(1, Level.WATCH, 50.0),
            other_thread,
            report(2, Level.URGENT, 30.0),
            report(1, Level.SAFE, 99.0),
        ],
        states,
        SETTINGS,
        lambda: f"id-{next(counter)}",
    )

    assert [(item.report.thread_id, item.report.snapshot_version) for item in applied] == [
        ("t1", 1),
        ("t2", 1),
        ("t1", 2),
    ], "the repeated version 1 of t1 is stale and left out"
    assert applied[0].previous is None and applied[2].previous is applied[0].decision.state
    assert states["t1"] is applied[2].decision.state and states["t1"].level is Level.URGENT
    assert states["t1"].relay_thread_id and states["t2"].level is Level.SAFE
