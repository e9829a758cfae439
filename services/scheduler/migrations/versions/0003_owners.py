"""Trust boundaries: the owner of each scheduled thread and worker command (from context_budget's
events, which take it from the reporting worker's token), so client tokens see only their owner's
threads, packages, alerts and rankings and a worker receives only its owner's commands; and
`revoked_devices` (this service's copy of the conversations service's device revocations).

Revision ID: 0003_owners
Revises: 0002
Create Date: 2027-01-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision: str = "0003_owners"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds the columns (existing rows: the default owner "local", whose worker tokens reported
    them before tokens named an owner), an index for owner-scoped reads, and the revocations table."""
    op.add_column(
        "scheduled_threads", sa.Column("owner_id", sa.String(200), nullable=False, server_default="local")
    )
    op.create_index("ix_scheduled_threads_owner", "scheduled_threads", ["owner_id"])
    op.add_column(
        "worker_commands", sa.Column("owner_id", sa.String(200), nullable=False, server_default="local")
    )
    op.create_table(
        "revoked_devices",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    """Drops the table, the index and the columns."""
    op.drop_table("revoked_devices")
    op.drop_index("ix_scheduled_threads_owner", table_name="scheduled_threads")
    with op.batch_alter_table("worker_commands") as batch:
        batch.drop_column("owner_id")
    with op.batch_alter_table("scheduled_threads") as batch:
        batch.drop_column("owner_id")
