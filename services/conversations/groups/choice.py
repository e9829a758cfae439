"""Which threads of a group get a message (CHAT-4): the budget-aware target choice of a dispatch plan.

Pure: member threads, their devices' presence and the time come in as values; the choice and a
reason in words for every member come out.

A member is fit for new work when, checked in this order (the first rule it fails is its reason):

1. it is not archived;
2. its device, Codex folder and Codex session id are known (a task needs all three);
3. its device is not offline (the scheduler's presence; unknown presence is said, not held against it);
4. its context budget has been reported (otherwise nobody can tell how close it is to compaction);
5. it is not critical (CB-7: wrap up and hand off first, no further context growth);
6. it is not flagged must-finish-before-compaction (CB-8);
7. it is not urgent (CB-7: it finishes its current atomic subtask before compaction);
8. no handoff is under way for it (required or ready: its work moves to a relay thread).

That leaves safe and watch threads, the ones the scheduler's `choose_thread_for_work` also accepts
(services/scheduler/domain/ranking.py, CB-17: "new subtasks go to threads with healthier budgets,
new threads, or idle threads"). Fit members are ordered healthier first (safe before watch, then the
most budget left), idle before busy within a level, then by title; at most `max_targets` of them
become targets, the rest are listed as left out. When no member is fit, one new relay thread (a new
Codex thread in the folder of a member whose device is up) takes the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from services.conversations.domain.model import (
    HANDOFF_READY,
    HANDOFF_REQUIRED,
    MAX_TITLE_LENGTH,
    ThreadBudget,
)
from services.shared.time import isoformat_utc

MEMBER = "member"
RELAY = "relay"
TARGET_KINDS = (MEMBER, RELAY)
RELAY_TITLE_SUFFIX = " (relay)"

DEFAULT_MAX_TARGETS = 10
DEFAULT_IDLE_AFTER = timedelta(minutes=5)

_LEVEL_ORDER = {"safe": 0, "watch": 1}

# Why a member is left out (LeftOut.rule), and how a count of them reads.
ARCHIVED = "archived"
METADATA = "metadata"
OFFLINE = "offline"
UNREPORTED = "unreported"
CRITICAL = "critical"
MUST_FINISH = "must_finish"
URGENT = "urgent"
HANDOFF = "handoff"
UNKNOWN_LEVEL = "unknown_level"
LIMIT = "limit"
RULE_WORDS = {
    ARCHIVED: "archived",
    METADATA: "with incomplete metadata",
    OFFLINE: "on an offline device",
    UNREPORTED: "without a reported budget",
    CRITICAL: "critical",
    MUST_FINISH: "must finish before compaction",
    URGENT: "urgent",
    HANDOFF: "handing off",
    UNKNOWN_LEVEL: "at an unknown level",
    LIMIT: "over the target limit",
}


@dataclass(frozen=True)
class MemberThread:
    """A thread of the group as the choice sees it.

    Attributes:
        node_id / codex_folder / codex_thread_ref: the thread's device, Codex working folder and
            Codex session id ("" when not known).
        budget: its latest context budget (None before its first report); percent 0-100.
        handoff_status: "none" | "required" | "ready".
        open_tasks: its chat tasks that are queued, claimed or running (they run before new work).
    """

    thread_id: str
    title: str
    node_id: str
    codex_folder: str
    codex_thread_ref: str
    archived: bool = False
    budget: ThreadBudget | None = None
    handoff_status: str = "none"
    open_tasks: int = 0


@dataclass(frozen=True)
class DevicePresence:
    """What the scheduler knows of a device (node): `online` when its local agent was seen within
    the scheduler's presence window; `last_seen_at` (UTC) None when never seen."""

    node_id: str
    online: bool
    last_seen_at: datetime | None = None


@dataclass(frozen=True)
class Presence:
    """The devices' presence at proposal time. `known` False when the scheduler could not be asked
    (then no device counts as offline, and reasons say presence is unknown)."""

    devices: Mapping[str, DevicePresence]
    known: bool = True

    def of(self, node_id: str) -> DevicePresence | None:
        """The presence of `node_id`; None when unknown (presence not known at all)."""
        if not self.known:
            return None
        return self.devices.get(node_id) or DevicePresence(node_id, online=False)


UNKNOWN_PRESENCE = Presence({}, known=False)


@dataclass(frozen=True)
class ChoiceSettings:
    """`max_targets`: most targets one plan gets (at least 1); `idle_after`: a thread whose context
    grew within this span (or that has open tasks) counts as busy."""

    max_targets: int = DEFAULT_MAX_TARGETS
    idle_after: timedelta = DEFAULT_IDLE_AFTER


@dataclass(frozen=True, slots=True)
class ChosenTarget:
    """A thread that gets the message: a member, or a new relay thread (`kind` "relay": thread_id
    and codex_thread_ref "", started in `codex_folder_ref` on `device_id`, next to the member
    `relay_of_thread_id`, titled `relay_title` of the host's). `reason` says why, in words; the
    budget is the member's (percent 0-100); a relay has none (None, ""): it is a new thread, whose
    budget is reported once it ran, never its host's."""

    kind: str
    thread_id: str
    title: str
    device_id: str
    codex_folder_ref: str
    codex_thread_ref: str
    reason: str
    remaining_pct: float | None = None
    level: str = ""
    relay_of_thread_id: str = ""


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A member that does not get the message: `rule` (one of RULE_WORDS' keys) and why in words."""

    thread_id: str
    title: str
    rule: str
    reason: str


@dataclass(frozen=True)
class TargetChoice:
    """The outcome: targets in order (best first), every other member with its reason, and
    `no_target_reason` when nothing can take the message (no target at all)."""

    targets: tuple[ChosenTarget, ...]
    left_out: tuple[LeftOut, ...]
    no_target_reason: str = ""


def choose_targets(
    members: Sequence[MemberThread],
    presence: Presence,
    now: datetime,
    settings: ChoiceSettings = ChoiceSettings(),
) -> TargetChoice:
    """The targets of a message to a group of `members` (see the module docstring).

    Args:
        members: the group's threads (archived ones included: they are left out with their reason).
        presence: the devices' presence (UNKNOWN_PRESENCE when the scheduler could not be asked).
        now: the current time (UTC), for idle versus busy.
        settings: the target limit and the idle span.

    Returns:
        A TargetChoice. O(n log n) in the number of members.
    """
    fit: list[tuple[tuple[int, int, float, str, str], MemberThread, bool]] = []
    left_out: list[LeftOut] = []
    for member in members:
        rule, reason = unfit_reason(member, presence)
        if rule:
            left_out.append(LeftOut(member.thread_id, member.title, rule, reason))
            continue
        budget = member.budget
        assert budget is not None
        busy = is_busy(member, now, settings.idle_after)
        key = (_LEVEL_ORDER[budget.level], int(busy), -budget.remaining_pct, member.title, member.thread_id)
        fit.append((key, member, busy))
    fit.sort(key=lambda entry: entry[0])
    limit = max(1, settings.max_targets)
    targets = [
        _member_target(member, busy, presence, now, settings.idle_after) for _key, member, busy in fit[:limit]
    ]
    for _key, member, _busy in fit[limit:]:
        left_out.append(
            LeftOut(
                member.thread_id,
                member.title,
                LIMIT,
                f"fit for new work, but a plan holds at most {limit} targets and healthier or idle "
                "threads came first",
            )
        )
    if targets:
        return TargetChoice(tuple(targets), tuple(left_out))
    relay = relay_target(members, presence, left_out)
    if relay is not None:
        return TargetChoice((relay,), tuple(left_out))
    return TargetChoice((), tuple(left_out), no_target_reason=_nothing_fits(members, left_out))


def unfit_reason(member: MemberThread, presence: Presence) -> tuple[str, str]:
    """Why `member` cannot take new work: (rule, reason in words), the first of rules 1-8 of the
    module docstring it fails; ("", "") when it is fit."""
    if member.archived:
        return ARCHIVED, "archived"
    missing = _missing_metadata(member)
    if missing:
        return METADATA, f"its {missing} not known yet (its device's worker registers it)"
    device = presence.of(member.node_id)
    if device is not None and not device.online:
        return OFFLINE, f"its device {member.node_id} is offline ({_last_seen(device)})"
    budget = member.budget
    if budget is None:
        return UNREPORTED, (
            "its context budget has not been reported yet, so Boss cannot tell how close it is to compaction"
        )
    left = f"{budget.remaining_pct:.1f} % left"
    if budget.level == "critical":
        return CRITICAL, f"critical ({left}): it wraps up and hands off first and takes no new work"
    if budget.must_finish_before_compaction:
        why = budget.must_finish_reason or "flagged"
        return MUST_FINISH, f"it must finish its current work before compaction ({why}; {left})"
    if budget.level == "urgent":
        return URGENT, (
            f"urgent ({left}): it finishes its current subtask before compaction and takes no new work"
        )
    if member.handoff_status in (HANDOFF_REQUIRED, HANDOFF_READY):
        return HANDOFF, (
            f"its handoff is under way ({member.handoff_status}; {left}): its work moves to a relay thread"
        )
    if budget.level not in _LEVEL_ORDER:
        return UNKNOWN_LEVEL, f"its context budget level {budget.level!r} is not one Boss knows"
    return "", ""


def is_busy(member: MemberThread, now: datetime, idle_after: timedelta) -> bool:
    """True when the thread has open tasks or its context grew within `idle_after` of `now`."""
    if member.open_tasks > 0:
        return True
    budget = member.budget
    return budget is not None and now - budget.captured_at < idle_after


def relay_target(
    members: Sequence[MemberThread], presence: Presence, left_out: Sequence[LeftOut]
) -> ChosenTarget | None:
    """A new Codex thread next to a member, when no member is fit: the host is a member that is not
    archived, whose device and folder are known and whose device is not offline; devices known to
    be online first, then the host with the most budget left, then by title. The relay is titled
    after its host (`relay_title`) and carries no budget. None when there is no such member."""
    hosts: list[tuple[tuple[int, float, str, str], MemberThread]] = []
    for member in members:
        if member.archived or not member.node_id or not member.codex_folder:
            continue
        device = presence.of(member.node_id)
        if device is not None and not device.online:
            continue
        remaining = member.budget.remaining_pct if member.budget is not None else -1.0
        hosts.append(((0 if device is not None else 1, -remaining, member.title, member.thread_id), member))
    if not hosts:
        return None
    host = min(hosts, key=lambda entry: entry[0])[1]
    why = _count_reasons(left_out)
    presence_note = "" if presence.of(host.node_id) is not None else " (device presence unknown)"
    return ChosenTarget(
        kind=RELAY,
        thread_id="",
        title=relay_title(host.title),
        device_id=host.node_id,
        codex_folder_ref=host.codex_folder,
        codex_thread_ref="",
        reason=(
            f"new Codex thread in {host.codex_folder} on {host.node_id}{presence_note}, the folder of "
            f"{host.title}: no member can take new work ({why})"
        ),
        relay_of_thread_id=host.thread_id,
    )


def relay_title(host_title: str) -> str:
    """The title of a relay thread started next to the member titled `host_title`: "<host title>
    (relay)", the host's title shortened (with "…") so the whole fits MAX_TITLE_LENGTH."""
    room = MAX_TITLE_LENGTH - len(RELAY_TITLE_SUFFIX)
    shown = host_title if len(host_title) <= room else host_title[: room - 1].rstrip() + "…"
    return shown + RELAY_TITLE_SUFFIX


def _member_target(
    member: MemberThread, busy: bool, presence: Presence, now: datetime, idle_after: timedelta
) -> ChosenTarget:
    budget = member.budget
    assert budget is not None
    words = [f"{budget.level}, {budget.remaining_pct:.1f} % left"]
    if budget.level == "watch":
        words.append("no large context")
    if member.open_tasks == 1:
        words.append("busy: 1 earlier message runs first")
    elif member.open_tasks > 1:
        words.append(f"busy: {member.open_tasks} earlier messages run first")
    elif busy:
        words.append(f"busy: its context grew at {isoformat_utc(budget.captured_at)}")
    else:
        words.append("idle")
    if presence.of(member.node_id) is None:
        words.append("device presence unknown")
    return ChosenTarget(
        kind=MEMBER,
        thread_id=member.thread_id,
        title=member.title,
        device_id=member.node_id,
        codex_folder_ref=member.codex_folder,
        codex_thread_ref=member.codex_thread_ref,
        reason=", ".join(words),
        remaining_pct=budget.remaining_pct,
        level=budget.level,
    )


def _missing_metadata(member: MemberThread) -> str:
    """The pieces of task metadata the member lacks with their verb ("device is", "Codex folder
    and Codex session id are"), "" when none."""
    if member.node_id and member.codex_folder and member.codex_thread_ref:
        return ""
    missing = [
        words
        for value, words in (
            (member.node_id, "device"),
            (member.codex_folder, "Codex folder"),
            (member.codex_thread_ref, "Codex session id"),
        )
        if not value
    ]
    if not missing:
        return ""
    return " and ".join(missing) + (" are" if len(missing) > 1 else " is")


def _last_seen(device: DevicePresence) -> str:
    if device.last_seen_at is None:
        return "never seen by Boss"
    return f"last seen at {isoformat_utc(device.last_seen_at)}"


def _count_reasons(left_out: Sequence[LeftOut]) -> str:
    """A short account of why members were left out, by rule: "2 critical, 1 archived"."""
    if not left_out:
        return "the group has no thread"
    counts: dict[str, int] = {}
    for entry in left_out:
        counts[entry.rule] = counts.get(entry.rule, 0) + 1
    return ", ".join(f"{count} {RULE_WORDS.get(rule, rule)}" for rule, count in counts.items())


def _nothing_fits(members: Sequence[MemberThread], left_out: Sequence[LeftOut]) -> str:
    if not members:
        return "the group has no thread"
    reasons = "; ".join(f"{entry.title}: {entry.reason}" for entry in left_out)
    return f"no thread of the group can take new work and none can host a new relay thread ({reasons})"
