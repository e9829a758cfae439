"""Pure rules of chat: what a send needs, the conversation's view of a task and how the scheduler's
status reports move it, the collaboration gate, and message sequences.

No I/O and no clock reads: times come in as arguments (aware UTC datetimes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from services.conversations.domain.model import GROUP, MASTER_AGENT, MAX_MESSAGE_LENGTH
from services.shared.errors import FailedPrecondition, FieldViolation, PreconditionViolation
from services.shared.time import isoformat_utc

# ErrorInfo reasons of the chat RPCs.
CLIENT_MESSAGE_ID_REUSED = "CLIENT_MESSAGE_ID_REUSED"
THREAD_METADATA_INCOMPLETE = "THREAD_METADATA_INCOMPLETE"
THREAD_ARCHIVED = "THREAD_ARCHIVED"
CHAT_PATH_NOT_AVAILABLE = "CHAT_PATH_NOT_AVAILABLE"
TASK_NOT_RETRYABLE = "TASK_NOT_RETRYABLE"
TASK_NOT_CANCELLABLE = "TASK_NOT_CANCELLABLE"

CONVERSATION_REPLY = "conversation_reply"
DISPATCH_EXECUTION = "dispatch_execution"
TASK_TYPES = (CONVERSATION_REPLY, DISPATCH_EXECUTION)

QUEUED = "queued"
CLAIMED = "claimed"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
EXPIRED = "expired"
TASK_STATUSES = (QUEUED, CLAIMED, RUNNING, COMPLETED, FAILED, TIMED_OUT, CANCELLED, EXPIRED)
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, TIMED_OUT, CANCELLED, EXPIRED})
RETRYABLE_STATUSES = frozenset({FAILED, TIMED_OUT, CANCELLED, EXPIRED})
"""Statuses a user may retry (a new task for the same message): every terminal one but completed."""

GATE_OPEN = "open"

MAX_CLIENT_MESSAGE_ID_LENGTH = 200
_CLIENT_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")

NUL = "\x00"
NUL_REFUSED = "must not contain NUL characters"
"""The violation of a text holding NUL (the gateway's words for the same rule)."""
NUL_REPLACEMENT = "\ufffd"
"""What a NUL in a scheduler report's text becomes (U+FFFD), so the report can be stored."""

METADATA_VIOLATION = "THREAD_METADATA"
"""`PreconditionViolation.type` of a missing piece of thread metadata."""


def is_terminal(status: str) -> bool:
    """Whether a task status is final (completed, failed, timed_out, cancelled, expired)."""
    return status in TERMINAL_STATUSES


# ---------------------------------------------------------------------------------------------------
# Sending


def check_post(text: str, client_message_id: str) -> list[FieldViolation]:
    """The violations of a PostMessage's fields, every one at once (empty when it is fine).

    `text`: 1-100,000 characters (code points), not only whitespace, and no NUL (PostgreSQL text
    cannot hold it; refused on every database alike). `client_message_id`: 1-200 characters of
    A-Z, a-z, 0-9 and `.`, `_`, `:`, `-`.
    """
    violations: list[FieldViolation] = []
    if not text.strip():
        violations.append(FieldViolation("text", "must not be empty or only whitespace"))
    elif len(text) > MAX_MESSAGE_LENGTH:
        violations.append(FieldViolation("text", f"must be at most {MAX_MESSAGE_LENGTH:,} characters"))
    elif NUL in text:
        violations.append(FieldViolation("text", NUL_REFUSED))
    if not client_message_id:
        violations.append(FieldViolation("client_message_id", "is required"))
    elif not _CLIENT_MESSAGE_ID.fullmatch(client_message_id):
        violations.append(
            FieldViolation(
                "client_message_id",
                f"must be 1-{MAX_CLIENT_MESSAGE_ID_LENGTH} characters of A-Z, a-z, 0-9, "
                "'.', '_', ':' and '-'",
            )
        )
    return violations


def check_after_sequence(after_sequence: int) -> list[FieldViolation]:
    """ListMessages' `after_sequence` must not be negative (0: from the first message)."""
    if after_sequence < 0:
        return [FieldViolation("after_sequence", "must not be negative")]
    return []


@dataclass(frozen=True)
class ChatThread:
    """The thread a single-thread chat talks to, as registered (empty strings: not known)."""

    thread_id: str
    node_id: str
    codex_folder: str
    codex_thread_ref: str
    archived: bool = False


# Seed name of each piece of metadata a task needs, and what is missing in words.
_METADATA: tuple[tuple[str, str, str], ...] = (
    ("node_id", "deviceId", "the device (node) that runs the thread is not known"),
    ("codex_folder", "codexFolderRef", "the thread's Codex working folder is not known"),
    ("codex_thread_ref", "codexThreadRef", "the thread's Codex session id is not known"),
)


def missing_metadata(thread: ChatThread | None) -> list[PreconditionViolation]:
    """One violation per piece of thread metadata a task needs and the thread lacks, named by its
    seed name (deviceId, codexFolderRef, codexThreadRef), in that order; every one for no thread."""
    found: list[PreconditionViolation] = []
    for attribute, seed_name, words in _METADATA:
        if thread is None or not getattr(thread, attribute):
            description = f"{words}: its device's worker registers it when it reports the thread"
            found.append(PreconditionViolation(METADATA_VIOLATION, seed_name, description))
    return found


def check_chat_target(
    project_id: str, conversation_type: str, project_archived: bool, thread: ChatThread | None
) -> ChatThread:
    """The thread a message to this project goes to, or why it cannot be sent (nothing is stored then:
    the client keeps its draft).

    Raises FailedPrecondition, checked in this order:
        CHAT_PATH_NOT_AVAILABLE: the master agent's conversation or a group (not built yet);
        THREAD_ARCHIVED: the project or its thread is archived;
        THREAD_METADATA_INCOMPLETE: the thread lacks node, Codex folder or Codex session id, with a
            PreconditionFailure violation naming each (`missing_metadata`).
    """
    if conversation_type in (MASTER_AGENT, GROUP):
        kind = "the master agent's conversation" if conversation_type == MASTER_AGENT else "a group"
        raise FailedPrecondition(
            f"chatting in {kind} is not available yet (project {project_id!r}); nothing was stored",
            reason=CHAT_PATH_NOT_AVAILABLE,
        )
    if project_archived or (thread is not None and thread.archived):
        raise FailedPrecondition(
            f"project {project_id!r}: its thread is archived; nothing was stored", reason=THREAD_ARCHIVED
        )
    missing = missing_metadata(thread)
    if missing or thread is None:
        names = ", ".join(violation.subject for violation in missing)
        raise FailedPrecondition(
            f"project {project_id!r}: the thread's metadata is incomplete (missing {names}); the message "
            "was not stored, keep the draft and send it again once the device has registered the thread",
            reason=THREAD_METADATA_INCOMPLETE,
            violations=missing,
        )
    return thread


# ---------------------------------------------------------------------------------------------------
# The conversation's projection of a task


@dataclass(frozen=True)
class ChatTask:
    """A task as the conversation sees it (the `ChatTask` proto plus the owner and the ordering
    time of the last status report applied).

    Attributes:
        status: one of TASK_STATUSES.
        failure_kind: the scheduler's failure kind ("session_not_found", "device_lost", ...) or "".
        device_last_seen_at: when the device's local agent was last seen (UTC), when known.
        created_at / updated_at: when this service created the task / last changed it (UTC; after a
            status report, the scheduler's time of that status).
        scheduler_updated_at: the scheduler's `updated_at` of the last report applied (orders
            reports; None before the first).
    """

    task_id: str
    owner_id: str
    task_type: str
    status: str
    project_id: str
    target_project_id: str
    target_thread_id: str
    device_id: str
    codex_folder_ref: str
    codex_thread_ref: str
    request_message_id: str
    created_at: datetime
    updated_at: datetime
    result_message_id: str = ""
    failure_kind: str = ""
    status_detail: str = ""
    device_last_seen_at: datetime | None = None
    retry_of_task_id: str = ""
    retried_by_task_id: str = ""
    scheduler_updated_at: datetime | None = None

    @property
    def retryable(self) -> bool:
        """Failed, timed out, cancelled or expired, and not retried yet."""
        return self.status in RETRYABLE_STATUSES and not self.retried_by_task_id

    def as_payload(self) -> dict[str, Any]:
        """The `ChatTask` proto's fields as JSON (snake_case; instants RFC 3339 UTC or null)."""
        return {
            "task_id": self.task_id,
            "task_type": self.task_type,
            "status": self.status,
            "project_id": self.project_id,
            "target_project_id": self.target_project_id,
            "target_thread_id": self.target_thread_id,
            "device_id": self.device_id,
            "codex_folder_ref": self.codex_folder_ref,
            "codex_thread_ref": self.codex_thread_ref,
            "request_message_id": self.request_message_id,
            "result_message_id": self.result_message_id,
            "failure_kind": self.failure_kind,
            "status_detail": self.status_detail,
            "device_last_seen_at": isoformat_utc(self.device_last_seen_at),
            "retry_of_task_id": self.retry_of_task_id,
            "retried_by_task_id": self.retried_by_task_id,
            "created_at": isoformat_utc(self.created_at),
            "updated_at": isoformat_utc(self.updated_at),
        }


def new_chat_task(
    task_id: str,
    owner_id: str,
    project_id: str,
    thread: ChatThread,
    request_message_id: str,
    now: datetime,
    retry_of_task_id: str = "",
) -> ChatTask:
    """A queued conversation_reply task of a single-thread chat: the reply goes back to the project
    the message came from, through the thread's current metadata."""
    return ChatTask(
        task_id=task_id,
        owner_id=owner_id,
        task_type=CONVERSATION_REPLY,
        status=QUEUED,
        project_id=project_id,
        target_project_id=project_id,
        target_thread_id=thread.thread_id,
        device_id=thread.node_id,
        codex_folder_ref=thread.codex_folder,
        codex_thread_ref=thread.codex_thread_ref,
        request_message_id=request_message_id,
        created_at=now,
        updated_at=now,
        retry_of_task_id=retry_of_task_id,
    )


def task_request_payload(task: ChatTask, instruction_text: str) -> dict[str, Any]:
    """The `task.requested` payload the scheduler creates the task from (idempotently by task_id)."""
    return {
        "owner_id": task.owner_id,
        "task_id": task.task_id,
        "task_type": task.task_type,
        "project_id": task.project_id,
        "target_project_id": task.target_project_id,
        "target_thread_id": task.target_thread_id,
        "device_id": task.device_id,
        "codex_folder_ref": task.codex_folder_ref,
        "codex_thread_ref": task.codex_thread_ref,
        "request_message_id": task.request_message_id,
        "instruction_text": instruction_text,
        "retry_of_task_id": task.retry_of_task_id,
        "dispatch_plan_id": "",
    }


@dataclass(frozen=True)
class StatusReport:
    """One `task.status_changed` event of the scheduler (its Task message as JSON), the fields this
    service reads. Times are aware UTC datetimes, None when the payload has null.
    `codex_session_id` is the Codex session the run reported ("" when none: a group's relay task
    reports the new thread's so), `worker_id` the worker that ran it ("" before a claim)."""

    task_id: str
    owner_id: str
    status: str
    failure_kind: str = ""
    status_detail: str = ""
    reply_text: str = ""
    device_last_seen_at: datetime | None = None
    heartbeat_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    codex_session_id: str = ""
    worker_id: str = ""


def _instant(payload: Mapping[str, Any], name: str) -> datetime | None:
    """An RFC 3339 instant of the payload (None for null or absent). Raises ValueError for text that
    is not one, or one without an offset."""
    value = payload.get(name)
    if value is None or value == "":
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"{name}: {value!r} has no UTC offset")
    return parsed


def _storable_text(payload: Mapping[str, Any], name: str) -> str:
    """A text of the payload ("" for null or absent) with NUL_REPLACEMENT for every NUL."""
    return str(payload.get(name) or "").replace(NUL, NUL_REPLACEMENT)


def parse_status_report(payload: Mapping[str, Any]) -> StatusReport:
    """A StatusReport from a `task.status_changed` payload.

    Texts (failure kind, detail, reply) get U+FFFD for every NUL: PostgreSQL text cannot hold NUL,
    and a report that cannot be stored would stop the projection of every later one.

    Raises ValueError when task_id is missing or holds NUL, the status is not one of TASK_STATUSES,
    or an instant is malformed (the caller skips such an event and logs it).
    """
    task_id = str(payload.get("task_id") or "")
    if not task_id:
        raise ValueError("no task_id")
    if NUL in task_id:
        raise ValueError(f"task_id {task_id!r} holds NUL")
    status = str(payload.get("status") or "")
    if status not in TASK_STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return StatusReport(
        task_id=task_id,
        owner_id=str(payload.get("owner_id") or ""),
        status=status,
        failure_kind=_storable_text(payload, "failure_kind"),
        status_detail=_storable_text(payload, "status_detail"),
        reply_text=_storable_text(payload, "reply_text"),
        device_last_seen_at=_instant(payload, "device_last_seen_at"),
        heartbeat_at=_instant(payload, "heartbeat_at"),
        started_at=_instant(payload, "started_at"),
        finished_at=_instant(payload, "finished_at"),
        updated_at=_instant(payload, "updated_at"),
        codex_session_id=_storable_text(payload, "codex_session_id"),
        worker_id=_storable_text(payload, "worker_id"),
    )


def apply_status_report(task: ChatTask, report: StatusReport, received_at: datetime) -> ChatTask | None:
    """The task after the scheduler's report, or None when the report changes nothing.

    Nothing changes once the task is terminal (the first terminal status is final: a replayed or
    late report is ignored), for a report older than the last one applied (by the scheduler's
    `updated_at`), or for a report that says what the task shows already. Otherwise status,
    failure kind, detail and device presence are the report's, and `updated_at` is the report's
    time (`received_at`, the event's time, when it has none).
    """
    if is_terminal(task.status):
        return None
    if (
        report.updated_at is not None
        and task.scheduler_updated_at is not None
        and report.updated_at < task.scheduler_updated_at
    ):
        return None
    seen_at = report.device_last_seen_at or task.device_last_seen_at
    shown = (task.status, task.failure_kind, task.status_detail, task.device_last_seen_at)
    if (report.status, report.failure_kind, report.status_detail, seen_at) == shown:
        return None
    return replace(
        task,
        status=report.status,
        failure_kind=report.failure_kind,
        status_detail=report.status_detail,
        device_last_seen_at=seen_at,
        updated_at=report.updated_at or received_at,
        scheduler_updated_at=report.updated_at or task.scheduler_updated_at,
    )


# ---------------------------------------------------------------------------------------------------
# The collaboration gate (CHAT-5)


@dataclass(frozen=True)
class CollaborationGate:
    """Where a project's collaboration stands: `state` "open" for single-thread chat; `tasks_total`
    the thread's tasks not yet terminal, `tasks_done` how many of those are terminal (0);
    `detail` in words."""

    state: str
    tasks_total: int
    tasks_done: int
    detail: str

    def as_payload(self) -> dict[str, Any]:
        """The `CollaborationGate` proto's fields as JSON."""
        return {
            "state": self.state,
            "tasks_total": self.tasks_total,
            "tasks_done": self.tasks_done,
            "detail": self.detail,
        }


def collaboration_gate(open_tasks: int, earlier_open_tasks: int) -> CollaborationGate:
    """The gate of a single-thread chat: always open (a thread's messages queue and run in order).

    Args:
        open_tasks: the thread's tasks that are not terminal (queued, claimed or running).
        earlier_open_tasks: how many of them were requested before the task in view (they run
            first); 0 when that task is terminal or runs next.
    """
    detail = ""
    if earlier_open_tasks == 1:
        detail = "1 earlier message of this thread runs first"
    elif earlier_open_tasks > 1:
        detail = f"{earlier_open_tasks} earlier messages of this thread run first"
    return CollaborationGate(GATE_OPEN, open_tasks, 0, detail)
