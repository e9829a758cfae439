"""SQLAlchemy Core tables of the conversations context (schema `conversations` on PostgreSQL).

`projects` holds the home-list rows *ready to serve*: the ring's figures are denormalised onto the
row (`indicator_*`) by the projection, so listing needs one indexed query and no cross-service call.
`threads` holds registered metadata plus the latest budget and handoff state of each thread.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from services.shared.outbox import define_outbox_tables
from services.shared.sql_types import UtcDateTime

metadata = MetaData()

projects = Table(
    "projects",
    metadata,
    Column("project_id", String(200), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("conversation_type", String(20), nullable=False),
    Column("title", String(200), nullable=False),
    Column("manual_pinned", Boolean, nullable=False, default=False),
    Column("latest_reply_at", UtcDateTime, nullable=True),
    # latest_reply_at, or created_at before the first reply: the home list's order key.
    Column("sort_at", UtcDateTime, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("archived_at", UtcDateTime, nullable=True),
    # The thread whose budget the ring shows (single_device: its thread; master: its main thread).
    Column("indicator_thread_id", String(200), nullable=False, default=""),
    Column("indicator_visible", Boolean, nullable=False, default=False),
    Column("indicator_percent", Integer, nullable=False, default=0),
    Column("indicator_level", String(20), nullable=False, default=""),
    Column("indicator_source_node_id", String(200), nullable=False, default=""),
    Column("indicator_updated_at", UtcDateTime, nullable=True),
    Column("indicator_must_finish", Boolean, nullable=False, default=False),
    # The scheduler's strategy in words for this project, when it published one.
    Column("strategy_summary", Text, nullable=False, default=""),
    Index("ix_projects_home_list", "owner_id", "manual_pinned", "sort_at", "project_id"),
    Index("ix_projects_indicator_thread", "indicator_thread_id"),
)

threads = Table(
    "threads",
    metadata,
    Column("thread_id", String(200), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("node_id", String(200), nullable=False),
    Column("worker_id", String(200), nullable=False),
    Column("codex_folder", Text, nullable=False, default=""),
    Column("codex_thread_ref", Text, nullable=False, default=""),
    Column("title", String(200), nullable=False),
    Column("single_device_project_id", String(200), nullable=False, default=""),
    Column("is_master_main_thread", Boolean, nullable=False, default=False),
    Column("registered_at", UtcDateTime, nullable=False),
    Column("archived_at", UtcDateTime, nullable=True),
    # Latest budget (NULL remaining_pct: never reported).
    Column("remaining_pct", Float, nullable=True),
    Column("level", String(20), nullable=False, default=""),
    Column("budget_node_id", String(200), nullable=False, default=""),
    Column("must_finish_before_compaction", Boolean, nullable=False, default=False),
    Column("must_finish_reason", Text, nullable=False, default=""),
    Column("compaction_expected_at", UtcDateTime, nullable=True),
    Column("last_compaction_at", UtcDateTime, nullable=True),
    Column("compaction_count", Integer, nullable=False, default=0),
    Column("estimated_remaining_turns", Integer, nullable=True),
    Column("snapshot_version", BigInteger, nullable=False, default=0),
    Column("captured_at", UtcDateTime, nullable=True),
    Column("budget_updated_at", UtcDateTime, nullable=True),
    Column("master_actions_json", Text, nullable=False, default="[]"),
    # Handoff state from the scheduler's events.
    Column("handoff_status", String(20), nullable=False, default="none"),
    Column("handoff_package_id", String(200), nullable=False, default=""),
    Column("handoff_reason", Text, nullable=False, default=""),
    Column("checklist_done_json", Text, nullable=False, default="[]"),
    # JSON object: checklist item key -> the ready package's detail of it (migration 0002).
    Column("checklist_details_json", Text, nullable=False, default="{}", server_default="{}"),
    Index("ix_threads_owner", "owner_id"),
)

project_threads = Table(
    "project_threads",
    metadata,
    Column("project_id", String(200), primary_key=True),
    Column("thread_id", String(200), primary_key=True),
    Column("joined_at", UtcDateTime, nullable=False),
    Index("ix_project_threads_thread", "thread_id"),
)

messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False, unique=True),
    Column("project_id", String(200), nullable=False),
    Column("author_kind", String(20), nullable=False),
    Column("thread_id", String(200), nullable=False, default=""),
    Column("text", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Index("ix_messages_project", "project_id", "id"),
)

outbox_events, outbox_sequencer, event_cursors = define_outbox_tables(metadata)
