"""Unary ingest: ack fields, persistence of every field, validation, duplicates, ordering, group commit."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from sqlalchemy import select

from services.context_budget.adapters.protobuf import snapshot_input_of
from services.context_budget.adapters.tables import thread_context_snapshots, thread_contexts
from services.context_budget.domain.ingest import StoredSnapshot
from services.context_budget.domain.model import ContextBudgetLevel, ThreadState
from services.context_budget.domain.validation import validate_snapshot
from services.context_budget.server import ContextBudgetService
from services.shared.time import utc_now
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import (
    auth,
    count_rows,
    report,
    rpc_failure,
    snapshot,
    violation_fields,
)

ACTIONS = {
    pb.CONTEXT_BUDGET_LEVEL_SAFE: [pb.MASTER_ACTION_REFRESH_STAGE_SUMMARY],
    pb.CONTEXT_BUDGET_LEVEL_WATCH: [
        pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND,
        pb.MASTER_ACTION_PREPARE_HANDOFF,
    ],
    pb.CONTEXT_BUDGET_LEVEL_URGENT: [
        pb.MASTER_ACTION_PREPARE_HANDOFF,
        pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND,
        pb.MASTER_ACTION_FINISH_CURRENT_SUBTASK,
        pb.MASTER_ACTION_PRECREATE_RELAY_THREAD,
    ],
    pb.CONTEXT_BUDGET_LEVEL_CRITICAL: [
        pb.MASTER_ACTION_RUN_PRE_COMPACTION_WRAP_UP,
        pb.MASTER_ACTION_PREPARE_HANDOFF,
        pb.MASTER_ACTION_FREEZE_CONTEXT_GROWTH,
        pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND,
    ],
}


@pytest.mark.parametrize(
    ("pct", "level", "cadence"),
    [
        (75.0, pb.CONTEXT_BUDGET_LEVEL_SAFE, 30),
        (40.0, pb.CONTEXT_BUDGET_LEVEL_WATCH, 15),
        (37.0, pb.CONTEXT_BUDGET_LEVEL_URGENT, 5),
        (24.9, pb.CONTEXT_BUDGET_LEVEL_CRITICAL, 5),
    ],
)
async def test_ack_carries_level_cadence_and_master_actions(
    stub: pb_grpc.ContextBudgetServiceStub,
    tokens: Tokens,
    pct: float,
    level: pb.ContextBudgetLevel,
    cadence: int,
) -> None:
    ack = await report(stub, tokens.worker, snapshot(pct=pct, snapshot_id="snap-1"))
    assert ack.accepted and not ack.duplicate and not ack.superseded
    assert (ack.thread_id, ack.snapshot_id) == ("thread-abc", "snap-1")
    assert ack.context_budget_level == level
    assert ack.next_required_report_in_seconds == cadence
    assert list(ack.master_actions) == ACTIONS[level]
    assert not ack.HasField("error")


@pytest.mark.parametrize(("minutes", "asks_for_handoff"), [(5, True), (30, False)])
async def test_a_compaction_expected_within_the_horizon_adds_prepare_handoff_at_any_level(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens, minutes: int, asks_for_handoff: bool
) -> None:
    message = snapshot(pct=80.0, snapshot_id=f"snap-{minutes}")
    message.compaction_expected_at.FromDatetime(message.captured_at.ToDatetime() + timedelta(minutes=minutes))
    ack = await report(stub, tokens.worker, message)
    assert ack.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE
    expected = ACTIONS[pb.CONTEXT_BUDGET_LEVEL_SAFE] + (
        [pb.MASTER_ACTION_PREPARE_HANDOFF] if asks_for_handoff else []
    )
    assert list(ack.master_actions) == expected  # what the scheduler's compaction-near rule sends
    context = (
        await stub.GetThreadContext(
            pb.GetThreadContextRequest(thread_id=message.thread_id), metadata=auth(tokens.client)
        )
    ).thread_context
    assert list(context.master_actions) == expected, "the thread's current context lists the ack's actions"


async def test_every_field_is_persisted_in_history_and_current_state(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    captured = utc_now().replace(microsecond=123456) - timedelta(seconds=30)
    message = snapshot(
        pct=37.5,
        snapshot_id="seed-example",
        task_id="task-017",
        context_budget_level=pb.CONTEXT_BUDGET_LEVEL_SAFE,
        must_finish_before_compaction=True,
        must_finish_reason="uncommitted changes in 3 files",
        estimated_remaining_turns=5,
        estimated_remaining_large_messages=2,
        compaction_count=1,
        version=42,
        captured_at=captured,
        last_total_tokens=160_000,
        model_context_window=258_400,
        auto_compact_token_limit=244_800,
        codex_context_left_pct=40,
        codex_folder="/src/app",
    )
    message.compaction_expected_at.FromDatetime(captured + timedelta(minutes=40))
    message.last_compaction_at.FromDatetime(captured - timedelta(minutes=44))
    ack = await report(stub, tokens.worker, message)
    assert ack.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT

    async with service.database.read() as connection:
        history = (await connection.execute(select(thread_context_snapshots))).mappings().one()
        current = (await connection.execute(select(thread_contexts))).mappings().one()
    expected = {
        "snapshot_id": "seed-example",
        "project_id": "proj-001",
        "task_id": "task-017",
        "thread_id": "thread-abc",
        "node_id": "mac-01",
        "worker_id": "worker-mac-01",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": 37.5,
        "context_budget_level": "urgent",
        "reported_context_budget_level": "safe",
        "compaction_expected_at": captured + timedelta(minutes=40),
        "must_finish_before_compaction": True,
        "must_finish_reason": "uncommitted changes in 3 files",
        "estimated_remaining_turns": 5,
        "estimated_remaining_large_messages": 2,
        "last_compaction_at": captured - timedelta(minutes=44),
        "compaction_count": 1,
        "snapshot_version": 42,
        "captured_at": captured,
        "last_total_tokens": 160_000,
        "model_context_window": 258_400,
        "auto_compact_token_limit": 244_800,
        "codex_context_left_pct": 40,
        "codex_folder": "/src/app",
    }
    for row in (history, current):
        assert {name: row[name] for name in expected} == expected
    assert history["superseded"] is False
    assert abs((history["received_at"] - utc_now()).total_seconds()) < 30
    assert current["updated_at"] == history["received_at"]

    context = (
        await stub.GetThreadContext(
            pb.GetThreadContextRequest(thread_id="thread-abc"), metadata=auth(tokens.client)
        )
    ).thread_context
    assert context.snapshot == message
    assert context.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT
    assert context.reported_context_budget_level == pb.CONTEXT_BUDGET_LEVEL_SAFE
    assert list(context.master_actions) == ACTIONS[pb.CONTEXT_BUDGET_LEVEL_URGENT]
    assert context.next_required_report_in_seconds == 5


async def test_invalid_snapshot_is_rejected_with_every_field_named_and_nothing_stored(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    bad = snapshot(pct=150.0, thread_id="", compaction_count=-2)
    bad.captured_at.FromDatetime(utc_now() + timedelta(hours=1))
    call = stub.ReportThreadContext(pb.ReportThreadContextRequest(snapshot=bad), metadata=auth(tokens.worker))
    code, status = await rpc_failure(call)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(status) == [
        "snapshot.thread_id",
        "snapshot.context_budget_remaining_pct",
        "snapshot.captured_at",
        "snapshot.compaction_count",
    ]
    assert await count_rows(service, thread_context_snapshots) == 0
    assert await count_rows(service, thread_contexts) == 0


async def test_missing_snapshot_and_unknown_enum_numbers_are_invalid_arguments(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    code, status = await rpc_failure(
        stub.ReportThreadContext(pb.ReportThreadContextRequest(), metadata=auth(tokens.worker))
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and violation_fields(status) == ["snapshot"]
    unknown = snapshot(source_kind=99, context_budget_level=17)  # type: ignore[arg-type]
    code, status = await rpc_failure(
        stub.ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=unknown), metadata=auth(tokens.worker)
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert violation_fields(status) == ["snapshot.source_kind", "snapshot.context_budget_level"]


async def test_duplicates_are_answered_but_stored_once(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    first = await report(stub, tokens.worker, snapshot(pct=45, snapshot_id="dup"))
    again = await report(stub, tokens.worker, snapshot(pct=45, snapshot_id="dup"))
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.accepted and again.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_WATCH

    # Without a snapshot_id the server derives a stable one, so a resent reading is a duplicate too.
    captured = utc_now() - timedelta(minutes=1)
    derived = await report(stub, tokens.worker, snapshot(pct=45, version=9, captured_at=captured))
    resent = await report(stub, tokens.worker, snapshot(pct=45, version=9, captured_at=captured))
    assert derived.snapshot_id and resent.snapshot_id == derived.snapshot_id
    assert (derived.duplicate, resent.duplicate) == (False, True)
    assert await count_rows(service, thread_context_snapshots) == 2


async def test_older_readings_are_kept_in_history_but_never_overwrite_the_current_state(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    newer = await report(stub, tokens.worker, snapshot(pct=45, version=10, snapshot_id="v10"))
    older = await report(stub, tokens.worker, snapshot(pct=10, version=9, snapshot_id="v9"))
    assert newer.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_WATCH
    assert older.accepted and older.superseded and not older.duplicate
    assert older.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_WATCH
    context = (
        await stub.GetThreadContext(
            pb.GetThreadContextRequest(thread_id="thread-abc"), metadata=auth(tokens.client)
        )
    ).thread_context
    assert context.snapshot.snapshot_id == "v10"
    assert await count_rows(service, thread_context_snapshots) == 2
    assert await count_rows(service, thread_context_snapshots, superseded=True) == 1


async def test_concurrent_unary_calls_share_transactions(
    service: ContextBudgetService, stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    before = service.batcher.batches_committed
    acks = await asyncio.gather(
        *(report(stub, tokens.worker, snapshot(f"thread-{n}", pct=n)) for n in range(40))
    )
    assert [ack.thread_id for ack in acks] == [f"thread-{n}" for n in range(40)]
    assert all(ack.accepted for ack in acks)
    assert service.batcher.batches_committed - before < 40
    assert await count_rows(service, thread_contexts) == 40


async def test_a_failed_batch_fails_every_waiter_and_stores_nothing(
    service: ContextBudgetService,
    stub: pb_grpc.ContextBudgetServiceStub,
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def failing_append(*_args: object) -> int:
        raise RuntimeError("disk full")

    # The outbox append runs after the snapshot and current-state writes of the same transaction.
    monkeypatch.setattr(service.event_log, "append", failing_append)
    calls = [
        stub.ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=snapshot(f"thread-{n}")), metadata=auth(tokens.worker)
        )
        for n in range(5)
    ]
    failures = await asyncio.gather(*(rpc_failure(call) for call in calls))
    assert {code for code, _status in failures} == {grpc.StatusCode.INTERNAL}
    assert await count_rows(service, thread_context_snapshots) == 0
    assert await count_rows(service, thread_contexts) == 0
    monkeypatch.undo()
    ack = await report(stub, tokens.worker, snapshot("thread-0"))
    assert ack.accepted
    assert await count_rows(service, thread_context_snapshots) == 1


@pytest.mark.parametrize("threads", [1, 70])
async def test_the_stored_current_row_never_goes_back_to_an_older_reading(
    service: ContextBudgetService, threads: int
) -> None:
    """The guard on the current-row write (for a writer in another process that planned on a stale
    view): small batches and COPY-sized batches alike keep the newer reading."""
    repository = service.handlers._repository
    now = utc_now()

    def states(version: int) -> tuple[list[StoredSnapshot], list[ThreadState]]:
        stored, current = [], []
        for n in range(threads):
            reading = validate_snapshot(
                snapshot_input_of(snapshot(f"t-{n}", pct=version * 10, version=version)), now=now, prefix="s"
            )
            stored.append(StoredSnapshot(reading, ContextBudgetLevel.CRITICAL, superseded=False))
            current.append(ThreadState(reading, ContextBudgetLevel.CRITICAL, None, None, now))
        return stored, current

    for version in (5, 3):
        stored, current = states(version)
        async with service.database.transaction() as connection:
            await repository.write_readings(connection, stored, current, now)
    assert await count_rows(service, thread_contexts, snapshot_version=5) == threads
    assert await count_rows(service, thread_context_snapshots) == 2 * threads
