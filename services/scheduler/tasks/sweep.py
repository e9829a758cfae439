"""Pure sweeper decisions: what happens to a task whose lease ran out or whose device is offline.

- claimed, lease run out: back to queued (it never started, so running it later is safe);
- running, lease run out: failed `device_lost`, "the device <node> stopped answering at <its last
  heartbeat or start>"; never queued again (a Codex turn has side effects);
- queued, device offline (not seen for the presence window, or never): said once in the status
  detail ("device <node> last seen at <UTC>" / "has not connected yet");
- queued, device offline, and waiting for longer than the queue expiry while its device was not
  seen: expired, saying how long it waited and when the device was last seen;
- queued, offline said, device back: the detail is cleared.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from services.scheduler.tasks.model import FailureKind, Task, TaskSettings, TaskStatus
from services.scheduler.tasks.rules import (
    device_lost_detail,
    expired_detail,
    is_offline,
    offline_detail,
    requeued_detail,
)


class SweepKind(StrEnum):
    """What the sweeper does to one task."""

    REQUEUE = "requeue"
    DEVICE_LOST = "device_lost"
    NOTE_OFFLINE = "note_offline"
    CLEAR_OFFLINE = "clear_offline"
    EXPIRE = "expire"


@dataclass(frozen=True)
class SweepAction:
    """One decision: `kind`, the status the task gets, and its new status detail."""

    kind: SweepKind
    task_id: str
    status: TaskStatus
    status_detail: str
    failure_kind: FailureKind = FailureKind.NONE


def decide(task: Task, now: datetime, settings: TaskSettings) -> SweepAction | None:
    """The sweeper's decision for `task` at database time `now` (its `device_last_seen_at` is the
    device's presence), or None when nothing is due."""
    lease_ran_out = task.lease_expires_at is not None and task.lease_expires_at <= now
    if task.status is TaskStatus.CLAIMED and lease_ran_out:
        return SweepAction(
            SweepKind.REQUEUE,
            task.task_id,
            TaskStatus.QUEUED,
            requeued_detail(task.worker_id, task.claimed_at),
        )
    if task.status is TaskStatus.RUNNING and lease_ran_out:
        return SweepAction(
            SweepKind.DEVICE_LOST,
            task.task_id,
            TaskStatus.FAILED,
            device_lost_detail(task.device_id, task.heartbeat_at or task.started_at),
            FailureKind.DEVICE_LOST,
        )
    if task.status is not TaskStatus.QUEUED:
        return None
    seen = task.device_last_seen_at
    if not is_offline(seen, now, settings.presence_window):
        if task.device_offline:
            return SweepAction(SweepKind.CLEAR_OFFLINE, task.task_id, TaskStatus.QUEUED, "")
        return None
    waited = now - task.created_at
    unseen_since = task.created_at if seen is None else max(task.created_at, seen)
    if now - unseen_since >= settings.queue_expiry:
        return SweepAction(
            SweepKind.EXPIRE, task.task_id, TaskStatus.EXPIRED, expired_detail(task.device_id, waited, seen)
        )
    if not task.device_offline:
        return SweepAction(
            SweepKind.NOTE_OFFLINE, task.task_id, TaskStatus.QUEUED, offline_detail(task.device_id, seen)
        )
    return None
