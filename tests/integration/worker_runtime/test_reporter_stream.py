"""StreamReporter against the real context_budget service: batching, per-item rejections that leave
the stream open, per-item storage failures that are re-sent, and a server restart on the same port
that loses no snapshot."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from sqlalchemy.exc import OperationalError

from services.context_budget.domain.ingest import IngestOutcome
from services.context_budget.domain.model import Snapshot
from services.shared.time import to_timestamp, utc_now
from tests.integration.worker_runtime.support import (
    NODE_ID,
    WORKER_ID,
    ContextBudgetHarness,
    RecordingReporter,
    eventually,
    running_agent,
    worker_settings,
)
from worker.demo_sessions import DemoSessionPlayer, write_demo_codex_home
from worker.snapshots import level_for_percent, snapshot_id_for


def make_snapshot(
    thread_id: str, percent: float = 72.5, version: int = 1, **fields: object
) -> pb.ThreadContextSnapshot:
    captured_at = utc_now() - timedelta(seconds=30) + timedelta(milliseconds=version)
    values: dict[str, object] = {
        "snapshot_id": snapshot_id_for(WORKER_ID, thread_id, version, captured_at),
        "thread_id": thread_id,
        "worker_id": WORKER_ID,
        "node_id": NODE_ID,
        "source_kind": pb.SOURCE_KIND_WORKER_ESTIMATOR,
        "context_budget_remaining_pct": percent,
        "context_budget_level": level_for_percent(min(percent, 100.0)),
        "snapshot_version": version,
        "captured_at": to_timestamp(captured_at),
    }
    values.update(fields)
    return pb.ThreadContextSnapshot(**values)  # type: ignore[arg-type]


async def test_everything_due_together_goes_in_one_message(context_budget: ContextBudgetHarness) -> None:
    reporter = RecordingReporter(context_budget.address, context_budget.worker_token())
    reporter.start()
    try:
        reporter.submit([make_snapshot(f"thread-{index:04d}") for index in range(1_200)])

        assert await reporter.flush(15.0)
        assert reporter.stats.acked == 1_200
        assert reporter.stats.batches_sent == 3
        assert await context_budget.stored_snapshot_ids() == reporter.submitted_ids
    finally:
        await reporter.close()


async def test_a_rejected_snapshot_is_dropped_and_the_stream_stays_open(
    context_budget: ContextBudgetHarness,
) -> None:
    reporter = RecordingReporter(context_budget.address, context_budget.worker_token())
    reporter.start()
    try:
        invalid = make_snapshot("thread-bad", percent=150.0)
        foreign = make_snapshot("thread-foreign", worker_id="worker-other", node_id="node-other")
        reporter.submit([make_snapshot("thread-1"), invalid, foreign, make_snapshot("thread-2")])

        assert await reporter.flush(10.0)
        assert (reporter.stats.acked, reporter.stats.rejected) == (2, 2)
        assert reporter.unacked_count == 0
        assert reporter.stats.streams_opened == 1
        rejections = "\n".join(reporter.stats.rejections)
        assert f"{invalid.snapshot_id}: snapshots[1].context_budget_remaining_pct" in rejections
        assert foreign.snapshot_id in rejections
        assert reporter.last_ack("thread-bad") is None

        later = make_snapshot("thread-3", percent=30.0)
        reporter.submit([later])
        assert await reporter.flush(10.0)
        assert reporter.stats.streams_opened == 1
        ack = reporter.last_ack("thread-3")
        assert ack is not None
        assert ack.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT
        assert ack.next_required_report_in_seconds == 5
        stored = await context_budget.stored_snapshot_ids()
        assert invalid.snapshot_id not in stored and later.snapshot_id in stored
    finally:
        await reporter.close()


async def test_snapshots_submitted_around_a_server_restart_are_all_acked(
    context_budget: ContextBudgetHarness,
) -> None:
    reporter = RecordingReporter(context_budget.address, context_budget.worker_token(), max_batch=50)
    reporter.start()
    try:
        reporter.submit([make_snapshot(f"before-{index:03d}") for index in range(150)])
        stopping = asyncio.create_task(context_budget.stop(grace=0.1))
        reporter.submit([make_snapshot(f"during-{index:03d}") for index in range(150)])
        await stopping
        reporter.submit([make_snapshot(f"down-{index:03d}") for index in range(100)])
        await asyncio.sleep(0.5)
        assert reporter.unacked_count > 0

        await context_budget.start()

        assert await reporter.flush(20.0), f"{reporter.unacked_count} snapshot(s) never acked"
        assert reporter.stats.stream_failures >= 1
        assert reporter.buffer_counters.superseded == 0
        assert len(reporter.submitted_ids) == 400
        assert await context_budget.stored_snapshot_ids() == reporter.submitted_ids
        assert reporter.stats.rejected == 0
    finally:
        await reporter.close()


async def test_the_agent_reconnects_and_reports_what_happened_while_the_server_was_down(
    context_budget: ContextBudgetHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="worker.reporter")
    codex_home = tmp_path / "codex"
    threads = write_demo_codex_home(codex_home, utc_now(), threads=3)
    ids = [thread.codex_thread_id for thread in threads]

    async with running_agent(worker_settings(codex_home, context_budget)) as running:

        async def all_reported() -> bool:
            return running.reporter.unacked_count == 0 and all(running.reporter.last_ack(i) for i in ids)

        await eventually(all_reported, what="the first reports")
        await context_budget.stop()
        advanced = DemoSessionPlayer(threads).advance(utc_now())

        def handed_over() -> bool:
            sent = [running.agent.threads[t.codex_thread_id].last_sent for t in advanced]
            return all(
                s is not None and s.last_total_tokens == t.last_total_tokens
                for s, t in zip(sent, advanced, strict=True)
            )

        await eventually(handed_over, what="the agent to hand over the new readings")
        assert running.reporter.unacked_count == 3
        await eventually(
            lambda: any("unreachable" in r.getMessage() for r in caplog.records),
            timeout=20.0,
            what="the outage said",
        )

        await context_budget.start()
        await eventually(lambda: running.reporter.unacked_count == 0, timeout=20.0, what="acks after restart")
        # The outage's end is said once, as its start was.
        back = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
        assert len(back) == 1 and "reporting resumes" in back[0]

        stored = await context_budget.stored_snapshot_ids()
        assert running.reporter.submitted_ids <= stored
        assert running.reporter.buffer_counters.superseded == 0
        for thread in advanced:
            context = await context_budget.thread_context(thread.codex_thread_id)
            assert context is not None
            assert context.snapshot.last_total_tokens == thread.last_total_tokens


async def test_snapshots_the_server_could_not_store_are_resent_not_dropped(
    context_budget: ContextBudgetHarness,
) -> None:
    service = context_budget.service
    assert service is not None
    store = service.batcher._process  # fault injection around the service's real ingest transaction
    failures = [OperationalError("INSERT", {}, ConnectionError("database gone")), ValueError("bug")]

    async def failing_then_storing(items: list[Snapshot]) -> list[IngestOutcome]:
        if failures:
            raise failures.pop(0)
        return await store(items)

    service.batcher._process = failing_then_storing
    reporter = RecordingReporter(context_budget.address, context_budget.worker_token())
    reporter.start()
    try:
        reporter.submit([make_snapshot(f"thread-{index}") for index in range(3)])

        assert await reporter.flush(15.0)
        assert failures == []
        assert (reporter.stats.acked, reporter.stats.rejected) == (3, 0)
        assert reporter.stats.streams_opened == 1
        assert await context_budget.stored_snapshot_ids() == reporter.submitted_ids
    finally:
        await reporter.close()
