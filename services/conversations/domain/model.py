"""The conversations context's values and rules: threads, projects, the home-list ring (CB-12, CB-16),
the project detail's risk view (CB-13) and the wrap-up checklist (CB-14, CB-18).

Everything here is pure: dataclasses in, dataclasses out, no clock reads except through arguments.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from services.shared.time import isoformat_utc

MASTER_AGENT = "master_agent"
SINGLE_DEVICE = "single_device"
GROUP = "group"
CONVERSATION_TYPES = (MASTER_AGENT, SINGLE_DEVICE, GROUP)

LEVELS = ("safe", "watch", "urgent", "critical")
"""Context budget levels, healthiest first (CB-7)."""

RING_STYLE = "ring_percent"
DEFAULT_OWNER_ID = "local"
MASTER_ALIAS = "master-agent"
"""The project id clients use for their master agent conversation (CHAT-2's path)."""

HANDOFF_NONE = "none"
HANDOFF_REQUIRED = "required"
HANDOFF_READY = "ready"

AUTHOR_KINDS = ("user", "thread", "master", "system")
MAX_TITLE_LENGTH = 200
MAX_MESSAGE_LENGTH = 100_000


def single_device_project_id(owner_id: str, thread_id: str) -> str:
    """The deterministic id of a thread's own project: "proj-" + 20 hex digits of SHA-1(owner, thread).

    Deterministic so that a repeated registration (or a budget report racing it) lands on one project.
    """
    digest = hashlib.sha1(f"{owner_id}\x00{thread_id}".encode()).hexdigest()[:20]
    return f"proj-{digest}"


def master_project_id(owner_id: str) -> str:
    """The id of an owner's master agent project: "master-" + 20 hex digits of SHA-1(owner)."""
    return "master-" + hashlib.sha1(owner_id.encode()).hexdigest()[:20]


def conversation_id_of(project_id: str) -> str:
    """The home-list row id of a project (seed §6.1 uses "conv-proj-001")."""
    return f"conv-{project_id}"


def default_title(thread_id: str, codex_folder: str) -> str:
    """A thread's title when the worker gave none: the folder's last component, else the thread id."""
    folder = codex_folder.rstrip("/\\")
    name = folder.replace("\\", "/").rsplit("/", 1)[-1] if folder else ""
    return (name or thread_id)[:MAX_TITLE_LENGTH]


def display_percent(remaining_pct: float) -> int:
    """The whole percent shown on every ring (home list, project detail, thread page: CB-16, CB-19).

    Rounded *down* and clamped to 0-100, so a thread is never shown healthier than it is (59.9 % shows
    59, the same side of the 60 % safe threshold as the level).
    """
    if math.isnan(remaining_pct):
        return 0
    return max(0, min(100, math.floor(remaining_pct)))


@dataclass(frozen=True)
class ThreadBudget:
    """The latest context budget of one thread, as context_budget published it.

    Attributes:
        remaining_pct: percent 0-100 of the usable context left (SPEC D-1).
        level: "safe" | "watch" | "urgent" | "critical" (the server's classification).
        updated_at: when context_budget committed the reading (UTC).
        captured_at: when the worker took the reading (UTC); orders readings.
        awaiting_reading_after_compaction: Codex compacted the thread after its last reading:
            "compacted, waiting for the first reading" (remaining_pct is then 100, not measured).
        compaction_limit_source: where the auto-compact limit came from ("configured",
            "model_default", "assumed"; "" when not reported).
    """

    remaining_pct: float
    level: str
    node_id: str
    updated_at: datetime
    captured_at: datetime
    snapshot_version: int = 0
    must_finish_before_compaction: bool = False
    must_finish_reason: str = ""
    compaction_expected_at: datetime | None = None
    last_compaction_at: datetime | None = None
    compaction_count: int = 0
    estimated_remaining_turns: int | None = None
    master_actions: tuple[str, ...] = ()
    awaiting_reading_after_compaction: bool = False
    compaction_limit_source: str = ""

    @property
    def percent(self) -> int:
        """The whole percent shown on rings."""
        return display_percent(self.remaining_pct)

    def is_newer_than(self, other: ThreadBudget | None) -> bool:
        """True when this reading should replace `other`: later capture, or the same capture with a
        higher snapshot_version. Equal readings are not newer (a replayed event changes nothing)."""
        return self.comes_after(None if other is None else other.reading_order)

    @property
    def reading_order(self) -> tuple[datetime, int]:
        """What orders readings of a thread: capture time, then snapshot_version."""
        return (self.captured_at, self.snapshot_version)

    def comes_after(self, reading_order: tuple[datetime, int] | None) -> bool:
        """`is_newer_than` a reading known only by its `reading_order` (None: no reading yet)."""
        return reading_order is None or self.reading_order > reading_order


@dataclass(frozen=True)
class Indicator:
    """The home-list ring (CB-12): shown for single_device projects and the master agent's main
    thread, hidden for groups (CB-5, CB-16).

    `awaiting_reading_after_compaction`: the shown thread's latest report is "compacted, waiting for
    the first reading"; its `percent` (100) is then a placeholder, not a measurement, and the ring
    says "compacted" instead until the next real reading."""

    visible: bool
    percent: int = 0
    level: str = ""
    style: str = RING_STYLE
    thread_id: str = ""
    source_node_id: str = ""
    updated_at: datetime | None = None
    must_finish_before_compaction: bool = False
    awaiting_reading_after_compaction: bool = False

    def as_payload(self) -> dict[str, object]:
        """The `context_budget_indicator` JSON object: the seed's four fields (§6.1) plus
        `awaiting_reading_after_compaction`."""
        return {
            "visible": self.visible,
            "style": self.style,
            "percent": self.percent,
            "level": self.level,
            "awaiting_reading_after_compaction": self.awaiting_reading_after_compaction,
        }

    def shows_the_same_as(self, other: Indicator) -> bool:
        """Whether the two rings show the same thing: visibility, whole percent, level, thread,
        source node, must-finish flag and "compacted, waiting for the first reading". Only the time
        of the reading may differ: a new reading of 61.8 % after one of 61.6 % leaves a ring that
        shows 61 % unchanged."""
        return self._shown() == other._shown()

    def _shown(self) -> tuple[object, ...]:
        """Every field but `updated_at`."""
        return (
            self.visible,
            self.percent,
            self.level,
            self.style,
            self.thread_id,
            self.source_node_id,
            self.must_finish_before_compaction,
            self.awaiting_reading_after_compaction,
        )


HIDDEN = Indicator(visible=False)


def indicator_for(conversation_type: str, thread_id: str, budget: ThreadBudget | None) -> Indicator:
    """The ring of a project conversation whose shown thread is `thread_id` with `budget`.

    CB-16: a group never shows one (several threads' budgets must not be squeezed into one value); a
    single_device project shows its thread's budget; the master agent shows its current main thread's
    budget (not a total of the system). No budget reported yet -> hidden.
    """
    if conversation_type == GROUP or budget is None or not thread_id:
        return HIDDEN
    return Indicator(
        visible=True,
        percent=budget.percent,
        level=budget.level,
        thread_id=thread_id,
        source_node_id=budget.node_id,
        updated_at=budget.updated_at,
        must_finish_before_compaction=budget.must_finish_before_compaction,
        awaiting_reading_after_compaction=budget.awaiting_reading_after_compaction,
    )


@dataclass(frozen=True)
class ThreadView:
    """One thread of a project with its budget (None before its first report) and handoff state."""

    thread_id: str
    title: str
    node_id: str
    worker_id: str
    budget: ThreadBudget | None
    handoff_status: str = HANDOFF_NONE


def _level_rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else -1


def risk_order(threads: Iterable[ThreadView]) -> list[ThreadView]:
    """Threads most at risk first: worst level, then must-finish, then earliest expected compaction,
    then lowest percent; threads that never reported last (ordered by id)."""

    def key(view: ThreadView) -> tuple[int, int, int, float, float, str]:
        budget = view.budget
        if budget is None:
            return (1, 0, 0, 0.0, 0.0, view.thread_id)
        expected = budget.compaction_expected_at.timestamp() if budget.compaction_expected_at else math.inf
        return (
            0,
            -_level_rank(budget.level),
            0 if budget.must_finish_before_compaction else 1,
            expected,
            budget.remaining_pct,
            view.thread_id,
        )

    return sorted(threads, key=key)


COMPACTION_RISK_HORIZON = timedelta(minutes=10)
"""How soon an expected compaction puts a safe thread at risk: the horizon of context_budget's
compaction_risk alert (services/context_budget/domain/alerts.py DEFAULT_COMPACTION_RISK_HORIZON)."""


def at_risk(view: ThreadView, now: datetime, horizon: timedelta = COMPACTION_RISK_HORIZON) -> bool:
    """Whether a thread is close to compaction: it reported a level of watch or worse, or its
    expected compaction (UTC) is within `horizon` of `now` (UTC). A safe thread whose compaction
    is further away, or that never reported, is not."""
    budget = view.budget
    if budget is None:
        return False
    if budget.level != LEVELS[0]:
        return True
    expected = budget.compaction_expected_at
    return expected is not None and expected - now <= horizon


def next_compaction_risk_thread(threads: Sequence[ThreadView]) -> str:
    """CB-13 `next_compaction_risk_thread_id`: the thread expected to compact first.

    The first thread in `risk_order` that is at risk: its level is watch or worse, or it has a
    compaction estimate. The level comes first because an estimate needs a recent token rate (an
    idle thread at 1 % has none, yet compacts at its next turn); among threads of the same level the
    earliest estimate, then the lowest percent, wins. "" when no thread is at risk.
    """
    for view in risk_order(threads):
        budget = view.budget
        if budget is not None and (budget.level != "safe" or budget.compaction_expected_at is not None):
            return view.thread_id
    return ""


def threads_requiring_handoff(threads: Sequence[ThreadView]) -> list[str]:
    """CB-13 `threads_requiring_handoff`: a handoff was required and is not ready yet, or the thread is
    critical (CB-7: run the wrap-up now) and has no ready package. In risk order."""
    return [
        t.thread_id
        for t in risk_order(threads)
        if t.handoff_status == HANDOFF_REQUIRED
        or (t.budget is not None and t.budget.level == "critical" and t.handoff_status != HANDOFF_READY)
    ]


def strategy_summary(threads: Sequence[ThreadView], scheduler_summary: str = "") -> str:
    """CB-13 `master_context_strategy_summary` in words.

    The scheduler's own summary wins when it published one, with the threads it names by id named
    by title as everywhere else in the app (`name_threads_by_title`); otherwise the CB-7 actions per
    level are stated for the threads at each level (the low budget is stressed here, not on the
    home list: CB-16). A thread compacted after its last reading is named as such, never counted
    as safe: the budget it shows until its next reading is a placeholder.
    """
    if scheduler_summary:
        return name_threads_by_title(scheduler_summary, threads)
    reported = [t for t in threads if t.budget is not None]
    if not reported:
        return "No thread has reported its context budget yet."
    by_level: dict[str, list[ThreadView]] = {level: [] for level in LEVELS}
    compacted: list[ThreadView] = []  # their "safe 100 %" is a placeholder, not a measurement
    for view in risk_order(reported):
        if view.budget is not None and view.budget.awaiting_reading_after_compaction:
            compacted.append(view)
            continue
        by_level[view.budget.level if view.budget else "safe"].append(view)  # type: ignore[index]

    def names(views: list[ThreadView]) -> str:
        return ", ".join(f"{v.title or v.thread_id} ({v.budget.percent if v.budget else 0}%)" for v in views)

    parts: list[str] = []
    if by_level["critical"]:
        parts.append(
            f"Critical: {names(by_level['critical'])}: run the pre-compaction wrap-up now and "
            "allow no further context growth."
        )
    if by_level["urgent"]:
        parts.append(
            f"Urgent: {names(by_level['urgent'])}: finish the current atomic subtask first and "
            "pre-create the relay thread."
        )
    if by_level["watch"]:
        parts.append(
            f"Watch: {names(by_level['watch'])}: no more large background context; start "
            "preparing the handoff."
        )
    if compacted:
        titles = ", ".join(v.title or v.thread_id for v in compacted)
        parts.append(f"Just compacted, waiting for their first reading: {titles}.")
    held = [(view, why) for view in by_level["safe"] if (why := _why_safe_is_held(view))]
    if held:
        listed = ", ".join(
            f"{v.title or v.thread_id} ({v.budget.percent if v.budget else 0}%, {why})" for v, why in held
        )
        parts.append(f"Safe but taking no new work: {listed}.")
    free = len(by_level["safe"]) - len(held)
    if free:
        parts.append(f"Safe: {free} thread(s) keep going; new subtasks go to them first.")
    elif by_level["safe"]:
        parts.append("No thread can take a new subtask now.")
    return " ".join(parts)


def _why_safe_is_held(view: ThreadView) -> str:
    """Why a safe thread takes no new subtask ("" when it may): it must finish before compaction
    (CB-8), its handoff is under way, or its compaction is expected within COMPACTION_RISK_HORIZON
    of its reading (the rule of context_budget's compaction_risk alert)."""
    budget = view.budget
    if budget is None:
        return ""
    if budget.must_finish_before_compaction:
        return "it must finish its current work before compaction"
    if view.handoff_status in (HANDOFF_REQUIRED, HANDOFF_READY):
        return f"its handoff is {view.handoff_status}"
    if at_risk(view, budget.captured_at):
        minutes = round(COMPACTION_RISK_HORIZON.total_seconds() / 60)
        return f"compaction expected within {minutes} minutes: its handoff comes first"
    return ""


def name_threads_by_title(text: str, threads: Sequence[ThreadView]) -> str:
    """`text` with every whole occurrence of one of `threads`' ids replaced by that thread's title
    (threads without a title keep their id). An id counts only where no letter, digit, `_` or `-`
    touches it, so an id never matches inside a word or a longer id."""
    titles = {
        view.thread_id: view.title
        for view in threads
        if view.title and view.title != view.thread_id and view.thread_id in text
    }
    if not titles:  # the common case on the projection's hot path: no pattern to build
        return text
    ids = "|".join(re.escape(thread_id) for thread_id in sorted(titles, key=len, reverse=True))
    return re.sub(rf"(?<![\w-])(?:{ids})(?![\w-])", lambda match: titles[match.group(0)], text)


CHECKLIST_ITEMS: tuple[tuple[str, str], ...] = (
    ("files_touched", "Files touched by the current change"),
    ("patches", "Patches done and not done"),
    ("last_key_command", "The last key command and its result"),
    ("last_test_run", "The last test conclusion"),
    ("open_questions", "Open questions"),
    ("next_actions", "Suggested next actions for the next thread"),
    ("evidence_links", "Links to required evidence"),
)
"""The CB-18 wrap-up checklist, in the order the spec lists it. The keys are the scheduler's checklist
item names (`services/scheduler/domain/handoff.py` CHECKLIST_ITEMS, the worker's and the scheduler
proto's), so its `missing_items` name these keys directly."""

CHECKLIST_KEYS: tuple[str, ...] = tuple(key for key, _label in CHECKLIST_ITEMS)


@dataclass(frozen=True)
class ChecklistEntry:
    """One line of the wrap-up checklist: `detail` is what the thread's ready handoff package says
    of the item (the scheduler's checklist detail, in words), "" while no package is ready."""

    key: str
    label: str
    done: bool = False
    detail: str = ""


def wrap_up_checklist(
    budget: ThreadBudget | None,
    handoff_status: str,
    done_keys: Iterable[str] = (),
    details: Mapping[str, str] | None = None,
) -> list[ChecklistEntry]:
    """The checklist the thread page shows (CB-14).

    In force when the thread is urgent or critical, must finish before compaction, or a handoff was
    required; empty while nothing needs wrapping up. `done_keys` are the items the thread's handoff
    package holds (see `apply_handoff_event`: every item of a ready package except those the
    scheduler reported missing); nothing is done while the package is only required. `details`
    (item key -> detail in words, `HandoffState.checklist_details`) are the ready package's own
    words for each item, done or missing; an item without one has detail "".
    """
    in_force = handoff_status in (HANDOFF_REQUIRED, HANDOFF_READY) or (
        budget is not None
        and (budget.level in ("urgent", "critical") or budget.must_finish_before_compaction)
    )
    if not in_force:
        return []
    done = set(done_keys)
    words = details or {}
    return [ChecklistEntry(key, label, key in done, words.get(key, "")) for key, label in CHECKLIST_ITEMS]


# ---------------------------------------------------------------------------------------------------
# The scheduler's handoff events (services/scheduler/service.py), as this context applies them.

SCHEDULER_HANDOFF_REQUIRED = "thread.handoff.required"
SCHEDULER_HANDOFF_READY = "thread.handoff.ready"
SCHEDULER_HANDOFF_CONSUMED = "thread.handoff.consumed"
SCHEDULER_HANDOFF_EXPIRED = "thread.handoff.expired"
SCHEDULER_HANDOFF_CLOSED = "thread.handoff.closed"
"""A compaction ended the thread's handoff cycle: it no longer presents the named package (whose
own status the scheduler leaves unchanged)."""
SCHEDULER_HANDOFF_EVENTS = (
    SCHEDULER_HANDOFF_REQUIRED,
    SCHEDULER_HANDOFF_READY,
    SCHEDULER_HANDOFF_CONSUMED,
    SCHEDULER_HANDOFF_EXPIRED,
    SCHEDULER_HANDOFF_CLOSED,
)


@dataclass(frozen=True)
class HandoffState:
    """A thread's handoff state as the thread page shows it.

    Attributes:
        status: "none" | "required" | "ready".
        handoff_package_id: the scheduler's package the state is about ("" when none).
        reason: why the handoff was required, in words (kept while the package is ready).
        checklist_done: CB-18 checklist keys the package holds.
        checklist_details: CB-18 checklist key -> the ready package's detail of the item in words
            (done or missing items alike); empty unless the status is "ready".
    """

    status: str = HANDOFF_NONE
    handoff_package_id: str = ""
    reason: str = ""
    checklist_done: tuple[str, ...] = ()
    checklist_details: Mapping[str, str] = field(default_factory=dict)


def handoff_reason_in_words(
    reason: str,
    *,
    level: str = "",
    remaining_pct: float | None = None,
    compaction_expected_at: datetime | None = None,
    compaction_count: int | None = None,
) -> str:
    """The scheduler's reason code of `thread.handoff.required` in words for the thread page.

    Codes (services/scheduler/domain/guarantee.py `risk_reason`, and service.py for the alert):
    "context_urgent" / "context_critical" (the budget level), "compaction_near" (Codex is expected to
    compact within the scheduler's horizon), "handoff_missing" (a compaction happened with no ready
    package). Any other text is returned unchanged; "" stays "".
    """
    if reason in ("context_urgent", "context_critical"):
        shown = level or reason.removeprefix("context_")
        left = f" ({remaining_pct:.1f} % left)" if remaining_pct is not None else ""
        return f"context budget {shown}{left}: wrap up before Codex compacts"
    if reason == "compaction_near":
        if compaction_expected_at is None:
            return "compaction expected soon"
        return f"compaction expected at {isoformat_utc(compaction_expected_at)}"
    if reason == "handoff_missing":
        which = f"compaction {compaction_count}" if compaction_count else "a compaction"
        return f"{which} happened with no ready handoff package"
    return reason


def apply_handoff_event(
    current: HandoffState,
    event_type: str,
    handoff_package_id: str,
    reason: str = "",
    missing_items: Iterable[str] = (),
    checklist_details: Mapping[str, str] | None = None,
    current_for_thread: bool = True,
) -> HandoffState | None:
    """The thread's handoff state after one of the scheduler's handoff events; None when the event
    is about an older package than the one the thread shows (stale: change nothing).

    - `thread.handoff.required`: always applies (a new requirement replaces whatever was shown);
      status "required", nothing of the checklist done yet.
    - `thread.handoff.ready`: status "ready" and every CB-18 item done except `missing_items` (the
      scheduler's names of items the worker looked for and did not find); the reason is kept, and
      `checklist_details` (item -> the package's detail in words; other keys are dropped) are kept
      so the thread page shows the package's own words. When the scheduler says the package is
      not `current_for_thread` (a compaction closed it before it became ready), the thread does
      not present it: back to "none" if the thread shows that package, else stale.
    - `thread.handoff.consumed` / `thread.handoff.expired`: back to "none".
    - `thread.handoff.closed` (a compaction ended the handoff cycle): back to "none"; the package
      keeps its status at the scheduler, it is just no longer the thread's.

    Ready, consumed, expired and closed are stale when the thread shows another, non-empty package
    id. Raises ValueError for an event type that is not one of SCHEDULER_HANDOFF_EVENTS.
    """
    if event_type == SCHEDULER_HANDOFF_REQUIRED:
        return HandoffState(HANDOFF_REQUIRED, handoff_package_id, reason)
    if event_type not in SCHEDULER_HANDOFF_EVENTS:
        raise ValueError(f"not a handoff event: {event_type!r}")
    if current.handoff_package_id and handoff_package_id != current.handoff_package_id:
        return None
    if event_type == SCHEDULER_HANDOFF_READY and not current_for_thread:
        return HandoffState() if current.handoff_package_id == handoff_package_id else None
    if event_type == SCHEDULER_HANDOFF_READY:
        missing = set(missing_items)
        done = tuple(key for key in CHECKLIST_KEYS if key not in missing)
        given = checklist_details or {}
        details = {key: given[key] for key in CHECKLIST_KEYS if key in given}
        return HandoffState(HANDOFF_READY, handoff_package_id, current.reason or reason, done, details)
    return HandoffState()


@dataclass(frozen=True)
class SortKey:
    """Position of a project in the home list: pinned first, then the latest reply (or creation when
    it has no reply yet) first, then project id (descending) to break ties."""

    pinned: bool
    sort_at: datetime
    project_id: str


@dataclass(frozen=True)
class Registration:
    """A validated RegisterThread command."""

    thread_id: str
    node_id: str
    worker_id: str
    owner_id: str
    codex_folder: str = ""
    codex_thread_ref: str = ""
    title: str = ""
    group_project_id: str = ""
    is_master_main_thread: bool = False
