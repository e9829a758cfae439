"""Pure conversions between the REST JSON shapes (schemas.py) and the context_budget protos.

Enum values travel as the lower-case suffix of the proto name: `CONTEXT_BUDGET_LEVEL_URGENT` is
"urgent", `MASTER_ACTION_PREPARE_HANDOFF` is "prepare_handoff". Instants are UTC on both sides.
No I/O here: unit-tested with plain values.
"""

from __future__ import annotations

import logging
import re
from typing import Any, cast

from boss.context_budget.v1 import context_budget_pb2 as pb
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from services.bff_gateway.schemas import (
    CHECKLIST_LABELS,
    AlertStatusName,
    AlertTypeName,
    ChecklistItemView,
    ChecklistStatusName,
    CompactionLimitSourceName,
    ContextBudgetLevelName,
    MasterActionName,
    SourceKindName,
    ThreadContextAlertView,
    ThreadContextBudgetView,
    ThreadContextReport,
    ThreadContextReportAck,
)
from services.shared.time import from_timestamp, to_timestamp

log = logging.getLogger(__name__)

_LEVEL_PREFIX = "CONTEXT_BUDGET_LEVEL_"
_SOURCE_PREFIX = "SOURCE_KIND_"
_ACTION_PREFIX = "MASTER_ACTION_"
_ALERT_TYPE_PREFIX = "ALERT_TYPE_"
_ALERT_STATUS_PREFIX = "ALERT_STATUS_"
_LIMIT_SOURCE_PREFIX = "COMPACTION_LIMIT_SOURCE_"
_SNAPSHOT_PATH = re.compile(r"^(snapshot|snapshots\[\d+\]|thread_context\.snapshot)\.")


def _enum_number(enum: Any, prefix: str, name: str) -> int:
    """The proto number of lower-case `name` (e.g. "urgent" -> CONTEXT_BUDGET_LEVEL_URGENT)."""
    return int(enum.Value(prefix + name.upper()))


def _enum_name(enum: Any, prefix: str, number: int) -> str | None:
    """The lower-case JSON name of proto value `number`; None for *_UNSPECIFIED and for values this
    gateway does not know yet (a newer server)."""
    try:
        name = str(enum.Name(number))
    except ValueError:
        log.warning("unknown %s value %d from context_budget", prefix.rstrip("_"), number)
        return None
    suffix = name.removeprefix(prefix)
    return None if suffix == "UNSPECIFIED" else suffix.lower()


def level_to_proto(level: ContextBudgetLevelName | None) -> int:
    """`"urgent"` -> CONTEXT_BUDGET_LEVEL_URGENT; None -> CONTEXT_BUDGET_LEVEL_UNSPECIFIED."""
    if level is None:
        return pb.CONTEXT_BUDGET_LEVEL_UNSPECIFIED
    return _enum_number(pb.ContextBudgetLevel, _LEVEL_PREFIX, level)


def level_from_proto(number: int) -> ContextBudgetLevelName | None:
    """CONTEXT_BUDGET_LEVEL_URGENT -> "urgent"; UNSPECIFIED or unknown -> None."""
    return cast(ContextBudgetLevelName | None, _enum_name(pb.ContextBudgetLevel, _LEVEL_PREFIX, number))


def source_kind_to_proto(kind: SourceKindName) -> int:
    """`"worker_estimator"` -> SOURCE_KIND_WORKER_ESTIMATOR."""
    return _enum_number(pb.SourceKind, _SOURCE_PREFIX, kind)


def source_kind_from_proto(number: int) -> SourceKindName | None:
    """SOURCE_KIND_WORKER_ESTIMATOR -> "worker_estimator"; UNSPECIFIED or unknown -> None."""
    return cast(SourceKindName | None, _enum_name(pb.SourceKind, _SOURCE_PREFIX, number))


def compaction_limit_source_from_proto(number: int) -> CompactionLimitSourceName | None:
    """COMPACTION_LIMIT_SOURCE_CONFIGURED -> "configured"; UNSPECIFIED or unknown -> None."""
    name = _enum_name(pb.CompactionLimitSource, _LIMIT_SOURCE_PREFIX, number)
    return cast(CompactionLimitSourceName | None, name)


def master_actions_from_proto(numbers: Any) -> list[MasterActionName]:
    """Repeated MasterAction -> JSON names, order kept; UNSPECIFIED and unknown values dropped."""
    names = (_enum_name(pb.MasterAction, _ACTION_PREFIX, int(number)) for number in numbers)
    return [cast(MasterActionName, name) for name in names if name is not None]


def _set_timestamp(message: Message, field: str, value: Any) -> None:
    """Sets Timestamp `field` of `message` from an aware datetime; leaves it unset for None."""
    stamp = to_timestamp(value)
    if stamp is not None:
        getattr(message, field).CopyFrom(stamp)


def _instant(message: Message, field: str) -> Any:
    """An aware UTC datetime from Timestamp `field`, or None when the field is unset."""
    if not message.HasField(field):
        return None
    return from_timestamp(cast(Timestamp, getattr(message, field)))


def snapshot_to_proto(report: ThreadContextReport) -> pb.ThreadContextSnapshot:
    """The proto snapshot for a validated report body. Optional text absent -> "" (proto3
    default); optional counts absent -> unset `optional` fields; instants already in UTC."""
    snapshot = pb.ThreadContextSnapshot(
        snapshot_id=report.snapshot_id or "",
        project_id=report.project_id or "",
        task_id=report.task_id or "",
        thread_id=report.thread_id,
        node_id=report.node_id,
        worker_id=report.worker_id,
        source_kind=source_kind_to_proto(report.source_kind),  # type: ignore[arg-type]
        context_budget_remaining_pct=report.context_budget_remaining_pct,
        context_budget_level=level_to_proto(report.context_budget_level),  # type: ignore[arg-type]
        must_finish_before_compaction=report.must_finish_before_compaction,
        compaction_count=report.compaction_count,
        snapshot_version=report.snapshot_version,
        last_total_tokens=report.last_total_tokens,
        model_context_window=report.model_context_window,
        auto_compact_token_limit=report.auto_compact_token_limit,
        must_finish_reason=report.must_finish_reason or "",
        codex_folder=report.codex_folder or "",
        awaiting_reading_after_compaction=report.awaiting_reading_after_compaction,
    )
    if report.compaction_limit_source is not None:
        snapshot.compaction_limit_source = _enum_number(  # type: ignore[assignment]
            pb.CompactionLimitSource, _LIMIT_SOURCE_PREFIX, report.compaction_limit_source
        )
    if report.estimated_remaining_turns is not None:
        snapshot.estimated_remaining_turns = report.estimated_remaining_turns
    if report.estimated_remaining_large_messages is not None:
        snapshot.estimated_remaining_large_messages = report.estimated_remaining_large_messages
    if report.codex_context_left_pct is not None:
        snapshot.codex_context_left_pct = report.codex_context_left_pct
    _set_timestamp(snapshot, "compaction_expected_at", report.compaction_expected_at)
    _set_timestamp(snapshot, "last_compaction_at", report.last_compaction_at)
    _set_timestamp(snapshot, "captured_at", report.captured_at)
    return snapshot


def ack_from_proto(ack: pb.ThreadContextAck) -> ThreadContextReportAck:
    """The JSON answer for an ack (seed §5.2 response shape plus duplicate/superseded)."""
    return ThreadContextReportAck(
        accepted=ack.accepted,
        thread_id=ack.thread_id,
        context_budget_level=level_from_proto(ack.context_budget_level),
        next_required_report_in_seconds=ack.next_required_report_in_seconds,
        master_actions=master_actions_from_proto(ack.master_actions),
        duplicate=ack.duplicate,
        superseded=ack.superseded,
    )


def alert_from_proto(alert: pb.ThreadContextAlert) -> ThreadContextAlertView:
    """One alert as JSON (lower-case type and status names, UTC instant)."""
    return ThreadContextAlertView(
        alert_id=alert.alert_id,
        alert_type=cast(AlertTypeName | None, _enum_name(pb.AlertType, _ALERT_TYPE_PREFIX, alert.alert_type)),
        alert_status=cast(
            AlertStatusName | None, _enum_name(pb.AlertStatus, _ALERT_STATUS_PREFIX, alert.alert_status)
        ),
        opened_at=_instant(alert, "opened_at"),
        reason=alert.reason,
    )


def _known(value: int) -> int | None:
    """Raw token figures are 0 when unknown (proto contract): None in JSON."""
    return value or None


def thread_context_view(
    context: pb.ThreadContext,
    *,
    wrap_up_checklist: list[dict[str, Any]] | None = None,
    handoff_package: dict[str, Any] | None = None,
) -> ThreadContextBudgetView:
    """The CB-14 thread view of a ThreadContext. `wrap_up_checklist` (items shaped as
    `checklist_item` makes them) and `handoff_package` come from the scheduler (empty list and None
    when it has nothing or is not wired)."""
    snapshot = context.snapshot
    return ThreadContextBudgetView(
        thread_id=snapshot.thread_id,
        project_id=snapshot.project_id or None,
        node_id=snapshot.node_id,
        context_budget_remaining_pct=snapshot.context_budget_remaining_pct,
        context_budget_level=level_from_proto(context.context_budget_level),
        compaction_expected_at=_instant(snapshot, "compaction_expected_at"),
        last_compaction_at=_instant(snapshot, "last_compaction_at"),
        compaction_count=snapshot.compaction_count,
        must_finish_before_compaction=snapshot.must_finish_before_compaction,
        must_finish_reason=snapshot.must_finish_reason or None,
        estimated_remaining_turns=(
            snapshot.estimated_remaining_turns if snapshot.HasField("estimated_remaining_turns") else None
        ),
        estimated_remaining_large_messages=(
            snapshot.estimated_remaining_large_messages
            if snapshot.HasField("estimated_remaining_large_messages")
            else None
        ),
        codex_context_left_pct=(
            snapshot.codex_context_left_pct if snapshot.HasField("codex_context_left_pct") else None
        ),
        last_total_tokens=_known(snapshot.last_total_tokens),
        model_context_window=_known(snapshot.model_context_window),
        auto_compact_token_limit=_known(snapshot.auto_compact_token_limit),
        compaction_limit_source=compaction_limit_source_from_proto(snapshot.compaction_limit_source),
        awaiting_reading_after_compaction=snapshot.awaiting_reading_after_compaction,
        source_kind=source_kind_from_proto(snapshot.source_kind),
        captured_at=_instant(snapshot, "captured_at"),
        updated_at=_instant(context, "updated_at"),
        next_required_report_in_seconds=context.next_required_report_in_seconds,
        master_actions=master_actions_from_proto(context.master_actions),
        open_alerts=[alert_from_proto(alert) for alert in context.open_alerts],
        wrap_up_checklist=[ChecklistItemView(**item) for item in wrap_up_checklist or []],
        handoff_package=handoff_package,
    )


def checklist_item(key: str, status: str | None, detail: str = "") -> dict[str, Any]:
    """One CB-18 checklist item in the gateway's one shape `{key, label, status, detail}` (see
    schemas.ChecklistItemView) from the scheduler's `{item, status, detail}`. The label comes from
    CHECKLIST_LABELS (an item this gateway does not know yet is labelled with its key in words); a
    status that is not done / missing / pending (UNSPECIFIED, a newer server) counts as pending."""
    known: tuple[ChecklistStatusName, ...] = ("done", "missing", "pending")
    shown = cast(ChecklistStatusName, status) if status in known else "pending"
    return {
        "key": key,
        "label": CHECKLIST_LABELS.get(key, key.replace("_", " ")),
        "status": shown,
        "detail": detail,
    }


def projection_checklist_item(
    key: str, label: str, done: bool, handoff_status: str, detail: str = ""
) -> dict[str, Any]:
    """A conversations-projection checklist line (`{key, label, done, detail}` plus the thread's
    handoff status) in the gateway's one shape. The projection marks done the items of a ready
    package; an item not done is "missing" once the package is ready (the worker did not find it)
    and "pending" before (nothing gathered yet). `detail` is the ready package's own detail of the
    item (the same words as the scheduler's checklist); without one (a package made before the
    projection kept details, or none ready) a done item has "" and the others say why in words."""
    if done:
        return {"key": key, "label": label, "status": "done", "detail": detail}
    if handoff_status == "ready":
        shown = detail or "not in the handoff package"
        return {"key": key, "label": label, "status": "missing", "detail": shown}
    return {"key": key, "label": label, "status": "pending", "detail": "not gathered yet"}


def json_field_of(proto_field: str) -> str:
    """The JSON body field named by a context_budget field violation: the snapshot prefix of the
    RPC request ("snapshot.", "snapshots[3].") is dropped, since the REST body is the snapshot."""
    return _SNAPSHOT_PATH.sub("", proto_field)
