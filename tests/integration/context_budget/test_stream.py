"""Bidirectional ingest stream: per-snapshot acks, per-item rejections, an open stream, concurrency."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from google.rpc import code_pb2

from services.context_budget.adapters.tables import thread_context_snapshots, thread_contexts
from services.context_budget.server import ContextBudgetService
from services.shared.errors import field_violations_of
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import auth, count_rows, read_events, snapshot


class Stream:
    """One open StreamThreadContext call: send a message, read its response."""

    def __init__(self, stub: pb_grpc.ContextBudgetServiceStub, token: str) -> None:
        self.call = stub.StreamThreadContext(metadata=auth(token))

    async def exchange(
        self, batch_id: int, snapshots: Sequence[pb.ThreadContextSnapshot]
    ) -> pb.StreamThreadContextResponse:
        await self.call.write(pb.StreamThreadContextRequest(batch_id=batch_id, snapshots=snapshots))
        response = await self.call.read()
        assert response is not grpc.aio.EOF
        return response

    async def close(self) -> None:
        await self.call.done_writing()
        assert await self.call.read() is grpc.aio.EOF
        assert await self.call.code() is grpc.StatusCode.OK


def fields_of(ack: pb.ThreadContextAck) -> list[str]:
    return [violation.field for violation in field_violations_of(ack.error)]


async def test_mixed_message_gets_one_ack_per_snapshot_and_the_stream_stays_open(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    stream = Stream(stub, tokens.worker)
    response = await stream.exchange(
        7,
        [
            snapshot("t-valid-1", pct=80),
            snapshot("t-invalid", pct=150),
            snapshot("t-foreign", worker_id="worker-win-02", node_id="win-02"),
            snapshot("t-valid-2", pct=30),
            snapshot("t-wrong-node", node_id="other-node"),
        ],
    )
    assert response.batch_id == 7
    acks = response.acks
    assert [ack.accepted for ack in acks] == [True, False, False, True, False]
    assert [ack.thread_id for ack in acks] == [
        "t-valid-1",
        "t-invalid",
        "t-foreign",
        "t-valid-2",
        "t-wrong-node",
    ]
    assert acks[0].context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE
    assert acks[3].context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT
    assert acks[3].next_required_report_in_seconds == 5
    assert acks[1].error.code == code_pb2.INVALID_ARGUMENT
    assert fields_of(acks[1]) == ["snapshots[1].context_budget_remaining_pct"]
    assert acks[2].error.code == code_pb2.PERMISSION_DENIED
    assert acks[4].error.code == code_pb2.PERMISSION_DENIED
    assert not acks[0].HasField("error")

    later = await stream.exchange(8, [snapshot("t-valid-1", pct=45, version=2)])
    assert later.batch_id == 8
    assert later.acks[0].accepted and later.acks[0].context_budget_level == pb.CONTEXT_BUDGET_LEVEL_WATCH
    await stream.close()
    assert await count_rows(service, thread_context_snapshots) == 3
    assert await count_rows(service, thread_contexts) == 2


async def test_empty_and_oversized_messages_are_rejected_as_a_whole(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    stream = Stream(stub, tokens.worker)
    empty = await stream.exchange(1, [])
    assert len(empty.acks) == 1
    assert empty.acks[0].error.code == code_pb2.INVALID_ARGUMENT and fields_of(empty.acks[0]) == ["snapshots"]

    oversized = await stream.exchange(2, [snapshot(f"t-{n}") for n in range(1_001)])
    assert len(oversized.acks) == 1_001
    assert all(not ack.accepted and fields_of(ack) == ["snapshots"] for ack in oversized.acks)
    assert await count_rows(service, thread_context_snapshots) == 0

    full = await stream.exchange(3, [snapshot(f"t-{n}") for n in range(1_000)])
    assert all(ack.accepted for ack in full.acks)
    await stream.close()
    assert await count_rows(service, thread_contexts) == 1_000


async def test_snapshots_of_one_thread_in_one_message_apply_in_order(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    stream = Stream(stub, tokens.worker)
    response = await stream.exchange(
        1,
        [
            snapshot("t1", pct=80, version=1),
            snapshot("t1", pct=50, version=2),
            snapshot("t1", pct=20, version=3),
            snapshot("t1", pct=90, version=2, snapshot_id="late-and-old"),
        ],
    )
    levels = [ack.context_budget_level for ack in response.acks]
    assert levels == [
        pb.CONTEXT_BUDGET_LEVEL_SAFE,
        pb.CONTEXT_BUDGET_LEVEL_WATCH,
        pb.CONTEXT_BUDGET_LEVEL_CRITICAL,
        pb.CONTEXT_BUDGET_LEVEL_CRITICAL,
    ]
    assert [ack.superseded for ack in response.acks] == [False, False, False, True]
    await stream.close()
    changes = await read_events(stub, tokens.admin, 0, 3, types=["thread.context.level_changed"])
    assert [(p["from_level"], p["to_level"]) for _s, _t, p in changes] == [
        (None, "safe"),
        ("safe", "watch"),
        ("watch", "critical"),
    ]


async def test_two_concurrent_streams_store_everything_exactly_once(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    other_stub_token = tokens.other_worker

    async def run(
        token: str, worker_id: str, node_id: str, prefix: str
    ) -> list[pb.StreamThreadContextResponse]:
        async def requests() -> AsyncIterator[pb.StreamThreadContextRequest]:
            for batch in range(5):
                yield pb.StreamThreadContextRequest(
                    batch_id=batch,
                    snapshots=[
                        snapshot(
                            f"{prefix}-{n}", pct=n, version=batch + 1, worker_id=worker_id, node_id=node_id
                        )
                        for n in range(100)
                    ],
                )

        call = stub.StreamThreadContext(requests(), metadata=auth(token))
        return [response async for response in call]

    first, second = await asyncio.gather(
        run(tokens.worker, "worker-mac-01", "mac-01", "mac"),
        run(other_stub_token, "worker-win-02", "win-02", "win"),
    )
    for responses in (first, second):
        assert [response.batch_id for response in responses] == [0, 1, 2, 3, 4]
        assert all(ack.accepted and not ack.superseded for r in responses for ack in r.acks)
        assert sum(len(r.acks) for r in responses) == 500
    assert await count_rows(service, thread_context_snapshots) == 1_000
    assert await count_rows(service, thread_contexts) == 200
    assert await count_rows(service, thread_contexts, snapshot_version=5) == 200


async def test_a_stream_without_report_scope_is_refused(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for token, code in (
        (tokens.client, grpc.StatusCode.PERMISSION_DENIED),
        (tokens.expired, grpc.StatusCode.UNAUTHENTICATED),
    ):
        call = stub.StreamThreadContext(metadata=auth(token))
        # The server refuses on the metadata, before any message: reading shows its status. (A
        # write could race the refusal and fail locally with INTERNAL instead.)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() is code
        assert await call.code() is code


async def test_a_stopping_server_ends_an_open_stream_after_answering_what_it_read(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    stream = Stream(stub, tokens.worker)
    answered = await stream.exchange(1, [snapshot("t-1", pct=80)])
    assert answered.acks[0].accepted
    # The server begins to stop (ServiceHost's on_draining): the worker's stream ends at once, with
    # OK, instead of holding the shutdown for its grace period; the worker reconnects elsewhere.
    service.servicer.end_report_streams()
    async with asyncio.timeout(5):
        assert await stream.call.read() is grpc.aio.EOF
        assert await stream.call.code() is grpc.StatusCode.OK
    assert await count_rows(service, thread_context_snapshots) == 1
