"""Bad input the trust-boundary trial found, at the three services' gRPC ports (SQLite, PostgreSQL):
an undecodable request is refused after the caller's token is checked (UNAUTHENTICATED without one,
INVALID_ARGUMENT naming `request` with one), never UNKNOWN with the decoder's error; thread ids
outside the documented alphabet are refused at ingest and registration, so every listed thread can
be opened; and a NUL in an id is INVALID_ARGUMENT, not an internal error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as cb_pb
from boss.conversations.v1 import conversations_pb2 as conv_pb
from boss.scheduler.v1 import scheduler_pb2 as sched_pb
from grpc_status import rpc_status

from services.shared.auth import bearer_metadata
from services.shared.errors import field_violations_of
from tests.conftest import DatabaseTarget
from tests.integration.test_trust_boundaries import Caller, World
from tests.integration.trust_stack import TrustStack, running_trust_stack

GARBAGE = b"\xff\xff\xff\x07"  # not protobuf wire format for any message


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[TrustStack]:
    async with running_trust_stack(database_target, tmp_path) as running:
        yield running


async def refusal(call: object) -> tuple[grpc.StatusCode, list[str], str]:
    """Awaits a call that must fail: its code, BadRequest fields and details."""
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        status = await rpc_status.aio.from_call(call)  # type: ignore[arg-type]
        fields = [v.field for v in field_violations_of(status)] if status else []
        return error.code(), fields, error.details() or ""
    raise AssertionError("the call succeeded")


@pytest.mark.parametrize(
    ("service", "unary", "stream"),
    [
        ("context_budget", "GetThreadContext", "StreamThreadContext"),
        ("scheduler", "GetThreadSchedule", "WatchEvents"),
        ("conversations", "ListConversations", "WatchEvents"),
    ],
)
async def test_an_undecodable_request_is_refused_after_the_token_check(
    stack: TrustStack, service: str, unary: str, stream: str
) -> None:
    package = {"context_budget": "ContextBudgetService", "scheduler": "SchedulerService"}.get(
        service, "ConversationsService"
    )
    prefix = f"/boss.{service}.v1.{package}/"
    token = bearer_metadata(stack.authority.issue_service("bad-input-test"))
    async with grpc.aio.insecure_channel(stack.addresses[service]) as channel:
        call = channel.unary_unary(prefix + unary)
        anonymous = await refusal(call(GARBAGE))
        assert anonymous[0] is grpc.StatusCode.UNAUTHENTICATED
        code, fields, details = await refusal(call(GARBAGE, metadata=token))
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["request"])
        assert "DecodeError" not in details and "Traceback" not in details

        if stream == "StreamThreadContext":
            opened = channel.stream_stream(prefix + stream)(
                metadata=bearer_metadata(stack.authority.issue_worker("w", "n"))
            )
            await opened.write(GARBAGE)
        else:
            opened = channel.unary_stream(prefix + stream)(GARBAGE, metadata=token)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await opened.read()
        assert ended.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "thread_id",
    ["a/b", "a\u202eb", "a\u2066b", "thread\x00id", "caf\u00e9", "with space"],
)
async def test_a_thread_id_outside_the_alphabet_is_refused_at_ingest_and_registration(
    stack: TrustStack, thread_id: str
) -> None:
    device = Caller(
        "worker", "worker", False, bearer_metadata(stack.authority.issue_worker("w", "n")), "w", "n"
    )
    snapshot = World(stack).snapshot(thread_id, 50.0, device)
    code, fields, _details = await refusal(
        stack.budget.ReportThreadContext(
            cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=device.metadata
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "snapshot.thread_id" in fields
    code, fields, _details = await refusal(
        stack.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(thread_id=thread_id, node_id="n", worker_id="w"),
            metadata=device.metadata,
        )
    )
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["thread_id"])


async def test_a_thread_id_of_the_alphabet_is_accepted_and_a_nul_in_a_read_is_bad_input(
    stack: TrustStack,
) -> None:
    device = Caller(
        "worker", "worker", False, bearer_metadata(stack.authority.issue_worker("w", "n")), "w", "n"
    )
    thread_id = "0199c2a4-5b1e-7c2d-9e3f-a1b2c3d4e5f6:x_y.z@node+1"
    snapshot = World(stack).snapshot(thread_id, 50.0, device)
    ack = await stack.budget.ReportThreadContext(
        cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=device.metadata
    )
    assert ack.ack.accepted
    registered = await stack.conversations.RegisterThread(
        conv_pb.RegisterThreadRequest(thread_id=thread_id, node_id="n", worker_id="w"),
        metadata=device.metadata,
    )
    assert registered.thread.thread_id == thread_id
    client = stack.client("local")
    for call in (
        stack.conversations.GetThreadContextBudget(
            conv_pb.GetThreadContextBudgetRequest(thread_id="a\x00b"), metadata=client
        ),
        stack.conversations.GetProject(conv_pb.GetProjectRequest(project_id="p\x00"), metadata=client),
        stack.scheduler.GetHandoffPackage(
            sched_pb.GetHandoffPackageRequest(handoff_package_id="hp\x00"), metadata=client
        ),
        stack.scheduler.GetThreadSchedule(
            sched_pb.GetThreadScheduleRequest(thread_id="t\x00"), metadata=client
        ),
        # A huge id is bad input too (its NOT_FOUND would not even fit gRPC's trailing metadata).
        stack.scheduler.GetHandoffPackage(
            sched_pb.GetHandoffPackageRequest(handoff_package_id="a" * 100_000), metadata=client
        ),
    ):
        code, fields, _details = await refusal(call)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and len(fields) == 1


@pytest.mark.parametrize("after_sequence", [2**63, 2**64 - 1])
@pytest.mark.parametrize(
    "rpc",
    [
        "context_budget WatchEvents",
        "scheduler WatchEvents",
        "conversations WatchEvents",
        "conversations ListEvents",
    ],
)
async def test_an_after_sequence_beyond_int64_is_invalid_argument_at_every_event_read(
    stack: TrustStack, rpc: str, after_sequence: int
) -> None:
    service = stack.service()
    calls = {
        "context_budget WatchEvents": lambda: stack.budget.WatchEvents(
            cb_pb.WatchEventsRequest(after_sequence=after_sequence), metadata=service
        ),
        "scheduler WatchEvents": lambda: stack.scheduler.WatchEvents(
            sched_pb.WatchEventsRequest(after_sequence=after_sequence), metadata=service
        ),
        "conversations WatchEvents": lambda: stack.conversations.WatchEvents(
            conv_pb.WatchEventsRequest(after_sequence=after_sequence), metadata=service
        ),
        "conversations ListEvents": lambda: stack.conversations.ListEvents(
            conv_pb.ListEventsRequest(after_sequence=after_sequence), metadata=service
        ),
    }
    call = calls[rpc]()
    try:
        # A bounded wait: a stream that swallowed the error would otherwise hang the test.
        await asyncio.wait_for(call.read() if hasattr(call, "read") else call, 10)
    except grpc.aio.AioRpcError as error:
        status = await rpc_status.aio.from_call(call)
        assert (error.code(), error.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid argument: after_sequence: must be at most 2^63-1",
        )
        assert status is not None and [v.field for v in field_violations_of(status)] == ["after_sequence"]
    else:
        raise AssertionError(f"{rpc} took after_sequence {after_sequence}")


async def test_the_largest_int64_after_sequence_is_a_valid_empty_read(stack: TrustStack) -> None:
    page = await stack.conversations.ListEvents(
        conv_pb.ListEventsRequest(after_sequence=2**63 - 1), metadata=stack.service()
    )
    assert (list(page.events), page.scanned_through_sequence) == ([], 2**63 - 1)
