"""The message that ends a task (CHAT-3: every terminal status writes exactly one): the thread's raw
reply, or a system message saying in one or two plain sentences what failed and what the user can
do. Pure: times come from the scheduler's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from services.conversations.chat.domain import (
    CANCELLED,
    COMPLETED,
    EXPIRED,
    TIMED_OUT,
    ChatTask,
    StatusReport,
)
from services.conversations.domain.model import master_project_id

THREAD_AUTHOR = "thread"
MASTER_AUTHOR = "master"
SYSTEM_AUTHOR = "system"


@dataclass(frozen=True)
class ResultMessage:
    """What to store in the task's target project: `author_kind` "thread" (with the thread's id) or
    "system" (thread_id "")."""

    author_kind: str
    thread_id: str
    text: str


def result_message(task: ChatTask, report: StatusReport) -> ResultMessage:
    """The message a terminal report writes: completed -> the thread's reply exactly as Codex gave
    it (no summary on top), authored "master" in the master agent's conversation (its own Codex
    thread answered: master_codex_node); a completed report without a reply, and every other
    terminal status -> a system message (`system_message_text`)."""
    if report.status == COMPLETED and report.reply_text:
        in_master = task.target_project_id == master_project_id(task.owner_id)
        author = MASTER_AUTHOR if in_master else THREAD_AUTHOR
        return ResultMessage(author, task.target_thread_id, report.reply_text)
    return ResultMessage(SYSTEM_AUTHOR, "", system_message_text(task, report))


def when(at: datetime | None, reference: datetime | None) -> str:
    """An instant for a sentence, in UTC: "10:04:05 UTC" when it falls on the same UTC day as
    `reference` (or there is none), else "2026-12-01 10:04:05 UTC"."""
    if at is None:
        return "an unknown time"
    moment = at.astimezone(UTC)
    if reference is None or reference.astimezone(UTC).date() == moment.date():
        return moment.strftime("%H:%M:%S UTC")
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _with_detail(sentence: str, detail: str) -> str:
    """`sentence` (no final period) followed by ": detail" when there is one, and a period."""
    detail = detail.strip().rstrip(".")
    return f"{sentence}: {detail}." if detail else f"{sentence}."


def system_message_text(task: ChatTask, report: StatusReport) -> str:
    """The system message of a task that ended without a reply, by status and failure kind.

    Failure kinds (the scheduler's FailureKind): session_not_found, thread_busy, not_logged_in,
    model_error, stalled, timed_out, could_not_start, no_reply, device_lost, interrupted, other.
    An unknown or empty kind reads as "other" (with the report's detail) for failed, and as the
    turn cap for timed_out.
    """
    device = task.device_id or "the device"
    reference = report.finished_at or report.updated_at
    if report.status == EXPIRED:
        seen = report.device_last_seen_at or task.device_last_seen_at
        offline = f"last seen at {when(seen, reference)}" if seen else "never seen by Boss"
        return (
            f"This message was not run: the device {device} was offline ({offline}) and the task "
            "expired in the queue. Retry it when the device is back online."
        )
    if report.status == CANCELLED:
        return "This message was cancelled before it ran; nothing was run. You can retry it."
    if report.status == COMPLETED:  # completed, but no reply text came back
        return f"Codex on {device} finished this message without a reply. You can retry it."
    kind = report.failure_kind or ("timed_out" if report.status == TIMED_OUT else "other")
    if kind == "session_not_found":
        return (
            f"Codex on {device} could not find this thread's session (codex_thread_ref "
            f"{task.codex_thread_ref}). Nothing was run. Retry after the device has the session."
        )
    if kind == "thread_busy":
        return (
            f"This thread is open in another Codex process on {device}, so this message was not run. "
            "Close it there and retry."
        )
    if kind == "not_logged_in":
        return (
            f"Codex on {device} is not logged in (no login or API key). Nothing was run. "
            f"Log in to Codex on {device} and retry."
        )
    if kind == "model_error":
        return _with_detail(f"The model answered Codex on {device} with an error", report.status_detail) + (
            " This message got no reply; you can retry it."
        )
    if kind == "stalled":
        return (
            f"Codex on {device} stopped producing output and was stopped after its stall timeout; "
            "this message may have been partly run. You can retry it."
        )
    if kind == "timed_out":
        return (
            f"Codex on {device} ran longer than its time limit for one message and was stopped; this "
            "message may have been partly run. You can retry it."
        )
    if kind == "could_not_start":
        return _with_detail(f"Codex could not be started on {device}", report.status_detail) + (
            f" Nothing was run. Check the Codex installation and the thread's folder "
            f"({task.codex_folder_ref}) on {device}, then retry."
        )
    if kind == "no_reply":
        return f"Codex on {device} finished this message without a reply. You can retry it."
    if kind == "device_lost":
        last = report.heartbeat_at or report.device_last_seen_at or report.started_at or reference
        return (
            f"The device {device} stopped answering at {when(last, reference)} while running this "
            "message; it was not run again automatically. You can retry it."
        )
    if kind == "interrupted":
        return (
            f"The local agent on {device} was stopped while running this message; it was not run "
            "again automatically. You can retry it."
        )
    return _with_detail(f"Running this message on {device} failed", report.status_detail) + (
        " You can retry it."
    )
