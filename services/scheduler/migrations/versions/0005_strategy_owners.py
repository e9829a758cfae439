"""Strategy summaries per owner: `project_strategies` is keyed by (owner_id, project_id), since the
project id of a reading is what the reporting worker names and two owners' devices may name the same
one; each owner's threads of it get a summary of their own.

The table only remembers the last summary published, so that unchanged ones are not published again.
Its rows are dropped rather than given a guessed owner: at start every project is dirty, so each
summary is computed and published once more, and the conversations service, which stores it, leaves
an unchanged one as it was.

Revision ID: 0005_strategy_owners
Revises: 0004_retention
Create Date: 2027-01-20
"""

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision = "0005_strategy_owners"
down_revision = "0004_retention"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Recreates the table with the owner in its key."""
    _recreate_keyed_by("owner_id", "project_id")


def downgrade() -> None:
    """Recreates the table keyed by project alone (its rows dropped, as on the way up)."""
    _recreate_keyed_by("project_id")


def _recreate_keyed_by(*key: str) -> None:
    """Drops the table and creates it empty with the primary key `key` (string columns)."""
    op.drop_table("project_strategies")
    op.create_table(
        "project_strategies",
        *(sa.Column(name, sa.String(length=200), nullable=False) for name in key),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint(*key),
    )
