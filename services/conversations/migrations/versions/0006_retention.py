"""Outbox retention: `event_consumers` (the committed positions this service's stream consumers
report) and `retention_marks`.

Revision ID: 0006_retention
Revises: 0005
Create Date: 2027-01-14
"""

from collections.abc import Sequence

from services.shared.retention import create_retention_tables, drop_retention_tables

revision: str = "0006_retention"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Adds both tables."""
    create_retention_tables()


def downgrade() -> None:
    """Drops both tables."""
    drop_retention_tables()
