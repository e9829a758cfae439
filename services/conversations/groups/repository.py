"""SqlAlchemyDispatchPlanRepository: the group chat's statements (dispatch_plans, dispatch_targets,
and the reads of member threads and task results it needs) inside a caller's transaction, plus
row <-> DispatchPlan conversions.

Decisions are conditional updates (`decide`, `mark_summarised`): the row lock of the first writer
orders concurrent confirmations, rejections and expiries of one plan on PostgreSQL (SQLite's write
transactions are serial), and the loser sees the status the winner wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import budget_of
from services.conversations.adapters.tables import (
    chat_tasks,
    dispatch_plans,
    dispatch_targets,
    messages,
    project_threads,
    threads,
)
from services.conversations.chat.domain import TERMINAL_STATUSES
from services.conversations.domain.model import HANDOFF_NONE
from services.conversations.groups.choice import LeftOut, MemberThread
from services.conversations.groups.plans import (
    CONFIRMED,
    PROPOSED,
    SUMMARY_NONE,
    SUMMARY_PENDING,
    SUMMARY_POSTED,
    DispatchPlan,
    DispatchTarget,
)
from services.conversations.groups.summary import TargetResult

Row = Mapping[Any, Any]

_PLAN_COLUMNS = (
    "plan_id",
    "owner_id",
    "project_id",
    "request_message_id",
    "request_text",
    "status",
    "drafted_by",
    "drafting_note",
    "created_at",
    "expires_at",
    "decided_at",
    "updated_at",
    "superseded_by_plan_id",
    "summary_status",
    "summary_message_id",
)
_TARGET_COLUMNS = (
    "target_id",
    "position",
    "kind",
    "thread_id",
    "thread_title",
    "device_id",
    "codex_folder_ref",
    "codex_thread_ref",
    "instruction",
    "reason",
    "remaining_pct",
    "level",
    "relay_of_thread_id",
    "status",
    "status_detail",
    "task_id",
    "task_status",
)
_TARGET_PROGRESS = (
    "device_id",
    "codex_folder_ref",
    "codex_thread_ref",
    "status",
    "status_detail",
    "task_id",
    "task_status",
)


def plan_row(plan: DispatchPlan) -> dict[str, Any]:
    """The `dispatch_plans` row of a plan."""
    row = {name: getattr(plan, name) for name in _PLAN_COLUMNS}
    row["left_out_json"] = json.dumps(
        [
            {
                "thread_id": entry.thread_id,
                "thread_title": entry.title,
                "rule": entry.rule,
                "reason": entry.reason,
            }
            for entry in plan.left_out
        ]
    )
    return row


def target_row(plan_id: str, target: DispatchTarget) -> dict[str, Any]:
    """The `dispatch_targets` row of a target."""
    return {"plan_id": plan_id, **{name: getattr(target, name) for name in _TARGET_COLUMNS}}


def plan_of(row: Row, target_rows: Sequence[Row]) -> DispatchPlan:
    """A DispatchPlan from its rows (targets ordered by position)."""
    left_out = tuple(
        LeftOut(str(entry["thread_id"]), str(entry["thread_title"]), str(entry["rule"]), str(entry["reason"]))
        for entry in json.loads(row["left_out_json"] or "[]")
    )
    targets = tuple(
        DispatchTarget(**{name: target[name] for name in _TARGET_COLUMNS})
        for target in sorted(target_rows, key=lambda target: int(target["position"]))
    )
    return DispatchPlan(**{name: row[name] for name in _PLAN_COLUMNS}, targets=targets, left_out=left_out)


class SqlAlchemyDispatchPlanRepository:
    """Every statement of the group chat, on one open connection (one transaction)."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    # --- plans --------------------------------------------------------------------------------------

    async def insert(self, plan: DispatchPlan) -> None:
        """Stores a new plan and its targets. Raises sqlalchemy.exc.IntegrityError when the request
        message has a plan already."""
        await self.connection.execute(insert(dispatch_plans).values(plan_row(plan)))
        if plan.targets:
            await self.connection.execute(
                insert(dispatch_targets), [target_row(plan.plan_id, target) for target in plan.targets]
            )

    async def decide(self, plan: DispatchPlan, expected_status: str = PROPOSED) -> bool:
        """Writes the plan's status, decision time, superseding plan and every target's progress,
        only if its stored status is still `expected_status`. True when written."""
        result = await self.connection.execute(
            update(dispatch_plans)
            .where(dispatch_plans.c.plan_id == plan.plan_id, dispatch_plans.c.status == expected_status)
            .values(
                status=plan.status,
                decided_at=plan.decided_at,
                updated_at=plan.updated_at,
                superseded_by_plan_id=plan.superseded_by_plan_id,
            )
        )
        if result.rowcount != 1:
            return False
        await self.save_targets(plan, plan.targets)
        return True

    async def save_progress(self, plan: DispatchPlan, target: DispatchTarget) -> None:
        """Writes one target's progress, and the plan's summary as pending when `plan` says so (only
        over no summary: a posted one stays posted)."""
        await self.save_targets(plan, [target])
        if plan.summary_status == SUMMARY_PENDING:
            await self.connection.execute(
                update(dispatch_plans)
                .where(
                    dispatch_plans.c.plan_id == plan.plan_id, dispatch_plans.c.summary_status == SUMMARY_NONE
                )
                .values(summary_status=SUMMARY_PENDING, updated_at=plan.updated_at)
            )

    async def save_targets(self, plan: DispatchPlan, targets: Sequence[DispatchTarget]) -> None:
        """Writes the progress columns of `targets` (device and Codex references, status, task)."""
        for target in targets:
            await self.connection.execute(
                update(dispatch_targets)
                .where(
                    dispatch_targets.c.plan_id == plan.plan_id,
                    dispatch_targets.c.target_id == target.target_id,
                )
                .values({name: getattr(target, name) for name in _TARGET_PROGRESS})
            )

    async def take_in_relay(self, plan_id: str, target: DispatchTarget) -> None:
        """Records that relay `target` of the plan is now its thread (the target as
        `relay.with_relay_taken_in` made it: thread id and Codex reference), and points its task
        at that thread."""
        await self.connection.execute(
            update(dispatch_targets)
            .where(dispatch_targets.c.plan_id == plan_id, dispatch_targets.c.target_id == target.target_id)
            .values(thread_id=target.thread_id, codex_thread_ref=target.codex_thread_ref)
        )
        if target.task_id:
            await self.connection.execute(
                update(chat_tasks)
                .where(chat_tasks.c.task_id == target.task_id)
                .values(target_thread_id=target.thread_id, codex_thread_ref=target.codex_thread_ref)
            )

    async def mark_summarised(self, plan: DispatchPlan) -> bool:
        """Records the posted summary unless another writer did already. True when recorded."""
        result = await self.connection.execute(
            update(dispatch_plans)
            .where(
                dispatch_plans.c.plan_id == plan.plan_id, dispatch_plans.c.summary_status == SUMMARY_PENDING
            )
            .values(
                summary_status=plan.summary_status,
                summary_message_id=plan.summary_message_id,
                updated_at=plan.updated_at,
            )
        )
        return result.rowcount == 1

    async def mark_summary_message(self, plan: DispatchPlan) -> None:
        """Records the posted summary's message id (after `mark_summarised`, in its transaction)."""
        await self.connection.execute(
            update(dispatch_plans)
            .where(dispatch_plans.c.plan_id == plan.plan_id)
            .values(summary_message_id=plan.summary_message_id)
        )

    async def plan(self, plan_id: str) -> DispatchPlan | None:
        """One plan with its targets, or None."""
        found = await self._plans(dispatch_plans.c.plan_id == plan_id)
        return found[0] if found else None

    async def plan_of_message(self, request_message_id: str) -> DispatchPlan | None:
        """The plan proposed for a user message, or None."""
        found = await self._plans(dispatch_plans.c.request_message_id == request_message_id)
        return found[0] if found else None

    async def plan_of_task(self, task_id: str) -> DispatchPlan | None:
        """The plan one of whose targets has task `task_id`, or None."""
        result = await self.connection.execute(
            select(dispatch_targets.c.plan_id).where(dispatch_targets.c.task_id == task_id).limit(1)
        )
        plan_id = result.scalar_one_or_none()
        return await self.plan(plan_id) if plan_id is not None else None

    async def open_plans(self, project_id: str) -> list[DispatchPlan]:
        """The project's plans a gate may be about: proposed ones, and confirmed ones whose summary
        is not posted yet."""
        return await self._plans(
            dispatch_plans.c.project_id == project_id,
            or_(
                dispatch_plans.c.status == PROPOSED,
                and_(dispatch_plans.c.status == CONFIRMED, dispatch_plans.c.summary_status != SUMMARY_POSTED),
            ),
        )

    async def pending_summaries(self) -> list[str]:
        """Ids of the plans whose summary is pending, oldest first."""
        result = await self.connection.execute(
            select(dispatch_plans.c.plan_id)
            .where(dispatch_plans.c.summary_status == SUMMARY_PENDING)
            .order_by(dispatch_plans.c.updated_at)
        )
        return [str(plan_id) for plan_id in result.scalars()]

    async def due_expiries(self, now: datetime, limit: int = 100) -> list[DispatchPlan]:
        """Proposed plans whose expiry has passed at `now`, oldest expiry first, at most `limit`."""
        result = await self.connection.execute(
            select(dispatch_plans.c.plan_id)
            .where(dispatch_plans.c.status == PROPOSED, dispatch_plans.c.expires_at <= now)
            .order_by(dispatch_plans.c.expires_at)
            .limit(limit)
        )
        ids = [str(plan_id) for plan_id in result.scalars()]
        return await self._plans(dispatch_plans.c.plan_id.in_(ids)) if ids else []

    async def next_expiry(self) -> datetime | None:
        """The earliest expiry of a proposed plan, or None when none is proposed."""
        result = await self.connection.execute(
            select(func.min(dispatch_plans.c.expires_at)).where(dispatch_plans.c.status == PROPOSED)
        )
        value = result.scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    async def _plans(self, *conditions: Any) -> list[DispatchPlan]:
        result = await self.connection.execute(select(dispatch_plans).where(*conditions))
        rows = list(result.mappings())
        if not rows:
            return []
        plan_ids = [row["plan_id"] for row in rows]
        found = await self.connection.execute(
            select(dispatch_targets).where(dispatch_targets.c.plan_id.in_(plan_ids))
        )
        by_plan: dict[str, list[Row]] = {plan_id: [] for plan_id in plan_ids}
        for target in found.mappings():
            by_plan[target["plan_id"]].append(target)
        return [plan_of(row, by_plan[row["plan_id"]]) for row in rows]

    # --- members and results ------------------------------------------------------------------------

    async def members(self, project_id: str) -> list[MemberThread]:
        """The project's threads (archived ones included) with their open chat task counts, by
        thread id."""
        open_tasks = (
            select(func.count())
            .where(
                chat_tasks.c.target_thread_id == threads.c.thread_id,
                chat_tasks.c.status.not_in(sorted(TERMINAL_STATUSES)),
            )
            .scalar_subquery()
        )
        result = await self.connection.execute(
            select(threads, open_tasks.label("open_tasks"))
            .join(project_threads, project_threads.c.thread_id == threads.c.thread_id)
            .where(project_threads.c.project_id == project_id)
            .order_by(threads.c.thread_id)
        )
        return [member_of(row) for row in result.mappings()]

    async def results(self, plan: DispatchPlan) -> list[TargetResult]:
        """How each dispatched target ended (its task's status and failure kind, and the text of the
        message that ended it), in the plan's order."""
        task_ids = [target.task_id for target in plan.dispatched]
        if not task_ids:
            return []
        found = await self.connection.execute(
            select(chat_tasks.c.task_id, chat_tasks.c.status, chat_tasks.c.failure_kind, messages.c.text)
            .select_from(chat_tasks)
            .outerjoin(messages, messages.c.message_id == chat_tasks.c.result_message_id)
            .where(chat_tasks.c.task_id.in_(task_ids))
        )
        by_task = {row["task_id"]: row for row in found.mappings()}
        results = []
        for target in plan.dispatched:
            row = by_task.get(target.task_id)
            status = row["status"] if row is not None else target.task_status
            results.append(
                TargetResult(
                    target,
                    status,
                    (row["failure_kind"] if row is not None else "") or "",
                    (row["text"] if row is not None else None) or "",
                )
            )
        return results


def member_of(row: Row) -> MemberThread:
    """A MemberThread from a `threads` row (with `open_tasks` when the query counted them)."""
    return MemberThread(
        thread_id=row["thread_id"],
        title=row["title"],
        node_id=row["node_id"] or "",
        codex_folder=row["codex_folder"] or "",
        codex_thread_ref=row["codex_thread_ref"] or "",
        archived=row["archived_at"] is not None,
        budget=budget_of(row),
        handoff_status=row["handoff_status"] or HANDOFF_NONE,
        open_tasks=int(row.get("open_tasks") or 0),
    )
