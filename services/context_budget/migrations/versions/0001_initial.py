"""Initial context_budget schema: snapshots, current states, threshold policies, alerts, outbox.

Revision ID: 0001_initial
Revises:
Create Date: 2026-01-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.shared.migrations import create_outbox_tables, drop_outbox_tables
from services.shared.sql_types import UtcDateTime

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _reading_columns() -> list[sa.Column]:
    """Columns of one reading, shared by thread_context_snapshots and thread_contexts."""
    return [
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("source_kind", sa.String(32), nullable=False),
        sa.Column("context_budget_remaining_pct", sa.Double(), nullable=False),
        sa.Column("context_budget_level", sa.String(16), nullable=False),
        sa.Column("reported_context_budget_level", sa.String(16), nullable=True),
        sa.Column("compaction_expected_at", UtcDateTime(), nullable=True),
        sa.Column("must_finish_before_compaction", sa.Boolean(), nullable=False),
        sa.Column("must_finish_reason", sa.Text(), nullable=False),
        sa.Column("estimated_remaining_turns", sa.Integer(), nullable=True),
        sa.Column("estimated_remaining_large_messages", sa.Integer(), nullable=True),
        sa.Column("last_compaction_at", UtcDateTime(), nullable=True),
        sa.Column("compaction_count", sa.Integer(), nullable=False),
        sa.Column("snapshot_version", sa.BigInteger(), nullable=False),
        sa.Column("captured_at", UtcDateTime(), nullable=False),
        sa.Column("last_total_tokens", sa.BigInteger(), nullable=False),
        sa.Column("model_context_window", sa.BigInteger(), nullable=False),
        sa.Column("auto_compact_token_limit", sa.BigInteger(), nullable=False),
        sa.Column("codex_context_left_pct", sa.Integer(), nullable=True),
        sa.Column("codex_folder", sa.Text(), nullable=False),
    ]


def upgrade() -> None:
    """Creates every table of the service."""
    op.create_table(
        "thread_context_snapshots",
        sa.Column("snapshot_id", sa.String(200), primary_key=True),
        sa.Column("thread_id", sa.String(200), nullable=False),
        *_reading_columns(),
        sa.Column("superseded", sa.Boolean(), nullable=False),
        sa.Column("received_at", UtcDateTime(), nullable=False),
    )
    op.create_index(
        "ix_thread_context_snapshots_thread_captured",
        "thread_context_snapshots",
        ["thread_id", "captured_at"],
    )

    op.create_table(
        "thread_contexts",
        sa.Column("thread_id", sa.String(200), primary_key=True),
        sa.Column("snapshot_id", sa.String(200), nullable=False),
        *_reading_columns(),
        sa.Column("level_alert_id", sa.String(36), nullable=True),
        sa.Column("compaction_risk_alert_id", sa.String(36), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_thread_contexts_project_thread", "thread_contexts", ["project_id", "thread_id"])

    op.create_table(
        "thread_context_threshold_policies",
        sa.Column("project_id", sa.String(200), primary_key=True),
        sa.Column("safe_min_pct", sa.Double(), nullable=False),
        sa.Column("watch_min_pct", sa.Double(), nullable=False),
        sa.Column("urgent_min_pct", sa.Double(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )

    op.create_table(
        "thread_context_alerts",
        sa.Column("alert_id", sa.String(36), primary_key=True),
        sa.Column("thread_id", sa.String(200), nullable=False),
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("alert_type", sa.String(32), nullable=False),
        sa.Column("alert_status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("opened_at", UtcDateTime(), nullable=False),
        sa.Column("acked_at", UtcDateTime(), nullable=True),
        sa.Column("resolved_at", UtcDateTime(), nullable=True),
    )
    op.create_index(
        "ix_thread_context_alerts_thread_status", "thread_context_alerts", ["thread_id", "alert_status"]
    )
    op.create_index("ix_thread_context_alerts_opened", "thread_context_alerts", ["opened_at", "alert_id"])
    op.create_index(
        "ix_thread_context_alerts_project_opened", "thread_context_alerts", ["project_id", "opened_at"]
    )

    create_outbox_tables()


def downgrade() -> None:
    """Drops every table of the service."""
    drop_outbox_tables()
    for table in (
        "thread_context_alerts",
        "thread_context_threshold_policies",
        "thread_contexts",
        "thread_context_snapshots",
    ):
        op.drop_table(table)
