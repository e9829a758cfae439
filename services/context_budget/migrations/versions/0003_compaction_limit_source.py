"""Where a reading's auto-compact limit came from, and "compacted, waiting for the first reading":
`compaction_limit_source` ("configured" | "model_default" | "assumed", NULL when not reported) and
`awaiting_reading_after_compaction` on both reading tables (existing rows: NULL and false).

Revision ID: 0003_compaction_limit_source
Revises: 0002_thread_owner
Create Date: 2027-01-12
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_compaction_limit_source"
down_revision: str | None = "0002_thread_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("thread_context_snapshots", "thread_contexts")


def upgrade() -> None:
    """Adds both columns, last, to both reading tables (the repository relies on that order)."""
    for table in _TABLES:
        op.add_column(table, sa.Column("compaction_limit_source", sa.String(16), nullable=True))
        op.add_column(
            table,
            sa.Column(
                "awaiting_reading_after_compaction", sa.Boolean(), nullable=False, server_default=sa.false()
            ),
        )


def downgrade() -> None:
    """Drops both columns from both tables."""
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("awaiting_reading_after_compaction")
            batch.drop_column("compaction_limit_source")
