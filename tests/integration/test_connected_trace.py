"""One worker report, one connected trace (docs/operations.md, "Traces"), on SQLite and PostgreSQL.

The three services wired as in production (tests/integration/trust_stack.py) and the gateway in
front of conversations, all in this process with tracing on and every span kept in memory; an SSE
client connected. The worker's own reporter (worker/reporter.py) sends one snapshot over
StreamThreadContext. Then: the report's span; context_budget's "ingest snapshot" span its child in
the same trace; the scheduler's and conversations' "apply context_budget events" batch spans each
linking to that ingest span; and the gateway's "deliver sse event" span for the event conversations
published linking to conversations' batch span, which the event carries, so the delivery leads
back to the report's trace.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from boss.context_budget.v1 import context_budget_pb2 as cb_pb
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.shared.time import to_timestamp, utc_now
from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import SseReader, serve_gateway_app
from tests.integration.trust_stack import SECRET, running_trust_stack
from tests.tracing_support import ids, ids_of, recorded_spans
from worker.reporter import StreamReporter

WORKER_ID, NODE_ID, OWNER_ID = "worker-traced", "node-traced", "owner-traced"
WAIT_SECONDS = 10.0


async def finished_span(
    spans: InMemorySpanExporter, name: str, matches: Callable[[ReadableSpan], bool]
) -> ReadableSpan:
    """The one finished span called `name` that `matches`, waiting up to WAIT_SECONDS for it."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        found = [span for span in spans.get_finished_spans() if span.name == name and matches(span)]
        if found:
            assert len(found) == 1, found
            return found[0]
        if asyncio.get_running_loop().time() > deadline:
            names = sorted({span.name for span in spans.get_finished_spans()})
            raise AssertionError(f"no finished {name!r} span that matches; finished: {names}")
        await asyncio.sleep(0.05)


def a_reading(thread_id: str) -> cb_pb.ThreadContextSnapshot:
    """One reading of a thread, as the worker builds them."""
    return cb_pb.ThreadContextSnapshot(
        snapshot_id=f"snap-{uuid.uuid4().hex[:12]}",
        thread_id=thread_id,
        node_id=NODE_ID,
        worker_id=WORKER_ID,
        source_kind=cb_pb.SOURCE_KIND_WORKER_ESTIMATOR,
        context_budget_remaining_pct=62.0,
        snapshot_version=1,
        captured_at=to_timestamp(utc_now() - timedelta(seconds=5)),
        last_total_tokens=90_000,
        codex_folder="/home/dev/traced",
    )


def attribute(name: str, value: object) -> Callable[[ReadableSpan], bool]:
    """Matches spans whose attribute `name` is `value`."""
    return lambda span: (span.attributes or {}).get(name) == value


def link_ids(span: ReadableSpan) -> list[tuple[int, int]]:
    """(trace id, span id) of each span `span` links to."""
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


async def test_one_report_makes_one_connected_trace_to_the_sse_client(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    thread_id = f"th-{uuid.uuid4().hex[:10]}"
    with recorded_spans() as spans:
        async with (
            running_trust_stack(database_target, tmp_path) as stack,
            serve_gateway_app(stack.addresses["conversations"], SECRET) as (_base_url, http, _app),
        ):
            client = {"Authorization": f"Bearer {stack.authority.issue_client(OWNER_ID)}"}
            async with http.stream("GET", "/api/v1/events", headers=client) as response:
                assert response.status_code == 200
                sse = SseReader(response)
                assert (await sse.next_event()).event == "stream.opened"

                reporter = StreamReporter(
                    stack.addresses["context_budget"],
                    stack.authority.issue_worker(WORKER_ID, NODE_ID, owner_id=OWNER_ID),
                )
                reporter.start()
                try:
                    reporter.submit([a_reading(thread_id)])
                    assert await reporter.flush(WAIT_SECONDS), reporter.stats
                finally:
                    await reporter.close()
                *_before, indicator = await sse.events_until(
                    lambda event: event.event == "conversation.context_indicator.updated", WAIT_SECONDS
                )
                assert indicator.data["thread_id"] == thread_id
                sequence = int(indicator.id)

                report = await finished_span(
                    spans, "report thread context", attribute("thread_id", thread_id)
                )
                ingest = await finished_span(spans, "ingest snapshot", attribute("thread_id", thread_id))
                scheduler_batch = await finished_span(
                    spans,
                    "apply context_budget events",
                    attribute("code.function.name", "SchedulerHandlers.apply_budget_events"),
                )
                conversations_batch = await finished_span(
                    spans,
                    "apply context_budget events",
                    attribute("code.function.name", "ConversationsHandlers.apply_budget_events"),
                )
                delivery = await finished_span(spans, "deliver sse event", attribute("sequence", sequence))
                [published] = await stack.conversations_app.event_log.read_after(sequence - 1, limit=1)

    # worker -> context_budget: the ingest span is the report span's child, in its trace.
    trace_id = report.context.trace_id
    assert ingest.context.trace_id == trace_id
    assert ingest.parent is not None and ingest.parent.span_id == report.context.span_id
    # context_budget's outbox -> scheduler / conversations: batch spans of their own, linked to it.
    for batch in (scheduler_batch, conversations_batch):
        assert batch.parent is None and batch.context.trace_id != trace_id
        assert link_ids(batch) == [ids(ingest)]
    # conversations' outbox -> gateway SSE: the event carries conversations' batch span, and its
    # delivery to the client links to that span, whose link leads back to the report's trace.
    assert published.type == indicator.event
    assert ids_of(published.trace_context) == ids(conversations_batch)
    assert dict(delivery.attributes or {}) == {"event_type": indicator.event, "sequence": sequence}
    assert delivery.parent is None
    assert link_ids(delivery) == [ids(conversations_batch)]
    assert [trace for trace, _span in link_ids(conversations_batch)] == [trace_id]
