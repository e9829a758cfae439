"""Devices and thread moves over the conversations service (docs/architecture.md, "Trust boundaries").

| method and path | what |
|---|---|
| GET /api/v1/devices | the caller's enrolled devices, newest first (revoked ones with `revoked_at`) |
| POST /api/v1/devices/pairing-codes | a one-time code enrolling one device: `python -m worker enroll CODE` |
| POST /api/v1/devices/{device_id}/revoke | revoke a device: every service refuses it at once |
| POST /api/v1/threads/{thread_id}/move | move a thread to another of the caller's devices |

Client tokens only (each route acts for the person whose token it is): conversations:read to list,
conversations:write otherwise. Another owner's device or thread is 404, as an unknown one. Errors as
problem+json: 422 naming a bad field; 409 UNKNOWN_DEVICE when no device of the caller is on the
node and worker a thread is moved to.
"""

from __future__ import annotations

from typing import Annotated

from boss.conversations.v1 import conversations_pb2 as pb
from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from services.bff_gateway.auth import Caller, CallerDep
from services.bff_gateway.problems import error_responses
from services.bff_gateway.request_body import json_body_openapi, read_json_body
from services.bff_gateway.routers.conversations import ThreadPageView, conversations_client, thread_page_view
from services.bff_gateway.schemas import ID_MAX_LENGTH
from services.shared.auth import SCOPE_CONVERSATIONS_READ, SCOPE_CONVERSATIONS_WRITE
from services.shared.time import from_timestamp, isoformat_utc

router = APIRouter(tags=["devices"])

DeviceId = Annotated[str, Path(min_length=1, max_length=64, description="The device's id.")]
ThreadId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The Codex thread's id.")]


class DeviceView(BaseModel):
    """An enrolled device (RFC 3339 UTC instants)."""

    device_id: str
    node_id: str
    worker_id: str
    device_name: str
    enrolled_at: str
    revoked_at: str | None = Field(description="When its owner revoked it; null while active.")
    active: bool


class DeviceList(BaseModel):
    """The caller's devices, newest first."""

    devices: list[DeviceView]


class PairingCodeView(BaseModel):
    """A one-time pairing code: enter it on the device with `python -m worker enroll CODE`."""

    pairing_code: str = Field(description="e.g. K7QX-M2PD; case and dashes do not matter.")
    expires_at: str = Field(description="When it stops working (RFC 3339 UTC), 10 minutes after it was made.")


class MoveThreadBody(BaseModel):
    """Where a thread moves: one of the caller's devices, by node and worker."""

    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(min_length=1, max_length=ID_MAX_LENGTH)
    worker_id: str = Field(min_length=1, max_length=ID_MAX_LENGTH)


def device_view(device: pb.Device) -> DeviceView:
    """The JSON form of a device."""
    revoked = isoformat_utc(from_timestamp(device.revoked_at)) if device.HasField("revoked_at") else None
    return DeviceView(
        device_id=device.device_id,
        node_id=device.node_id,
        worker_id=device.worker_id,
        device_name=device.device_name,
        enrolled_at=isoformat_utc(from_timestamp(device.enrolled_at)) or "",
        revoked_at=revoked,
        active=revoked is None,
    )


def _authorise(caller: Caller, scope: str) -> None:
    """The scope, then the token's kind (403 problems)."""
    caller.require(scope)
    caller.require_client()


@router.get(
    "/api/v1/devices",
    response_model=DeviceList,
    summary="Your enrolled devices",
    responses=error_responses(401, 403, 502, 503),
)
async def list_devices(request: Request, caller: CallerDep) -> DeviceList:
    """Every device enrolled for you, newest first; a revoked one has `revoked_at` and `active` false."""
    _authorise(caller, SCOPE_CONVERSATIONS_READ)
    response = await conversations_client(request).call("ListDevices", pb.ListDevicesRequest(), caller.token)
    return DeviceList(devices=[device_view(device) for device in response.devices])


@router.post(
    "/api/v1/devices/pairing-codes",
    response_model=PairingCodeView,
    status_code=201,
    summary="A one-time code that enrolls one device",
    responses=error_responses(401, 403, 502, 503),
)
async def create_pairing_code(request: Request, caller: CallerDep) -> PairingCodeView:
    """A code valid for 10 minutes, once: on the device, `python -m worker enroll CODE` stores a
    credential bound to that device and to you."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    response = await conversations_client(request).call(
        "CreatePairingCode", pb.CreatePairingCodeRequest(), caller.token
    )
    return PairingCodeView(
        pairing_code=response.pairing_code,
        expires_at=isoformat_utc(from_timestamp(response.expires_at)) or "",
    )


@router.post(
    "/api/v1/devices/{device_id}/revoke",
    response_model=DeviceView,
    summary="Revoke a device",
    responses=error_responses(401, 403, 404, 422, 502, 503),
)
async def revoke_device(device_id: DeviceId, request: Request, caller: CallerDep) -> DeviceView:
    """Every service refuses the device's credential from now on, and its open streams end.
    Idempotent. 404 for an unknown device or another owner's."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    response = await conversations_client(request).call(
        "RevokeDevice", pb.RevokeDeviceRequest(device_id=device_id), caller.token
    )
    return device_view(response.device)


@router.post(
    "/api/v1/threads/{thread_id}/move",
    response_model=ThreadPageView,
    summary="Move a thread to another of your devices",
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 502, 503),
    openapi_extra=json_body_openapi(MoveThreadBody),
)
async def move_thread(thread_id: ThreadId, request: Request, caller: CallerDep) -> ThreadPageView:
    """Only the named device may report and register the thread from now on, and the thread's
    commands go to it. Answers the thread page. 404 for an unknown thread or another owner's; 409
    (UNKNOWN_DEVICE) when none of your devices is that node and worker."""
    # The scope and kind before the body: a token that may not is 403 whatever it sends.
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    body = await read_json_body(request, MoveThreadBody)
    client = conversations_client(request)
    await client.call(
        "MoveThread",
        pb.MoveThreadRequest(thread_id=thread_id, node_id=body.node_id, worker_id=body.worker_id),
        caller.token,
    )
    page = await client.call(
        "GetThreadContextBudget", pb.GetThreadContextBudgetRequest(thread_id=thread_id), caller.token
    )
    return thread_page_view(page.thread_context_budget)
