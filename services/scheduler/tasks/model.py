"""Task values and the task state machine (no I/O).

Statuses: queued -> claimed -> running -> completed | failed | timed_out, with claimed -> queued when
a claim's lease runs out before the run started, queued -> expired when the task waited too long
for an offline device, and queued | claimed -> cancelled. Terminal statuses never change again. A
running task is never queued again once its agent may have started the run: a Codex turn has side
effects, so a run whose agent stopped answering is failed (`device_lost`), and the user may retry it
as a new task. The one exception is a task a claim started (`ClaimTask` with `start`) whose answer
never reached the agent (its call was cancelled before the answer went out): nobody holds its
lease, so it goes back to queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from services.shared.errors import FailedPrecondition


class TaskStatus(StrEnum):
    """Where a task is; the values are the event payload's and the database's words."""

    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class TaskType(StrEnum):
    """What a task is for (CHAT-1)."""

    CONVERSATION_REPLY = "conversation_reply"
    DISPATCH_EXECUTION = "dispatch_execution"


class FailureKind(StrEnum):
    """Why a run failed (the proto's FailureKind suffixes); NONE for a task that did not fail."""

    NONE = ""
    SESSION_NOT_FOUND = "session_not_found"
    THREAD_BUSY = "thread_busy"
    NOT_LOGGED_IN = "not_logged_in"
    MODEL_ERROR = "model_error"
    STALLED = "stalled"
    TIMED_OUT = "timed_out"
    COULD_NOT_START = "could_not_start"
    NO_REPLY = "no_reply"
    DEVICE_LOST = "device_lost"
    INTERRUPTED = "interrupted"
    OTHER = "other"


TERMINAL: frozenset[TaskStatus] = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TIMED_OUT, TaskStatus.CANCELLED, TaskStatus.EXPIRED}
)
"""Statuses a task never leaves."""

ACTIVE: frozenset[TaskStatus] = frozenset({TaskStatus.CLAIMED, TaskStatus.RUNNING})
"""Statuses in which a task holds its thread: at most one task per Codex thread is in one of them."""

OPEN: frozenset[TaskStatus] = frozenset({TaskStatus.QUEUED, *ACTIVE})
"""Non-terminal statuses: a thread's later tasks wait for every open earlier one."""

_ALLOWED: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset({TaskStatus.CLAIMED, TaskStatus.EXPIRED, TaskStatus.CANCELLED}),
    TaskStatus.CLAIMED: frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TIMED_OUT}),
    **{status: frozenset() for status in TERMINAL},
}


def can_transition(current: TaskStatus, target: TaskStatus) -> bool:
    """True when `current -> target` is a legal task transition."""
    return target in _ALLOWED[current]


def check_transition(task_id: str, current: TaskStatus, target: TaskStatus) -> None:
    """Raises FailedPrecondition (reason ILLEGAL_TASK_TRANSITION) for an illegal transition."""
    if not can_transition(current, target):
        raise FailedPrecondition(
            f"task {task_id} is {current.value}; it cannot become {target.value}",
            reason="ILLEGAL_TASK_TRANSITION",
        )


@dataclass(frozen=True)
class TaskSettings:
    """Lease and presence rules (spans; all instants they apply to are database time, UTC).

    Attributes:
        claim_lease: how long a claim holds a task before it is started (then back to queued).
        run_lease: how long a running task's lease lasts after its start or last heartbeat (the
            agent heartbeats every third of it); when it runs out the task fails `device_lost`.
        presence_window: a device whose local agent was not seen for this long is offline.
        queue_expiry: a queued task expires once it waited this long while its device is offline.
        sweep_interval: how often the sweeper looks for leases run out and offline devices.
        presence_write_interval: at most one presence write per device (owner and node) per this
            span, per process.
    """

    claim_lease: timedelta = timedelta(seconds=30)
    run_lease: timedelta = timedelta(seconds=30)
    presence_window: timedelta = timedelta(seconds=90)
    queue_expiry: timedelta = timedelta(seconds=900)
    sweep_interval: timedelta = timedelta(seconds=1)
    presence_write_interval: timedelta = timedelta(seconds=5)


@dataclass(frozen=True)
class TaskRequest:
    """What conversations asked for (a `task.requested` payload), validated."""

    task_id: str
    owner_id: str
    task_type: TaskType
    project_id: str
    target_project_id: str
    target_thread_id: str
    device_id: str
    codex_folder_ref: str
    codex_thread_ref: str
    request_message_id: str
    instruction_text: str
    retry_of_task_id: str = ""
    dispatch_plan_id: str = ""


@dataclass(frozen=True)
class Task:
    """A stored task (the `tasks` row). Instants are aware UTC datetimes (database time).

    `lease_id` is the fencing token of the current (or last) claim: never published in events.
    `device_offline` is True while the task is queued and its status_detail says its device is
    offline. `device_last_seen_at` is the device presence's value when the task was read.
    """

    task_id: str
    task_type: TaskType
    status: TaskStatus
    owner_id: str
    project_id: str
    target_project_id: str
    target_thread_id: str
    device_id: str
    codex_folder_ref: str
    codex_thread_ref: str
    request_message_id: str
    instruction_text: str
    dispatch_plan_id: str
    retry_of_task_id: str
    attempt: int
    worker_id: str
    lease_id: str
    created_at: datetime
    updated_at: datetime
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_expires_at: datetime | None = None
    heartbeat_at: datetime | None = None
    reply_text: str = ""
    failure_kind: FailureKind = FailureKind.NONE
    status_detail: str = ""
    device_offline: bool = False
    codex_session_id: str = ""
    device_last_seen_at: datetime | None = None

    @property
    def terminal(self) -> bool:
        """True once the task is completed, failed, timed out, cancelled or expired."""
        return self.status in TERMINAL
