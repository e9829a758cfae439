"""The group chat's progress after a confirmation (CHAT-4): the dispatch tasks' status reports
applied to the group and its plan, the master agent's summary once every task has ended, and the
expiry of plans nobody confirmed. Published events: `conversation.message.created`, `task.updated`
(with the group's gate) and `dispatch_plan.updated` (change progressed | summarised | expired).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import Row
from services.conversations.chat.domain import ChatTask, StatusReport, is_terminal
from services.conversations.chat.handlers import task_updated_event, write_message
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.groups.plans import (
    SUMMARY_PENDING,
    DispatchPlan,
    DispatchTarget,
    apply_task_status,
    expire,
    summarised,
)
from services.conversations.groups.relay import RelayIntake, TakenIn, relay_thread_of, with_relay_taken_in
from services.conversations.groups.repository import SqlAlchemyDispatchPlanRepository
from services.conversations.groups.settings import DispatchSettings
from services.conversations.groups.summary import (
    TargetResult,
    dispatch_result_message,
    expiry_text,
    plain_summary,
    read_summary,
    summary_request,
)
from services.conversations.groups.support import (
    MASTER_AUTHOR,
    SYSTEM_AUTHOR,
    ask_model,
    current_gate,
    plan_event,
    project_row,
)
from services.conversations.master.model import MasterModel
from services.shared.db import Database
from services.shared.outbox import EventLog, NewEvent
from services.shared.time import utc_now

log = logging.getLogger(__name__)


class DispatchProgress:
    """The progress use cases (see the module docstring); GroupHandlers makes one and delegates.

    Args:
        database / event_log: the conversations database and its outbox.
        settings: the model timeout.
        model: the master model for summaries; None: a plain summary.
        clock: the current time (UTC).
        relay_intake: takes a relay target's new Codex thread in (groups/relay.py); None: relay
            threads stay outside the system (their results still reach the group).
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        settings: DispatchSettings,
        model: MasterModel | None,
        clock: Callable[[], datetime] = utc_now,
        relay_intake: RelayIntake | None = None,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.settings = settings
        self.model = model
        self._clock = clock
        self.relay_intake = relay_intake

    # --- dispatch tasks' status reports (inside the scheduler consumer's transaction) -------------

    async def apply_dispatch_task(
        self,
        connection: AsyncConnection,
        changed: ChatTask,
        report: StatusReport,
        project: Row | None,
    ) -> list[NewEvent]:
        """Applies a status report that changed a dispatch_execution task (`changed`, as
        `apply_status_report` made it): on its first terminal status the message that ends it goes
        into the group, named by its thread (`dispatch_result_message`); the task row is saved; its
        target's progress is saved and, when it was the plan's last task to end, the summary becomes
        pending. A relay target whose report names the new Codex session is first taken in as a real
        thread (`relay_intake`: registered, in the home list, a member of the group), the target
        and task pointed at it, and its own conversation given the instruction and the answer.
        Returns `conversation.message.created` (when terminal), the intake's events, `task.updated`
        with the group's gate, and `dispatch_plan.updated` when the plan moved."""
        plans = SqlAlchemyDispatchPlanRepository(connection)
        plan = await plans.plan_of_task(changed.task_id)
        target = plan.target_of_task(changed.task_id) if plan is not None else None
        now = self._clock()
        published: list[NewEvent] = []
        if is_terminal(changed.status) and plan is not None and target is not None:
            relay = relay_thread_of(plan, target, report)
            taken = await self.relay_intake(connection, relay, now) if relay and self.relay_intake else None
            if taken is not None:
                plan = with_relay_taken_in(plan, target.target_id, taken.thread_id)
                target = plan.target(target.target_id)
                assert target is not None
                await plans.take_in_relay(plan.plan_id, target)
                changed = replace(
                    changed, target_thread_id=target.thread_id, codex_thread_ref=target.codex_thread_ref
                )
                published += taken.events
                published += await self._relay_conversation(connection, taken, target, changed, report, now)
        if is_terminal(changed.status):
            if project is None:
                log.error(
                    "dispatch task %s ended, but its group %s is unknown", changed.task_id, changed.project_id
                )
            else:
                title = target.thread_title if target is not None else changed.target_thread_id
                result = dispatch_result_message(changed, report, title)
                message, created = await write_message(
                    connection,
                    project,
                    author_kind=result.author_kind,
                    thread_id=result.thread_id,
                    text=result.text,
                    now=now,
                    task_id=changed.task_id,
                )
                changed = replace(changed, result_message_id=message["message_id"])
                published.append(created)
        await SqlAlchemyChatRepository(connection).save_status(changed)
        progressed = (
            apply_task_status(plan, changed.task_id, changed.status, now) if plan is not None else None
        )
        if progressed is not None:
            moved = progressed.target_of_task(changed.task_id)
            assert moved is not None
            await plans.save_progress(progressed, moved)
        gate = await current_gate(plans, changed.project_id, self._clock())
        published.append(task_updated_event(changed, gate))
        if progressed is not None:
            published.append(plan_event(progressed, "progressed", gate, now))
        return published

    async def _relay_conversation(
        self,
        connection: AsyncConnection,
        taken: TakenIn,
        target: DispatchTarget,
        changed: ChatTask,
        report: StatusReport,
        now: datetime,
    ) -> list[NewEvent]:
        """Writes into a relay thread's own conversation the instruction it was given (by the
        master agent) and the message that ended its task; returns their events."""
        project = await project_row(connection, taken.project_id)
        _asked, asked = await write_message(
            connection, project, author_kind=MASTER_AUTHOR, thread_id="", text=target.instruction, now=now
        )
        result = dispatch_result_message(changed, report, target.thread_title)
        _answer, answered = await write_message(
            connection,
            project,
            author_kind=result.author_kind,
            thread_id=result.thread_id,
            text=result.text,
            now=now,
            task_id=changed.task_id,
        )
        return [asked, answered]

    # --- the summary and expiry (background) ------------------------------------------------------

    async def summarise(self, plan_id: str) -> bool:
        """Posts the master agent's summary of a plan whose summary is pending: the model's
        (`read_summary`, asked outside the transaction) or the plain one, naming the failures; then
        the plan's summary is posted and the gate open again. One transaction: the master message,
        `conversation.message.created` and `dispatch_plan.updated`. True when this call posted it
        (False: not pending, or another process posted it first)."""
        async with self.database.read() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            plan = await plans.plan(plan_id)
            if plan is None or plan.summary_status != SUMMARY_PENDING:
                return False
            results = await plans.results(plan)
        text = await self._summary_text(plan, results)
        async with self.database.transaction() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            now = self._clock()
            done = summarised(plan, "", now)
            assert done is not None
            if not await plans.mark_summarised(done):
                return False
            project = await project_row(connection, plan.project_id)
            message, said = await write_message(
                connection, project, author_kind=MASTER_AUTHOR, thread_id="", text=text, now=now
            )
            done = replace(done, summary_message_id=message["message_id"])
            await plans.mark_summary_message(done)
            gate = await current_gate(plans, plan.project_id, self._clock())
            appended = await self.event_log.append(
                connection, [said, plan_event(done, "summarised", gate, now)]
            )
        self.event_log.kick(appended)
        return True

    async def _summary_text(self, plan: DispatchPlan, results: Sequence[TargetResult]) -> str:
        """The model's summary when it gives a usable one (`read_summary`), else the plain one."""
        if self.model is not None:
            answer, problem = await ask_model(
                self.model, summary_request(plan, results), self.settings.model_timeout_s
            )
            text = read_summary(answer, results) if answer is not None else None
            if text is not None:
                return text
            log.info(
                "plan %s: no summary of the model (%s); a plain one is posted",
                plan.plan_id,
                problem or "unusable",
            )
        return plain_summary(plan, results)

    async def pending_summaries(self) -> list[str]:
        """Ids of the plans whose summary is pending."""
        async with self.database.read() as connection:
            return await SqlAlchemyDispatchPlanRepository(connection).pending_summaries()

    async def expire_due(self) -> int:
        """Writes every proposed plan past its expiry as expired, each in its own transaction with a
        system message saying nothing was sent and `dispatch_plan.updated`. Returns how many."""
        async with self.database.read() as connection:
            due = await SqlAlchemyDispatchPlanRepository(connection).due_expiries(self._clock())
        count = 0
        for plan in due:
            async with self.database.transaction() as connection:
                plans = SqlAlchemyDispatchPlanRepository(connection)
                now = self._clock()
                expired = expire(plan, now)
                if expired is None or not await plans.decide(expired):
                    continue
                project = await project_row(connection, plan.project_id)
                _message, said = await write_message(
                    connection,
                    project,
                    author_kind=SYSTEM_AUTHOR,
                    thread_id="",
                    text=expiry_text(plan),
                    now=now,
                )
                gate = await current_gate(plans, plan.project_id, self._clock())
                appended = await self.event_log.append(
                    connection, [said, plan_event(expired, "expired", gate, now)]
                )
            self.event_log.kick(appended)
            count += 1
        return count
