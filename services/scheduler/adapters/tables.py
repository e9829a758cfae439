"""SQLAlchemy Core tables of the scheduler (schema `scheduler` on PostgreSQL), on one MetaData.

- `scheduled_threads`: the scheduling view of each thread (one row per thread_id), with its owner.
- `thread_handoff_packages`: CB-6 packages; list fields are JSON text.
- `worker_commands`: commands for workers, persisted until acknowledged (for one owner's device).
- `handoff_alerts`: `handoff_missing` alerts (CB-6 alert shape); see services/scheduler/README.md for why
  they live here and not in context_budget.
- `project_strategies`: the last strategy summary published per owner and project (to publish only
  changes).
- outbox tables (`outbox_events`, `outbox_sequencer`, `event_cursors`).
- `revoked_devices`: devices whose tokens are refused (from the conversations service's events).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from services.shared.devices import define_revoked_devices_table
from services.shared.outbox import define_outbox_tables
from services.shared.retention import define_retention_tables
from services.shared.sql_types import UtcDateTime

metadata = MetaData()

scheduled_threads = Table(
    "scheduled_threads",
    metadata,
    Column("thread_id", String(200), primary_key=True),
    Column("project_id", String(200), nullable=False, default=""),
    Column("task_id", String(200), nullable=False, default=""),
    Column("node_id", String(200), nullable=False, default=""),
    Column("worker_id", String(200), nullable=False, default=""),
    Column("codex_folder", Text, nullable=False, default=""),
    Column("level", String(20), nullable=True),
    Column("remaining_pct", Float, nullable=False),
    Column("reported_must_finish", Boolean, nullable=False, default=False),
    Column("reported_must_finish_reason", Text, nullable=False, default=""),
    Column("master_must_finish", Boolean, nullable=False, default=False),
    Column("master_must_finish_reason", Text, nullable=False, default=""),
    Column("compaction_expected_at", UtcDateTime, nullable=True),
    Column("compaction_count", Integer, nullable=False, default=0),
    Column("last_compaction_at", UtcDateTime, nullable=True),
    Column("snapshot_version", BigInteger, nullable=False, default=0),
    Column("captured_at", UtcDateTime, nullable=True),
    Column("last_total_tokens", BigInteger, nullable=False, default=0),
    Column("last_activity_at", UtcDateTime, nullable=True),
    Column("task_importance", Integer, nullable=False, default=0),
    Column("unsolidified_patch", Boolean, nullable=False, default=False),
    Column("unsolidified_test_results", Boolean, nullable=False, default=False),
    Column("hardware_test_in_progress", Boolean, nullable=False, default=False),
    Column("busy", Boolean, nullable=False, default=False),
    Column("no_large_context_appends", Boolean, nullable=False, default=False),
    Column("finish_current_subtask", Boolean, nullable=False, default=False),
    Column("context_growth_frozen", Boolean, nullable=False, default=False),
    Column("relay_thread_id", String(200), nullable=False, default=""),
    Column("current_package_id", String(64), nullable=False, default=""),
    Column("current_package_status", String(20), nullable=True),
    Column("package_epoch", Integer, nullable=False, default=-1),
    Column("epoch", Integer, nullable=False, default=0),
    Column("prepare_issued_at", UtcDateTime, nullable=True),
    Column("prepare_issued_at_critical", Boolean, nullable=False, default=False),
    Column("commands_sent", Text, nullable=False, default=""),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("owner_id", String(200), nullable=False, default="local", server_default="local"),
    Index("ix_scheduled_threads_project", "project_id"),
    Index("ix_scheduled_threads_owner", "owner_id"),
)

thread_handoff_packages = Table(
    "thread_handoff_packages",
    metadata,
    Column("handoff_package_id", String(64), primary_key=True),
    Column("project_id", String(200), nullable=False, default=""),
    Column("task_id", String(200), nullable=False, default=""),
    Column("from_thread_id", String(200), nullable=False),
    Column("to_thread_id", String(200), nullable=False, default=""),
    Column("node_id", String(200), nullable=False, default=""),
    Column("package_status", String(20), nullable=False),
    Column("summary_text", Text, nullable=False, default=""),
    Column("open_questions", Text, nullable=False, default="[]"),
    Column("critical_files", Text, nullable=False, default="[]"),
    Column("critical_commands", Text, nullable=False, default="[]"),
    Column("critical_tests", Text, nullable=False, default="[]"),
    Column("critical_artifacts", Text, nullable=False, default="[]"),
    Column("decision_links", Text, nullable=False, default="[]"),
    Column("patches_done", Text, nullable=False, default="[]"),
    Column("patches_not_done", Text, nullable=False, default="[]"),
    Column("suggested_next_actions", Text, nullable=False, default="[]"),
    Column("checklist", Text, nullable=False, default="[]"),
    Column("epoch", Integer, nullable=False, default=0),
    Column("last_command_id", String(64), nullable=False, default=""),
    Column("consumed_by_thread_id", String(200), nullable=False, default=""),
    Column("created_at", UtcDateTime, nullable=False),
    Column("ready_at", UtcDateTime, nullable=True),
    Column("consumed_at", UtcDateTime, nullable=True),
    Column("expires_at", UtcDateTime, nullable=True),
    Index("ix_packages_from_thread", "from_thread_id", "created_at"),
    Index("ix_packages_status_expiry", "package_status", "expires_at"),
)

worker_commands = Table(
    "worker_commands",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("command_id", String(64), nullable=False, unique=True),
    Column("command_type", String(40), nullable=False),
    Column("thread_id", String(200), nullable=False),
    Column("project_id", String(200), nullable=False, default=""),
    Column("node_id", String(200), nullable=False),
    Column("worker_id", String(200), nullable=False),
    Column("handoff_package_id", String(64), nullable=False, default=""),
    Column("to_thread_id", String(200), nullable=False, default=""),
    Column("codex_folder", Text, nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("command_status", String(20), nullable=False),
    Column("delivery_count", Integer, nullable=False, default=0),
    Column("issued_at", UtcDateTime, nullable=False),
    Column("delivered_at", UtcDateTime, nullable=True),
    Column("acked_at", UtcDateTime, nullable=True),
    Column("outcome", String(20), nullable=False, default=""),
    Column("outcome_detail", Text, nullable=False, default=""),
    Column("owner_id", String(200), nullable=False, default="local", server_default="local"),
    Index("ix_worker_commands_node_status", "node_id", "worker_id", "command_status", "id"),
)

handoff_alerts = Table(
    "handoff_alerts",
    metadata,
    Column("alert_id", String(64), primary_key=True),
    Column("thread_id", String(200), nullable=False),
    Column("project_id", String(200), nullable=False, default=""),
    Column("alert_type", String(40), nullable=False),
    Column("alert_status", String(20), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("compaction_count", Integer, nullable=False, default=0),
    Column("opened_at", UtcDateTime, nullable=False),
    Column("resolved_at", UtcDateTime, nullable=True),
    Index("ix_handoff_alerts_thread", "thread_id", "alert_status"),
)

project_strategies = Table(
    "project_strategies",
    metadata,
    Column("owner_id", String(200), primary_key=True),
    Column("project_id", String(200), primary_key=True),
    Column("summary", Text, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

outbox_events, outbox_sequencer, event_cursors = define_outbox_tables(metadata)
# Outbox and history retention (services/shared/retention.py).
event_consumers, retention_marks = define_retention_tables(metadata)
revoked_devices = define_revoked_devices_table(metadata)
