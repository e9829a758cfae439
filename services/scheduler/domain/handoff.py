"""Handoff package rules (CB-6, CB-18): status transitions, the wrap-up checklist, expiry.

Transitions: draft -> ready (a worker uploads), ready -> ready (a later upload refreshes it),
ready -> consumed (the relay thread takes it over), draft|ready -> expired (time to live passed).
Everything else (ready -> draft, consumed twice, anything out of consumed or expired) is illegal and
raises FailedPrecondition naming both statuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from services.scheduler.domain.model import PackageStatus
from services.shared.errors import FailedPrecondition

CHECKLIST_ITEMS: tuple[str, ...] = (
    "files_touched",
    "patches",
    "last_key_command",
    "last_test_run",
    "open_questions",
    "next_actions",
    "evidence_links",
)
"""CB-18's wrap-up checklist, in the order the worker fills it."""

CHECKLIST_STATUSES = ("pending", "done", "missing")

_ALLOWED: dict[PackageStatus, frozenset[PackageStatus]] = {
    PackageStatus.DRAFT: frozenset({PackageStatus.READY, PackageStatus.EXPIRED}),
    PackageStatus.READY: frozenset({PackageStatus.READY, PackageStatus.CONSUMED, PackageStatus.EXPIRED}),
    PackageStatus.CONSUMED: frozenset(),
    PackageStatus.EXPIRED: frozenset(),
}


@dataclass(frozen=True)
class ChecklistEntry:
    """One CB-18 item: `item` from CHECKLIST_ITEMS, `status` pending|done|missing, `detail` in words."""

    item: str
    status: str
    detail: str = ""


def can_transition(current: PackageStatus, target: PackageStatus) -> bool:
    """True when `current -> target` is a legal package transition."""
    return target in _ALLOWED[current]


def check_transition(handoff_package_id: str, current: PackageStatus, target: PackageStatus) -> None:
    """Raises FailedPrecondition (reason ILLEGAL_PACKAGE_TRANSITION) for an illegal transition."""
    if not can_transition(current, target):
        raise FailedPrecondition(
            f"handoff package {handoff_package_id} is {current.value}; it cannot become {target.value}",
            reason="ILLEGAL_PACKAGE_TRANSITION",
        )


def draft_checklist() -> tuple[ChecklistEntry, ...]:
    """Every CB-18 item pending (a draft package before the worker filled it)."""
    return tuple(ChecklistEntry(item, "pending", "not gathered yet") for item in CHECKLIST_ITEMS)


def normalise_checklist(entries: list[ChecklistEntry]) -> tuple[ChecklistEntry, ...]:
    """The uploaded checklist in CHECKLIST_ITEMS order; an item the worker did not report is missing
    ("not reported by the worker"). Unknown items are dropped."""
    by_item = {entry.item: entry for entry in entries if entry.item in CHECKLIST_ITEMS}
    return tuple(
        by_item.get(item, ChecklistEntry(item, "missing", "not reported by the worker"))
        for item in CHECKLIST_ITEMS
    )


def is_expired(status: PackageStatus, expires_at: datetime | None, now: datetime) -> bool:
    """True when a draft or ready package's time to live has passed at `now`."""
    return (
        status in (PackageStatus.DRAFT, PackageStatus.READY) and expires_at is not None and expires_at <= now
    )


@dataclass(frozen=True)
class CommandRun:
    """A command run in the thread with its result (CB-18 "last key command and its result")."""

    command: str
    exit_code: int | None = None
    output_tail: str = ""
    ran_at: datetime | None = None


@dataclass(frozen=True)
class TestRun:
    """A test run and its outcome: passed | failed | running | unknown (CB-18 "last test conclusion")."""

    command: str
    outcome: str = "unknown"
    summary: str = ""
    ran_at: datetime | None = None


@dataclass(frozen=True)
class PackageContent:
    """What a worker fills in on prepare_handoff (CB-6 list fields plus CB-18's extras)."""

    summary_text: str = ""
    open_questions: tuple[str, ...] = ()
    critical_files: tuple[str, ...] = ()
    critical_commands: tuple[CommandRun, ...] = ()
    critical_tests: tuple[TestRun, ...] = ()
    critical_artifacts: tuple[str, ...] = ()
    decision_links: tuple[str, ...] = ()
    patches_done: tuple[str, ...] = ()
    patches_not_done: tuple[str, ...] = ()
    suggested_next_actions: tuple[str, ...] = ()
    checklist: tuple[ChecklistEntry, ...] = ()


@dataclass(frozen=True)
class HandoffPackage:
    """A handoff package (CB-6 `thread_handoff_packages`). Datetimes aware UTC.

    `epoch` is the thread's compaction_count the package was opened in; `last_command_id` the
    prepare_handoff command of the latest upload (a repeated upload for it changes nothing).
    """

    handoff_package_id: str
    project_id: str
    task_id: str
    from_thread_id: str
    to_thread_id: str
    node_id: str
    package_status: PackageStatus
    content: PackageContent
    epoch: int
    created_at: datetime
    ready_at: datetime | None = None
    consumed_at: datetime | None = None
    expires_at: datetime | None = None
    consumed_by_thread_id: str = ""
    last_command_id: str = ""
