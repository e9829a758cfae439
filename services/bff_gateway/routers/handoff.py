"""Handoff packages over REST, and the scheduler behind CB-14's wrap-up checklist.

- `GET /api/v1/handoff-packages/{handoff_package_id}`: one package (CB-6 fields, CB-18 checklist).
- `POST /api/v1/handoff-packages/{handoff_package_id}/consume`: ready -> consumed by the relay thread
  (409 problem for an illegal transition: consumed twice, draft, expired).
- :class:`SchedulerWrapUpSource`: the `WrapUpSource` of `GET /api/v1/threads/{id}/context-budget`,
  reading the scheduler's `GetThreadSchedule`; the scheduler being unknown of the thread or
  unreachable gives no checklist (logged), never a failed budget read.

The caller's token is forwarded; the scheduler enforces scopes (read: scheduler:read; consume:
scheduler:admin, handoff:write or conversations:write). The gateway checks consume's scopes itself
too, before it reads the optional body, so a token that may not consume is 403 whatever it sends.
A client token reaches only packages of its own owner's threads (the package's from_thread_id,
checked with the conversations service, see ownership.py); another owner's package is answered
exactly as an unknown id (404).

Checklist items have the gateway's one shape `{key, label, status, detail}` (schemas.ChecklistItemView).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any

import grpc
from boss.scheduler.v1 import scheduler_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from fastapi import APIRouter, FastAPI, Path, Request
from pydantic import BaseModel, Field

from services.bff_gateway.auth import Caller, CallerDep
from services.bff_gateway.clients import ChannelSlot, WrapUpView
from services.bff_gateway.mapping import checklist_item
from services.bff_gateway.ownership import require_own_thread
from services.bff_gateway.problems import ProblemError, error_responses, problem_for_rpc_error
from services.bff_gateway.request_body import json_body_openapi, read_optional_json_body
from services.bff_gateway.schemas import ID_MAX_LENGTH
from services.shared.auth import HANDOFF_CONSUME_SCOPES, SCOPE_SCHEDULER_READ, bearer_metadata
from services.shared.errors import PACKAGE_NOT_FOUND
from services.shared.time import from_timestamp, isoformat_utc

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/v1/handoff-packages", tags=["handoff"])


def _enum_name(enum: Any, value: int, prefix: str) -> str | None:
    """ "ready" from PACKAGE_STATUS_READY; None for the UNSPECIFIED value."""
    name = str(enum.Name(value))
    return None if name.endswith("UNSPECIFIED") else name.removeprefix(prefix).lower()


def _time(message: Any, field: str) -> str | None:
    return isoformat_utc(from_timestamp(getattr(message, field))) if message.HasField(field) else None


def checklist_json(package: pb.HandoffPackage) -> list[dict[str, Any]]:
    """CB-18 checklist items: {key, label, status: pending|done|missing, detail}."""
    return [
        checklist_item(
            entry.item,
            _enum_name(pb.ChecklistItemStatus, entry.status, "CHECKLIST_ITEM_STATUS_"),
            entry.detail,
        )
        for entry in package.checklist
    ]


def package_not_found(handoff_package_id: str) -> ProblemError:
    """404 for a package the caller may not see: worded as the scheduler words an unknown id, so
    another owner's package cannot be told apart from one that does not exist."""
    return ProblemError(
        404,
        "not-found",
        f"handoff package {handoff_package_id} does not exist",
        title="Not found",
        reason=PACKAGE_NOT_FOUND,
    )


def package_json(package: pb.HandoffPackage) -> dict[str, Any]:
    """A package as JSON: CB-6 field names, RFC 3339 UTC instants, lower-case statuses."""
    return {
        "handoff_package_id": package.handoff_package_id,
        "project_id": package.project_id,
        "task_id": package.task_id,
        "from_thread_id": package.from_thread_id,
        "to_thread_id": package.to_thread_id or None,
        "node_id": package.node_id,
        "package_status": _enum_name(pb.PackageStatus, package.package_status, "PACKAGE_STATUS_"),
        "summary_text": package.summary_text,
        "open_questions": list(package.open_questions),
        "critical_files": list(package.critical_files),
        "critical_commands": [
            {
                "command": run.command,
                "exit_code": run.exit_code if run.HasField("exit_code") else None,
                "output_tail": run.output_tail,
                "ran_at": _time(run, "ran_at"),
            }
            for run in package.critical_commands
        ],
        "critical_tests": [
            {
                "command": test.command,
                "outcome": test.outcome,
                "summary": test.summary,
                "ran_at": _time(test, "ran_at"),
            }
            for test in package.critical_tests
        ],
        "critical_artifacts": list(package.critical_artifacts),
        "decision_links": list(package.decision_links),
        "patches_done": list(package.patches_done),
        "patches_not_done": list(package.patches_not_done),
        "suggested_next_actions": list(package.suggested_next_actions),
        "checklist": checklist_json(package),
        "missing_items": [
            entry.item for entry in package.checklist if entry.status == pb.CHECKLIST_ITEM_STATUS_MISSING
        ],
        "created_at": _time(package, "created_at"),
        "ready_at": _time(package, "ready_at"),
        "consumed_at": _time(package, "consumed_at"),
        "expires_at": _time(package, "expires_at"),
        "consumed_by_thread_id": package.consumed_by_thread_id or None,
    }


@dataclass
class SchedulerClient:
    """Calls boss.scheduler.v1.SchedulerService as the caller holding a token. Methods raise
    grpc.aio.AioRpcError."""

    slot: ChannelSlot
    timeout_seconds: float

    def _stub(self) -> pb_grpc.SchedulerServiceStub:
        return pb_grpc.SchedulerServiceStub(self.slot.get())

    async def get_package(self, handoff_package_id: str, token: str) -> pb.HandoffPackage:
        """GetHandoffPackage (NOT_FOUND for an unknown id)."""
        response = await self._stub().GetHandoffPackage(
            pb.GetHandoffPackageRequest(handoff_package_id=handoff_package_id),
            metadata=bearer_metadata(token),
            timeout=self.timeout_seconds,
        )
        return response.handoff_package

    async def consume_package(
        self, handoff_package_id: str, consumed_by: str, token: str
    ) -> pb.HandoffPackage:
        """ConsumeHandoffPackage (FAILED_PRECONDITION unless ready)."""
        response = await self._stub().ConsumeHandoffPackage(
            pb.ConsumeHandoffPackageRequest(
                handoff_package_id=handoff_package_id, consumed_by_thread_id=consumed_by
            ),
            metadata=bearer_metadata(token),
            timeout=self.timeout_seconds,
        )
        return response.handoff_package

    async def thread_schedule(self, thread_id: str, token: str) -> pb.ThreadSchedule:
        """GetThreadSchedule (NOT_FOUND for a thread the scheduler never saw)."""
        response = await self._stub().GetThreadSchedule(
            pb.GetThreadScheduleRequest(thread_id=thread_id),
            metadata=bearer_metadata(token),
            timeout=self.timeout_seconds,
        )
        return response.thread_schedule


@dataclass
class SchedulerWrapUpSource:
    """CB-14's wrap-up checklist and handoff package status from the scheduler's thread schedule."""

    client: SchedulerClient

    async def wrap_up_view(self, thread_id: str, token: str) -> WrapUpView | None:
        """The current package's checklist and the package (None when the scheduler has no package for
        the thread, does not know it, or cannot be reached; the last two are logged)."""
        try:
            schedule = await self.client.thread_schedule(thread_id, token)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("scheduler unavailable for thread %s wrap-up (%s)", thread_id, error.code())
            return None
        if not schedule.HasField("current_package"):
            return None
        package = package_json(schedule.current_package)
        package["relay_thread_id"] = schedule.relay_thread_id or None
        return WrapUpView(checklist=package["checklist"], handoff_package=package)


def install(app: FastAPI, client: SchedulerClient) -> None:
    """Adds the handoff routes and makes `client` reachable from them."""
    app.state.scheduler_client = client
    app.include_router(router)


def _client(request: Request) -> SchedulerClient:
    client: SchedulerClient = request.app.state.scheduler_client
    return client


class ConsumeRequest(BaseModel):
    """Body of the consume call."""

    consumed_by_thread_id: str = Field(
        default="",
        max_length=ID_MAX_LENGTH,
        description="The relay thread; defaults to the package's to_thread_id.",
    )


PackageId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The package's id.")]


@router.get(
    "/{handoff_package_id}",
    summary="A handoff package",
    responses=error_responses(401, 403, 404, 422, 502, 503),
)
async def get_handoff_package(
    handoff_package_id: PackageId, caller: CallerDep, request: Request
) -> dict[str, Any]:
    """The package with every CB-6 field, its CB-18 checklist (done / missing) and its status.
    Needs scheduler:read. 404 for an unknown id, and for a client token for another owner's package;
    503 when the scheduler or (for client tokens) conversations cannot be reached."""
    caller.require(SCOPE_SCHEDULER_READ)
    package = await _own_package(handoff_package_id, caller, request)
    return package_json(package)


async def _own_package(handoff_package_id: str, caller: Caller, request: Request) -> pb.HandoffPackage:
    """The package, after checking that a client token's owner owns its from_thread_id."""
    try:
        package = await _client(request).get_package(handoff_package_id, caller.token)
    except grpc.aio.AioRpcError as error:
        raise problem_for_rpc_error("scheduler", error) from error
    await require_own_thread(
        request, caller, package.from_thread_id, not_found=package_not_found(handoff_package_id)
    )
    return package


@router.post(
    "/{handoff_package_id}/consume",
    summary="Mark a ready handoff package consumed by its relay thread",
    responses=error_responses(401, 403, 404, 409, 422, 502, 503),
    openapi_extra=json_body_openapi(ConsumeRequest, required=False),
)
async def consume_handoff_package(
    handoff_package_id: PackageId, caller: CallerDep, request: Request
) -> dict[str, Any]:
    """ready -> consumed. 409 when the package is not ready (consumed twice, draft, expired); 404
    for an unknown id (and, for a client token, another owner's package, left untouched); 403
    without scheduler:admin, handoff:write or conversations:write."""
    # The scope before the optional ConsumeRequest body: a token that may not consume is 403
    # whatever it sends (request_body.py).
    caller.require_any(HANDOFF_CONSUME_SCOPES)
    body = await read_optional_json_body(request, ConsumeRequest)
    if caller.principal.kind == "client":
        await _own_package(handoff_package_id, caller, request)
    try:
        package = await _client(request).consume_package(
            handoff_package_id, body.consumed_by_thread_id if body else "", caller.token
        )
    except grpc.aio.AioRpcError as error:
        raise problem_for_rpc_error("scheduler", error) from error
    return package_json(package)
