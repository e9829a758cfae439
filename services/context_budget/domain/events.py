"""Events the context budget publishes (CB-11), and their JSON payloads.

Every event travels in a `boss.common.v1.EventEnvelope` (subject ids thread_id, project_id, node_id
on the envelope too) through the service's outbox and `WatchEvents`. Instants are RFC 3339 UTC text
with a `Z` suffix (or null), percentages are numbers 0-100, levels and enumerations lower-case names.

`owner_id` in the payloads below is the owner of the device the thread belongs to (from the
reporting worker's token). The stream is for Boss services only (service tokens).

`thread.context.updated`: one per applied snapshot (never for a duplicate or an older reading)::

    {"thread_id", "project_id", "task_id", "node_id", "worker_id", "owner_id", "snapshot_id",
     "source_kind": "codex_app_server" | "codex_sdk" | "worker_estimator",
     "context_budget_remaining_pct": 37.0,
     "context_budget_level": "safe" | "watch" | "urgent" | "critical",     # the server's level
     "previous_level": "safe" | ... | null,                                # null for a new thread
     "reported_context_budget_level": "urgent" | ... | null,               # the worker's claim
     "compaction_expected_at": "2026-03-25T08:08:30Z" | null,
     "must_finish_before_compaction": true, "must_finish_reason": "...",
     "estimated_remaining_turns": 5 | null, "estimated_remaining_large_messages": 2 | null,
     "last_compaction_at": "..." | null, "compaction_count": 1,
     "snapshot_version": 42, "captured_at": "...", "updated_at": "...",
     "codex_context_left_pct": 40 | null, "last_total_tokens": 150000,
     "model_context_window": 258400, "auto_compact_token_limit": 244800, "codex_folder": "/src/app",
     "compaction_limit_source": "configured" | "model_default" | "assumed" | null,
     "awaiting_reading_after_compaction": false,   # true: compacted, waiting for the first reading
     "master_actions": ["prepare_handoff", "avoid_large_context_append", ...],
     "next_required_report_in_seconds": 5}

`thread.context.level_changed`: the server's level differs from the thread's previous one (a thread's
first applied snapshot counts, with from_level null)::

    {"thread_id", "project_id", "node_id", "owner_id", "from_level": "safe" | ... | null, "to_level": "watch",
     "context_budget_remaining_pct": 45.0, "captured_at": "..."}

`thread.context.compaction_risk_opened` / `thread.context.compaction_risk_resolved`::

    {"thread_id", "project_id", "owner_id", "alert_id", "reason", "compaction_expected_at": "..." | null}

  (reason: why the risk holds, or for resolved why it no longer holds; compaction_expected_at: the
  applied snapshot's expectation.)

`thread.context.compaction_observed`: compaction_count rose above the thread's previous reading::

    {"thread_id", "project_id", "node_id", "owner_id", "compaction_count": 2, "previous_compaction_count": 1,
     "last_compaction_at": "..." | null}

`thread.context.alert_changed`: on every alert open, acknowledge and resolve::

    {"alert_id", "thread_id", "project_id",
     "alert_type": "context_watch" | "context_urgent" | "context_critical" | "compaction_risk"
                   | "handoff_missing",
     "alert_status": "opened" | "acked" | "resolved",
     "opened_at": "...", "acked_at": "..." | null, "resolved_at": "..." | null, "reason": "..."}

Within one transaction a thread's events are written in this order: updated, level_changed, the
alert changes of the level change, compaction risk (with its alert change), compaction_observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.context_budget.domain.model import (
    Alert,
    CompactionLimitSource,
    ContextBudgetLevel,
    Snapshot,
    ThreadState,
)
from services.context_budget.domain.policy import master_actions_of, report_interval_seconds
from services.shared.time import isoformat_utc

THREAD_CONTEXT_UPDATED = "thread.context.updated"
THREAD_CONTEXT_LEVEL_CHANGED = "thread.context.level_changed"
THREAD_CONTEXT_COMPACTION_RISK_OPENED = "thread.context.compaction_risk_opened"
THREAD_CONTEXT_COMPACTION_RISK_RESOLVED = "thread.context.compaction_risk_resolved"
THREAD_CONTEXT_COMPACTION_OBSERVED = "thread.context.compaction_observed"
THREAD_CONTEXT_ALERT_CHANGED = "thread.context.alert_changed"

EVENT_TYPES = (
    THREAD_CONTEXT_UPDATED,
    THREAD_CONTEXT_LEVEL_CHANGED,
    THREAD_CONTEXT_COMPACTION_RISK_OPENED,
    THREAD_CONTEXT_COMPACTION_RISK_RESOLVED,
    THREAD_CONTEXT_COMPACTION_OBSERVED,
    THREAD_CONTEXT_ALERT_CHANGED,
)


@dataclass(slots=True)
class EventDraft:
    """An event to publish: its type, JSON-able payload and subject ids."""

    type: str
    payload: dict[str, Any]
    thread_id: str
    project_id: str
    node_id: str


def _level(level: ContextBudgetLevel | None) -> str | None:
    return None if level is None else level.value


def _value(source: CompactionLimitSource | None) -> str | None:
    return None if source is None else source.value


def updated_event(
    state: ThreadState, previous_level: ContextBudgetLevel | None, *, compaction_near: bool
) -> EventDraft:
    """`thread.context.updated` for the thread's newly applied state; `compaction_near`: its
    compaction is expected within the risk horizon (`master_actions` then has prepare_handoff)."""
    s = state.snapshot
    payload = {
        "thread_id": s.thread_id,
        "project_id": s.project_id,
        "task_id": s.task_id,
        "node_id": s.node_id,
        "worker_id": s.worker_id,
        "owner_id": s.owner_id,
        "snapshot_id": s.snapshot_id,
        "source_kind": s.source_kind.value,
        "context_budget_remaining_pct": s.context_budget_remaining_pct,
        "context_budget_level": state.level.value,
        "previous_level": _level(previous_level),
        "reported_context_budget_level": _level(s.reported_level),
        "compaction_expected_at": isoformat_utc(s.compaction_expected_at),
        "must_finish_before_compaction": s.must_finish_before_compaction,
        "must_finish_reason": s.must_finish_reason,
        "estimated_remaining_turns": s.estimated_remaining_turns,
        "estimated_remaining_large_messages": s.estimated_remaining_large_messages,
        "last_compaction_at": isoformat_utc(s.last_compaction_at),
        "compaction_count": s.compaction_count,
        "snapshot_version": s.snapshot_version,
        "captured_at": isoformat_utc(s.captured_at),
        "updated_at": isoformat_utc(state.updated_at),
        "codex_context_left_pct": s.codex_context_left_pct,
        "last_total_tokens": s.last_total_tokens,
        "model_context_window": s.model_context_window,
        "auto_compact_token_limit": s.auto_compact_token_limit,
        "codex_folder": s.codex_folder,
        "compaction_limit_source": _value(s.compaction_limit_source),
        "awaiting_reading_after_compaction": s.awaiting_reading_after_compaction,
        "master_actions": [action.value for action in master_actions_of(state.level, compaction_near)],
        "next_required_report_in_seconds": report_interval_seconds(state.level),
    }
    return EventDraft(THREAD_CONTEXT_UPDATED, payload, s.thread_id, s.project_id, s.node_id)


def level_changed_event(state: ThreadState, previous_level: ContextBudgetLevel | None) -> EventDraft:
    """`thread.context.level_changed` from `previous_level` (None for a new thread) to state.level."""
    s = state.snapshot
    payload = {
        "thread_id": s.thread_id,
        "project_id": s.project_id,
        "node_id": s.node_id,
        "owner_id": s.owner_id,
        "from_level": _level(previous_level),
        "to_level": state.level.value,
        "context_budget_remaining_pct": s.context_budget_remaining_pct,
        "captured_at": isoformat_utc(s.captured_at),
    }
    return EventDraft(THREAD_CONTEXT_LEVEL_CHANGED, payload, s.thread_id, s.project_id, s.node_id)


def compaction_risk_event(event_type: str, alert_id: str, reason: str, snapshot: Snapshot) -> EventDraft:
    """`thread.context.compaction_risk_opened` or `..._resolved` for the risk alert `alert_id`."""
    payload = {
        "thread_id": snapshot.thread_id,
        "project_id": snapshot.project_id,
        "owner_id": snapshot.owner_id,
        "alert_id": alert_id,
        "reason": reason,
        "compaction_expected_at": isoformat_utc(snapshot.compaction_expected_at),
    }
    return EventDraft(event_type, payload, snapshot.thread_id, snapshot.project_id, snapshot.node_id)


def compaction_observed_event(snapshot: Snapshot, previous_count: int) -> EventDraft:
    """`thread.context.compaction_observed`: compaction_count rose from `previous_count`."""
    payload = {
        "thread_id": snapshot.thread_id,
        "project_id": snapshot.project_id,
        "node_id": snapshot.node_id,
        "owner_id": snapshot.owner_id,
        "compaction_count": snapshot.compaction_count,
        "previous_compaction_count": previous_count,
        "last_compaction_at": isoformat_utc(snapshot.last_compaction_at),
    }
    return EventDraft(
        THREAD_CONTEXT_COMPACTION_OBSERVED, payload, snapshot.thread_id, snapshot.project_id, snapshot.node_id
    )


def alert_payload(alert: Alert) -> dict[str, Any]:
    """The JSON form of an alert (also the payload of `thread.context.alert_changed`)."""
    return {
        "alert_id": alert.alert_id,
        "thread_id": alert.thread_id,
        "project_id": alert.project_id,
        "alert_type": alert.alert_type.value,
        "alert_status": alert.alert_status.value,
        "opened_at": isoformat_utc(alert.opened_at),
        "acked_at": isoformat_utc(alert.acked_at),
        "resolved_at": isoformat_utc(alert.resolved_at),
        "reason": alert.reason,
    }


def alert_changed_event(alert: Alert, node_id: str = "") -> EventDraft:
    """`thread.context.alert_changed` for the alert's new status."""
    return EventDraft(
        THREAD_CONTEXT_ALERT_CHANGED, alert_payload(alert), alert.thread_id, alert.project_id, node_id
    )
