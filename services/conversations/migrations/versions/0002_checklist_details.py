"""threads.checklist_details_json: the ready handoff package's words for each checklist item, so the
thread page shows the same checklist details as the scheduler's package.

Revision ID: 0002
Revises: 0001
Create Date: 2026-05-20
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds the column; existing threads get "{}" (no details until their next ready package)."""
    op.add_column(
        "threads",
        sa.Column("checklist_details_json", sa.Text, nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    """Drops the column."""
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("checklist_details_json")
