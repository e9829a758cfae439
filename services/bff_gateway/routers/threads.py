"""Thread reads: `GET /api/v1/threads/{thread_id}/context-budget` (SPEC CB-14)."""

from __future__ import annotations

from typing import Annotated

import grpc
from fastapi import APIRouter, Path, Request

from services.bff_gateway.auth import CallerDep
from services.bff_gateway.mapping import thread_context_view
from services.bff_gateway.ownership import require_own_thread
from services.bff_gateway.problems import error_responses, problem_for_rpc_error
from services.bff_gateway.schemas import ID_MAX_LENGTH, ThreadContextBudgetView
from services.bff_gateway.state import GatewayDep
from services.shared.auth import SCOPE_CONTEXT_READ

router = APIRouter(prefix="/api/v1/threads", tags=["threads"])


@router.get(
    "/{thread_id}/context-budget",
    response_model=ThreadContextBudgetView,
    summary="A thread's current context budget",
    responses=error_responses(401, 403, 404, 422, 429, 502, 503),
)
async def get_thread_context_budget(
    thread_id: Annotated[
        str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The Codex thread's id.")
    ],
    caller: CallerDep,
    gateway: GatewayDep,
    request: Request,
) -> ThreadContextBudgetView:
    """The thread's latest accepted reading as classified by the server: percent, level, expected
    and last compaction, the raw Codex figures, open alerts, when the worker must report next, plus
    the wrap-up checklist and handoff package from the scheduler (empty / null until it is wired).

    `wrap_up_checklist` items are `{key, label, status, detail}` (status done | missing | pending),
    the same shape as the thread page's (`/context-summary`).

    Needs a client token with context:read (or a service token). A client token sees only its own
    owner's threads (asked of the conversations service, see ownership.py): another owner's thread
    is 404 like an unknown one, and conversations being unreachable is 503. 404 for a thread that
    never reported.
    """
    caller.require(SCOPE_CONTEXT_READ)
    await require_own_thread(request, caller, thread_id)
    try:
        context = await gateway.context_budget.get_thread_context(thread_id, caller.token)
    except grpc.aio.AioRpcError as error:
        raise problem_for_rpc_error(
            "context_budget", error, retry_after_seconds=gateway.settings.retry_after_seconds
        ) from error
    wrap_up = await gateway.wrap_up.wrap_up_view(thread_id, caller.token)
    return thread_context_view(
        context,
        wrap_up_checklist=wrap_up.checklist if wrap_up else None,
        handoff_package=wrap_up.handoff_package if wrap_up else None,
    )
