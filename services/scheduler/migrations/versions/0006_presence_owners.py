"""Device presence per owner: `device_presence` is keyed by (owner_id, node_id). Enrollment takes any
node id, so two owners' machines may share one; keyed by node alone, one owner's polling device made
another's offline node look online (its queued tasks stopped expiring, its tasks and group plans
named the other device's last poll).

Existing rows go to the owners whose tasks name that node, or to the default owner "local" when no
task does (a node with several owners' tasks gives each of them the row: presence is minutes old at
most, and the next poll of each device corrects it).

Revision ID: 0006_presence_owners
Revises: 0005_strategy_owners
Create Date: 2027-01-21
"""

import sqlalchemy as sa
from alembic import op

from services.shared.sql_types import UtcDateTime

revision = "0006_presence_owners"
down_revision = "0005_strategy_owners"
branch_labels = None
depends_on = None

OWNED_ROWS = """
SELECT COALESCE(o.owner_id, 'local'), p.node_id, p.worker_id, p.last_seen_at FROM device_presence p
LEFT JOIN (SELECT DISTINCT owner_id, device_id FROM tasks) AS o ON o.device_id = p.node_id"""

LATEST_ROW_PER_NODE = """
SELECT node_id, MAX(worker_id), MAX(last_seen_at) FROM device_presence GROUP BY node_id"""


def upgrade() -> None:
    """Rebuilds the table keyed by owner and node, each row given its owner."""
    _rebuild(("owner_id", "node_id"), OWNED_ROWS)


def downgrade() -> None:
    """Rebuilds the table keyed by node alone, the latest sign of life of each node kept."""
    _rebuild(("node_id",), LATEST_ROW_PER_NODE)


def _rebuild(key: tuple[str, ...], rows: str) -> None:
    """Creates the table anew with the primary key `key`, filled by the query `rows` (its columns:
    `key`, worker_id, last_seen_at) over the old one, which it replaces."""
    op.create_table(
        "device_presence_rebuilt",
        *(sa.Column(name, sa.String(length=200), nullable=False) for name in key),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("last_seen_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint(*key),
    )
    columns = ", ".join((*key, "worker_id", "last_seen_at"))
    op.execute(f"INSERT INTO device_presence_rebuilt ({columns}) {rows}")
    op.drop_table("device_presence")
    op.rename_table("device_presence_rebuilt", "device_presence")
