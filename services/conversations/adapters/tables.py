"""SQLAlchemy Core tables of the conversations context (schema `conversations` on PostgreSQL).

`projects` holds the home-list rows *ready to serve*: the ring's figures are denormalised onto the
row (`indicator_*`) by the projection, so listing needs one indexed query and no cross-service call.
`threads` holds registered metadata plus the latest budget and handoff state of each thread.
`messages`, `message_sequences` and `chat_tasks` are chat's (services/conversations/chat);
`dispatch_plans` and `dispatch_targets` are the group chat's (services/conversations/groups).
`devices` and `pairing_codes` are the device registry's (services/conversations/devices.py).
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
    false,
    text,
)

from services.shared.outbox import define_outbox_tables
from services.shared.retention import define_retention_tables
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
    # The shown thread is "compacted, waiting for the first reading" (migration 0008).
    Column("indicator_awaiting_reading", Boolean, nullable=False, default=False, server_default=false()),
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
    # "Compacted, waiting for the first reading", and where L came from (migration 0005).
    Column(
        "awaiting_reading_after_compaction", Boolean, nullable=False, default=False, server_default=false()
    ),
    Column("compaction_limit_source", String(20), nullable=False, default="", server_default=""),
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
    # Position in its conversation: 1, 2, 3 ... without gaps, taken from `message_sequences` in the
    # writing transaction (migration 0003 numbered the messages stored before).
    Column("sequence", BigInteger, nullable=False),
    # The client's idempotency key of a message sent with PostMessage; NULL otherwise (so the unique
    # index below holds only the keyed ones).
    Column("client_message_id", String(200), nullable=True),
    # The task the message requested (user message) or ended (reply or system message); "" if none.
    Column("task_id", String(64), nullable=False, default="", server_default=""),
    Index("ix_messages_project", "project_id", "id"),
    Index("ux_messages_project_sequence", "project_id", "sequence", unique=True),
    Index("ux_messages_client_message", "project_id", "client_message_id", unique=True),
)

# One row per conversation that has messages: the last sequence handed out. Writers take the next one
# with one upsert, whose row lock (held until commit) orders a conversation's writers, so sequences
# become visible in order and never collide.
message_sequences = Table(
    "message_sequences",
    metadata,
    Column("project_id", String(200), primary_key=True),
    Column("last_sequence", BigInteger, nullable=False),
)

# The conversation's projection of the scheduler's tasks (ChatTask): created with the message that
# requests it, kept from the scheduler's `task.status_changed` events.
chat_tasks = Table(
    "chat_tasks",
    metadata,
    Column("task_id", String(64), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("task_type", String(30), nullable=False),
    Column("status", String(20), nullable=False),
    Column("project_id", String(200), nullable=False),
    Column("target_project_id", String(200), nullable=False),
    Column("target_thread_id", String(200), nullable=False),
    Column("device_id", String(200), nullable=False),
    Column("codex_folder_ref", Text, nullable=False),
    Column("codex_thread_ref", Text, nullable=False),
    Column("request_message_id", String(64), nullable=False),
    Column("result_message_id", String(64), nullable=False),
    Column("failure_kind", String(40), nullable=False),
    Column("status_detail", Text, nullable=False),
    Column("device_last_seen_at", UtcDateTime, nullable=True),
    Column("retry_of_task_id", String(64), nullable=False),
    Column("retried_by_task_id", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # The scheduler's `updated_at` of the last status report applied (orders reports).
    Column("scheduler_updated_at", UtcDateTime, nullable=True),
    Index("ix_chat_tasks_thread_status", "target_thread_id", "status"),
    Index("ix_chat_tasks_request_message", "request_message_id"),
)

# A group message's dispatch plan (services/conversations/groups, migration 0004): one row per plan,
# its targets in `dispatch_targets`. `left_out_json` is a JSON array of {thread_id, thread_title,
# rule, reason}: the members the plan does not send to.
dispatch_plans = Table(
    "dispatch_plans",
    metadata,
    Column("plan_id", String(64), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("project_id", String(200), nullable=False),
    Column("request_message_id", String(64), nullable=False),
    Column("request_text", Text, nullable=False),
    Column("status", String(20), nullable=False),
    Column("left_out_json", Text, nullable=False),
    Column("drafted_by", String(20), nullable=False),
    Column("drafting_note", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Column("decided_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("superseded_by_plan_id", String(64), nullable=False),
    Column("summary_status", String(20), nullable=False),
    Column("summary_message_id", String(64), nullable=False),
    Index("ix_dispatch_plans_project", "project_id", "status"),
    Index("ux_dispatch_plans_request_message", "request_message_id", unique=True),
    Index("ix_dispatch_plans_status_expiry", "status", "expires_at"),
    Index("ix_dispatch_plans_summary", "summary_status"),
)

dispatch_targets = Table(
    "dispatch_targets",
    metadata,
    Column("plan_id", String(64), primary_key=True),
    Column("target_id", String(20), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("kind", String(10), nullable=False),
    Column("thread_id", String(200), nullable=False),
    Column("thread_title", String(200), nullable=False),
    Column("device_id", String(200), nullable=False),
    Column("codex_folder_ref", Text, nullable=False),
    Column("codex_thread_ref", Text, nullable=False),
    Column("instruction", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("remaining_pct", Float, nullable=True),
    Column("level", String(20), nullable=False),
    Column("relay_of_thread_id", String(200), nullable=False),
    Column("status", String(20), nullable=False),
    Column("status_detail", Text, nullable=False),
    Column("task_id", String(64), nullable=False),
    Column("task_status", String(20), nullable=False),
    Index("ix_dispatch_targets_task", "task_id"),
)

devices = Table(
    "devices",
    metadata,
    Column("device_id", String(64), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("node_id", String(200), nullable=False),
    Column("worker_id", String(200), nullable=False),
    Column("device_name", String(200), nullable=False),
    Column("enrolled_at", UtcDateTime, nullable=False),
    Column("revoked_at", UtcDateTime, nullable=True),
    Index("ix_devices_owner", "owner_id", "enrolled_at"),
    # At most one active device per owner, node and worker (migration 0007).
    Index(
        "ux_devices_active_device",
        "owner_id",
        "node_id",
        "worker_id",
        unique=True,
        sqlite_where=text("revoked_at IS NULL"),
        postgresql_where=text("revoked_at IS NULL"),
    ),
)

pairing_codes = Table(
    "pairing_codes",
    metadata,
    # SHA-256 (hex) of the normalised code: the code itself is never stored.
    Column("code_hash", String(64), primary_key=True),
    Column("owner_id", String(200), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    Column("used_at", UtcDateTime, nullable=True),
    Column("device_id", String(64), nullable=False, server_default=""),
)

outbox_events, outbox_sequencer, event_cursors = define_outbox_tables(metadata)
# Outbox and history retention (services/shared/retention.py).
event_consumers, retention_marks = define_retention_tables(metadata)
