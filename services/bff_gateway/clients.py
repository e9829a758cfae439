"""gRPC clients of the backends the gateway calls, and the management of their channels.

One grpc.aio channel per backend, created inside the serving event loop (a grpc.aio channel belongs
to the loop it was made in) and closed when the app stops, unless the caller passed its own channel
(then the caller closes it). Every call carries the caller's bearer token as `authorization`
metadata, so each backend enforces its own rules on the real caller; every call has a deadline.

Channel options (gRPC keepalive guide; retry design gRFC A6; connection back-off, gRPC's
connection-backoff.md): keepalive pings every 30 s so dead connections are noticed, connection
attempts at most 0.5 s apart so a backend that is back is reached within a second, round-robin
over resolved addresses (useful with `dns:///` targets in Kubernetes), and transparent retries of
UNAVAILABLE (3 attempts, 50-500 ms backoff): reads are idempotent, and a re-sent snapshot is
answered as a duplicate by context_budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boss_common import channels
from services.shared.auth import bearer_metadata

CONTEXT_BUDGET_SERVICE = pb.DESCRIPTOR.services_by_name["ContextBudgetService"].full_name

_SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": CONTEXT_BUDGET_SERVICE}, {"service": "grpc.health.v1.Health"}],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.5s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
}

CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # Reconnect to a backend that is back within a second: gRPC's default back-off between
    # connection attempts starts at 1 s and grows to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
)


def open_channel(target: str) -> grpc.aio.Channel:
    """A grpc.aio channel to `target` (host:port or a gRPC target such as dns:///x:50051) with
    CHANNEL_OPTIONS, TLS or plaintext as BOSS_GRPC_TLS / BOSS_TLS_CA_FILE say (boss_common/channels.py).
    Call it inside the event loop that will use the channel."""
    return channels.open_channel(target, CHANNEL_OPTIONS)


@dataclass
class ChannelSlot:
    """One backend's channel: the one passed in (not owned), or one opened on first use (owned,
    closed by `close`)."""

    target: str
    channel: grpc.aio.Channel | None = None
    owned: bool = field(default=False, init=False)

    def get(self) -> grpc.aio.Channel:
        """The channel, opened now in the running loop if there is none yet."""
        if self.channel is None:
            self.channel = open_channel(self.target)
            self.owned = True
        return self.channel

    async def close(self) -> None:
        """Closes the channel if this slot opened it."""
        if self.owned and self.channel is not None:
            await self.channel.close()
            self.channel = None
            self.owned = False


@dataclass
class ContextBudgetClient:
    """Calls boss.context_budget.v1.ContextBudgetService. Methods raise grpc.aio.AioRpcError
    (map it with problems.problem_for_rpc_error)."""

    slot: ChannelSlot
    timeout_seconds: float

    def _stub(self) -> pb_grpc.ContextBudgetServiceStub:
        return pb_grpc.ContextBudgetServiceStub(self.slot.get())

    async def report_thread_context(
        self, snapshot: pb.ThreadContextSnapshot, token: str
    ) -> pb.ThreadContextAck:
        """ReportThreadContext as the caller holding `token`; the ack after the snapshot committed."""
        response = await self._stub().ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=snapshot),
            metadata=bearer_metadata(token),
            timeout=self.timeout_seconds,
        )
        return response.ack

    async def get_thread_context(self, thread_id: str, token: str) -> pb.ThreadContext:
        """GetThreadContext as the caller holding `token` (NOT_FOUND for a thread never reported)."""
        response = await self._stub().GetThreadContext(
            pb.GetThreadContextRequest(thread_id=thread_id),
            metadata=bearer_metadata(token),
            timeout=self.timeout_seconds,
        )
        return response.thread_context

    async def health(self, timeout_seconds: float) -> str:
        """ContextBudgetService's gRPC health status name (see `health_status`)."""
        return await health_status(self.slot, CONTEXT_BUDGET_SERVICE, timeout_seconds)


async def health_status(slot: ChannelSlot, service: str, timeout_seconds: float) -> str:
    """The gRPC health status name of `service` (its full name, e.g.
    "boss.conversations.v1.ConversationsService") behind `slot`: "SERVING", "NOT_SERVING", ..., or
    the failing status code's name (e.g. "UNAVAILABLE", "DEADLINE_EXCEEDED") when the check itself
    fails. Never raises for an unreachable backend."""
    stub = health_pb2_grpc.HealthStub(slot.get())
    try:
        response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_seconds)
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


@dataclass(frozen=True)
class WrapUpView:
    """What the scheduler knows about a thread's pre-compaction wrap-up (CB-14, CB-18): the current
    checklist items and the handoff package (None when there is none). JSON-ready dicts."""

    checklist: list[dict[str, Any]]
    handoff_package: dict[str, Any] | None


class WrapUpSource(Protocol):
    """Seam for the scheduler client (a later issue): the wrap-up state of one thread, read as the
    caller holding `token`; None when the scheduler has nothing for the thread."""

    async def wrap_up_view(self, thread_id: str, token: str) -> WrapUpView | None:
        """The thread's checklist and handoff package, or None."""
        ...


class NoWrapUpSource:
    """The WrapUpSource used until the scheduler is wired: knows nothing about any thread."""

    async def wrap_up_view(self, thread_id: str, token: str) -> WrapUpView | None:
        """Always None: no checklist, no handoff package yet."""
        return None
