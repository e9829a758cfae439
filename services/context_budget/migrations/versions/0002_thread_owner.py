"""Trust boundaries: `thread_contexts.owner_id` (a thread belongs to the owner of the device that
first reported it, taken from the worker's token) with an index for owner-scoped reads, and
`revoked_devices` (this service's copy of the conversations service's device revocations).

Revision ID: 0002_thread_owner
Revises: 0001_initial
Create Date: 2027-01-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision: str = "0002_thread_owner"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds the column (existing threads: the default owner "local", whose worker tokens reported
    them before tokens named an owner), its index and the revocations table."""
    op.add_column(
        "thread_contexts", sa.Column("owner_id", sa.String(200), nullable=False, server_default="local")
    )
    op.create_index("ix_thread_contexts_owner_thread", "thread_contexts", ["owner_id", "thread_id"])
    op.create_table(
        "revoked_devices",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    """Drops the table, the index and the column."""
    op.drop_table("revoked_devices")
    op.drop_index("ix_thread_contexts_owner_thread", table_name="thread_contexts")
    with op.batch_alter_table("thread_contexts") as batch:
        batch.drop_column("owner_id")
