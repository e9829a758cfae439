"""Trust boundaries: enrolled devices and their pairing codes.

- `devices`: one row per device enrolled by pairing code (owner, node, worker, name, when enrolled,
  when revoked). At most one active device per (owner, node, worker).
- `pairing_codes`: short-lived one-time codes, stored as their SHA-256 only, with their owner, expiry
  and the device that used them.

Revision ID: 0007_devices
Revises: 0006_retention
Create Date: 2027-01-10
"""

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision = "0007_devices"
down_revision = "0006_retention"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates both tables and their indexes."""
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("node_id", sa.String(200), nullable=False),
        sa.Column("worker_id", sa.String(200), nullable=False),
        sa.Column("device_name", sa.String(200), nullable=False),
        sa.Column("enrolled_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
    )
    op.create_index("ix_devices_owner", "devices", ["owner_id", "enrolled_at"])
    op.create_index(
        "ux_devices_active_device",
        "devices",
        ["owner_id", "node_id", "worker_id"],
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    )
    op.create_table(
        "pairing_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("owner_id", sa.String(200), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("used_at", UtcDateTime(), nullable=True),
        sa.Column("device_id", sa.String(64), nullable=False, server_default=""),
    )


def downgrade() -> None:
    """Drops both tables."""
    op.drop_table("pairing_codes")
    op.drop_index("ux_devices_active_device", table_name="devices")
    op.drop_index("ix_devices_owner", table_name="devices")
    op.drop_table("devices")
