"""Device presence for dispatch plans: the port, and its adapter over the scheduler's
`ListDevicePresence` (the scheduler alone knows when each node's local agent was last seen).

A plan is proposed even when the scheduler cannot be asked: the adapter then answers
UNKNOWN_PRESENCE (no device counts as offline, and the targets' reasons say presence is unknown);
a task for an offline device still waits in the scheduler's queue, says so, and expires with a
system message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import grpc

from boss_common.channels import open_channel
from services.conversations.groups.choice import UNKNOWN_PRESENCE, DevicePresence, Presence
from services.shared.auth import bearer_metadata
from services.shared.time import from_timestamp

log = logging.getLogger(__name__)

PRESENCE_TIMEOUT_S = 2.0
"""How long a proposal waits for the scheduler's answer (seconds)."""


class DevicePresenceSource(Protocol):
    """Where proposals learn which devices are online."""

    async def presence(self, owner_id: str, node_ids: Sequence[str]) -> Presence:
        """The presence of `owner_id`'s devices `node_ids` (a node id names a device only with its
        owner); UNKNOWN_PRESENCE when it cannot be known (never raises)."""
        ...


class GrpcSchedulerPresence:
    """DevicePresenceSource over the scheduler's ListDevicePresence (a service token with
    scheduler:read). The channel is opened on first use, in the running event loop.

    Args:
        address: the scheduler's gRPC address (host:port).
        token: the service token sent as `authorization`.
        timeout_s: the call's deadline (seconds).
        channel: a channel to use instead (the caller's: `close` leaves it open).
    """

    def __init__(
        self,
        address: str,
        token: str,
        timeout_s: float = PRESENCE_TIMEOUT_S,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self._address = address
        self._token = token
        self._timeout_s = timeout_s
        self._channel = channel
        self._owned = channel is None

    async def presence(self, owner_id: str, node_ids: Sequence[str]) -> Presence:
        """See DevicePresenceSource; a failed call is logged and answers UNKNOWN_PRESENCE."""
        from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

        wanted = sorted({node for node in node_ids if node})
        if not wanted:
            return Presence({})
        if self._channel is None:
            self._channel = open_channel(self._address)
            self._owned = True
        stub = scheduler_pb2_grpc.SchedulerServiceStub(self._channel)
        try:
            answer = await stub.ListDevicePresence(
                scheduler_pb2.ListDevicePresenceRequest(owner_id=owner_id, node_ids=wanted),
                metadata=bearer_metadata(self._token),
                timeout=self._timeout_s,
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "device presence unknown: the scheduler at %s answered %s (%s)",
                self._address,
                error.code().name,
                error.details(),
            )
            return UNKNOWN_PRESENCE
        return Presence(
            {
                device.node_id: DevicePresence(
                    device.node_id,
                    device.online,
                    from_timestamp(device.last_seen_at) if device.HasField("last_seen_at") else None,
                )
                for device in answer.devices
            }
        )

    async def close(self) -> None:
        """Closes the channel it opened (if any)."""
        if self._channel is not None and self._owned:
            await self._channel.close()
            self._channel = None
