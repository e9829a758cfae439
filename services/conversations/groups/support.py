"""What the group chat's use cases share: the `dispatch_plan.updated` event, a group's current
gate, the group's project row, and a bounded call of the master model."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import Row, SqlAlchemyConversationsRepository
from services.conversations.chat.domain import CollaborationGate
from services.conversations.domain.model import conversation_id_of
from services.conversations.groups.plans import DispatchPlan, group_gate, plan_in_view
from services.conversations.groups.repository import SqlAlchemyDispatchPlanRepository
from services.conversations.master.model import ChatMessage, MasterModel, MasterModelUnavailable
from services.shared.errors import PROJECT_NOT_FOUND, NotFound
from services.shared.outbox import NewEvent

log = logging.getLogger(__name__)

PLAN_UPDATED = "dispatch_plan.updated"
MASTER_AUTHOR = "master"
SYSTEM_AUTHOR = "system"


def plan_event(plan: DispatchPlan, change: str, gate: CollaborationGate, now: datetime) -> NewEvent:
    """`dispatch_plan.updated` for a plan as it is now: {owner_id, project_id, conversation_id,
    change, dispatch_plan (DispatchPlan.as_payload at `now`), collaboration_gate}."""
    return NewEvent(
        PLAN_UPDATED,
        {
            "owner_id": plan.owner_id,
            "project_id": plan.project_id,
            "conversation_id": conversation_id_of(plan.project_id),
            "change": change,
            "dispatch_plan": plan.as_payload(now),
            "collaboration_gate": gate.as_payload(),
        },
        project_id=plan.project_id,
    )


async def current_gate(
    plans: SqlAlchemyDispatchPlanRepository, project_id: str, now: datetime
) -> CollaborationGate:
    """The group's gate from its open plans as stored (in the caller's transaction)."""
    return group_gate(plan_in_view(await plans.open_plans(project_id), now), now)


async def project_row(connection: AsyncConnection, project_id: str) -> Row:
    """The project row messages are written into. Raises NotFound (PROJECT_NOT_FOUND)."""
    project = await SqlAlchemyConversationsRepository(connection).project(project_id)
    if project is None:
        raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
    return project


async def ask_model(
    model: MasterModel, messages: Sequence[ChatMessage], timeout_s: float, *, json_answer: bool = False
) -> tuple[str | None, str]:
    """(The model's answer, "") or (None, why it gave none, in words), within `timeout_s` seconds
    (and one more, should the model overrun its own). Never raises; call it outside transactions."""
    try:
        async with asyncio.timeout(timeout_s + 1.0):
            answer = await model.complete(messages, timeout_s=timeout_s, json_answer=json_answer)
    except MasterModelUnavailable as error:
        return None, f"the model could not answer: {error}"
    except TimeoutError:
        return None, f"the model did not answer within {timeout_s:.0f} s"
    except Exception:
        log.exception("the master model's call failed")
        return None, "the call to the model failed"
    return answer.text, ""
