"""The task tables, on the scheduler's MetaData (services/scheduler/adapters/tables.py).

- `tasks`: one row per task; `id` is the queue order (creation order), `task_id` the public id.
  Partial indexes keep the hot queries small: `ix_tasks_node_queue` (a node's queued tasks in
  order: the claim), `ix_tasks_thread_open` (a thread's open tasks: the per-thread order),
  `ix_tasks_lease` (leases that may run out: the sweeper), and the unique `ux_tasks_thread_active`:
  at most one claimed or running task per Codex thread, whatever the number of claimers or
  scheduler processes.
- `device_presence`: when each owner's node's local agent was last seen (ClaimTask and heartbeats),
  by (owner_id, node_id): enrollment takes any node id, so two owners' machines may share one.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, String, Table, Text, text

from services.scheduler.adapters.tables import metadata
from services.shared.sql_types import UtcDateTime

QUEUED_ONLY = "status = 'queued'"
OPEN_ONLY = "status IN ('queued', 'claimed', 'running')"
ACTIVE_ONLY = "status IN ('claimed', 'running')"


tasks = Table(
    "tasks",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("task_id", String(200), nullable=False, unique=True),
    Column("task_type", String(40), nullable=False),
    Column("status", String(20), nullable=False),
    Column("owner_id", String(200), nullable=False, default=""),
    Column("project_id", String(200), nullable=False, default=""),
    Column("target_project_id", String(200), nullable=False, default=""),
    Column("target_thread_id", String(200), nullable=False, default=""),
    Column("device_id", String(200), nullable=False, default=""),
    Column("codex_folder_ref", Text, nullable=False, default=""),
    Column("codex_thread_ref", String(200), nullable=False, default=""),
    Column("request_message_id", String(200), nullable=False, default=""),
    Column("instruction_text", Text, nullable=False, default=""),
    Column("dispatch_plan_id", String(200), nullable=False, default=""),
    Column("retry_of_task_id", String(200), nullable=False, default=""),
    Column("attempt", Integer, nullable=False, default=0),
    Column("worker_id", String(200), nullable=False, default=""),
    Column("lease_id", String(64), nullable=False, default=""),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("claimed_at", UtcDateTime, nullable=True),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    Column("heartbeat_at", UtcDateTime, nullable=True),
    Column("reply_text", Text, nullable=False, default=""),
    Column("failure_kind", String(40), nullable=False, default=""),
    Column("status_detail", Text, nullable=False, default=""),
    Column("device_offline", Boolean, nullable=False, default=False),
    Column("codex_session_id", String(200), nullable=False, default=""),
    Index(
        "ix_tasks_node_queue",
        "device_id",
        "id",
        postgresql_where=text(QUEUED_ONLY),
        sqlite_where=text(QUEUED_ONLY),
    ),
    Index(
        "ix_tasks_thread_open",
        "target_thread_id",
        "id",
        postgresql_where=text(OPEN_ONLY),
        sqlite_where=text(OPEN_ONLY),
    ),
    Index(
        "ix_tasks_lease",
        "lease_expires_at",
        postgresql_where=text(ACTIVE_ONLY),
        sqlite_where=text(ACTIVE_ONLY),
    ),
    Index(
        "ux_tasks_thread_active",
        "target_thread_id",
        unique=True,
        postgresql_where=text(ACTIVE_ONLY),
        sqlite_where=text(ACTIVE_ONLY),
    ),
)

device_presence = Table(
    "device_presence",
    metadata,
    Column("owner_id", String(200), primary_key=True),
    Column("node_id", String(200), primary_key=True),
    Column("worker_id", String(200), nullable=False, default=""),
    Column("last_seen_at", UtcDateTime, nullable=False),
)
