"""Events through the outbox and WatchEvents: payloads, level changes, compaction risk, resume."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.shared.time import isoformat_utc, utc_now
from tests.integration.context_budget.conftest import Tokens
from tests.integration.context_budget.support import auth, read_events, report, snapshot


async def test_level_changes_publish_updates_level_changes_and_alert_changes(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for version, pct in enumerate((80, 45, 30, 70), start=1):
        await report(stub, tokens.worker, snapshot(pct=pct, version=version))
    events = await read_events(stub, tokens.admin, 0, 12)
    assert [
        (kind, payload.get("to_level") or payload.get("alert_status")) for _seq, kind, payload in events
    ] == [
        ("thread.context.updated", None),
        ("thread.context.level_changed", "safe"),
        ("thread.context.updated", None),
        ("thread.context.level_changed", "watch"),
        ("thread.context.alert_changed", "opened"),
        ("thread.context.updated", None),
        ("thread.context.level_changed", "urgent"),
        ("thread.context.alert_changed", "resolved"),
        ("thread.context.alert_changed", "opened"),
        ("thread.context.updated", None),
        ("thread.context.level_changed", "safe"),
        ("thread.context.alert_changed", "resolved"),
    ]
    assert [seq for seq, _kind, _payload in events] == list(range(1, 13))

    watch_opened = events[4][2]
    urgent_resolved = events[11][2]
    assert (watch_opened["alert_type"], events[7][2]["alert_type"]) == ("context_watch", "context_watch")
    assert events[7][2]["alert_id"] == watch_opened["alert_id"]
    assert urgent_resolved["alert_type"] == "context_urgent" and urgent_resolved["resolved_at"]
    updated = events[5][2]
    assert updated["context_budget_level"] == "urgent" and updated["previous_level"] == "watch"
    assert updated["master_actions"] == [
        "prepare_handoff",
        "avoid_large_context_append",
        "finish_current_subtask",
        "precreate_relay_thread",
    ]
    assert updated["next_required_report_in_seconds"] == 5
    assert events[6][2] == {
        "thread_id": "thread-abc",
        "project_id": "proj-001",
        "node_id": "mac-01",
        "owner_id": "owner-1",
        "from_level": "watch",
        "to_level": "urgent",
        "context_budget_remaining_pct": 30.0,
        "captured_at": updated["captured_at"],
    }

    alerts = (
        await stub.ListAlerts(pb.ListAlertsRequest(thread_id="thread-abc"), metadata=auth(tokens.admin))
    ).alerts
    assert sorted((a.alert_type, a.alert_status) for a in alerts) == [
        (pb.ALERT_TYPE_CONTEXT_WATCH, pb.ALERT_STATUS_RESOLVED),
        (pb.ALERT_TYPE_CONTEXT_URGENT, pb.ALERT_STATUS_RESOLVED),
    ]


async def test_compaction_risk_opens_and_resolves_with_events(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    captured = utc_now() - timedelta(seconds=30)
    near = snapshot(pct=70, version=1, captured_at=captured)
    near.compaction_expected_at.FromDatetime(captured + timedelta(minutes=4))
    await report(stub, tokens.worker, near)
    far = snapshot(pct=70, version=2, captured_at=captured + timedelta(seconds=10))
    far.compaction_expected_at.FromDatetime(captured + timedelta(hours=2))
    await report(stub, tokens.worker, far)

    risk = await read_events(
        stub,
        tokens.admin,
        0,
        2,
        types=["thread.context.compaction_risk_opened", "thread.context.compaction_risk_resolved"],
    )
    (_s1, opened_type, opened), (_s2, resolved_type, resolved) = risk
    assert (opened_type, resolved_type) == (
        "thread.context.compaction_risk_opened",
        "thread.context.compaction_risk_resolved",
    )
    assert opened["alert_id"] == resolved["alert_id"]
    assert opened["compaction_expected_at"] == isoformat_utc(captured + timedelta(minutes=4))
    assert "within 10 minutes" in opened["reason"]
    assert resolved["compaction_expected_at"] == isoformat_utc(captured + timedelta(hours=2))

    context = (
        await stub.GetThreadContext(
            pb.GetThreadContextRequest(thread_id="thread-abc"), metadata=auth(tokens.client)
        )
    ).thread_context
    assert list(context.open_alerts) == []


async def test_must_finish_at_urgent_is_a_compaction_risk_and_compactions_are_observed(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    await report(stub, tokens.worker, snapshot(pct=30, version=1, compaction_count=1))
    await report(
        stub,
        tokens.worker,
        snapshot(pct=28, version=2, compaction_count=1, must_finish_before_compaction=True),
    )
    compacted = snapshot(pct=85, version=3, compaction_count=2, must_finish_before_compaction=True)
    compacted.last_compaction_at.FromDatetime(utc_now() - timedelta(seconds=3))
    await report(stub, tokens.worker, compacted)
    events = await read_events(
        stub,
        tokens.admin,
        0,
        3,
        types=[
            "thread.context.compaction_risk_opened",
            "thread.context.compaction_risk_resolved",
            "thread.context.compaction_observed",
        ],
    )
    assert [kind for _s, kind, _p in events] == [
        "thread.context.compaction_risk_opened",
        "thread.context.compaction_risk_resolved",
        "thread.context.compaction_observed",
    ]
    assert events[0][2]["reason"] == "level urgent and must finish before compaction"
    observed = events[2][2]
    assert (observed["compaction_count"], observed["previous_compaction_count"]) == (2, 1)
    assert observed["last_compaction_at"] is not None


async def test_watch_events_resumes_after_a_sequence_without_loss_or_repeat(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    for n in range(6):
        await report(stub, tokens.worker, snapshot(f"t-{n}", pct=80))
    # Each new safe thread publishes updated + level_changed: 12 events.
    first = await read_events(stub, tokens.admin, 0, 5)
    assert [seq for seq, _k, _p in first] == [1, 2, 3, 4, 5]
    rest = await read_events(stub, tokens.admin, first[-1][0], 7)
    assert [seq for seq, _k, _p in rest] == list(range(6, 13))
    assert {p["thread_id"] for _s, _k, p in first + rest} == {f"t-{n}" for n in range(6)}

    # A follower at the head receives live events as they commit, and only those.
    follower = asyncio.ensure_future(read_events(stub, tokens.admin, 12, 2))
    await asyncio.sleep(0.2)
    await report(stub, tokens.worker, snapshot("t-live", pct=80))
    live = await follower
    assert [(seq, kind) for seq, kind, _p in live] == [
        (13, "thread.context.updated"),
        (14, "thread.context.level_changed"),
    ]
    assert live[0][2]["thread_id"] == "t-live"


async def test_events_name_their_subjects_on_the_envelope(
    stub: pb_grpc.ContextBudgetServiceStub, tokens: Tokens
) -> None:
    await report(stub, tokens.worker, snapshot(pct=80))
    call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), metadata=auth(tokens.admin))
    envelope = (await call.read()).events[0]
    call.cancel()
    assert (envelope.sequence, envelope.type) == (1, "thread.context.updated")
    assert (envelope.thread_id, envelope.project_id, envelope.node_id) == ("thread-abc", "proj-001", "mac-01")
    assert envelope.HasField("occurred_at")
