"""A group's relay thread (services/conversations/groups/relay.py and choice.relay_title): its title
after its host, what a relay task's report makes of it, and the plan once it is taken in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.conversations.chat.domain import StatusReport
from services.conversations.domain.model import MAX_TITLE_LENGTH
from services.conversations.groups.choice import MEMBER, RELAY, ChosenTarget, relay_title
from services.conversations.groups.plans import DispatchPlan, Drafts, new_plan
from services.conversations.groups.relay import RelayThread, relay_thread_of, with_relay_taken_in

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SESSION = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"


def target(kind: str, thread_id: str = "", codex_thread_ref: str = "") -> ChosenTarget:
    return ChosenTarget(
        kind=kind,
        thread_id=thread_id,
        title=relay_title("south-line") if kind == RELAY else "north",
        device_id="mac-01",
        codex_folder_ref="/Users/dev/south-line",
        codex_thread_ref=codex_thread_ref,
        reason="why",
        relay_of_thread_id="th-south" if kind == RELAY else "",
    )


def plan_of(*chosen: ChosenTarget) -> DispatchPlan:
    return new_plan(
        "plan-0f0f",
        "local",
        "group-1",
        "msg-1",
        "go",
        list(chosen),
        [],
        Drafts({}, "user_text"),
        T0,
        timedelta(minutes=30),
    )


def ended(codex_session_id: str = SESSION) -> StatusReport:
    return StatusReport(
        task_id="task-1",
        owner_id="local",
        status="completed",
        reply_text="done",
        codex_session_id=codex_session_id,
        worker_id="worker-a",
    )


def test_a_relay_is_titled_after_its_host_within_the_title_limit() -> None:
    assert relay_title("south-line") == "south-line (relay)"
    long = relay_title("x" * MAX_TITLE_LENGTH)
    assert len(long) == MAX_TITLE_LENGTH and long.endswith("… (relay)")
    assert len(relay_title("y" * (MAX_TITLE_LENGTH - 8))) == MAX_TITLE_LENGTH


def test_a_relay_tasks_report_of_its_session_names_the_thread_to_take_in() -> None:
    plan = plan_of(target(RELAY))
    (relay,) = plan.targets

    assert relay_thread_of(plan, relay, ended()) == RelayThread(
        thread_id=SESSION,
        owner_id="local",
        node_id="mac-01",
        worker_id="worker-a",
        codex_folder="/Users/dev/south-line",
        title="south-line (relay)",
        group_project_id="group-1",
    )


def test_nothing_is_taken_in_for_a_member_a_relay_taken_in_already_or_a_report_without_a_session() -> None:
    plan = plan_of(target(MEMBER, "th-north", "0199-north"), target(RELAY))
    member, relay = plan.targets
    taken = with_relay_taken_in(plan, relay.target_id, SESSION)

    assert relay_thread_of(plan, member, ended()) is None
    assert relay_thread_of(taken, taken.targets[1], ended()) is None
    assert relay_thread_of(plan, relay, ended("")) is None
    assert relay_thread_of(plan, relay, ended("a/b")) is None  # not a thread id a client can open


def test_taking_a_relay_in_points_only_its_target_at_the_new_thread() -> None:
    plan = plan_of(target(MEMBER, "th-north", "0199-north"), target(RELAY))

    taken = with_relay_taken_in(plan, "t2", SESSION)

    assert [(t.thread_id, t.codex_thread_ref) for t in taken.targets] == [
        ("th-north", "0199-north"),
        (SESSION, SESSION),
    ]
    assert [(t.thread_id, t.codex_thread_ref) for t in plan.targets][1] == ("relay-0f0f-t2", "")
