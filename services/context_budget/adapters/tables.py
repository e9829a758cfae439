"""SQLAlchemy Core tables of the context budget (CB-6 names), plus the shared outbox tables.

- `thread_context_snapshots`: every reading not rejected and not a duplicate (history), with the
  server's level, the worker's claimed level, whether it was superseded, and when it arrived.
- `thread_contexts`: one row per thread, its current (latest applied) reading, the server level,
  the ids of the thread's open level and compaction_risk alerts, and the thread's owner. Its
  (owner_id, node_id, worker_id) is the device the thread belongs to: the first to report it, or
  the one its owner moved it to.
- `thread_context_threshold_policies`: per-project threshold overrides; project_id "" is the default.
- `thread_context_alerts`: alerts and their lifecycle.
- `revoked_devices`: devices whose tokens are refused (from the conversations service's events).

Enumerations are stored as their lower-case names, percentages as double precision (0-100),
instants as UTC (`UtcDateTime`), token figures as 64-bit integers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)

from services.shared.devices import define_revoked_devices_table
from services.shared.outbox import define_outbox_tables
from services.shared.retention import define_retention_tables
from services.shared.sql_types import UtcDateTime

ID_LENGTH = 200

metadata = MetaData()


def _reading_columns() -> list[Column[object]]:
    """The columns of one reading, shared by the history and the current-state tables."""
    return [
        Column("project_id", String(ID_LENGTH), nullable=False),
        Column("task_id", String(ID_LENGTH), nullable=False),
        Column("node_id", String(ID_LENGTH), nullable=False),
        Column("worker_id", String(ID_LENGTH), nullable=False),
        Column("source_kind", String(32), nullable=False),
        Column("context_budget_remaining_pct", Double, nullable=False),
        Column("context_budget_level", String(16), nullable=False),
        Column("reported_context_budget_level", String(16), nullable=True),
        Column("compaction_expected_at", UtcDateTime, nullable=True),
        Column("must_finish_before_compaction", Boolean, nullable=False),
        Column("must_finish_reason", Text, nullable=False),
        Column("estimated_remaining_turns", Integer, nullable=True),
        Column("estimated_remaining_large_messages", Integer, nullable=True),
        Column("last_compaction_at", UtcDateTime, nullable=True),
        Column("compaction_count", Integer, nullable=False),
        Column("snapshot_version", BigInteger, nullable=False),
        Column("captured_at", UtcDateTime, nullable=False),
        Column("last_total_tokens", BigInteger, nullable=False),
        Column("model_context_window", BigInteger, nullable=False),
        Column("auto_compact_token_limit", BigInteger, nullable=False),
        Column("codex_context_left_pct", Integer, nullable=True),
        Column("codex_folder", Text, nullable=False),
    ]


def _limit_columns() -> list[Column[Any]]:
    """Where a reading's L came from and whether it awaits its first measurement after a
    compaction (migration 0003): the last columns of both reading tables."""
    return [
        Column("compaction_limit_source", String(16), nullable=True),
        Column("awaiting_reading_after_compaction", Boolean, nullable=False, server_default=false()),
    ]


thread_context_snapshots = Table(
    "thread_context_snapshots",
    metadata,
    Column("snapshot_id", String(ID_LENGTH), primary_key=True),
    Column("thread_id", String(ID_LENGTH), nullable=False),
    *_reading_columns(),
    Column("superseded", Boolean, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    *_limit_columns(),
    Index("ix_thread_context_snapshots_thread_captured", "thread_id", "captured_at"),
    # History retention reads the readings in this order (services/context_budget/retention.py).
    Index("ix_thread_context_snapshots_captured_snapshot", "captured_at", "snapshot_id"),
)

thread_contexts = Table(
    "thread_contexts",
    metadata,
    Column("thread_id", String(ID_LENGTH), primary_key=True),
    Column("snapshot_id", String(ID_LENGTH), nullable=False),
    *_reading_columns(),
    Column("level_alert_id", String(36), nullable=True),
    Column("compaction_risk_alert_id", String(36), nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("owner_id", String(ID_LENGTH), nullable=False, server_default="local"),
    *_limit_columns(),
    Index("ix_thread_contexts_project_thread", "project_id", "thread_id"),
    Index("ix_thread_contexts_owner_thread", "owner_id", "thread_id"),
)

thread_context_threshold_policies = Table(
    "thread_context_threshold_policies",
    metadata,
    Column("project_id", String(ID_LENGTH), primary_key=True),
    Column("safe_min_pct", Double, nullable=False),
    Column("watch_min_pct", Double, nullable=False),
    Column("urgent_min_pct", Double, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

thread_context_alerts = Table(
    "thread_context_alerts",
    metadata,
    Column("alert_id", String(36), primary_key=True),
    Column("thread_id", String(ID_LENGTH), nullable=False),
    Column("project_id", String(ID_LENGTH), nullable=False),
    Column("alert_type", String(32), nullable=False),
    Column("alert_status", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("opened_at", UtcDateTime, nullable=False),
    Column("acked_at", UtcDateTime, nullable=True),
    Column("resolved_at", UtcDateTime, nullable=True),
    Index("ix_thread_context_alerts_thread_status", "thread_id", "alert_status"),
    Index("ix_thread_context_alerts_opened", "opened_at", "alert_id"),
    Index("ix_thread_context_alerts_project_opened", "project_id", "opened_at"),
)

outbox_events, outbox_sequencer, event_cursors = define_outbox_tables(metadata)
# Outbox and history retention (services/shared/retention.py).
event_consumers, retention_marks = define_retention_tables(metadata)
revoked_devices = define_revoked_devices_table(metadata)
