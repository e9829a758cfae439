"""Dispatch plans (CHAT-4): their values, their lifecycle and the group's collaboration gate.

A plan is proposed for one user message of a group, with one target per thread that is to get the
message (ChosenTarget) and the members left out with their reasons. Its status moves

    proposed -> confirmed | rejected | expired | superseded

and never again once it left `proposed`. A proposed plan whose `expires_at` has passed reads as
expired everywhere (`effective_status`), whether or not the expiry was written yet. Confirming drops
the targets the user dropped, skips targets that can no longer take work (archived or unfit since the
proposal) and dispatches the rest, one `dispatch_execution` task each. Once every dispatched task is
terminal the plan's summary is pending; the master agent's summary message ends it.

Pure: times come in as arguments (aware UTC datetimes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from services.conversations.chat.domain import GATE_OPEN, CollaborationGate, is_terminal
from services.conversations.groups.choice import (
    MEMBER,
    UNKNOWN_PRESENCE,
    ChosenTarget,
    LeftOut,
    MemberThread,
    unfit_reason,
)
from services.shared.errors import FailedPrecondition, FieldViolation, PreconditionViolation
from services.shared.time import isoformat_utc

PROPOSED = "proposed"
CONFIRMED = "confirmed"
REJECTED = "rejected"
EXPIRED = "expired"
SUPERSEDED = "superseded"
PLAN_STATUSES = (PROPOSED, CONFIRMED, REJECTED, EXPIRED, SUPERSEDED)

# A target's status: proposed (waits for the confirmation), dropped (by the user), skipped (could no
# longer take work at the confirmation), dispatched (its task was requested).
TARGET_PROPOSED = "proposed"
TARGET_DROPPED = "dropped"
TARGET_SKIPPED = "skipped"
TARGET_DISPATCHED = "dispatched"

# The summary: none yet, pending (every dispatched task is terminal), posted (the message is stored).
SUMMARY_NONE = ""
SUMMARY_PENDING = "pending"
SUMMARY_POSTED = "posted"

# How the targets' instructions were drafted.
DRAFTED_BY_MODEL = "master_model"
DRAFTED_BY_USER_TEXT = "user_text"

GATE_AWAITING_CONFIRMATION = "awaiting_confirmation"
GATE_EXECUTING = "executing"
GATE_SUMMARISING = "summarising"

# ErrorInfo reasons.
DISPATCH_PLAN_NOT_FOUND = "DISPATCH_PLAN_NOT_FOUND"
DISPATCH_PLAN_REJECTED = "DISPATCH_PLAN_REJECTED"
DISPATCH_PLAN_EXPIRED = "DISPATCH_PLAN_EXPIRED"
DISPATCH_PLAN_SUPERSEDED = "DISPATCH_PLAN_SUPERSEDED"
DISPATCH_PLAN_CONFIRMED = "DISPATCH_PLAN_CONFIRMED"
DISPATCH_PLAN_TARGETS_UNAVAILABLE = "DISPATCH_PLAN_TARGETS_UNAVAILABLE"
_CLOSED_REASONS = {
    REJECTED: DISPATCH_PLAN_REJECTED,
    EXPIRED: DISPATCH_PLAN_EXPIRED,
    SUPERSEDED: DISPATCH_PLAN_SUPERSEDED,
    CONFIRMED: DISPATCH_PLAN_CONFIRMED,
}
TARGET_VIOLATION = "DISPATCH_TARGET"
"""`PreconditionViolation.type` of a target that can no longer take work (subject: its target id)."""


@dataclass(frozen=True)
class DispatchTarget:
    """One target of a plan (a ChosenTarget with its place, instruction and progress).

    Attributes:
        target_id: "t1", "t2", ... in the plan's order (best first).
        kind: "member" or "relay" (a new Codex thread; thread_id is then "relay-..." and
            codex_thread_ref "" until its task ran).
        instruction: what the thread is sent (the model's draft, or the user's text).
        reason: why this thread, in words.
        remaining_pct / level: the member's budget at the proposal (percent 0-100; None, "" when
            not reported).
        status: proposed | dropped | skipped | dispatched; `status_detail` why skipped, in words.
        task_id / task_status: its dispatch_execution task once dispatched ("" before).
    """

    target_id: str
    position: int
    kind: str
    thread_id: str
    thread_title: str
    device_id: str
    codex_folder_ref: str
    codex_thread_ref: str
    instruction: str
    reason: str
    remaining_pct: float | None = None
    level: str = ""
    relay_of_thread_id: str = ""
    status: str = TARGET_PROPOSED
    status_detail: str = ""
    task_id: str = ""
    task_status: str = ""

    @property
    def done(self) -> bool:
        """Dispatched and its task terminal."""
        return self.status == TARGET_DISPATCHED and is_terminal(self.task_status)

    def as_payload(self) -> dict[str, Any]:
        """The `DispatchTarget` proto's fields as JSON."""
        return {
            "target_id": self.target_id,
            "position": self.position,
            "kind": self.kind,
            "thread_id": self.thread_id,
            "thread_title": self.thread_title,
            "device_id": self.device_id,
            "codex_folder_ref": self.codex_folder_ref,
            "codex_thread_ref": self.codex_thread_ref,
            "instruction": self.instruction,
            "reason": self.reason,
            "budget_reported": self.remaining_pct is not None,
            "remaining_pct": self.remaining_pct if self.remaining_pct is not None else 0.0,
            "level": self.level,
            "relay_of_thread_id": self.relay_of_thread_id,
            "status": self.status,
            "status_detail": self.status_detail,
            "task_id": self.task_id,
            "task_status": self.task_status,
        }


@dataclass(frozen=True)
class DispatchPlan:
    """A group message's dispatch plan.

    Attributes:
        status: one of PLAN_STATUSES as stored (see `effective_status` for expiry).
        targets: in order, best first.
        left_out: the members that do not get the message, with their reasons.
        drafted_by: "master_model" or "user_text"; `drafting_note` says why the user's text was
            used when a model was asked ("" otherwise).
        created_at / expires_at / decided_at / updated_at: UTC; decided_at set when the status left
            proposed.
        superseded_by_plan_id: the newer plan, once superseded.
        summary_status: "" | "pending" | "posted"; summary_message_id once posted.
    """

    plan_id: str
    owner_id: str
    project_id: str
    request_message_id: str
    request_text: str
    status: str
    targets: tuple[DispatchTarget, ...]
    left_out: tuple[LeftOut, ...]
    drafted_by: str
    drafting_note: str
    created_at: datetime
    expires_at: datetime
    updated_at: datetime
    decided_at: datetime | None = None
    superseded_by_plan_id: str = ""
    summary_status: str = SUMMARY_NONE
    summary_message_id: str = ""

    def effective_status(self, now: datetime) -> str:
        """The status, with a proposed plan past its expiry read as expired."""
        if self.status == PROPOSED and now >= self.expires_at:
            return EXPIRED
        return self.status

    @property
    def dispatched(self) -> tuple[DispatchTarget, ...]:
        """The targets whose tasks were requested."""
        return tuple(target for target in self.targets if target.status == TARGET_DISPATCHED)

    @property
    def kept(self) -> tuple[DispatchTarget, ...]:
        """The targets still proposed (not dropped)."""
        return tuple(target for target in self.targets if target.status == TARGET_PROPOSED)

    def target(self, target_id: str) -> DispatchTarget | None:
        """The target with `target_id`, or None."""
        return next((target for target in self.targets if target.target_id == target_id), None)

    def target_of_task(self, task_id: str) -> DispatchTarget | None:
        """The target whose task is `task_id`, or None."""
        return next((target for target in self.targets if task_id and target.task_id == task_id), None)

    def as_payload(self, now: datetime) -> dict[str, Any]:
        """The `DispatchPlan` proto's fields as JSON (status effective at `now`; instants RFC 3339
        UTC or null)."""
        return {
            "plan_id": self.plan_id,
            "project_id": self.project_id,
            "request_message_id": self.request_message_id,
            "status": self.effective_status(now),
            "targets": [target.as_payload() for target in self.targets],
            "left_out": [
                {"thread_id": entry.thread_id, "thread_title": entry.title, "reason": entry.reason}
                for entry in self.left_out
            ],
            "drafted_by": self.drafted_by,
            "drafting_note": self.drafting_note,
            "created_at": isoformat_utc(self.created_at),
            "expires_at": isoformat_utc(self.expires_at),
            "decided_at": isoformat_utc(self.decided_at),
            "updated_at": isoformat_utc(self.updated_at),
            "superseded_by_plan_id": self.superseded_by_plan_id,
            "summary_status": self.summary_status,
            "summary_message_id": self.summary_message_id,
        }


@dataclass(frozen=True)
class Drafts:
    """The instruction of each target (by target id; a missing one gets the user's text), who drafted
    them, and, when the user's text stands in for a model's draft, why."""

    instructions: Mapping[str, str]
    drafted_by: str
    note: str = ""


def new_plan(
    plan_id: str,
    owner_id: str,
    project_id: str,
    request_message_id: str,
    request_text: str,
    chosen: Sequence[ChosenTarget],
    left_out: Sequence[LeftOut],
    drafts: Drafts,
    now: datetime,
    ttl: timedelta,
) -> DispatchPlan:
    """A proposed plan for `chosen` (targets "t1", "t2", ... in order), expiring `ttl` after `now`.
    A relay target's thread id is "relay-" + the plan id's hex + "-" + its target id."""
    targets = []
    for position, chosen_target in enumerate(chosen, start=1):
        target_id = f"t{position}"
        thread_id = chosen_target.thread_id or f"relay-{plan_id.removeprefix('plan-')}-{target_id}"
        targets.append(
            DispatchTarget(
                target_id=target_id,
                position=position,
                kind=chosen_target.kind,
                thread_id=thread_id,
                thread_title=chosen_target.title,
                device_id=chosen_target.device_id,
                codex_folder_ref=chosen_target.codex_folder_ref,
                codex_thread_ref=chosen_target.codex_thread_ref,
                instruction=drafts.instructions.get(target_id) or request_text,
                reason=chosen_target.reason,
                remaining_pct=chosen_target.remaining_pct,
                level=chosen_target.level,
                relay_of_thread_id=chosen_target.relay_of_thread_id,
            )
        )
    return DispatchPlan(
        plan_id=plan_id,
        owner_id=owner_id,
        project_id=project_id,
        request_message_id=request_message_id,
        request_text=request_text,
        status=PROPOSED,
        targets=tuple(targets),
        left_out=tuple(left_out),
        drafted_by=drafts.drafted_by,
        drafting_note=drafts.note,
        created_at=now,
        expires_at=now + ttl,
        updated_at=now,
    )


def closed_error(plan: DispatchPlan, now: datetime, doing: str) -> FailedPrecondition:
    """The 409 for `doing` ("confirmed", "rejected") a plan that is no longer proposed."""
    status = plan.effective_status(now)
    why = {
        REJECTED: "it was rejected",
        EXPIRED: f"it expired unconfirmed at {isoformat_utc(plan.expires_at)}",
        SUPERSEDED: f"a newer message of the group replaced it with plan {plan.superseded_by_plan_id}",
        CONFIRMED: "it was confirmed already",
    }.get(status, f"it is {status}")
    return FailedPrecondition(
        f"dispatch plan {plan.plan_id!r} cannot be {doing}: {why}; nothing was sent",
        reason=_CLOSED_REASONS.get(status, "DISPATCH_PLAN_CLOSED"),
    )


def check_drops(plan: DispatchPlan, dropped_target_ids: Sequence[str]) -> list[FieldViolation]:
    """The violations of a confirmation's `dropped_target_ids` (empty when fine): each must name a
    target of the plan, and at least one target must be kept (to send nothing, reject the plan)."""
    known = {target.target_id for target in plan.targets}
    unknown = sorted({target_id for target_id in dropped_target_ids if target_id not in known})
    violations: list[FieldViolation] = []
    if unknown:
        violations.append(
            FieldViolation(
                "dropped_target_ids",
                f"names no target of plan {plan.plan_id}: {', '.join(unknown)} (its targets: "
                f"{', '.join(sorted(known))})",
            )
        )
    elif known and known <= set(dropped_target_ids):
        violations.append(
            FieldViolation(
                "dropped_target_ids", "drops every target; reject the plan instead to send nothing"
            )
        )
    return violations


def confirm(
    plan: DispatchPlan,
    dropped_target_ids: Sequence[str],
    members_now: Mapping[str, MemberThread],
    task_ids: Iterator[str],
    now: datetime,
) -> DispatchPlan:
    """The plan confirmed at `now`: the dropped targets dropped, member targets that can no longer
    take work skipped with why (no longer a member, archived, or unfit by their budget now:
    `unfit_reason` without presence, which the scheduler's queue handles), the rest dispatched with
    the next id of `task_ids` and the member's current Codex references.

    Call it on a proposed plan whose drops passed `check_drops`. Raises FailedPrecondition
    (DISPATCH_PLAN_TARGETS_UNAVAILABLE, a PreconditionViolation per skipped target) when no target
    is left to dispatch; nothing is confirmed then.
    """
    dropped = set(dropped_target_ids)
    targets: list[DispatchTarget] = []
    skipped: list[PreconditionViolation] = []
    for target in plan.targets:
        if target.target_id in dropped:
            targets.append(replace(target, status=TARGET_DROPPED, status_detail="dropped by you"))
            continue
        if target.kind == MEMBER:
            member = members_now.get(target.thread_id)
            why = _unavailable(member)
            if why:
                targets.append(replace(target, status=TARGET_SKIPPED, status_detail=why))
                skipped.append(
                    PreconditionViolation(TARGET_VIOLATION, target.target_id, f"{target.thread_title}: {why}")
                )
                continue
            assert member is not None
            target = replace(
                target,
                device_id=member.node_id,
                codex_folder_ref=member.codex_folder,
                codex_thread_ref=member.codex_thread_ref,
            )
        targets.append(
            replace(target, status=TARGET_DISPATCHED, task_id=next(task_ids), task_status="queued")
        )
    if not any(target.status == TARGET_DISPATCHED for target in targets):
        raise FailedPrecondition(
            f"dispatch plan {plan.plan_id!r}: none of its kept targets can take work now "
            f"({'; '.join(violation.description for violation in skipped)}); nothing was sent. "
            "Reject it, or send the message again for a new plan",
            reason=DISPATCH_PLAN_TARGETS_UNAVAILABLE,
            violations=skipped,
        )
    return replace(plan, status=CONFIRMED, targets=tuple(targets), decided_at=now, updated_at=now)


def _unavailable(member: MemberThread | None) -> str:
    """Why a member target cannot be dispatched at the confirmation ("" when it can)."""
    if member is None:
        return "it left the group after the plan was proposed"
    if member.archived:
        return "it was archived after the plan was proposed"
    _rule, reason = unfit_reason(member, UNKNOWN_PRESENCE)
    return f"{reason} (since the plan was proposed)" if reason else ""


def reject(plan: DispatchPlan, now: datetime) -> DispatchPlan:
    """The plan rejected at `now` (a rejected plan again: unchanged). Raises FailedPrecondition
    (`closed_error`) for a plan confirmed, expired or superseded."""
    status = plan.effective_status(now)
    if status == REJECTED:
        return plan
    if status != PROPOSED:
        raise closed_error(plan, now, "rejected")
    return replace(plan, status=REJECTED, decided_at=now, updated_at=now)


def expire(plan: DispatchPlan, now: datetime) -> DispatchPlan | None:
    """The plan written as expired when it is proposed and past its expiry; None otherwise."""
    if plan.status != PROPOSED or now < plan.expires_at:
        return None
    return replace(plan, status=EXPIRED, decided_at=plan.expires_at, updated_at=now)


def supersede(plan: DispatchPlan, newer_plan_id: str, now: datetime) -> DispatchPlan | None:
    """A proposed plan replaced by a newer message's plan (`newer_plan_id`, "" when the newer
    message got no plan); None when the plan is not proposed (an expired one stays expired)."""
    if plan.effective_status(now) != PROPOSED:
        return None
    return replace(
        plan, status=SUPERSEDED, superseded_by_plan_id=newer_plan_id, decided_at=now, updated_at=now
    )


def apply_task_status(
    plan: DispatchPlan, task_id: str, task_status: str, now: datetime
) -> DispatchPlan | None:
    """The plan after its task `task_id` reached `task_status`; None when that changes nothing (an
    unknown task, the same status, or a target whose task is terminal already). When every
    dispatched task is terminal, the summary becomes pending."""
    target = plan.target_of_task(task_id)
    if target is None or target.task_status == task_status or is_terminal(target.task_status):
        return None
    targets = tuple(
        replace(entry, task_status=task_status) if entry.target_id == target.target_id else entry
        for entry in plan.targets
    )
    changed = replace(plan, targets=targets, updated_at=now)
    if plan.summary_status == SUMMARY_NONE and all(entry.done for entry in changed.dispatched):
        changed = replace(changed, summary_status=SUMMARY_PENDING)
    return changed


def summarised(plan: DispatchPlan, summary_message_id: str, now: datetime) -> DispatchPlan | None:
    """The plan with its summary posted; None unless the summary is pending (posted already)."""
    if plan.summary_status != SUMMARY_PENDING:
        return None
    return replace(plan, summary_status=SUMMARY_POSTED, summary_message_id=summary_message_id, updated_at=now)


def plan_in_view(plans: Sequence[DispatchPlan], now: datetime) -> DispatchPlan | None:
    """The plan a group's gate is about, among its recent plans: the one awaiting confirmation,
    else the newest confirmed plan whose summary is not posted yet; None when neither."""
    pending = [plan for plan in plans if plan.effective_status(now) == PROPOSED]
    if pending:
        return max(pending, key=lambda plan: (plan.created_at, plan.plan_id))
    running = [plan for plan in plans if plan.status == CONFIRMED and plan.summary_status != SUMMARY_POSTED]
    if running:
        return max(running, key=lambda plan: (plan.created_at, plan.plan_id))
    return None


def executing_plans(plans: Sequence[DispatchPlan]) -> tuple[DispatchPlan, ...]:
    """The confirmed plans among `plans` whose summary is not posted yet (tasks running, or the
    summary pending), newest first."""
    running = [plan for plan in plans if plan.status == CONFIRMED and plan.summary_status != SUMMARY_POSTED]
    return tuple(sorted(running, key=lambda plan: (plan.created_at, plan.plan_id), reverse=True))


def group_gate(plan: DispatchPlan | None, now: datetime) -> CollaborationGate:
    """Where a group stands (CHAT-5), from the plan in view (`plan_in_view`):

    - awaiting_confirmation: a plan waits; tasks_total its kept targets, tasks_done 0;
    - executing: a confirmed plan's tasks run; tasks_total the dispatched targets, tasks_done the
      terminal ones ("k of N done");
    - summarising: every task is terminal and the master agent's summary is not posted yet;
    - open: none of these (send freely).
    """
    if plan is None:
        return CollaborationGate(GATE_OPEN, 0, 0, "")
    status = plan.effective_status(now)
    if status == PROPOSED:
        kept = len(plan.kept)
        threads = "1 thread" if kept == 1 else f"{kept} threads"
        return CollaborationGate(
            GATE_AWAITING_CONFIRMATION,
            kept,
            0,
            f"a dispatch plan for {threads} waits for your confirmation until "
            f"{isoformat_utc(plan.expires_at)}",
        )
    if status != CONFIRMED or plan.summary_status == SUMMARY_POSTED:
        return CollaborationGate(GATE_OPEN, 0, 0, "")
    total = len(plan.dispatched)
    done = sum(1 for target in plan.dispatched if target.done)
    if done < total:
        return CollaborationGate(GATE_EXECUTING, total, done, f"{done} of {total} done")
    return CollaborationGate(
        GATE_SUMMARISING, total, done, f"all {total} done; the master agent is summarising the results"
    )
