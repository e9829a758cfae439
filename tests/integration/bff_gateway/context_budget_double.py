"""A test double of the context_budget gRPC peer, for the gateway's mapping tests.

It is a real grpc.aio server (health, reflection, rich errors through services.shared's ServiceHost
and translate_errors) implementing the generated ContextBudgetServiceServicer, so the gateway is
tested over real gRPC: metadata, deadlines, status codes and google.rpc details in trailers. What
it does with a snapshot is deliberately simple and controlled by the test: it verifies the bearer
token like the real service (worker binding), classifies with the CB-7 default thresholds, answers
the seed §5.2 master actions, keeps the latest snapshot per thread in memory, and fails with
`fail_with` when a test sets it. It is NOT the context_budget service; the service's own rules are
tested in its own folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.bff_gateway.clients import CONTEXT_BUDGET_SERVICE
from services.shared.auth import SCOPE_CONTEXT_READ, SCOPE_CONTEXT_REPORT, Principal, TokenAuthority
from services.shared.errors import THREAD_NOT_FOUND, BossError, FieldViolation, InvalidArgument, NotFound
from services.shared.grpc_server import ServiceHost, translate_errors
from services.shared.time import from_timestamp, to_timestamp, utc_now

SECRET = "gateway-tests-secret-0123456789abcdef"

# CB-7 default thresholds and CB-9 cadence; actions as in the seed's §5.2 example answer.
_ACTIONS: dict[int, list[int]] = {
    pb.CONTEXT_BUDGET_LEVEL_SAFE: [pb.MASTER_ACTION_REFRESH_STAGE_SUMMARY],
    pb.CONTEXT_BUDGET_LEVEL_WATCH: [pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND],
    pb.CONTEXT_BUDGET_LEVEL_URGENT: [
        pb.MASTER_ACTION_PREPARE_HANDOFF,
        pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND,
    ],
    pb.CONTEXT_BUDGET_LEVEL_CRITICAL: [
        pb.MASTER_ACTION_RUN_PRE_COMPACTION_WRAP_UP,
        pb.MASTER_ACTION_FREEZE_CONTEXT_GROWTH,
    ],
}
_NEXT_REPORT_SECONDS: dict[int, int] = {
    pb.CONTEXT_BUDGET_LEVEL_SAFE: 30,
    pb.CONTEXT_BUDGET_LEVEL_WATCH: 15,
    pb.CONTEXT_BUDGET_LEVEL_URGENT: 5,
    pb.CONTEXT_BUDGET_LEVEL_CRITICAL: 5,
}


def classify(percent: float) -> int:
    """CB-7 default level of a percent."""
    if percent >= 60:
        return pb.CONTEXT_BUDGET_LEVEL_SAFE
    if percent >= 40:
        return pb.CONTEXT_BUDGET_LEVEL_WATCH
    if percent >= 25:
        return pb.CONTEXT_BUDGET_LEVEL_URGENT
    return pb.CONTEXT_BUDGET_LEVEL_CRITICAL


@dataclass
class ContextBudgetDouble(pb_grpc.ContextBudgetServiceServicer):
    """The controllable peer. `received` holds every snapshot and `tokens` every bearer token it
    was sent; `fail_with` makes the next calls fail with that error."""

    authority: TokenAuthority = field(default_factory=lambda: TokenAuthority(SECRET))
    received: list[pb.ThreadContextSnapshot] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    contexts: dict[str, pb.ThreadContext] = field(default_factory=dict)
    fail_with: BossError | None = None

    def _caller(self, context: grpc.aio.ServicerContext) -> Principal:
        """Verifies and records the call's bearer token; raises `fail_with` when set."""
        principal = self.authority.verify_grpc(context)
        header = dict(context.invocation_metadata() or ())["authorization"]
        self.tokens.append(header.partition(" ")[2])
        if self.fail_with is not None:
            raise self.fail_with
        return principal

    @translate_errors
    async def ReportThreadContext(
        self, request: pb.ReportThreadContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportThreadContextResponse:
        """Checks token and binding, rejects captured_at > 5 min ahead (as snapshot.captured_at),
        stores the snapshot and acks with the CB-7 level, CB-9 cadence and seed actions."""
        principal = self._caller(context)
        principal.require(SCOPE_CONTEXT_REPORT)
        snapshot = request.snapshot
        principal.require_worker(snapshot.worker_id, snapshot.node_id)
        if from_timestamp(snapshot.captured_at) > utc_now() + timedelta(minutes=5):
            raise InvalidArgument(
                [
                    FieldViolation(
                        "snapshot.captured_at", "must not be later than 5 minutes after the server's clock"
                    )
                ]
            )
        self.received.append(snapshot)
        level = classify(snapshot.context_budget_remaining_pct)
        previous = self.contexts.get(snapshot.thread_id)
        duplicate = previous is not None and previous.snapshot == snapshot
        self.contexts[snapshot.thread_id] = pb.ThreadContext(
            snapshot=snapshot,
            context_budget_level=level,  # type: ignore[arg-type]
            updated_at=to_timestamp(utc_now()),
            next_required_report_in_seconds=_NEXT_REPORT_SECONDS[level],
            master_actions=_ACTIONS[level],  # type: ignore[arg-type]
        )
        return pb.ReportThreadContextResponse(
            ack=pb.ThreadContextAck(
                accepted=True,
                thread_id=snapshot.thread_id,
                snapshot_id=snapshot.snapshot_id or "derived",
                context_budget_level=level,  # type: ignore[arg-type]
                next_required_report_in_seconds=_NEXT_REPORT_SECONDS[level],
                master_actions=_ACTIONS[level],  # type: ignore[arg-type]
                duplicate=duplicate,
            )
        )

    @translate_errors
    async def GetThreadContext(
        self, request: pb.GetThreadContextRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThreadContextResponse:
        """The stored context of the thread; NOT_FOUND when it never reported."""
        self._caller(context).require(SCOPE_CONTEXT_READ)
        found = self.contexts.get(request.thread_id)
        if found is None:
            raise NotFound(f"thread {request.thread_id!r} never reported", reason=THREAD_NOT_FOUND)
        return pb.GetThreadContextResponse(thread_context=found)


@dataclass
class RunningDouble:
    """A started double: its servicer and the address it listens on."""

    servicer: ContextBudgetDouble
    address: str
    server: grpc.aio.Server

    async def stop(self) -> None:
        """Stops the server at once."""
        await self.server.stop(0)


async def start_double(servicer: ContextBudgetDouble | None = None) -> RunningDouble:
    """Starts a double on 127.0.0.1 (a free port) in the running event loop."""
    servicer = servicer or ContextBudgetDouble()
    host = ServiceHost(
        name="context_budget_double",
        listen="127.0.0.1:0",
        register=lambda server: pb_grpc.add_ContextBudgetServiceServicer_to_server(servicer, server),
        service_names=[CONTEXT_BUDGET_SERVICE],
    )
    server, _health, port = await host.start()
    return RunningDouble(servicer=servicer, address=f"127.0.0.1:{port}", server=server)
