"""The device RPCs of `boss.conversations.v1.ConversationsService` (MoveThread, CreatePairingCode,
EnrollDevice, ListDevices, RevokeDevice); `ConversationsServicer` delegates to `DeviceServicer`.

Who may call (docs/architecture.md, "Trust boundaries"): MoveThread, CreatePairingCode, ListDevices
and RevokeDevice take client tokens (acting for their own owner) and service tokens (naming the
owner in the request; empty: the default owner) with conversations:write (ListDevices:
conversations:read); worker tokens are refused (PERMISSION_DENIED). EnrollDevice takes no token: the
pairing code is the credential.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
from boss.conversations.v1 import conversations_pb2 as pb

from services.conversations.devices import DeviceHandlers
from services.conversations.service import ConversationsHandlers
from services.shared.auth import (
    CLIENT,
    SCOPE_CONVERSATIONS_READ,
    SCOPE_CONVERSATIONS_WRITE,
    SERVICE,
    Principal,
    TokenAuthority,
)
from services.shared.grpc_server import translate_errors
from services.shared.time import to_timestamp


def device_message(device: dict[str, object]) -> pb.Device:
    """The wire form of a `devices` row."""
    message = pb.Device(
        device_id=str(device["device_id"]),
        owner_id=str(device["owner_id"]),
        node_id=str(device["node_id"]),
        worker_id=str(device["worker_id"]),
        device_name=str(device["device_name"]),
        enrolled_at=to_timestamp(device["enrolled_at"]),  # type: ignore[arg-type]
    )
    if device["revoked_at"] is not None:
        message.revoked_at.CopyFrom(to_timestamp(device["revoked_at"]))  # type: ignore[arg-type]
    return message


class DeviceServicer:
    """The device RPCs over `DeviceHandlers` and `ConversationsHandlers.move_thread`
    (`thread_message`: the servicer's wire form of a thread row)."""

    def __init__(
        self,
        handlers: ConversationsHandlers,
        devices: DeviceHandlers,
        authority: TokenAuthority,
        thread_message: Callable[[Mapping[Any, Any]], pb.Thread],
    ) -> None:
        self._handlers = handlers
        self.devices = devices
        self._authority = authority
        self._thread_message = thread_message

    def _owner_of(self, context: grpc.aio.ServicerContext, scope: str, requested: str) -> str:
        """The owner the call acts for: a client token's own, or the one a service token names
        (empty: the default owner). Raises Unauthenticated or PermissionDenied (worker tokens,
        missing scope)."""
        principal: Principal = self._authority.authorize_grpc(context, scope, CLIENT, SERVICE)
        if principal.kind == CLIENT:
            return principal.owner_id
        return requested or self._handlers.default_owner_id

    @translate_errors
    async def MoveThread(
        self, request: pb.MoveThreadRequest, context: grpc.aio.ServicerContext
    ) -> pb.MoveThreadResponse:
        """Moves the owner's thread to another of the owner's devices (ConversationsHandlers.move_thread)."""
        owner = self._owner_of(context, SCOPE_CONVERSATIONS_WRITE, request.owner_id)
        thread, moved = await self._handlers.move_thread(
            owner, request.thread_id, request.node_id, request.worker_id
        )
        return pb.MoveThreadResponse(thread=self._thread_message(thread), moved=moved)

    @translate_errors
    async def CreatePairingCode(
        self, request: pb.CreatePairingCodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePairingCodeResponse:
        """A one-time pairing code for the owner (DeviceHandlers.create_pairing_code)."""
        owner = self._owner_of(context, SCOPE_CONVERSATIONS_WRITE, request.owner_id)
        code, expires_at = await self.devices.create_pairing_code(owner)
        return pb.CreatePairingCodeResponse(pairing_code=code, expires_at=to_timestamp(expires_at))

    @translate_errors
    async def EnrollDevice(
        self, request: pb.EnrollDeviceRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollDeviceResponse:
        """Trades a pairing code for the device's credential (DeviceHandlers.enroll); no token."""
        enrollment = await self.devices.enroll(
            request.pairing_code,
            request.node_id,
            request.worker_id,
            request.device_name,
            context.peer() or "",
        )
        return pb.EnrollDeviceResponse(
            device=device_message(enrollment.device),
            worker_token=enrollment.worker_token,
            token_expires_at=to_timestamp(enrollment.token_expires_at),
        )

    @translate_errors
    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDevicesResponse:
        """The owner's devices, newest first."""
        owner = self._owner_of(context, SCOPE_CONVERSATIONS_READ, request.owner_id)
        rows = await self.devices.list_devices(owner)
        return pb.ListDevicesResponse(devices=[device_message(row) for row in rows])

    @translate_errors
    async def RevokeDevice(
        self, request: pb.RevokeDeviceRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeDeviceResponse:
        """Revokes one of the owner's devices (DeviceHandlers.revoke)."""
        owner = self._owner_of(context, SCOPE_CONVERSATIONS_WRITE, request.owner_id)
        device = await self.devices.revoke(owner, request.device_id)
        return pb.RevokeDeviceResponse(device=device_message(device))
