"""The reporter's span per report: recorded only when tracing is on, its context carried in the
snapshot (worker/reporter.py, "Traces")."""

from __future__ import annotations

from boss.context_budget.v1 import context_budget_pb2

from tests.tracing_support import ids, ids_of, recorded_spans, spans_named
from worker.reporter import StreamReporter


def snap(snapshot_id: str, thread: str = "t1") -> context_budget_pb2.ThreadContextSnapshot:
    return context_budget_pb2.ThreadContextSnapshot(snapshot_id=snapshot_id, thread_id=thread)


def test_each_new_report_gets_a_span_whose_context_the_snapshot_carries() -> None:
    reporter = StreamReporter("127.0.0.1:9", "token")
    first, second = snap("s1", "t1"), snap("s2", "t2")
    with recorded_spans() as spans:
        assert reporter.submit([first, second, first]) == 2  # the repeat is still unacked: no report
    reported = spans_named(spans, "report thread context")

    assert [dict(span.attributes or {}) for span in reported] == [
        {"thread_id": "t1", "snapshot_id": "s1"},
        {"thread_id": "t2", "snapshot_id": "s2"},
    ]
    for snapshot, span in zip((first, second), reported, strict=True):
        assert ids_of(snapshot.trace_context) == ids(span)
    assert reported[0].context.trace_id != reported[1].context.trace_id  # one trace per report


def test_without_tracing_a_report_carries_no_context() -> None:
    reporter = StreamReporter("127.0.0.1:9", "token")
    snapshot = snap("s1")

    assert reporter.submit([snapshot]) == 1
    assert dict(snapshot.trace_context) == {}
