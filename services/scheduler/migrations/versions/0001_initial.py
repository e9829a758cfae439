"""Initial scheduler schema: scheduled_threads, thread_handoff_packages, worker_commands,
handoff_alerts, project_strategies and the outbox tables.

Revision ID: 0001
Revises:
Create Date: 2025-05-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.shared.migrations import create_outbox_tables, drop_outbox_tables
from services.shared.sql_types import UtcDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create every scheduler table."""
    create_outbox_tables()
    op.create_table(
        "handoff_alerts",
        sa.Column("alert_id", sa.String(length=64), nullable=False),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("alert_type", sa.String(length=40), nullable=False),
        sa.Column("alert_status", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("compaction_count", sa.Integer(), nullable=False),
        sa.Column("opened_at", UtcDateTime(), nullable=False),
        sa.Column("resolved_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("alert_id"),
    )
    op.create_index("ix_handoff_alerts_thread", "handoff_alerts", ["thread_id", "alert_status"], unique=False)
    op.create_table(
        "project_strategies",
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("project_id"),
    )
    op.create_table(
        "scheduled_threads",
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("node_id", sa.String(length=200), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("codex_folder", sa.Text(), nullable=False),
        sa.Column("level", sa.String(length=20), nullable=True),
        sa.Column("remaining_pct", sa.Float(), nullable=False),
        sa.Column("reported_must_finish", sa.Boolean(), nullable=False),
        sa.Column("reported_must_finish_reason", sa.Text(), nullable=False),
        sa.Column("master_must_finish", sa.Boolean(), nullable=False),
        sa.Column("master_must_finish_reason", sa.Text(), nullable=False),
        sa.Column("compaction_expected_at", UtcDateTime(), nullable=True),
        sa.Column("compaction_count", sa.Integer(), nullable=False),
        sa.Column("last_compaction_at", UtcDateTime(), nullable=True),
        sa.Column("snapshot_version", sa.BigInteger(), nullable=False),
        sa.Column("captured_at", UtcDateTime(), nullable=True),
        sa.Column("last_total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("last_activity_at", UtcDateTime(), nullable=True),
        sa.Column("task_importance", sa.Integer(), nullable=False),
        sa.Column("unsolidified_patch", sa.Boolean(), nullable=False),
        sa.Column("unsolidified_test_results", sa.Boolean(), nullable=False),
        sa.Column("hardware_test_in_progress", sa.Boolean(), nullable=False),
        sa.Column("busy", sa.Boolean(), nullable=False),
        sa.Column("no_large_context_appends", sa.Boolean(), nullable=False),
        sa.Column("finish_current_subtask", sa.Boolean(), nullable=False),
        sa.Column("context_growth_frozen", sa.Boolean(), nullable=False),
        sa.Column("relay_thread_id", sa.String(length=200), nullable=False),
        sa.Column("current_package_id", sa.String(length=64), nullable=False),
        sa.Column("current_package_status", sa.String(length=20), nullable=True),
        sa.Column("package_epoch", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("prepare_issued_at", UtcDateTime(), nullable=True),
        sa.Column("prepare_issued_at_critical", sa.Boolean(), nullable=False),
        sa.Column("commands_sent", sa.Text(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("thread_id"),
    )
    op.create_index("ix_scheduled_threads_project", "scheduled_threads", ["project_id"], unique=False)
    op.create_table(
        "thread_handoff_packages",
        sa.Column("handoff_package_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("from_thread_id", sa.String(length=200), nullable=False),
        sa.Column("to_thread_id", sa.String(length=200), nullable=False),
        sa.Column("node_id", sa.String(length=200), nullable=False),
        sa.Column("package_status", sa.String(length=20), nullable=False),
        sa.Column("summary_text", sa.Text(), nullable=False),
        sa.Column("open_questions", sa.Text(), nullable=False),
        sa.Column("critical_files", sa.Text(), nullable=False),
        sa.Column("critical_commands", sa.Text(), nullable=False),
        sa.Column("critical_tests", sa.Text(), nullable=False),
        sa.Column("critical_artifacts", sa.Text(), nullable=False),
        sa.Column("decision_links", sa.Text(), nullable=False),
        sa.Column("patches_done", sa.Text(), nullable=False),
        sa.Column("patches_not_done", sa.Text(), nullable=False),
        sa.Column("suggested_next_actions", sa.Text(), nullable=False),
        sa.Column("checklist", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("last_command_id", sa.String(length=64), nullable=False),
        sa.Column("consumed_by_thread_id", sa.String(length=200), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("ready_at", UtcDateTime(), nullable=True),
        sa.Column("consumed_at", UtcDateTime(), nullable=True),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("handoff_package_id"),
    )
    op.create_index(
        "ix_packages_from_thread", "thread_handoff_packages", ["from_thread_id", "created_at"], unique=False
    )
    op.create_index(
        "ix_packages_status_expiry", "thread_handoff_packages", ["package_status", "expires_at"], unique=False
    )
    op.create_table(
        "worker_commands",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("command_id", sa.String(length=64), nullable=False),
        sa.Column("command_type", sa.String(length=40), nullable=False),
        sa.Column("thread_id", sa.String(length=200), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("node_id", sa.String(length=200), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("handoff_package_id", sa.String(length=64), nullable=False),
        sa.Column("to_thread_id", sa.String(length=200), nullable=False),
        sa.Column("codex_folder", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("command_status", sa.String(length=20), nullable=False),
        sa.Column("delivery_count", sa.Integer(), nullable=False),
        sa.Column("issued_at", UtcDateTime(), nullable=False),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.Column("acked_at", UtcDateTime(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("outcome_detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("command_id"),
    )
    op.create_index(
        "ix_worker_commands_node_status",
        "worker_commands",
        ["node_id", "worker_id", "command_status", "id"],
        unique=False,
    )


def downgrade() -> None:
    """Drop every scheduler table."""
    op.drop_table("worker_commands")
    op.drop_table("thread_handoff_packages")
    op.drop_table("scheduled_threads")
    op.drop_table("project_strategies")
    op.drop_table("handoff_alerts")
    drop_outbox_tables()
