"""Trust boundaries at ingest: a thread belongs to the device that first reported it, owners see only
their own threads, and a reused snapshot_id with a different reading is refused (never a silent
duplicate). Unary and stream, on SQLite and PostgreSQL."""

from __future__ import annotations

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from grpc_status import rpc_status

from services.context_budget.adapters.tables import thread_context_snapshots, thread_contexts
from services.context_budget.server import ContextBudgetService
from services.shared.errors import field_violations_of
from tests.integration.context_budget.conftest import OWNER_ID, Tokens
from tests.integration.context_budget.support import (
    NODE_ID,
    WORKER_ID,
    auth,
    count_rows,
    report,
    rpc_failure,
    snapshot,
    violation_fields,
)


def reason_of(status: object) -> str:
    """The ErrorInfo reason of a rich status."""
    from google.rpc import error_details_pb2

    for detail in status.details:  # type: ignore[attr-defined]
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    raise AssertionError("no ErrorInfo")


async def current_pct(service: ContextBudgetService, thread_id: str) -> float:
    view = await service.handlers.get_thread_context(thread_id)
    return view.state.snapshot.context_budget_remaining_pct


async def test_a_different_reading_under_a_stored_snapshot_id_is_refused_and_changes_nothing(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    first = await report(stub, tokens.worker, snapshot(pct=45, snapshot_id="reading-1"))
    repeat = await report(stub, tokens.worker, snapshot(pct=45, snapshot_id="reading-1"))
    assert (first.duplicate, repeat.duplicate) == (False, True)

    call = stub.ReportThreadContext(
        pb.ReportThreadContextRequest(snapshot=snapshot(pct=12.5, snapshot_id="reading-1")),
        metadata=auth(tokens.worker),
    )
    code, status = await rpc_failure(call)
    assert code is grpc.StatusCode.ALREADY_EXISTS
    assert violation_fields(status) == ["snapshot_id"]
    assert reason_of(status) == "SNAPSHOT_ID_REUSED"
    assert await count_rows(service, thread_context_snapshots) == 1
    assert await current_pct(service, "thread-abc") == 45.0

    # The same in the stream: the reused id gets an error ack, the rest of the message is applied.
    stream = stub.StreamThreadContext(metadata=auth(tokens.worker))
    await stream.write(
        pb.StreamThreadContextRequest(
            batch_id=3,
            snapshots=[
                snapshot(pct=45, snapshot_id="reading-1"),
                snapshot(pct=12.5, version=1, snapshot_id="reading-1", must_finish_reason="other"),
                snapshot(pct=30, version=2, snapshot_id="reading-2"),
                snapshot(pct=31, version=2, snapshot_id="reading-2"),
            ],
        )
    )
    response = await stream.read()
    await stream.done_writing()
    exact, reused, applied, reused_in_batch = response.acks
    assert exact.accepted and exact.duplicate
    for refused in (reused, reused_in_batch):
        assert not refused.accepted and refused.error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
        assert [v.field for v in field_violations_of(refused.error)] == ["snapshot_id"]
    assert applied.accepted and not applied.duplicate
    assert await count_rows(service, thread_context_snapshots) == 2
    assert await current_pct(service, "thread-abc") == 30.0


async def test_another_device_cannot_report_a_thread_and_nothing_changes(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    await report(stub, tokens.worker, snapshot(pct=80, snapshot_id="mine"))
    other_owner = service.authority.issue_worker("worker-b", "node-b", owner_id="owner-2")
    # The trial's attack: worker B, with its own valid token, reports A's thread at 12.5 %.
    for token, worker_id, node_id in (
        (tokens.other_worker, "worker-win-02", "win-02"),  # the same owner's other device
        (other_owner, "worker-b", "node-b"),  # another owner's device
    ):
        call = stub.ReportThreadContext(
            pb.ReportThreadContextRequest(
                snapshot=snapshot(pct=12.5, version=5, worker_id=worker_id, node_id=node_id)
            ),
            metadata=auth(token),
        )
        code, status = await rpc_failure(call)
        assert code is grpc.StatusCode.PERMISSION_DENIED
        assert status is not None and reason_of(status) == "THREAD_BOUND_TO_OTHER_DEVICE"
        assert NODE_ID not in status.message and OWNER_ID not in status.message
    # Even a device of another owner with the very same worker and node names is another device.
    twin = service.authority.issue_worker(WORKER_ID, NODE_ID, owner_id="owner-2")
    code, status = await rpc_failure(
        stub.ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=snapshot(pct=12.5, version=6)), metadata=auth(twin)
        )
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED

    stream = stub.StreamThreadContext(metadata=auth(other_owner))
    await stream.write(
        pb.StreamThreadContextRequest(
            batch_id=1,
            snapshots=[
                snapshot(pct=12.5, version=7, worker_id="worker-b", node_id="node-b"),
                snapshot("thread-of-b", pct=50, worker_id="worker-b", node_id="node-b"),
            ],
        )
    )
    refused, own = (await stream.read()).acks
    await stream.done_writing()
    assert not refused.accepted and refused.error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert own.accepted

    assert await count_rows(service, thread_context_snapshots, thread_id="thread-abc") == 1
    view = await service.handlers.get_thread_context("thread-abc")
    assert view.state.snapshot.context_budget_remaining_pct == 80.0
    assert (view.state.snapshot.owner_id, view.state.snapshot.node_id) == (OWNER_ID, NODE_ID)
    assert await count_rows(service, thread_contexts, owner_id="owner-2") == 1


async def test_client_tokens_see_only_their_owners_threads_and_alerts(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    await report(stub, tokens.worker, snapshot("thread-of-a", pct=30))
    other_worker = service.authority.issue_worker("worker-b", "node-b", owner_id="owner-2")
    await report(stub, other_worker, snapshot("thread-of-b", pct=20, worker_id="worker-b", node_id="node-b"))
    client_b = auth(service.authority.issue_client("owner-2"))

    code, status = await rpc_failure(
        stub.GetThreadContext(pb.GetThreadContextRequest(thread_id="thread-of-a"), metadata=client_b)
    )
    assert code is grpc.StatusCode.NOT_FOUND
    unknown_code, unknown = await rpc_failure(
        stub.GetThreadContext(pb.GetThreadContextRequest(thread_id="no-such-thread"), metadata=client_b)
    )
    assert (unknown_code, reason_of(status)) == (code, reason_of(unknown))  # the same answer

    listed = await stub.ListThreadContexts(pb.ListThreadContextsRequest(), metadata=client_b)
    assert [c.snapshot.thread_id for c in listed.thread_contexts] == ["thread-of-b"]
    alerts = await stub.ListAlerts(pb.ListAlertsRequest(), metadata=client_b)
    assert {alert.thread_id for alert in alerts.alerts} == {"thread-of-b"}
    asked = await stub.ListAlerts(pb.ListAlertsRequest(thread_id="thread-of-a"), metadata=client_b)
    assert list(asked.alerts) == []
    every = await stub.ListThreadContexts(pb.ListThreadContextsRequest(), metadata=auth(tokens.admin))
    assert [c.snapshot.thread_id for c in every.thread_contexts] == ["thread-of-a", "thread-of-b"]

    watch = stub.WatchEvents(pb.WatchEventsRequest(), metadata=client_b)
    try:
        await watch.read()
    except grpc.aio.AioRpcError as error:
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    else:
        raise AssertionError("a client token followed every owner's events")
    status = await rpc_status.aio.from_call(watch)
    assert status is not None and reason_of(status) == "TOKEN_KIND_NOT_ALLOWED"
