"""projects.indicator_awaiting_reading: the home-list ring's thread is "compacted, waiting for the first
reading", so the ring says "compacted" instead of a percent nobody measured.

Rows whose shown thread is in that state already (threads.awaiting_reading_after_compaction, migration
0005) get true; every other row false.

Revision ID: 0008
Revises: 0007_devices
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007_devices"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds the column and sets it from the shown thread's latest budget."""
    op.add_column(
        "projects",
        sa.Column("indicator_awaiting_reading", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.execute(
        "UPDATE projects SET indicator_awaiting_reading = true WHERE indicator_visible AND EXISTS "
        "(SELECT 1 FROM threads WHERE threads.thread_id = projects.indicator_thread_id "
        "AND threads.awaiting_reading_after_compaction)"
    )


def downgrade() -> None:
    """Drops the column."""
    with op.batch_alter_table("projects") as batch:
        batch.drop_column("indicator_awaiting_reading")
