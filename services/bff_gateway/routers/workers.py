"""Worker ingest over REST: `POST /api/v1/workers/{worker_id}/thread-context` (SPEC CB-10).

The same contract as context_budget's gRPC ReportThreadContext, in the seed's JSON (§5.2). Checks,
in order: bearer token (401), token scope (403), token binding to the path's worker_id (403), body
size (413), JSON (400), field types and ranges (422), path worker_id equal to the body's (400),
token binding to the body's worker_id and node_id (403); then context_budget validates, classifies
and commits, and its answer (or error) is mapped. The body is read only once the token may report
for the path's worker (request_body.py), so a token that may not is 401 / 403 whatever it sends.
"""

from __future__ import annotations

from typing import Annotated

import grpc
from fastapi import APIRouter, Path, Request

from services.bff_gateway.auth import Caller, CallerDep
from services.bff_gateway.mapping import ack_from_proto, snapshot_to_proto
from services.bff_gateway.problems import (
    error_responses,
    forbidden,
    invalid_request,
    problem_for_grpc_status,
    problem_for_rpc_error,
)
from services.bff_gateway.request_body import json_body_openapi, read_json_body
from services.bff_gateway.schemas import ID_MAX_LENGTH, ThreadContextReport, ThreadContextReportAck
from services.bff_gateway.state import GatewayDep
from services.shared.auth import SCOPE_CONTEXT_REPORT
from services.shared.errors import PermissionDenied

router = APIRouter(prefix="/api/v1/workers", tags=["workers"])

_FIELD_OF_REASON = {"WORKER_MISMATCH": ("worker_id",), "NODE_MISMATCH": ("node_id",)}


@router.post(
    "/{worker_id}/thread-context",
    response_model=ThreadContextReportAck,
    summary="Report one thread's context budget",
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 429, 502, 503),
    openapi_extra=json_body_openapi(ThreadContextReport),
)
async def report_thread_context(
    worker_id: Annotated[
        str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The reporting worker.")
    ],
    request: Request,
    caller: CallerDep,
    gateway: GatewayDep,
) -> ThreadContextReportAck:
    """Stores one snapshot through context_budget and answers with the server's level, when to
    report next (seconds) and the master agent's actions (seed §5.2).

    Needs a worker token (scope context:report) bound to the body's worker_id and node_id; the token
    is forwarded, and context_budget checks the binding again. Answered only after the snapshot
    committed; a re-sent snapshot (the very same reading) is answered with `duplicate: true`, an
    older one with `superseded: true`. 409 (SNAPSHOT_ID_REUSED, naming `snapshot_id`) for a
    different reading under a stored snapshot_id; 403 (THREAD_BOUND_TO_OTHER_DEVICE) for a thread
    that belongs to another device. Nothing is stored then.
    """
    # The scope and the path's worker before the body: a token that may not report for this
    # worker is 403 whatever it sends; the binding to the body's node needs the body.
    caller.require(SCOPE_CONTEXT_REPORT)
    _require_worker(caller, worker_id)
    report = await read_json_body(request, ThreadContextReport)
    if worker_id != report.worker_id:
        raise invalid_request(
            "worker_id",
            f"path worker_id {worker_id!r} differs from body worker_id {report.worker_id!r}",
            reason="WORKER_ID_MISMATCH",
        )
    _require_worker(caller, report.worker_id, report.node_id)
    settings = gateway.settings
    try:
        ack = await gateway.context_budget.report_thread_context(snapshot_to_proto(report), caller.token)
    except grpc.aio.AioRpcError as error:
        raise problem_for_rpc_error(
            "context_budget", error, retry_after_seconds=settings.retry_after_seconds
        ) from error
    if not ack.accepted and ack.HasField("error"):
        raise problem_for_grpc_status(
            "context_budget",
            grpc_code(ack.error.code),
            ack.error.message,
            ack.error,
            retry_after_seconds=settings.retry_after_seconds,
        )
    return ack_from_proto(ack)


def _require_worker(caller: Caller, worker_id: str, node_id: str | None = None) -> None:
    """`Principal.require_worker` as a 403 problem naming the mismatched field."""
    try:
        caller.principal.require_worker(worker_id, node_id)
    except PermissionDenied as error:
        raise forbidden(
            error.message, reason=error.reason, fields=_FIELD_OF_REASON.get(error.reason, ())
        ) from error


def grpc_code(number: int) -> grpc.StatusCode:
    """The grpc.StatusCode with numeric value `number` (UNKNOWN for a number gRPC does not define)."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
