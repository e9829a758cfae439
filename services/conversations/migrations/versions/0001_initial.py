"""The conversations context's first schema: projects, threads, membership, messages, outbox.

Revision ID: 0001
Revises:
Create Date: 2026-05-01
"""

import sqlalchemy as sa
from alembic import op

from services.shared.migrations import create_outbox_tables, drop_outbox_tables
from services.shared.sql_types import UtcDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    """Creates every table of adapters/tables.py."""
    op.create_table(
        "projects",
        sa.Column("project_id", sa.String(200), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("conversation_type", sa.String(20), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("manual_pinned", sa.Boolean, nullable=False),
        sa.Column("latest_reply_at", UtcDateTime, nullable=True),
        sa.Column("sort_at", UtcDateTime, nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("updated_at", UtcDateTime, nullable=False),
        sa.Column("archived_at", UtcDateTime, nullable=True),
        sa.Column("indicator_thread_id", sa.String(200), nullable=False),
        sa.Column("indicator_visible", sa.Boolean, nullable=False),
        sa.Column("indicator_percent", sa.Integer, nullable=False),
        sa.Column("indicator_level", sa.String(20), nullable=False),
        sa.Column("indicator_source_node_id", sa.String(200), nullable=False),
        sa.Column("indicator_updated_at", UtcDateTime, nullable=True),
        sa.Column("indicator_must_finish", sa.Boolean, nullable=False),
        sa.Column("strategy_summary", sa.Text, nullable=False),
    )
    op.create_index(
        "ix_projects_home_list", "projects", ["owner_id", "manual_pinned", "sort_at", "project_id"]
    )
    op.create_index("ix_projects_indicator_thread", "projects", ["indicator_thread_id"])
    op.create_table(
        "threads",
        sa.Column("thread_id", sa.String(200), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("codex_folder", sa.Text, nullable=False),
        sa.Column("codex_thread_ref", sa.Text, nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("single_device_project_id", sa.String(200), nullable=False),
        sa.Column("is_master_main_thread", sa.Boolean, nullable=False),
        sa.Column("registered_at", UtcDateTime, nullable=False),
        sa.Column("archived_at", UtcDateTime, nullable=True),
        sa.Column("remaining_pct", sa.Float, nullable=True),
        sa.Column("level", sa.String(20), nullable=False),
        sa.Column("budget_node_id", sa.String(200), nullable=False),
        sa.Column("must_finish_before_compaction", sa.Boolean, nullable=False),
        sa.Column("must_finish_reason", sa.Text, nullable=False),
        sa.Column("compaction_expected_at", UtcDateTime, nullable=True),
        sa.Column("last_compaction_at", UtcDateTime, nullable=True),
        sa.Column("compaction_count", sa.Integer, nullable=False),
        sa.Column("estimated_remaining_turns", sa.Integer, nullable=True),
        sa.Column("snapshot_version", sa.BigInteger, nullable=False),
        sa.Column("captured_at", UtcDateTime, nullable=True),
        sa.Column("budget_updated_at", UtcDateTime, nullable=True),
        sa.Column("master_actions_json", sa.Text, nullable=False),
        sa.Column("handoff_status", sa.String(20), nullable=False),
        sa.Column("handoff_package_id", sa.String(200), nullable=False),
        sa.Column("handoff_reason", sa.Text, nullable=False),
        sa.Column("checklist_done_json", sa.Text, nullable=False),
    )
    op.create_index("ix_threads_owner", "threads", ["owner_id"])
    op.create_table(
        "project_threads",
        sa.Column("project_id", sa.String(200), primary_key=True),
        sa.Column("thread_id", sa.String(200), primary_key=True),
        sa.Column("joined_at", UtcDateTime, nullable=False),
    )
    op.create_index("ix_project_threads_thread", "project_threads", ["thread_id"])
    op.create_table(
        "messages",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(64), nullable=False, unique=True),
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("author_kind", sa.String(20), nullable=False),
        sa.Column("thread_id", sa.String(200), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
    )
    op.create_index("ix_messages_project", "messages", ["project_id", "id"])
    create_outbox_tables()


def downgrade() -> None:
    """Drops every table."""
    drop_outbox_tables()
    for name in (
        "messages",
        "project_threads",
        "threads",
        "projects",
    ):
        op.drop_table(name)
