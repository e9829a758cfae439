"""Reads (GetThreadContext, ListThreadContexts paging) and authentication / authorisation."""

from __future__ import annotations

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.context_budget.adapters.tables import thread_context_snapshots
from services.context_budget.server import ContextBudgetService
from services.shared.errors import reason_of
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import (
    auth,
    count_rows,
    report,
    rpc_failure,
    snapshot,
    violation_fields,
)


async def test_get_thread_context_unknown_and_missing_ids(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    client = auth(tokens.client)
    code, status = await rpc_failure(
        stub.GetThreadContext(pb.GetThreadContextRequest(thread_id="nope"), metadata=client)
    )
    assert code is grpc.StatusCode.NOT_FOUND and reason_of(status) == "THREAD_NOT_FOUND"
    code, status = await rpc_failure(stub.GetThreadContext(pb.GetThreadContextRequest(), metadata=client))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["thread_id"]


async def test_list_thread_contexts_filters_and_pages(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for n in range(5):
        await report(stub, tokens.worker, snapshot(f"a-thread-{n}", pct=20 * n))
    await report(stub, tokens.worker, snapshot("b-thread", project_id="proj-002"))
    client = auth(tokens.client)

    pages: list[list[str]] = []
    token = ""
    while True:
        page = await stub.ListThreadContexts(
            pb.ListThreadContextsRequest(project_id="proj-001", page_size=2, page_token=token),
            metadata=client,
        )
        pages.append([c.snapshot.thread_id for c in page.thread_contexts])
        token = page.next_page_token
        if not token:
            break
    assert pages == [["a-thread-0", "a-thread-1"], ["a-thread-2", "a-thread-3"], ["a-thread-4"]]

    chosen = await stub.ListThreadContexts(
        pb.ListThreadContextsRequest(thread_ids=["b-thread", "a-thread-0", "missing"]), metadata=client
    )
    assert [c.snapshot.thread_id for c in chosen.thread_contexts] == ["a-thread-0", "b-thread"]
    critical = chosen.thread_contexts[0]
    assert critical.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_CRITICAL
    assert [a.alert_type for a in critical.open_alerts] == [pb.ALERT_TYPE_CONTEXT_CRITICAL]
    everything = await stub.ListThreadContexts(pb.ListThreadContextsRequest(), metadata=client)
    assert len(everything.thread_contexts) == 6 and everything.next_page_token == ""


async def test_list_thread_contexts_rejects_bad_paging(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for n in range(3):
        await report(stub, tokens.worker, snapshot(f"t-{n}"))
    client = auth(tokens.client)
    first = await stub.ListThreadContexts(
        pb.ListThreadContextsRequest(project_id="proj-001", page_size=1), metadata=client
    )
    assert first.next_page_token
    for request, field in (
        (pb.ListThreadContextsRequest(page_size=-1), "page_size"),
        (pb.ListThreadContextsRequest(page_token="not-a-token"), "page_token"),
        (pb.ListThreadContextsRequest(project_id="proj-002", page_token=first.next_page_token), "page_token"),
        (pb.ListThreadContextsRequest(page_token=first.next_page_token[:-2] + "AA"), "page_token"),
        (pb.ListThreadContextsRequest(thread_ids=["ok", ""]), "thread_ids[1]"),
        (pb.ListThreadContextsRequest(thread_ids=[f"t{n}" for n in range(1_001)]), "thread_ids"),
    ):
        code, status = await rpc_failure(stub.ListThreadContexts(request, metadata=client))
        assert code is grpc.StatusCode.INVALID_ARGUMENT, field
        assert violation_fields(status) == [field]


@pytest.mark.parametrize("token_name", ["missing", "expired", "forged", "garbage"])
async def test_invalid_tokens_are_unauthenticated_and_nothing_is_stored(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens, token_name: str
) -> None:
    metadata = {
        "missing": (),
        "expired": auth(tokens.expired),
        "forged": auth(tokens.forged),
        "garbage": (("authorization", "Bearer not.a.jwt"),),
    }[token_name]
    code, _ = await rpc_failure(
        stub.ReportThreadContext(pb.ReportThreadContextRequest(snapshot=snapshot()), metadata=metadata)
    )
    assert code is grpc.StatusCode.UNAUTHENTICATED
    code, _ = await rpc_failure(
        stub.GetThreadContext(pb.GetThreadContextRequest(thread_id="thread-abc"), metadata=metadata)
    )
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert await count_rows(service, thread_context_snapshots) == 0


async def test_scopes_and_worker_binding_are_enforced(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    client_report = stub.ReportThreadContext(
        pb.ReportThreadContextRequest(snapshot=snapshot()), metadata=auth(tokens.client)
    )
    assert (await rpc_failure(client_report))[0] is grpc.StatusCode.PERMISSION_DENIED
    foreign = stub.ReportThreadContext(
        pb.ReportThreadContextRequest(snapshot=snapshot()), metadata=auth(tokens.other_worker)
    )
    assert (await rpc_failure(foreign))[0] is grpc.StatusCode.PERMISSION_DENIED
    wrong_node = stub.ReportThreadContext(
        pb.ReportThreadContextRequest(snapshot=snapshot(node_id="win-02")), metadata=auth(tokens.worker)
    )
    assert (await rpc_failure(wrong_node))[0] is grpc.StatusCode.PERMISSION_DENIED
    assert await count_rows(service, thread_context_snapshots) == 0

    worker_read = stub.GetThreadContext(
        pb.GetThreadContextRequest(thread_id="x"), metadata=auth(tokens.worker)
    )
    assert (await rpc_failure(worker_read))[0] is grpc.StatusCode.PERMISSION_DENIED
    worker_watch = stub.WatchEvents(pb.WatchEventsRequest(), metadata=auth(tokens.worker))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await worker_watch.read()
    assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_health_and_reflection_need_no_token(service: ContextBudgetService) -> None:
    async with grpc.aio.insecure_channel(service.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "boss.context_budget.v1.ContextBudgetService"):
            response = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert response.status == health_pb2.HealthCheckResponse.SERVING
