"""History retention: `event_consumers` (the committed positions this service's stream consumers
report), `retention_marks` (how far each retention job has finished) and the index retention reads
the readings in, `thread_context_snapshots (captured_at, snapshot_id)`.

Revision ID: 0004_retention
Revises: 0003_compaction_limit_source
Create Date: 2027-01-14
"""

from collections.abc import Sequence

from alembic import op

from services.shared.retention import create_retention_tables, drop_retention_tables

revision: str = "0004_retention"
down_revision: str | None = "0003_compaction_limit_source"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds both tables and the index (building it reads the whole history once)."""
    create_retention_tables()
    op.create_index(
        "ix_thread_context_snapshots_captured_snapshot",
        "thread_context_snapshots",
        ["captured_at", "snapshot_id"],
    )


def downgrade() -> None:
    """Drops the index and both tables."""
    op.drop_index("ix_thread_context_snapshots_captured_snapshot", table_name="thread_context_snapshots")
    drop_retention_tables()
