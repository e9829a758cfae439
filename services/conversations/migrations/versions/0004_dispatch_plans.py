"""Group chat: dispatch plans and their targets (services/conversations/groups).

Revision ID: 0004
Revises: 0003
Create Date: 2026-06-08
"""

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds `dispatch_plans` and `dispatch_targets`."""
    op.create_table(
        "dispatch_plans",
        sa.Column("plan_id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("request_message_id", sa.String(64), nullable=False),
        sa.Column("request_text", sa.Text, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("left_out_json", sa.Text, nullable=False),
        sa.Column("drafted_by", sa.String(20), nullable=False),
        sa.Column("drafting_note", sa.Text, nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("expires_at", UtcDateTime, nullable=False),
        sa.Column("decided_at", UtcDateTime, nullable=True),
        sa.Column("updated_at", UtcDateTime, nullable=False),
        sa.Column("superseded_by_plan_id", sa.String(64), nullable=False),
        sa.Column("summary_status", sa.String(20), nullable=False),
        sa.Column("summary_message_id", sa.String(64), nullable=False),
    )
    op.create_index("ix_dispatch_plans_project", "dispatch_plans", ["project_id", "status"])
    op.create_index(
        "ux_dispatch_plans_request_message", "dispatch_plans", ["request_message_id"], unique=True
    )
    op.create_index("ix_dispatch_plans_status_expiry", "dispatch_plans", ["status", "expires_at"])
    op.create_index("ix_dispatch_plans_summary", "dispatch_plans", ["summary_status"])
    op.create_table(
        "dispatch_targets",
        sa.Column("plan_id", sa.String(64), primary_key=True),
        sa.Column("target_id", sa.String(20), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("thread_id", sa.String(200), nullable=False),
        sa.Column("thread_title", sa.String(200), nullable=False),
        sa.Column("device_id", sa.String(200), nullable=False),
        sa.Column("codex_folder_ref", sa.Text, nullable=False),
        sa.Column("codex_thread_ref", sa.Text, nullable=False),
        sa.Column("instruction", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("remaining_pct", sa.Float, nullable=True),
        sa.Column("level", sa.String(20), nullable=False),
        sa.Column("relay_of_thread_id", sa.String(200), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("status_detail", sa.Text, nullable=False),
        sa.Column("task_id", sa.String(64), nullable=False),
        sa.Column("task_status", sa.String(20), nullable=False),
    )
    op.create_index("ix_dispatch_targets_task", "dispatch_targets", ["task_id"])


def downgrade() -> None:
    """Drops what `upgrade` added."""
    op.drop_table("dispatch_targets")
    op.drop_table("dispatch_plans")
