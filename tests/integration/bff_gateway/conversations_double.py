"""A test double of the conversations gRPC peer for the gateway's owner check (ownership.py).

A real grpc.aio server (ServiceHost, rich errors) implementing only GetThreadContextBudget, with the
conversations service's owner rule: the bearer token is verified, conversations:read is required,
a client token acts for its own owner_id (a service token names the owner in the request, empty
meaning "local"), and a thread of another owner or unknown is NOT_FOUND (reason THREAD_NOT_FOUND).
Which thread belongs to which owner is set by the test in `owners`; `calls` records (thread_id,
token) of every call. It is NOT the conversations service, whose own rules are tested in
tests/integration/conversations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc

from services.shared.auth import SCOPE_CONVERSATIONS_READ, TokenAuthority
from services.shared.errors import THREAD_NOT_FOUND, NotFound
from services.shared.grpc_server import ServiceHost, translate_errors

CONVERSATIONS_SERVICE = pb.DESCRIPTOR.services_by_name["ConversationsService"].full_name


@dataclass
class ConversationsDouble(pb_grpc.ConversationsServiceServicer):
    """The controllable peer: `owners` maps thread_id -> owner_id."""

    authority: TokenAuthority
    owners: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    @translate_errors
    async def GetThreadContextBudget(
        self, request: pb.GetThreadContextBudgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThreadContextBudgetResponse:
        """A minimal thread page of the caller's owner's thread; NOT_FOUND otherwise."""
        principal = self.authority.verify_grpc(context)
        header = dict(context.invocation_metadata() or ())["authorization"]
        self.calls.append((request.thread_id, header.partition(" ")[2]))
        principal.require(SCOPE_CONVERSATIONS_READ)
        owner = principal.owner_id if principal.kind == "client" else (request.owner_id or "local")
        if self.owners.get(request.thread_id) != owner:
            raise NotFound(f"thread {request.thread_id!r} not found", reason=THREAD_NOT_FOUND)
        return pb.GetThreadContextBudgetResponse(
            thread_context_budget=pb.ThreadContextBudget(
                thread=pb.Thread(thread_id=request.thread_id, owner_id=owner),
                context=pb.ThreadContextSummary(thread_id=request.thread_id),
                handoff_status="none",
            )
        )


@dataclass
class RunningConversations:
    """A started double: its servicer and the address it listens on."""

    servicer: ConversationsDouble
    address: str
    server: grpc.aio.Server

    async def stop(self) -> None:
        """Stops the server at once."""
        await self.server.stop(0)


async def start_conversations(authority: TokenAuthority, owners: dict[str, str]) -> RunningConversations:
    """Starts a double on 127.0.0.1 (a free port) in the running event loop."""
    servicer = ConversationsDouble(authority=authority, owners=dict(owners))
    host = ServiceHost(
        name="conversations_double",
        listen="127.0.0.1:0",
        register=lambda server: pb_grpc.add_ConversationsServiceServicer_to_server(servicer, server),
        service_names=[CONVERSATIONS_SERVICE],
    )
    server, _health, port = await host.start()
    return RunningConversations(servicer=servicer, address=f"127.0.0.1:{port}", server=server)
