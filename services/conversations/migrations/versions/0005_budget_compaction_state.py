"""threads.awaiting_reading_after_compaction and threads.compaction_limit_source: the thread's latest
budget says "compacted, waiting for the first reading", and where its auto-compact limit came from
("configured" | "model_default" | "assumed", "" when not reported), as context_budget published it.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-12
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds both columns; existing threads get false and "" until their next reading."""
    op.add_column(
        "threads",
        sa.Column("awaiting_reading_after_compaction", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "threads", sa.Column("compaction_limit_source", sa.String(20), nullable=False, server_default="")
    )


def downgrade() -> None:
    """Drops both columns."""
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("compaction_limit_source")
        batch.drop_column("awaiting_reading_after_compaction")
