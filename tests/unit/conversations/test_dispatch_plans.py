"""Dispatch plans (CHAT-4): proposal, confirmation with dropped and skipped targets, rejection,
expiry, superseding, task progress up to a pending summary, and the group's collaboration gate."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.domain.model import ThreadBudget
from services.conversations.groups.choice import RELAY, ChosenTarget, LeftOut, MemberThread
from services.conversations.groups.plans import (
    CONFIRMED,
    DISPATCH_PLAN_CONFIRMED,
    DISPATCH_PLAN_EXPIRED,
    DISPATCH_PLAN_REJECTED,
    DISPATCH_PLAN_SUPERSEDED,
    DISPATCH_PLAN_TARGETS_UNAVAILABLE,
    DRAFTED_BY_MODEL,
    EXPIRED,
    PROPOSED,
    REJECTED,
    SUMMARY_PENDING,
    SUMMARY_POSTED,
    SUPERSEDED,
    TARGET_DISPATCHED,
    TARGET_DROPPED,
    TARGET_SKIPPED,
    DispatchPlan,
    Drafts,
    apply_task_status,
    check_drops,
    closed_error,
    confirm,
    expire,
    group_gate,
    new_plan,
    plan_in_view,
    reject,
    summarised,
    supersede,
)
from services.shared.errors import FailedPrecondition

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
TTL = timedelta(minutes=30)


def chosen(thread_id: str, pct: float = 80.0) -> ChosenTarget:
    return ChosenTarget(
        kind="member",
        thread_id=thread_id,
        title=thread_id.removeprefix("th-"),
        device_id="mac-01",
        codex_folder_ref=f"/Users/dev/{thread_id}",
        codex_thread_ref=f"0199-{thread_id}",
        reason=f"safe, {pct:.1f} % left, idle",
        remaining_pct=pct,
        level="safe",
    )


def member(thread_id: str, level: str = "safe", **fields: object) -> MemberThread:
    values: dict[str, object] = {
        "thread_id": thread_id,
        "title": thread_id.removeprefix("th-"),
        "node_id": "mac-01",
        "codex_folder": f"/Users/dev/{thread_id}",
        "codex_thread_ref": f"0199-{thread_id}-now",
        "budget": ThreadBudget(80.0 if level == "safe" else 2.0, level, "mac-01", T0, T0),
        **fields,
    }
    return MemberThread(**values)  # type: ignore[arg-type]


def plan(*thread_ids: str, drafts: Drafts | None = None, plan_id: str = "plan-abc") -> DispatchPlan:
    return new_plan(
        plan_id,
        "local",
        "group-1",
        "msg-1",
        "run the tests",
        [chosen(thread_id) for thread_id in thread_ids],
        [LeftOut("th-hot", "hot", "critical", "critical (2.0 % left): ...")],
        drafts or Drafts({}, "user_text"),
        T0,
        TTL,
    )


def test_a_new_plan_numbers_its_targets_and_takes_the_drafted_instructions_or_the_users_text() -> None:
    drafts = Drafts({"t2": "run the south-line tests"}, DRAFTED_BY_MODEL)

    proposed = plan("th-north", "th-south", drafts=drafts)

    assert proposed.status == PROPOSED and proposed.expires_at == T0 + TTL
    assert [(t.target_id, t.position, t.thread_id, t.instruction) for t in proposed.targets] == [
        ("t1", 1, "th-north", "run the tests"),
        ("t2", 2, "th-south", "run the south-line tests"),
    ]
    assert proposed.drafted_by == DRAFTED_BY_MODEL
    payload = proposed.as_payload(T0)
    assert (
        payload["targets"][0]["budget_reported"] is True and payload["left_out"][0]["thread_title"] == "hot"
    )
    assert payload["expires_at"] == "2026-12-01T10:30:00Z" and payload["decided_at"] is None


def test_a_relay_target_gets_a_thread_id_of_its_own() -> None:
    relay = replace(
        chosen("th-host"), kind=RELAY, thread_id="", codex_thread_ref="", relay_of_thread_id="th-host"
    )

    proposed = new_plan(
        "plan-0f0f", "local", "group-1", "msg-1", "go", [relay], [], Drafts({}, "user_text"), T0, TTL
    )

    assert proposed.targets[0].thread_id == "relay-0f0f-t1"
    assert proposed.targets[0].codex_thread_ref == ""


def test_confirming_drops_skips_and_dispatches_with_the_members_current_references() -> None:
    proposed = plan("th-a", "th-b", "th-c", "th-d")
    members = {
        "th-a": member("th-a"),
        "th-b": member("th-b", archived=True),
        "th-c": member("th-c", "critical"),
        # th-d left the group
    }

    confirmed = confirm(
        proposed, ["t4"], members, (f"task-{n}" for n in itertools.count(1)), T0 + timedelta(minutes=2)
    )

    assert confirmed.status == CONFIRMED and confirmed.decided_at == T0 + timedelta(minutes=2)
    assert [(t.target_id, t.status, t.task_id) for t in confirmed.targets] == [
        ("t1", TARGET_DISPATCHED, "task-1"),
        ("t2", TARGET_SKIPPED, ""),
        ("t3", TARGET_SKIPPED, ""),
        ("t4", TARGET_DROPPED, ""),
    ]
    assert confirmed.targets[0].codex_thread_ref == "0199-th-a-now"
    assert confirmed.targets[1].status_detail == "it was archived after the plan was proposed"
    assert confirmed.targets[2].status_detail.startswith("critical (2.0 % left)")
    assert confirmed.targets[2].status_detail.endswith("(since the plan was proposed)")


def test_confirming_with_no_target_left_is_a_clear_conflict_naming_each() -> None:
    proposed = plan("th-a", "th-b")

    with pytest.raises(FailedPrecondition) as raised:
        confirm(proposed, ["t2"], {"th-a": member("th-a", archived=True)}, iter(["task-1"]), T0)

    assert raised.value.reason == DISPATCH_PLAN_TARGETS_UNAVAILABLE
    assert [(v.type, v.subject) for v in raised.value.violations] == [("DISPATCH_TARGET", "t1")]
    assert "a: it was archived after the plan was proposed" in raised.value.message


def test_drops_must_name_targets_and_keep_one() -> None:
    proposed = plan("th-a", "th-b")

    assert check_drops(proposed, []) == []
    assert check_drops(proposed, ["t2"]) == []
    unknown = check_drops(proposed, ["t9", "t2"])
    assert [v.field for v in unknown] == ["dropped_target_ids"]
    assert "names no target of plan plan-abc: t9 (its targets: t1, t2)" in unknown[0].description
    every = check_drops(proposed, ["t1", "t2"])
    assert every[0].description == "drops every target; reject the plan instead to send nothing"


def test_a_proposed_plan_past_its_expiry_reads_as_expired_and_cannot_be_decided() -> None:
    proposed = plan("th-a")
    late = T0 + TTL

    assert proposed.effective_status(late - timedelta(seconds=1)) == PROPOSED
    assert proposed.effective_status(late) == EXPIRED
    error = closed_error(proposed, late, "confirmed")
    assert error.reason == DISPATCH_PLAN_EXPIRED
    assert "expired unconfirmed at 2026-12-01T10:30:00Z" in error.message
    with pytest.raises(FailedPrecondition) as raised:
        reject(proposed, late)
    assert raised.value.reason == DISPATCH_PLAN_EXPIRED
    assert expire(proposed, late - timedelta(seconds=1)) is None
    expired = expire(proposed, late + timedelta(seconds=5))
    assert expired is not None and (expired.status, expired.decided_at) == (EXPIRED, late)
    assert supersede(proposed, "plan-new", late) is None


def test_rejecting_is_idempotent_and_closes_the_plan_to_confirmation() -> None:
    rejected = reject(plan("th-a"), T0)

    assert rejected.status == REJECTED and reject(rejected, T0) is rejected
    assert closed_error(rejected, T0, "confirmed").reason == DISPATCH_PLAN_REJECTED


def test_a_confirmed_plan_cannot_be_rejected_nor_superseded() -> None:
    confirmed = confirm(plan("th-a"), [], {"th-a": member("th-a")}, iter(["task-1"]), T0)

    with pytest.raises(FailedPrecondition) as raised:
        reject(confirmed, T0)
    assert raised.value.reason == DISPATCH_PLAN_CONFIRMED
    assert supersede(confirmed, "plan-new", T0) is None


def test_superseding_names_the_newer_plan() -> None:
    superseded = supersede(plan("th-a"), "plan-new", T0)

    assert superseded is not None and superseded.status == SUPERSEDED
    error = closed_error(superseded, T0, "confirmed")
    assert error.reason == DISPATCH_PLAN_SUPERSEDED and "plan-new" in error.message


def test_task_progress_moves_the_plan_to_a_pending_summary_once_every_task_ended() -> None:
    confirmed = confirm(
        plan("th-a", "th-b"),
        [],
        {"th-a": member("th-a"), "th-b": member("th-b")},
        iter(["task-1", "task-2"]),
        T0,
    )

    running = apply_task_status(confirmed, "task-1", "running", T0)
    assert running is not None and running.summary_status == ""
    assert apply_task_status(running, "task-1", "running", T0) is None
    assert apply_task_status(running, "task-9", "completed", T0) is None
    one_done = apply_task_status(running, "task-1", "completed", T0)
    assert one_done is not None and one_done.summary_status == ""
    assert apply_task_status(one_done, "task-1", "failed", T0) is None  # terminal stays terminal
    all_done = apply_task_status(one_done, "task-2", "failed", T0)
    assert all_done is not None and all_done.summary_status == SUMMARY_PENDING
    posted = summarised(all_done, "msg-9", T0)
    assert posted is not None and (posted.summary_status, posted.summary_message_id) == (
        SUMMARY_POSTED,
        "msg-9",
    )
    assert summarised(posted, "msg-10", T0) is None


def test_the_gate_says_where_the_group_stands() -> None:
    proposed = plan("th-a", "th-b")
    assert group_gate(None, T0).as_payload() == {
        "state": "open",
        "tasks_total": 0,
        "tasks_done": 0,
        "detail": "",
    }
    waiting = group_gate(proposed, T0)
    assert (waiting.state, waiting.tasks_total, waiting.tasks_done) == ("awaiting_confirmation", 2, 0)
    assert (
        waiting.detail
        == "a dispatch plan for 2 threads waits for your confirmation until 2026-12-01T10:30:00Z"
    )

    confirmed = confirm(
        proposed, [], {"th-a": member("th-a"), "th-b": member("th-b")}, iter(["t-1", "t-2"]), T0
    )
    executing = group_gate(confirmed, T0)
    assert (executing.state, executing.tasks_total, executing.tasks_done, executing.detail) == (
        "executing",
        2,
        0,
        "0 of 2 done",
    )
    one = apply_task_status(confirmed, "t-1", "completed", T0)
    assert one is not None and group_gate(one, T0).detail == "1 of 2 done"
    both = apply_task_status(one, "t-2", "timed_out", T0)
    assert both is not None
    summarising = group_gate(both, T0)
    assert (summarising.state, summarising.tasks_done) == ("summarising", 2)
    posted = summarised(both, "msg-9", T0)
    assert posted is not None and group_gate(posted, T0).state == "open"
    assert group_gate(proposed, T0 + TTL).state == "open"  # expired


def test_the_plan_in_view_is_the_pending_one_else_the_newest_running_one() -> None:
    older = confirm(plan("th-a", plan_id="plan-1"), [], {"th-a": member("th-a")}, iter(["t-1"]), T0)
    newer_running = replace(
        confirm(plan("th-a", plan_id="plan-2"), [], {"th-a": member("th-a")}, iter(["t-2"]), T0),
        created_at=T0 + timedelta(minutes=1),
    )
    pending = replace(plan("th-a", plan_id="plan-3"), created_at=T0 - timedelta(minutes=5))

    assert plan_in_view([older, newer_running, pending], T0) is pending
    assert plan_in_view([older, newer_running], T0) is newer_running
    assert plan_in_view([pending], T0 + TTL) is None
    assert plan_in_view([], T0) is None
