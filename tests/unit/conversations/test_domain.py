"""Pure rules of the conversations context: the ring's percent and visibility (CB-16), risk order,
next compaction risk and threads requiring handoff (CB-13), the checklist (CB-14/18), the scheduler's
handoff events and reasons, page tokens."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.domain.model import (
    CHECKLIST_KEYS,
    GROUP,
    MASTER_AGENT,
    SINGLE_DEVICE,
    HandoffState,
    Indicator,
    ThreadBudget,
    ThreadView,
    apply_handoff_event,
    at_risk,
    default_title,
    display_percent,
    handoff_reason_in_words,
    indicator_for,
    name_threads_by_title,
    next_compaction_risk_thread,
    risk_order,
    single_device_project_id,
    strategy_summary,
    threads_requiring_handoff,
    wrap_up_checklist,
)
from services.conversations.domain.validation import check_id
from services.shared.errors import FieldViolation

T0 = datetime(2026, 3, 25, 1, 0, tzinfo=UTC)


def budget(
    pct: float,
    level: str,
    *,
    expected_in: float | None = None,
    must_finish: bool = False,
    version: int = 1,
    captured: datetime = T0,
) -> ThreadBudget:
    return ThreadBudget(
        remaining_pct=pct,
        level=level,
        node_id="node-a",
        updated_at=captured,
        captured_at=captured,
        snapshot_version=version,
        must_finish_before_compaction=must_finish,
        compaction_expected_at=T0 + timedelta(minutes=expected_in) if expected_in is not None else None,
    )


def view(thread_id: str, b: ThreadBudget | None, handoff: str = "none") -> ThreadView:
    return ThreadView(thread_id, thread_id.upper(), "node-a", "worker-a", b, handoff)


@pytest.mark.parametrize(
    ("pct", "shown"),
    [(52.7, 52), (59.99, 59), (60.0, 60), (0.4, 0), (-3.0, 0), (100.0, 100), (float("nan"), 0)],
)
def test_display_percent_rounds_down_and_clamps(pct: float, shown: int) -> None:
    assert display_percent(pct) == shown


def test_ring_is_shown_for_single_device_and_master_hidden_for_group() -> None:
    b = budget(52.7, "watch")
    single = indicator_for(SINGLE_DEVICE, "th-1", b)
    assert (single.visible, single.percent, single.level, single.style) == (True, 52, "watch", "ring_percent")
    assert indicator_for(MASTER_AGENT, "m", b).visible
    assert not indicator_for(GROUP, "th-1", b).visible
    assert not indicator_for(SINGLE_DEVICE, "th-1", None).visible
    assert indicator_for(GROUP, "th-1", b).as_payload() == {
        "visible": False,
        "style": "ring_percent",
        "percent": 0,
        "level": "",
        "awaiting_reading_after_compaction": False,
    }


def test_a_ring_whose_thread_awaits_its_first_reading_after_a_compaction_says_so() -> None:
    waiting = replace(budget(100.0, "safe"), compaction_count=1, awaiting_reading_after_compaction=True)
    ring = indicator_for(SINGLE_DEVICE, "th-1", waiting)
    # The seed's four fields stay as they are (100 is the placeholder); the flag says it is not measured.
    assert ring.as_payload() == {
        "visible": True,
        "style": "ring_percent",
        "percent": 100,
        "level": "safe",
        "awaiting_reading_after_compaction": True,
    }
    measured = indicator_for(SINGLE_DEVICE, "th-1", replace(waiting, awaiting_reading_after_compaction=False))
    assert not measured.awaiting_reading_after_compaction
    assert not ring.shows_the_same_as(measured), "a real reading of 100 % after it changes the ring"
    assert not indicator_for(GROUP, "th-1", waiting).awaiting_reading_after_compaction


def test_newer_reading_wins_by_capture_time_then_version() -> None:
    old = budget(50, "watch", version=3)
    assert budget(40, "watch", version=4).is_newer_than(old)
    assert not budget(40, "watch", version=3).is_newer_than(old)
    assert not budget(40, "watch", version=9, captured=T0 - timedelta(seconds=1)).is_newer_than(old)
    assert old.is_newer_than(None)
    assert budget(40, "watch", version=4).comes_after(old.reading_order)
    assert not budget(40, "watch", version=3).comes_after(old.reading_order), "the same reading again"
    assert budget(40, "watch", version=1, captured=T0 + timedelta(seconds=1)).comes_after((T0, 9))
    assert old.comes_after(None), "no reading stored yet"


def test_risk_order_and_next_compaction_risk() -> None:
    threads = [
        view("safe", budget(80, "safe")),
        view("urgent", budget(30, "urgent")),
        view("critical", budget(20, "critical")),
        view("silent", None),
        view("watch", budget(45, "watch", expected_in=10)),
    ]
    assert [t.thread_id for t in risk_order(threads)] == ["critical", "urgent", "watch", "safe", "silent"]
    assert next_compaction_risk_thread(threads) == "critical"  # the worst level, dated or not
    undated = [t for t in threads if t.thread_id != "watch"]
    assert next_compaction_risk_thread(undated) == "critical"
    urgent_pair = [view("slow", budget(28, "urgent")), view("fast", budget(31, "urgent", expected_in=5))]
    assert next_compaction_risk_thread(urgent_pair) == "fast"  # same level: the earliest estimate
    dated_safe = [
        view("idle-critical", budget(1, "critical")),
        view("busy-safe", budget(67, "safe", expected_in=9)),
    ]
    assert next_compaction_risk_thread(dated_safe) == "idle-critical"
    assert next_compaction_risk_thread([view("busy-safe", budget(67, "safe", expected_in=9))]) == "busy-safe"
    assert next_compaction_risk_thread([view("safe", budget(80, "safe"))]) == ""


def test_threads_requiring_handoff() -> None:
    threads = [
        view("a", budget(20, "critical")),
        view("b", budget(20, "critical"), "ready"),
        view("c", budget(70, "safe"), "required"),
        view("d", budget(45, "watch")),
    ]
    assert threads_requiring_handoff(threads) == ["a", "c"]


def test_strategy_summary_states_actions_per_level() -> None:
    text = strategy_summary([view("a", budget(20.5, "critical")), view("b", budget(70, "safe"))])
    assert text.startswith("Critical: A (20%): run the pre-compaction wrap-up now")
    assert "Safe: 1 thread(s)" in text
    assert strategy_summary([view("a", None)]) == "No thread has reported its context budget yet."
    assert strategy_summary([], "scheduler says so") == "scheduler says so"


def test_a_thread_just_compacted_is_named_as_such_not_counted_safe() -> None:
    compacted = replace(budget(100, "safe"), awaiting_reading_after_compaction=True)
    text = strategy_summary([view("a", compacted), view("b", budget(70, "safe"))])
    assert text == (
        "Just compacted, waiting for their first reading: A. "
        "Safe: 1 thread(s) keep going; new subtasks go to them first."
    )


def test_safe_threads_that_cannot_take_work_are_not_offered_for_new_subtasks() -> None:
    soon = budget(67, "safe", expected_in=0.5)  # the reading predicts a compaction 30 s later
    later = budget(90, "safe", expected_in=45)
    finishing = budget(80, "safe", must_finish=True)
    text = strategy_summary(
        [
            view("soon", soon),
            view("later", later),
            view("finishing", finishing),
            view("handing", budget(75, "safe"), "ready"),
        ]
    )
    assert text == (
        "Safe but taking no new work: FINISHING (80%, it must finish its current work before compaction), "
        "SOON (67%, compaction expected within 10 minutes: its handoff comes first), "
        "HANDING (75%, its handoff is ready). "
        "Safe: 1 thread(s) keep going; new subtasks go to them first."
    )
    assert strategy_summary([view("soon", soon)]) == (
        "Safe but taking no new work: SOON (67%, compaction expected within 10 minutes: its handoff "
        "comes first). No thread can take a new subtask now."
    )


@pytest.mark.parametrize(
    ("reading", "expected"),
    [
        (budget(80, "safe"), False),  # no estimate
        (budget(80, "safe", expected_in=20), False),  # compaction far off: not at risk
        (budget(80, "safe", expected_in=10), True),  # within the 10-minute horizon
        (budget(80, "safe", expected_in=-1), True),  # overdue
        (budget(55, "watch"), True),
        (budget(9, "critical", expected_in=60), True),
        (None, False),  # never reported
    ],
)
def test_at_risk_means_watch_or_worse_or_compaction_within_the_horizon(
    reading: ThreadBudget | None, expected: bool
) -> None:
    assert at_risk(view("a", reading), T0) is expected
    assert at_risk(view("a", budget(80, "safe", expected_in=20)), T0, timedelta(minutes=30))


def test_the_schedulers_summary_names_threads_by_title() -> None:
    threads = [view("a", budget(20, "critical")), view("th-2", budget(70, "safe")), view("th-22", None)]
    scheduler = "2 threads: 1 critical, 1 safe. Wrap up and hand off a first (patch). New work goes to th-2."

    assert strategy_summary(threads, scheduler) == (
        "2 threads: 1 critical, 1 safe. Wrap up and hand off A first (patch). New work goes to TH-2."
    )
    assert name_threads_by_title("th-22 and th-2, not th-2x or xth-2", threads) == (
        "TH-22 and TH-2, not th-2x or xth-2"
    )


def test_checklist_in_force_only_when_needed() -> None:
    assert wrap_up_checklist(budget(45, "watch"), "none") == []
    items = wrap_up_checklist(budget(30, "urgent"), "none", ["patches"])
    assert [i.key for i in items if i.done] == ["patches"] and len(items) == 7
    assert wrap_up_checklist(budget(70, "safe", must_finish=True), "none") != []
    ready = wrap_up_checklist(budget(70, "safe"), "ready", ["files_touched", "last_test_run"])
    assert [(i.key, i.done) for i in ready if i.done] == [("files_touched", True), ("last_test_run", True)]


def test_checklist_keys_are_the_schedulers_item_names() -> None:
    from services.scheduler.domain.handoff import CHECKLIST_ITEMS as SCHEDULER_ITEMS

    assert CHECKLIST_KEYS == SCHEDULER_ITEMS


def test_required_then_ready_with_missing_items_then_consumed() -> None:
    required = apply_handoff_event(HandoffState(), "thread.handoff.required", "hp-1", "context budget urgent")
    assert required == HandoffState("required", "hp-1", "context budget urgent", ())
    ready = apply_handoff_event(
        required, "thread.handoff.ready", "hp-1", missing_items=["last_test_run", "evidence_links"]
    )
    assert ready == HandoffState(
        "ready",
        "hp-1",
        "context budget urgent",
        ("files_touched", "patches", "last_key_command", "open_questions", "next_actions"),
    )
    assert apply_handoff_event(ready, "thread.handoff.consumed", "hp-1") == HandoffState()
    assert apply_handoff_event(ready, "thread.handoff.expired", "hp-1") == HandoffState()


def test_events_about_an_older_package_change_nothing_but_a_new_requirement_does() -> None:
    shown = HandoffState("required", "hp-2", "compaction 1 happened with no ready handoff package")
    for event_type in ("thread.handoff.ready", "thread.handoff.consumed", "thread.handoff.expired"):
        assert apply_handoff_event(shown, event_type, "hp-1") is None
    assert apply_handoff_event(shown, "thread.handoff.required", "hp-3", "again") == HandoffState(
        "required", "hp-3", "again"
    )
    ready_without_requirement = apply_handoff_event(HandoffState(), "thread.handoff.ready", "hp-9")
    assert ready_without_requirement is not None
    assert ready_without_requirement.checklist_done == CHECKLIST_KEYS
    with pytest.raises(ValueError, match=r"thread\.schedule\.updated"):
        apply_handoff_event(shown, "thread.schedule.updated", "hp-2")


def test_a_ready_package_keeps_its_checklist_details_for_the_thread_page() -> None:
    required = apply_handoff_event(HandoffState(), "thread.handoff.required", "hp-1", "urgent")
    assert required is not None
    details = {
        "files_touched": "2 files: parser.py, lexer.py",
        "last_test_run": "no test run found in the session",
        "evidence_links": "not reported by the worker",
        "colour": "not a checklist item",
    }

    ready = apply_handoff_event(
        required,
        "thread.handoff.ready",
        "hp-1",
        missing_items=["last_test_run", "evidence_links"],
        checklist_details=details,
    )

    assert ready is not None
    assert dict(ready.checklist_details) == {key: details[key] for key in CHECKLIST_KEYS if key in details}
    shown = {
        entry.key: (entry.done, entry.detail)
        for entry in wrap_up_checklist(None, ready.status, ready.checklist_done, ready.checklist_details)
    }
    assert shown["files_touched"] == (True, "2 files: parser.py, lexer.py")
    assert shown["last_test_run"] == (False, "no test run found in the session")
    assert shown["evidence_links"] == (False, "not reported by the worker")
    assert shown["patches"] == (True, "")  # the package said nothing of it
    consumed = apply_handoff_event(ready, "thread.handoff.consumed", "hp-1")
    assert consumed == HandoffState() and dict(consumed.checklist_details) == {}


def test_a_compaction_closes_the_shown_package_and_a_late_upload_does_not_bring_it_back() -> None:
    ready = HandoffState("ready", "hp-1", "urgent", CHECKLIST_KEYS, {"patches": "1 patch"})

    closed = apply_handoff_event(ready, "thread.handoff.closed", "hp-1")

    assert closed == HandoffState()
    assert apply_handoff_event(HandoffState("required", "hp-2"), "thread.handoff.closed", "hp-1") is None
    # The draft a compaction closed becomes ready later: the scheduler says it is not the thread's.
    assert apply_handoff_event(closed, "thread.handoff.ready", "hp-1", current_for_thread=False) is None
    missing = HandoffState("required", "hp-1", "compaction 1 happened with no ready handoff package")
    assert apply_handoff_event(missing, "thread.handoff.ready", "hp-1", current_for_thread=False) == (
        HandoffState()
    )
    newer = HandoffState("required", "hp-2", "urgent")
    assert apply_handoff_event(newer, "thread.handoff.ready", "hp-1", current_for_thread=False) is None


def test_handoff_reasons_in_words() -> None:
    assert (
        handoff_reason_in_words("context_urgent", level="urgent", remaining_pct=31.46)
        == "context budget urgent (31.5 % left): wrap up before Codex compacts"
    )
    critical = handoff_reason_in_words("context_critical")
    assert critical == "context budget critical: wrap up before Codex compacts"
    assert (
        handoff_reason_in_words("compaction_near", compaction_expected_at=T0)
        == "compaction expected at 2026-03-25T01:00:00Z"
    )
    assert handoff_reason_in_words("compaction_near") == "compaction expected soon"
    assert (
        handoff_reason_in_words("handoff_missing", compaction_count=2)
        == "compaction 2 happened with no ready handoff package"
    )
    assert handoff_reason_in_words("operator asked") == "operator asked"
    assert handoff_reason_in_words("") == ""


def test_ids_and_titles() -> None:
    assert single_device_project_id("local", "th-1") == single_device_project_id("local", "th-1")
    assert single_device_project_id("local", "th-1") != single_device_project_id("other", "th-1")
    assert default_title("th-1", "/home/dev/north-line/") == "north-line"
    assert default_title("th-1", "C:\\work\\pilot") == "pilot"
    assert default_title("th-1", "") == "th-1"


def test_rings_that_differ_only_in_the_time_of_the_reading_show_the_same() -> None:
    at = datetime(2026, 3, 25, 8, 0, tzinfo=UTC)
    ring = Indicator(visible=True, percent=61, level="safe", thread_id="t", source_node_id="n", updated_at=at)
    assert ring.shows_the_same_as(replace(ring, updated_at=at + timedelta(seconds=15)))
    for field in fields(Indicator):  # every field but the time of the reading, new ones included
        if field.name == "updated_at":
            continue
        value = getattr(ring, field.name)
        other = (
            not value if isinstance(value, bool) else value + 1 if isinstance(value, int) else f"{value}-x"
        )
        assert not ring.shows_the_same_as(replace(ring, **{field.name: other})), field.name


def test_an_id_with_a_c1_control_or_bidirectional_character_is_refused_naming_the_field() -> None:
    cases = {
        "node\u202e-a": "must not contain bidirectional formatting characters",
        "node\u2066a": "must not contain bidirectional formatting characters",
        "node\x85a": "must not contain control characters",
        "node\x7fa": "must not contain control characters",
        "node\x00a": "must not contain control characters",
        " node-a": "must not have surrounding spaces",
    }
    for value, description in cases.items():
        violations: list[FieldViolation] = []
        check_id("node_id", value, violations)
        assert violations == [FieldViolation("node_id", description)], value
    fine: list[FieldViolation] = []
    check_id("node_id", "node-a.local", fine)
    assert fine == []
