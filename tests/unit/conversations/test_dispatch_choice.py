"""The target choice of a group's dispatch plan (CHAT-4): never a critical, urgent or must-finish
thread, nor an archived one, one on an offline device or one whose budget nobody knows, each with
its reason in words; healthier first, idle before busy; at most the target limit; a new relay thread
when no member is fit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.conversations.domain.model import ThreadBudget
from services.conversations.groups.choice import (
    MEMBER,
    RELAY,
    UNKNOWN_PRESENCE,
    ChoiceSettings,
    DevicePresence,
    MemberThread,
    Presence,
    choose_targets,
)

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(hours=2)


def budget(pct: float, level: str, *, captured_at: datetime = LONG_AGO, **fields: object) -> ThreadBudget:
    return ThreadBudget(
        remaining_pct=pct,
        level=level,
        node_id="mac-01",
        updated_at=captured_at,
        captured_at=captured_at,
        **fields,  # type: ignore[arg-type]
    )


def member(thread_id: str, pct: float | None = 80.0, level: str = "safe", **fields: object) -> MemberThread:
    values: dict[str, object] = {
        "thread_id": thread_id,
        "title": thread_id.replace("th-", ""),
        "node_id": "mac-01",
        "codex_folder": f"/Users/dev/{thread_id}",
        "codex_thread_ref": f"0199-{thread_id}",
        "budget": budget(pct, level) if pct is not None else None,
        **fields,
    }
    return MemberThread(**values)  # type: ignore[arg-type]


ONLINE = Presence(
    {"mac-01": DevicePresence("mac-01", True, NOW), "mac-02": DevicePresence("mac-02", True, NOW)}
)


def reasons_of(choice: object) -> dict[str, str]:
    return {entry.thread_id: entry.reason for entry in choice.left_out}  # type: ignore[attr-defined]


def test_healthier_threads_come_first_and_a_critical_one_is_left_out_with_its_reason() -> None:
    members = [
        member("th-critical", 3.2, "critical"),
        member("th-watch", 45.5, "watch"),
        member("th-safe-low", 61.0, "safe"),
        member("th-safe-high", 92.0, "safe"),
    ]

    choice = choose_targets(members, ONLINE, NOW)

    assert [target.thread_id for target in choice.targets] == ["th-safe-high", "th-safe-low", "th-watch"]
    assert [target.reason for target in choice.targets] == [
        "safe, 92.0 % left, idle",
        "safe, 61.0 % left, idle",
        "watch, 45.5 % left, no large context, idle",
    ]
    assert reasons_of(choice) == {
        "th-critical": "critical (3.2 % left): it wraps up and hands off first and takes no new work"
    }
    assert all(target.kind == MEMBER for target in choice.targets)
    assert choice.targets[0].codex_thread_ref == "0199-th-safe-high"
    assert (choice.targets[0].remaining_pct, choice.targets[0].level) == (92.0, "safe")


def test_idle_threads_come_before_busy_ones_of_the_same_level() -> None:
    members = [
        member("th-queued", 95.0, open_tasks=2),
        member("th-growing", 90.0, budget=budget(90.0, "safe", captured_at=NOW - timedelta(minutes=1))),
        member("th-idle", 70.0),
        member("th-watch-idle", 50.0, "watch"),
    ]

    choice = choose_targets(members, ONLINE, NOW)

    assert [target.thread_id for target in choice.targets] == [
        "th-idle",
        "th-queued",
        "th-growing",
        "th-watch-idle",
    ]
    by_id = {target.thread_id: target.reason for target in choice.targets}
    assert by_id["th-queued"] == "safe, 95.0 % left, busy: 2 earlier messages run first"
    assert by_id["th-growing"] == "safe, 90.0 % left, busy: its context grew at 2026-12-01T09:59:00Z"


def test_the_idle_span_is_a_setting() -> None:
    grown = budget(90.0, "safe", captured_at=NOW - timedelta(minutes=3))
    members = [member("th-recent", budget=grown), member("th-other", 60.0)]

    five_minutes = choose_targets(members, ONLINE, NOW, ChoiceSettings(idle_after=timedelta(minutes=5)))
    one_minute = choose_targets(members, ONLINE, NOW, ChoiceSettings(idle_after=timedelta(minutes=1)))

    assert [target.thread_id for target in five_minutes.targets] == ["th-other", "th-recent"]
    assert [target.thread_id for target in one_minute.targets] == ["th-recent", "th-other"]


def test_every_unfit_member_is_left_out_with_the_first_rule_it_fails() -> None:
    members = [
        member("th-archived", archived=True),
        member("th-no-ref", codex_thread_ref=""),
        member("th-no-device", node_id="", codex_folder=""),
        member("th-offline", node_id="mac-03"),
        member("th-never-seen", node_id="mac-04"),
        member("th-unreported", None),
        member(
            "th-must-finish",
            70.0,
            budget=budget(
                70.0, "safe", must_finish_before_compaction=True, must_finish_reason="uncommitted patch"
            ),
        ),
        member("th-urgent", 14.0, "urgent"),
        member("th-handoff", 40.0, "watch", handoff_status="required"),
        member("th-fit", 80.0),
    ]
    presence = Presence(
        {
            "mac-01": DevicePresence("mac-01", True, NOW),
            "mac-03": DevicePresence("mac-03", False, datetime(2026, 12, 1, 9, 30, tzinfo=UTC)),
        }
    )

    choice = choose_targets(members, presence, NOW)

    assert [target.thread_id for target in choice.targets] == ["th-fit"]
    assert reasons_of(choice) == {
        "th-archived": "archived",
        "th-no-ref": "its Codex session id is not known yet (its device's worker registers it)",
        "th-no-device": "its device and Codex folder are not known yet (its device's worker registers it)",
        "th-offline": "its device mac-03 is offline (last seen at 2026-12-01T09:30:00Z)",
        "th-never-seen": "its device mac-04 is offline (never seen by Boss)",
        "th-unreported": (
            "its context budget has not been reported yet, so Boss cannot tell how close it is to compaction"
        ),
        "th-must-finish": (
            "it must finish its current work before compaction (uncommitted patch; 70.0 % left)"
        ),
        "th-urgent": (
            "urgent (14.0 % left): it finishes its current subtask before compaction and takes no new work"
        ),
        "th-handoff": "its handoff is under way (required; 40.0 % left): its work moves to a relay thread",
    }
    assert {entry.rule for entry in choice.left_out} == {
        "archived",
        "metadata",
        "offline",
        "unreported",
        "must_finish",
        "urgent",
        "handoff",
    }


def test_unknown_presence_is_said_and_not_held_against_a_thread() -> None:
    choice = choose_targets([member("th-1", node_id="mac-09")], UNKNOWN_PRESENCE, NOW)

    assert [target.thread_id for target in choice.targets] == ["th-1"]
    assert choice.targets[0].reason == "safe, 80.0 % left, idle, device presence unknown"


def test_at_most_the_target_limit_of_fit_threads_get_it_and_the_rest_are_told_why() -> None:
    members = [member(f"th-{index:02d}", 50.0 + index) for index in range(5)]

    choice = choose_targets(members, ONLINE, NOW, ChoiceSettings(max_targets=2))

    assert [target.thread_id for target in choice.targets] == ["th-04", "th-03"]
    assert sorted(reasons_of(choice)) == ["th-00", "th-01", "th-02"]
    assert reasons_of(choice)["th-00"] == (
        "fit for new work, but a plan holds at most 2 targets and healthier or idle threads came first"
    )


def test_a_new_relay_thread_takes_the_message_when_no_member_is_fit() -> None:
    members = [
        member("th-critical", 2.0, "critical"),
        member("th-urgent", 12.0, "urgent", node_id="mac-02", codex_folder="/Users/dev/south-line"),
        member("th-offline", 90.0, node_id="mac-03"),
        member("th-archived", 95.0, archived=True),
    ]

    choice = choose_targets(members, ONLINE, NOW)

    assert len(choice.targets) == 1
    relay = choice.targets[0]
    assert (relay.kind, relay.thread_id, relay.codex_thread_ref) == (RELAY, "", "")
    # The host with the most budget left among members on an online device with a folder.
    assert (relay.device_id, relay.codex_folder_ref, relay.relay_of_thread_id) == (
        "mac-02",
        "/Users/dev/south-line",
        "th-urgent",
    )
    assert relay.reason == (
        "new Codex thread in /Users/dev/south-line on mac-02, the folder of urgent: no member can take new "
        "work (1 critical, 1 urgent, 1 on an offline device, 1 archived)"
    )
    # Titled after its host, but a new thread: no budget of its own yet, never the host's.
    assert relay.title == "urgent (relay)"
    assert (relay.remaining_pct, relay.level) == (None, "")
    assert len(choice.left_out) == 4 and choice.no_target_reason == ""


def test_nothing_is_chosen_when_no_member_can_even_host_a_relay_thread() -> None:
    members = [member("th-offline", node_id="mac-03"), member("th-archived", archived=True)]

    choice = choose_targets(members, ONLINE, NOW)

    assert choice.targets == ()
    assert choice.no_target_reason == (
        "no thread of the group can take new work and none can host a new relay thread (offline: its device "
        "mac-03 is offline (never seen by Boss); archived: archived)"
    )


def test_an_empty_group_gets_no_target() -> None:
    choice = choose_targets([], ONLINE, NOW)

    assert (choice.targets, choice.no_target_reason) == ((), "the group has no thread")
