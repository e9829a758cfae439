"""Chat: per-conversation message sequences, the client's idempotency key and the task of a message,
the sequence counters, and the conversation's projection of tasks (`chat_tasks`).

Messages stored before get sequences 1, 2, 3 ... per project in the order they were stored (their
internal id), and each project's counter starts after its last one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-06-01
"""

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds the message columns (numbering existing messages), `message_sequences` and `chat_tasks`."""
    op.add_column("messages", sa.Column("sequence", sa.BigInteger, nullable=True))
    op.add_column("messages", sa.Column("client_message_id", sa.String(200), nullable=True))
    op.add_column("messages", sa.Column("task_id", sa.String(64), nullable=False, server_default=""))
    op.execute(
        "UPDATE messages SET sequence = (SELECT COUNT(*) FROM messages AS earlier "
        "WHERE earlier.project_id = messages.project_id AND earlier.id <= messages.id)"
    )
    with op.batch_alter_table("messages") as batch:
        batch.alter_column("sequence", existing_type=sa.BigInteger, nullable=False)
    op.create_index("ux_messages_project_sequence", "messages", ["project_id", "sequence"], unique=True)
    op.create_index(
        "ux_messages_client_message", "messages", ["project_id", "client_message_id"], unique=True
    )
    op.create_table(
        "message_sequences",
        sa.Column("project_id", sa.String(200), primary_key=True),
        sa.Column("last_sequence", sa.BigInteger, nullable=False),
    )
    op.execute(
        "INSERT INTO message_sequences (project_id, last_sequence) "
        "SELECT project_id, MAX(sequence) FROM messages GROUP BY project_id"
    )
    op.create_table(
        "chat_tasks",
        sa.Column("task_id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("task_type", sa.String(30), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("project_id", sa.String(200), nullable=False),
        sa.Column("target_project_id", sa.String(200), nullable=False),
        sa.Column("target_thread_id", sa.String(200), nullable=False),
        sa.Column("device_id", sa.String(200), nullable=False),
        sa.Column("codex_folder_ref", sa.Text, nullable=False),
        sa.Column("codex_thread_ref", sa.Text, nullable=False),
        sa.Column("request_message_id", sa.String(64), nullable=False),
        sa.Column("result_message_id", sa.String(64), nullable=False),
        sa.Column("failure_kind", sa.String(40), nullable=False),
        sa.Column("status_detail", sa.Text, nullable=False),
        sa.Column("device_last_seen_at", UtcDateTime, nullable=True),
        sa.Column("retry_of_task_id", sa.String(64), nullable=False),
        sa.Column("retried_by_task_id", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime, nullable=False),
        sa.Column("updated_at", UtcDateTime, nullable=False),
        sa.Column("scheduler_updated_at", UtcDateTime, nullable=True),
    )
    op.create_index("ix_chat_tasks_thread_status", "chat_tasks", ["target_thread_id", "status"])
    op.create_index("ix_chat_tasks_request_message", "chat_tasks", ["request_message_id"])


def downgrade() -> None:
    """Drops what `upgrade` added."""
    op.drop_table("chat_tasks")
    op.drop_table("message_sequences")
    op.drop_index("ux_messages_client_message", table_name="messages")
    op.drop_index("ux_messages_project_sequence", table_name="messages")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("task_id")
        batch.drop_column("client_message_id")
        batch.drop_column("sequence")
