"""Tasks and leases: the `tasks` table with its partial indexes (a node's queue, a thread's open
tasks, leases that may run out, and at most one claimed or running task per Codex thread), and
`device_presence`.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED_ONLY = "status = 'queued'"
OPEN_ONLY = "status IN ('queued', 'claimed', 'running')"
ACTIVE_ONLY = "status IN ('claimed', 'running')"


def upgrade() -> None:
    """Create the task tables and indexes."""
    op.create_table(
        "tasks",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("task_type", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("owner_id", sa.String(length=200), nullable=False),
        sa.Column("project_id", sa.String(length=200), nullable=False),
        sa.Column("target_project_id", sa.String(length=200), nullable=False),
        sa.Column("target_thread_id", sa.String(length=200), nullable=False),
        sa.Column("device_id", sa.String(length=200), nullable=False),
        sa.Column("codex_folder_ref", sa.Text(), nullable=False),
        sa.Column("codex_thread_ref", sa.String(length=200), nullable=False),
        sa.Column("request_message_id", sa.String(length=200), nullable=False),
        sa.Column("instruction_text", sa.Text(), nullable=False),
        sa.Column("dispatch_plan_id", sa.String(length=200), nullable=False),
        sa.Column("retry_of_task_id", sa.String(length=200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("lease_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("claimed_at", UtcDateTime(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("lease_expires_at", UtcDateTime(), nullable=True),
        sa.Column("heartbeat_at", UtcDateTime(), nullable=True),
        sa.Column("reply_text", sa.Text(), nullable=False),
        sa.Column("failure_kind", sa.String(length=40), nullable=False),
        sa.Column("status_detail", sa.Text(), nullable=False),
        sa.Column("device_offline", sa.Boolean(), nullable=False),
        sa.Column("codex_session_id", sa.String(length=200), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("task_id"),
    )
    op.create_index(
        "ix_tasks_node_queue",
        "tasks",
        ["device_id", "id"],
        postgresql_where=sa.text(QUEUED_ONLY),
        sqlite_where=sa.text(QUEUED_ONLY),
    )
    op.create_index(
        "ix_tasks_thread_open",
        "tasks",
        ["target_thread_id", "id"],
        postgresql_where=sa.text(OPEN_ONLY),
        sqlite_where=sa.text(OPEN_ONLY),
    )
    op.create_index(
        "ix_tasks_lease",
        "tasks",
        ["lease_expires_at"],
        postgresql_where=sa.text(ACTIVE_ONLY),
        sqlite_where=sa.text(ACTIVE_ONLY),
    )
    op.create_index(
        "ux_tasks_thread_active",
        "tasks",
        ["target_thread_id"],
        unique=True,
        postgresql_where=sa.text(ACTIVE_ONLY),
        sqlite_where=sa.text(ACTIVE_ONLY),
    )
    op.create_table(
        "device_presence",
        sa.Column("node_id", sa.String(length=200), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("last_seen_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("node_id"),
    )


def downgrade() -> None:
    """Drop the task tables."""
    op.drop_table("device_presence")
    op.drop_table("tasks")
