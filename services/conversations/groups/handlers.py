"""The group chat's use cases (CHAT-4) on the conversations database and outbox: a message into a
group and its dispatch plan, reading, confirming and rejecting a plan, and a group's state for a
client that comes back; what follows a confirmation (the dispatch tasks' reports, the summary,
expiry) is `progress.DispatchProgress`, reached through `GroupHandlers.progress`.

Every command is one transaction with the events it publishes; the master model and the scheduler's
device presence are asked before it opens, never inside it. Published event types (payloads carry
`owner_id`), besides chat's `conversation.message.created`, `task.requested` and `task.updated`:

- `dispatch_plan.updated` {owner_id, project_id, conversation_id, change: proposed | superseded |
  confirmed | rejected | expired | progressed | summarised, dispatch_plan: {the DispatchPlan
  fields, snake_case}, collaboration_gate: {state, tasks_total, tasks_done, detail}}.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import Row, SqlAlchemyConversationsRepository
from services.conversations.chat.domain import (
    DISPATCH_EXECUTION,
    QUEUED,
    ChatTask,
    CollaborationGate,
    StatusReport,
    task_request_payload,
)
from services.conversations.chat.handlers import (
    TASK_REQUESTED,
    SentMessage,
    check_repeat_text,
    task_updated_event,
    write_message,
)
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.domain.model import GROUP
from services.conversations.domain.validation import check_id, raise_if_any
from services.conversations.groups.choice import (
    UNKNOWN_PRESENCE,
    ChosenTarget,
    MemberThread,
    Presence,
    TargetChoice,
    choose_targets,
)
from services.conversations.groups.drafting import draft_request, fallback_note, read_drafts, user_text_drafts
from services.conversations.groups.plans import (
    CONFIRMED,
    DISPATCH_PLAN_NOT_FOUND,
    PROPOSED,
    DispatchPlan,
    Drafts,
    check_drops,
    closed_error,
    confirm,
    executing_plans,
    group_gate,
    new_plan,
    plan_in_view,
    reject,
    supersede,
)
from services.conversations.groups.presence import DevicePresenceSource
from services.conversations.groups.progress import DispatchProgress
from services.conversations.groups.relay import RelayIntake
from services.conversations.groups.repository import SqlAlchemyDispatchPlanRepository
from services.conversations.groups.settings import DispatchSettings
from services.conversations.groups.summary import (
    REJECTED_TEXT,
    confirmation_text,
    no_target_text,
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
from services.shared.errors import PROJECT_NOT_FOUND, FieldViolation, NotFound
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.time import utc_now

log = logging.getLogger(__name__)

GROUP_ID_PREFIX = "group-"
"""How every group project's id starts (ConversationsHandlers.create_group)."""
MAX_DROPPED_TARGETS = 100


@dataclass(frozen=True)
class PlanView:
    """A plan with its group's gate (GetDispatchPlan, RejectDispatchPlan)."""

    plan: DispatchPlan
    gate: CollaborationGate


@dataclass(frozen=True)
class ConfirmedPlan:
    """ConfirmDispatchPlan's answer: the plan, its tasks in the plan's order, the group's gate."""

    plan: DispatchPlan
    tasks: list[ChatTask]
    gate: CollaborationGate


@dataclass(frozen=True)
class GroupState:
    """What a client needs to resume a group: the plan waiting for confirmation (or None), the
    gate, and the confirmed plans whose summary is not posted yet (`executing_plans`, newest
    first: their progress)."""

    pending_plan: DispatchPlan | None
    gate: CollaborationGate
    executing_plans: tuple[DispatchPlan, ...] = ()


def dispatch_task_of(plan: DispatchPlan, target_id: str, owner_id: str, now: datetime) -> ChatTask:
    """The queued dispatch_execution task of a dispatched target: its result goes back into the
    group (`target_project_id` = the group)."""
    target = plan.target(target_id)
    assert target is not None
    return ChatTask(
        task_id=target.task_id,
        owner_id=owner_id,
        task_type=DISPATCH_EXECUTION,
        status=QUEUED,
        project_id=plan.project_id,
        target_project_id=plan.project_id,
        target_thread_id=target.thread_id,
        device_id=target.device_id,
        codex_folder_ref=target.codex_folder_ref,
        codex_thread_ref=target.codex_thread_ref,
        request_message_id=plan.request_message_id,
        created_at=now,
        updated_at=now,
    )


def task_facts(targets: Sequence[ChosenTarget]) -> list[dict[str, object]]:
    """What the drafting request tells the model of each target (ids as `new_plan` gives them)."""
    return [
        {
            "target_id": f"t{position}",
            "thread_title": target.title,
            "codex_folder_ref": target.codex_folder_ref,
            "kind": target.kind,
            "level": target.level,
            "remaining_pct": target.remaining_pct,
            "reason": target.reason,
        }
        for position, target in enumerate(targets, start=1)
    ]


class GroupHandlers:
    """The group chat's use cases (see the module docstring).

    Args:
        database: the conversations database.
        event_log: its outbox.
        settings: plan expiry, target limit, idle span, model timeout.
        model: the master model drafting instructions and summaries; None: the user's text and a
            plain summary.
        presence: where devices' presence comes from; None: unknown (no device counts as offline).
        clock: the current time (UTC).
        relay_intake: takes a relay target's new Codex thread in once its task reported it
            (ConversationsHandlers.take_in_relay_thread; groups/relay.py).
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        settings: DispatchSettings | None = None,
        model: MasterModel | None = None,
        presence: DevicePresenceSource | None = None,
        clock: Callable[[], datetime] = utc_now,
        relay_intake: RelayIntake | None = None,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.settings = settings or DispatchSettings()
        self.model = model
        self.presence = presence
        self._clock = clock
        self.progress = DispatchProgress(database, event_log, self.settings, model, clock, relay_intake)

    # --- sending --------------------------------------------------------------------------------

    async def post_message(
        self, owner: str, project_id: str, text: str, client_message_id: str
    ) -> SentMessage:
        """A user message into the owner's group `project_id` (its fields already validated by
        ChatHandlers.post_message): the members' budgets, open tasks and devices' presence choose
        the targets (`choose_targets`), the master model drafts their instructions (outside any
        transaction), then one transaction stores the user message, supersedes the group's pending
        plan and stores the new plan (or, when no thread can take the message, the master agent's
        message saying why). Answers the message, the plan (None in that case) and the gate.

        Idempotent by client_message_id as PostMessage: a repeat answers the stored message and its
        plan (`created` False). Raises NotFound (PROJECT_NOT_FOUND) and AlreadyExists
        (CLIENT_MESSAGE_ID_REUSED)."""
        async with self.database.read() as connection:
            project = await _owned_group(SqlAlchemyConversationsRepository(connection), owner, project_id)
            stored = await SqlAlchemyChatRepository(connection).message_by_client_id(
                project_id, client_message_id
            )
            if stored is not None:
                return await self._repeat(connection, stored, text)
            members = await SqlAlchemyDispatchPlanRepository(connection).members(project_id)
        presence = await self._presence_of(owner, members)
        choice = choose_targets(members, presence, self._clock(), self.settings.choice)
        drafts = await self._drafts(text, choice.targets)
        try:
            async with self.database.transaction() as connection:
                sent, appended = await self._store_post(
                    connection, project, text, client_message_id, choice, drafts
                )
        except IntegrityError:
            async with self.database.read() as connection:
                chat = SqlAlchemyChatRepository(connection)
                stored = await chat.message_by_client_id(project_id, client_message_id)
                if stored is None:
                    raise
                log.info("a repeat of %s in group %s raced the first send", client_message_id, project_id)
                return await self._repeat(connection, stored, text)
        self.event_log.kick(appended)
        return sent

    async def _store_post(
        self,
        connection: AsyncConnection,
        project: Row,
        text: str,
        client_message_id: str,
        choice: TargetChoice,
        drafts: Drafts,
    ) -> tuple[SentMessage, list[StoredEvent]]:
        """`post_message`'s transaction (see there)."""
        now = self._clock()
        project_id, owner = project["project_id"], project["owner_id"]
        message, created = await write_message(
            connection,
            project,
            author_kind="user",
            thread_id="",
            text=text,
            now=now,
            client_message_id=client_message_id,
        )
        plans = SqlAlchemyDispatchPlanRepository(connection)
        earlier = await plans.open_plans(project_id)
        plan = None
        if choice.targets:
            plan = new_plan(
                f"plan-{uuid.uuid4().hex}",
                owner,
                project_id,
                message["message_id"],
                text,
                choice.targets,
                choice.left_out,
                drafts,
                now,
                self.settings.plan_ttl,
            )
        superseded = []
        for old in earlier:
            changed = supersede(old, plan.plan_id if plan else "", now)
            if changed is not None and await plans.decide(changed):
                superseded.append(changed)
        events: list[NewEvent] = [created]
        if plan is not None:
            await plans.insert(plan)
        else:
            _said, said = await write_message(
                connection,
                project,
                author_kind=MASTER_AUTHOR,
                thread_id="",
                text=no_target_text(choice.no_target_reason),
                now=now,
            )
            events.append(said)
        gone = {old.plan_id for old in superseded}
        current = [old for old in earlier if old.plan_id not in gone] + ([plan] if plan else [])
        gate = group_gate(plan_in_view(current, now), now)
        events += [plan_event(old, "superseded", gate, now) for old in superseded]
        if plan is not None:
            events.append(plan_event(plan, "proposed", gate, now))
        appended = await self.event_log.append(connection, events)
        return SentMessage(message, None, gate, created=True, dispatch_plan=plan), appended

    async def _repeat(self, connection: AsyncConnection, stored: dict[str, Any], text: str) -> SentMessage:
        check_repeat_text(stored, text)
        plans = SqlAlchemyDispatchPlanRepository(connection)
        plan = await plans.plan_of_message(str(stored["message_id"]))
        gate = await self._gate(plans, str(stored["project_id"]))
        return SentMessage(stored, None, gate, created=False, dispatch_plan=plan)

    async def _presence_of(self, owner: str, members: Sequence[MemberThread]) -> Presence:
        """The presence of the owner's devices the group's members are on."""
        if self.presence is None:
            return UNKNOWN_PRESENCE
        return await self.presence.presence(
            owner, sorted({member.node_id for member in members if member.node_id})
        )

    async def _drafts(self, text: str, targets: Sequence[ChosenTarget]) -> Drafts:
        """The targets' instructions: the model's when it is configured and answers well in time,
        else the user's text with the reason."""
        if not targets or self.model is None:
            return user_text_drafts()
        answer, problem = await ask_model(
            self.model,
            draft_request(text, task_facts(targets)),
            self.settings.model_timeout_s,
            json_answer=True,
        )
        if answer is None:
            return user_text_drafts(fallback_note(problem))
        return read_drafts(answer, [f"t{position}" for position in range(1, len(targets) + 1)])

    # --- plans ----------------------------------------------------------------------------------

    async def get_plan(self, owner: str, plan_id: str) -> PlanView:
        """GetDispatchPlan. Raises InvalidArgument (plan_id) and NotFound (DISPATCH_PLAN_NOT_FOUND:
        unknown or another owner's)."""
        _check_plan_id(plan_id)
        async with self.database.read() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            plan = await _owned_plan(plans, owner, plan_id)
            return PlanView(plan, await self._gate(plans, plan.project_id))

    async def group_state_of(self, owner: str, project_id: str) -> GroupState | None:
        """`group_state` of the owner's project `project_id`; None (without a read) for an id that
        is no group's (groups' ids start with "group-") and for an unknown or another owner's
        project (the caller's own read answers those)."""
        if not project_id.startswith(GROUP_ID_PREFIX):
            return None
        async with self.database.read() as connection:
            project = await SqlAlchemyConversationsRepository(connection).project(project_id)
        if project is None:
            return None
        return await self.group_state(owner, project)

    async def group_state(self, owner: str, project: Row) -> GroupState | None:
        """The pending plan and gate of a group (`project`, a row the caller read for `owner`);
        None for a project that is not a group."""
        if project["conversation_type"] != GROUP or project["owner_id"] != owner:
            return None
        async with self.database.read() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            open_plans = await plans.open_plans(project["project_id"])
        now = self._clock()
        pending = [plan for plan in open_plans if plan.effective_status(now) == PROPOSED]
        return GroupState(
            plan_in_view(pending, now) if pending else None,
            group_gate(plan_in_view(open_plans, now), now),
            executing_plans(open_plans),
        )

    async def confirm_plan(
        self, owner: str, plan_id: str, dropped_target_ids: Sequence[str]
    ) -> ConfirmedPlan:
        """ConfirmDispatchPlan (`confirm`): in one transaction the plan's decision, one queued
        dispatch_execution task per dispatched target with its `task.requested` (carrying the plan
        id and the target's instruction) and `task.updated`, the master agent's message naming who
        got it, and `dispatch_plan.updated`. A confirmed plan again answers it as it is (no writes).

        Raises InvalidArgument (plan_id, dropped_target_ids), NotFound (DISPATCH_PLAN_NOT_FOUND)
        and FailedPrecondition (DISPATCH_PLAN_REJECTED | _EXPIRED | _SUPERSEDED |
        _TARGETS_UNAVAILABLE)."""
        _check_plan_id(plan_id)
        violations: list[FieldViolation] = []
        for target_id in dropped_target_ids:
            check_id("dropped_target_ids", target_id, violations)
        if len(dropped_target_ids) > MAX_DROPPED_TARGETS:
            violations.append(FieldViolation("dropped_target_ids", f"at most {MAX_DROPPED_TARGETS} ids"))
        raise_if_any(violations)
        async with self.database.transaction() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            chat = SqlAlchemyChatRepository(connection)
            plan = await _owned_plan(plans, owner, plan_id)
            now = self._clock()
            if plan.status == CONFIRMED:
                return await self._confirmed_as_is(plans, chat, plan)
            if plan.effective_status(now) != PROPOSED:
                raise closed_error(plan, now, "confirmed")
            raise_if_any(check_drops(plan, dropped_target_ids))
            members = {member.thread_id: member for member in await plans.members(plan.project_id)}
            confirmed = confirm(plan, dropped_target_ids, members, _task_ids(), now)
            if not await plans.decide(confirmed):  # a concurrent decision committed first
                stored = await plans.plan(plan_id)
                assert stored is not None
                if stored.status == CONFIRMED:
                    return await self._confirmed_as_is(plans, chat, stored)
                raise closed_error(stored, now, "confirmed")
            tasks = [
                dispatch_task_of(confirmed, target.target_id, owner, now) for target in confirmed.dispatched
            ]
            for task in tasks:
                await chat.insert_task(task)
            project = await project_row(connection, confirmed.project_id)
            _message, said = await write_message(
                connection,
                project,
                author_kind=MASTER_AUTHOR,
                thread_id="",
                text=confirmation_text(confirmed),
                now=now,
            )
            gate = await self._gate(plans, confirmed.project_id)
            events = [_task_requested(task, confirmed) for task in tasks]
            events += [task_updated_event(task, gate) for task in tasks]
            events += [said, plan_event(confirmed, "confirmed", gate, now)]
            appended = await self.event_log.append(connection, events)
        self.event_log.kick(appended)
        return ConfirmedPlan(confirmed, tasks, gate)

    async def _confirmed_as_is(
        self, plans: SqlAlchemyDispatchPlanRepository, chat: SqlAlchemyChatRepository, plan: DispatchPlan
    ) -> ConfirmedPlan:
        tasks = [task for target in plan.dispatched if (task := await chat.task(target.task_id)) is not None]
        return ConfirmedPlan(plan, tasks, await self._gate(plans, plan.project_id))

    async def reject_plan(self, owner: str, plan_id: str) -> PlanView:
        """RejectDispatchPlan: the plan rejected, a system message saying nothing was sent, and
        `dispatch_plan.updated`, in one transaction; a rejected plan again answers it as it is.
        Raises InvalidArgument (plan_id), NotFound (DISPATCH_PLAN_NOT_FOUND) and FailedPrecondition
        (DISPATCH_PLAN_CONFIRMED | _EXPIRED | _SUPERSEDED)."""
        _check_plan_id(plan_id)
        async with self.database.transaction() as connection:
            plans = SqlAlchemyDispatchPlanRepository(connection)
            plan = await _owned_plan(plans, owner, plan_id)
            now = self._clock()
            rejected = reject(plan, now)
            if rejected is plan:
                return PlanView(plan, await self._gate(plans, plan.project_id))
            if not await plans.decide(rejected):
                stored = await plans.plan(plan_id)
                assert stored is not None
                return PlanView(reject(stored, now), await self._gate(plans, plan.project_id))
            project = await project_row(connection, plan.project_id)
            _message, said = await write_message(
                connection, project, author_kind=SYSTEM_AUTHOR, thread_id="", text=REJECTED_TEXT, now=now
            )
            gate = await self._gate(plans, plan.project_id)
            appended = await self.event_log.append(
                connection, [said, plan_event(rejected, "rejected", gate, now)]
            )
        self.event_log.kick(appended)
        return PlanView(rejected, gate)

    async def _gate(self, plans: SqlAlchemyDispatchPlanRepository, project_id: str) -> CollaborationGate:
        return await current_gate(plans, project_id, self._clock())

    # --- progress (services/conversations/groups/progress.py) -----------------------------------

    async def apply_dispatch_task(
        self, connection: AsyncConnection, changed: ChatTask, report: StatusReport, project: Row | None
    ) -> list[NewEvent]:
        """A dispatch task's status report, in the scheduler consumer's transaction
        (`DispatchProgress.apply_dispatch_task`)."""
        return await self.progress.apply_dispatch_task(connection, changed, report, project)

    async def gate_of_task(self, connection: AsyncConnection, task: ChatTask) -> CollaborationGate:
        """The gate of a dispatch task's group."""
        return await self._gate(SqlAlchemyDispatchPlanRepository(connection), task.project_id)


# ---------------------------------------------------------------------------------------------------


def _task_ids() -> Iterator[str]:
    while True:
        yield f"task-{uuid.uuid4().hex}"


def _task_requested(task: ChatTask, plan: DispatchPlan) -> NewEvent:
    """`task.requested` of a dispatch task: its target's instruction and the plan's id."""
    target = plan.target_of_task(task.task_id)
    assert target is not None
    payload = {**task_request_payload(task, target.instruction), "dispatch_plan_id": plan.plan_id}
    return NewEvent(
        TASK_REQUESTED,
        payload,
        thread_id=task.target_thread_id,
        project_id=task.project_id,
        node_id=task.device_id,
    )


def _check_plan_id(plan_id: str) -> None:
    violations: list[FieldViolation] = []
    check_id("plan_id", plan_id, violations)
    raise_if_any(violations)


async def _owned_plan(plans: SqlAlchemyDispatchPlanRepository, owner: str, plan_id: str) -> DispatchPlan:
    plan = await plans.plan(plan_id)
    if plan is None or plan.owner_id != owner:
        raise NotFound(f"dispatch plan {plan_id!r} not found", reason=DISPATCH_PLAN_NOT_FOUND)
    return plan


async def _owned_group(repository: SqlAlchemyConversationsRepository, owner: str, project_id: str) -> Row:
    project = await repository.project(project_id)
    if project is None or project["owner_id"] != owner or project["conversation_type"] != GROUP:
        raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
    return project
