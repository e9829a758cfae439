"""Group chat's dispatch plans (SPEC CHAT-4) over the conversations service.

| method and path | what |
|---|---|
| GET /api/v1/dispatch-plans/{plan_id} | a plan and its group's collaboration gate |
| POST /api/v1/dispatch-plans/{plan_id}/confirm | confirm, optionally `{dropped_target_ids}`: 200 |
| POST /api/v1/dispatch-plans/{plan_id}/reject | reject: nothing is sent |

A plan is proposed by sending a message to a group (`POST /api/v1/projects/{groupId}/messages`
answers it as `dispatchPlan`); a plan waiting for confirmation is also in the group's project
detail (`pending_dispatch_plan`) and message page (`pendingDispatchPlan`), so a client returns to
its pending_dispatch_plan state after a reconnect or restart. Every change is an SSE
`dispatch_plan.updated` event (`dispatchPlan`, `collaborationGate`).

Client tokens only, as the chat routes (routers/chat.py): conversations:write to confirm and reject,
conversations:read to read; another owner's plan is 404, as an unknown one. Errors as problem+json:
422 naming `dropped_target_ids` (a target the plan does not have, or every target) or `plan_id`;
404 DISPATCH_PLAN_NOT_FOUND; 409 DISPATCH_PLAN_REJECTED, DISPATCH_PLAN_EXPIRED,
DISPATCH_PLAN_SUPERSEDED, DISPATCH_PLAN_CONFIRMED (rejecting a confirmed plan) and
DISPATCH_PLAN_TARGETS_UNAVAILABLE (no kept target can take work any more; one `errors` entry per
target).
"""

from __future__ import annotations

from typing import Annotated

from boss.conversations.v1 import conversations_pb2 as pb
from fastapi import APIRouter, Path, Request

from services.bff_gateway.auth import Caller, CallerDep
from services.bff_gateway.chat.mapping import confirm_dispatch_plan_answer, dispatch_plan_answer
from services.bff_gateway.chat.schemas import (
    ConfirmDispatchPlanAnswer,
    ConfirmDispatchPlanBody,
    DispatchPlanAnswer,
)
from services.bff_gateway.problems import error_responses
from services.bff_gateway.request_body import json_body_openapi, read_optional_json_body
from services.bff_gateway.routers.conversations import conversations_client
from services.bff_gateway.schemas import ID_MAX_LENGTH
from services.shared.auth import SCOPE_CONVERSATIONS_READ, SCOPE_CONVERSATIONS_WRITE

router = APIRouter(tags=["chat"])

PlanId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The dispatch plan's id.")]


def _authorise(caller: Caller, scope: str) -> None:
    """The scope, then the token's kind (403 problems)."""
    caller.require(scope)
    caller.require_client()


@router.get(
    "/api/v1/dispatch-plans/{plan_id}",
    response_model=DispatchPlanAnswer,
    summary="A group's dispatch plan and where the group stands",
    responses=error_responses(401, 403, 404, 422, 502, 503),
)
async def get_dispatch_plan(plan_id: PlanId, request: Request, caller: CallerDep) -> DispatchPlanAnswer:
    """`{dispatchPlan, collaborationGate}`: the targets with their instructions, reasons and budgets,
    the members left out and why, and the plan's status (a proposed plan past `expiresAt` reads as
    expired). 404 DISPATCH_PLAN_NOT_FOUND for an unknown plan or another owner's."""
    _authorise(caller, SCOPE_CONVERSATIONS_READ)
    answer = await conversations_client(request).call(
        "GetDispatchPlan", pb.GetDispatchPlanRequest(plan_id=plan_id), caller.token
    )
    return dispatch_plan_answer(answer)


@router.post(
    "/api/v1/dispatch-plans/{plan_id}/confirm",
    response_model=ConfirmDispatchPlanAnswer,
    summary="Confirm a dispatch plan (optionally dropping targets)",
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 502, 503),
    openapi_extra=json_body_openapi(ConfirmDispatchPlanBody, required=False),
)
async def confirm_dispatch_plan(
    plan_id: PlanId, request: Request, caller: CallerDep
) -> ConfirmDispatchPlanAnswer:
    """Sends the message to the plan's kept targets: one `dispatch_execution` task each (`tasks`,
    plan order), the master agent's message naming who got it, and targets that can no longer take
    work (archived, left the group, critical or must-finish since the proposal) skipped with why.
    Each thread's raw result then arrives in the group as a message named by its thread, and the
    master agent's summary once all have ended; `collaborationGate` says executing k of N, then
    summarising, then open. Confirming a confirmed plan again answers it as it is (whatever the
    drops). An empty body (or none) keeps every target.

    Errors: 422 naming `dropped_target_ids`; 404 DISPATCH_PLAN_NOT_FOUND; 409 DISPATCH_PLAN_REJECTED,
    DISPATCH_PLAN_EXPIRED, DISPATCH_PLAN_SUPERSEDED, DISPATCH_PLAN_TARGETS_UNAVAILABLE."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    body = await read_optional_json_body(request, ConfirmDispatchPlanBody)
    dropped = body.dropped_target_ids if body is not None else []
    answer = await conversations_client(request).call(
        "ConfirmDispatchPlan",
        pb.ConfirmDispatchPlanRequest(plan_id=plan_id, dropped_target_ids=dropped),
        caller.token,
    )
    return confirm_dispatch_plan_answer(answer)


@router.post(
    "/api/v1/dispatch-plans/{plan_id}/reject",
    response_model=DispatchPlanAnswer,
    summary="Reject a dispatch plan: nothing is sent",
    responses=error_responses(401, 403, 404, 409, 422, 502, 503),
)
async def reject_dispatch_plan(plan_id: PlanId, request: Request, caller: CallerDep) -> DispatchPlanAnswer:
    """`{dispatchPlan, collaborationGate}` with the plan rejected (a system message in the group
    says nothing was sent); a rejected plan again answers the same. 409 DISPATCH_PLAN_CONFIRMED,
    DISPATCH_PLAN_EXPIRED, DISPATCH_PLAN_SUPERSEDED; 404 DISPATCH_PLAN_NOT_FOUND."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    answer = await conversations_client(request).call(
        "RejectDispatchPlan", pb.RejectDispatchPlanRequest(plan_id=plan_id), caller.token
    )
    return dispatch_plan_answer(answer)
