"""Traces through ingest (services/context_budget/handlers.py, "Traces"): one stream message
carrying several reports, stored in one transaction, still gives each report its own trace, and
every event carries the span of the report it follows from."""

from __future__ import annotations

from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.context_budget.server import ContextBudgetService
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import auth, snapshot
from tests.tracing_support import ids, ids_of, recorded_spans, spans_named
from worker.reporter import trace_report


async def test_each_report_of_a_message_gets_its_own_ingest_span_and_events(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    reports = [snapshot("t-trace-1", pct=80), snapshot("t-trace-2", pct=30), snapshot("t-untraced")]
    with recorded_spans() as spans:
        for message in reports[:2]:
            trace_report(message)  # as the worker's reporter does
        call = stub.StreamThreadContext(metadata=auth(tokens.worker))
        await call.write(pb.StreamThreadContextRequest(batch_id=1, snapshots=reports))
        response = await call.read()
        call.cancel()
    assert [ack.accepted for ack in response.acks] == [True, True, True]
    assert service.batcher.batches_committed == 1, "the three reports shared one transaction"

    reported = {span.attributes["thread_id"]: span for span in spans_named(spans, "report thread context")}
    ingested = {span.attributes["thread_id"]: span for span in spans_named(spans, "ingest snapshot")}
    assert set(ingested) == {"t-trace-1", "t-trace-2", "t-untraced"}
    for thread_id, report in reported.items():
        ingest = ingested[thread_id]
        assert ingest.context.trace_id == report.context.trace_id
        assert ingest.parent is not None and ingest.parent.span_id == report.context.span_id
    untraced = ingested["t-untraced"]
    assert untraced.parent is None, "a report without a context starts a trace of its own"

    events = await service.event_log.read_after(0)
    assert events
    for event in events:
        ingest = ingested[event.thread_id]
        assert ids_of(event.trace_context) == ids(ingest)
    assert {event.thread_id for event in events} == set(ingested)
