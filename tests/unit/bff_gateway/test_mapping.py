"""JSON <-> proto conversions of the gateway (pure: plain values in, plain values out)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

from boss.context_budget.v1 import context_budget_pb2 as pb

from services.bff_gateway.mapping import (
    ack_from_proto,
    checklist_item,
    json_field_of,
    level_from_proto,
    master_actions_from_proto,
    projection_checklist_item,
    snapshot_to_proto,
    thread_context_view,
)
from services.bff_gateway.schemas import (
    CHECKLIST_LABELS,
    AlertStatusName,
    AlertTypeName,
    ContextBudgetLevelName,
    MasterActionName,
    SourceKindName,
    ThreadContextReport,
)
from services.conversations.domain.model import CHECKLIST_ITEMS as PROJECTION_CHECKLIST
from services.scheduler.domain.handoff import CHECKLIST_ITEMS as SCHEDULER_CHECKLIST
from services.shared.time import from_timestamp, to_timestamp
from tests.unit.bff_gateway.seed_example import SEED


def json_names(enum: object, prefix: str) -> set[str]:
    """The lower-case suffixes of a proto enum's values, without "unspecified"."""
    names = {value.name.removeprefix(prefix).lower() for value in enum.DESCRIPTOR.values}  # type: ignore[attr-defined]
    return names - {"unspecified"}


def test_json_enum_names_are_exactly_the_proto_suffixes() -> None:
    assert set(get_args(ContextBudgetLevelName)) == json_names(pb.ContextBudgetLevel, "CONTEXT_BUDGET_LEVEL_")
    assert set(get_args(SourceKindName)) == json_names(pb.SourceKind, "SOURCE_KIND_")
    assert set(get_args(MasterActionName)) == json_names(pb.MasterAction, "MASTER_ACTION_")
    assert set(get_args(AlertTypeName)) == json_names(pb.AlertType, "ALERT_TYPE_")
    assert set(get_args(AlertStatusName)) == json_names(pb.AlertStatus, "ALERT_STATUS_")


def test_seed_body_maps_to_a_utc_snapshot() -> None:
    snapshot = snapshot_to_proto(ThreadContextReport.model_validate(SEED))

    assert from_timestamp(snapshot.captured_at) == datetime(2026, 3, 25, 7, 56, tzinfo=UTC)
    assert from_timestamp(snapshot.compaction_expected_at) == datetime(2026, 3, 25, 8, 8, 30, tzinfo=UTC)
    assert from_timestamp(snapshot.last_compaction_at) == datetime(2026, 3, 25, 7, 12, 10, tzinfo=UTC)
    assert snapshot.source_kind == pb.SOURCE_KIND_WORKER_ESTIMATOR
    assert snapshot.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_URGENT
    assert snapshot.context_budget_remaining_pct == 37.0
    assert snapshot.HasField("estimated_remaining_turns") and snapshot.estimated_remaining_turns == 5
    assert snapshot.estimated_remaining_large_messages == 2
    assert snapshot.compaction_count == 1
    assert snapshot.must_finish_before_compaction is True
    assert (snapshot.project_id, snapshot.task_id) == ("proj-001", "task-017")


def test_absent_optional_fields_stay_unset_in_the_proto() -> None:
    minimal = {
        key: SEED[key]
        for key in (
            "node_id",
            "worker_id",
            "thread_id",
            "source_kind",
            "context_budget_remaining_pct",
            "captured_at",
        )
    }

    snapshot = snapshot_to_proto(ThreadContextReport.model_validate(minimal))

    assert snapshot.context_budget_level == pb.CONTEXT_BUDGET_LEVEL_UNSPECIFIED
    for field in (
        "compaction_expected_at",
        "last_compaction_at",
        "estimated_remaining_turns",
        "estimated_remaining_large_messages",
        "codex_context_left_pct",
    ):
        assert not snapshot.HasField(field), field
    assert (snapshot.project_id, snapshot.task_id, snapshot.snapshot_id) == ("", "", "")


def test_zero_estimates_are_sent_as_present_zeros() -> None:
    snapshot = snapshot_to_proto(
        ThreadContextReport.model_validate(
            {**SEED, "estimated_remaining_turns": 0, "codex_context_left_pct": 0}
        )
    )

    assert snapshot.HasField("estimated_remaining_turns") and snapshot.estimated_remaining_turns == 0
    assert snapshot.HasField("codex_context_left_pct") and snapshot.codex_context_left_pct == 0


def test_ack_maps_to_the_seed_response_shape_keeping_action_order() -> None:
    ack = pb.ThreadContextAck(
        accepted=True,
        thread_id="thread-abc",
        context_budget_level=pb.CONTEXT_BUDGET_LEVEL_URGENT,
        next_required_report_in_seconds=5,
        master_actions=[pb.MASTER_ACTION_PREPARE_HANDOFF, pb.MASTER_ACTION_AVOID_LARGE_CONTEXT_APPEND],
        superseded=True,
    )

    assert ack_from_proto(ack).model_dump() == {
        "accepted": True,
        "thread_id": "thread-abc",
        "context_budget_level": "urgent",
        "next_required_report_in_seconds": 5,
        "master_actions": ["prepare_handoff", "avoid_large_context_append"],
        "duplicate": False,
        "superseded": True,
    }


def test_unspecified_and_unknown_enum_values_are_dropped() -> None:
    assert level_from_proto(pb.CONTEXT_BUDGET_LEVEL_UNSPECIFIED) is None
    assert level_from_proto(99) is None
    assert master_actions_from_proto(
        [pb.MASTER_ACTION_UNSPECIFIED, 42, pb.MASTER_ACTION_FREEZE_CONTEXT_GROWTH]
    ) == ["freeze_context_growth"]


def test_thread_view_turns_unknown_figures_into_nulls() -> None:
    context = pb.ThreadContext(
        snapshot=pb.ThreadContextSnapshot(
            thread_id="thread-abc",
            node_id="mac-01",
            worker_id="worker-mac-01",
            source_kind=pb.SOURCE_KIND_CODEX_APP_SERVER,
            context_budget_remaining_pct=12.5,
            captured_at=to_timestamp(datetime(2026, 3, 25, 7, 56, tzinfo=UTC)),
        ),
        context_budget_level=pb.CONTEXT_BUDGET_LEVEL_CRITICAL,
        next_required_report_in_seconds=5,
    )

    view = thread_context_view(context).model_dump(mode="json")

    assert view["project_id"] is None
    assert view["must_finish_reason"] is None
    assert view["estimated_remaining_turns"] is None
    assert view["codex_context_left_pct"] is None
    assert (view["last_total_tokens"], view["model_context_window"], view["auto_compact_token_limit"]) == (
        None,
        None,
        None,
    )
    assert view["compaction_expected_at"] is None and view["updated_at"] is None
    assert view["captured_at"] == "2026-03-25T07:56:00Z"
    assert view["context_budget_level"] == "critical"
    assert view["source_kind"] == "codex_app_server"
    assert (view["wrap_up_checklist"], view["handoff_package"]) == ([], None)


def test_thread_view_says_where_l_came_from_and_a_compaction_awaiting_its_reading() -> None:
    context = pb.ThreadContext(
        snapshot=pb.ThreadContextSnapshot(
            thread_id="thread-abc",
            node_id="mac-01",
            worker_id="worker-mac-01",
            source_kind=pb.SOURCE_KIND_WORKER_ESTIMATOR,
            context_budget_remaining_pct=100.0,
            compaction_count=2,
            auto_compact_token_limit=20_000,
            compaction_limit_source=pb.COMPACTION_LIMIT_SOURCE_CONFIGURED,
            awaiting_reading_after_compaction=True,
            captured_at=to_timestamp(datetime(2026, 3, 25, 7, 56, tzinfo=UTC)),
        ),
        context_budget_level=pb.CONTEXT_BUDGET_LEVEL_SAFE,
    )
    view = thread_context_view(context).model_dump(mode="json")
    assert (view["compaction_limit_source"], view["auto_compact_token_limit"]) == ("configured", 20_000)
    assert view["awaiting_reading_after_compaction"] is True
    assert (view["last_total_tokens"], view["codex_context_left_pct"]) == (None, None)
    unreported = thread_context_view(pb.ThreadContext(snapshot=pb.ThreadContextSnapshot())).model_dump()
    assert (unreported["compaction_limit_source"], unreported["awaiting_reading_after_compaction"]) == (
        None,
        False,
    )


def test_alerts_map_with_lower_case_names_and_utc_time() -> None:
    context = pb.ThreadContext(
        snapshot=pb.ThreadContextSnapshot(thread_id="t", node_id="n"),
        open_alerts=[
            pb.ThreadContextAlert(
                alert_id="a-1",
                alert_type=pb.ALERT_TYPE_HANDOFF_MISSING,
                alert_status=pb.ALERT_STATUS_ACKED,
                opened_at=to_timestamp(datetime(2026, 3, 25, 8, 0, tzinfo=UTC)),
                reason="compacted without package",
            )
        ],
    )

    [alert] = thread_context_view(context).model_dump(mode="json")["open_alerts"]

    assert alert == {
        "alert_id": "a-1",
        "alert_type": "handoff_missing",
        "alert_status": "acked",
        "opened_at": "2026-03-25T08:00:00Z",
        "reason": "compacted without package",
    }


def test_field_violation_paths_become_json_field_names() -> None:
    assert json_field_of("snapshot.captured_at") == "captured_at"
    assert json_field_of("snapshots[12].context_budget_remaining_pct") == "context_budget_remaining_pct"
    assert json_field_of("thread_id") == "thread_id"
    assert json_field_of("policy.safe_min_pct") == "policy.safe_min_pct"


def test_checklist_labels_are_the_projections_for_the_schedulers_items() -> None:
    assert tuple(CHECKLIST_LABELS) == SCHEDULER_CHECKLIST
    assert tuple(CHECKLIST_LABELS.items()) == PROJECTION_CHECKLIST


def test_scheduler_checklist_item_gets_key_label_status_and_detail() -> None:
    assert checklist_item("last_test_run", "missing", "no test run in the session") == {
        "key": "last_test_run",
        "label": "The last test conclusion",
        "status": "missing",
        "detail": "no test run in the session",
    }
    assert checklist_item("new_item", None) == {
        "key": "new_item",
        "label": "new item",
        "status": "pending",
        "detail": "",
    }


def test_projection_item_is_missing_only_once_the_package_is_ready() -> None:
    label = "Open questions"

    assert projection_checklist_item("open_questions", label, True, "ready")["status"] == "done"
    assert projection_checklist_item("open_questions", label, False, "ready") == {
        "key": "open_questions",
        "label": label,
        "status": "missing",
        "detail": "not in the handoff package",
    }
    assert projection_checklist_item("open_questions", label, False, "required")["status"] == "pending"
    assert projection_checklist_item("open_questions", label, False, "none")["status"] == "pending"


def test_thread_view_checklist_has_the_one_item_shape() -> None:
    context = pb.ThreadContext(snapshot=pb.ThreadContextSnapshot(thread_id="t1"))
    item = checklist_item("patches", "done", "2 patches")

    view = thread_context_view(context, wrap_up_checklist=[item]).model_dump()

    assert view["wrap_up_checklist"] == [
        {"key": "patches", "label": "Patches done and not done", "status": "done", "detail": "2 patches"}
    ]
