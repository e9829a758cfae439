"""Sweeper decisions as a pure function of a task, its device's presence and the database time."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from services.scheduler.tasks.model import FailureKind, Task, TaskSettings, TaskStatus, TaskType
from services.scheduler.tasks.sweep import SweepAction, SweepKind, decide

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SETTINGS = TaskSettings(presence_window=timedelta(seconds=90), queue_expiry=timedelta(seconds=900))


def task(status: TaskStatus, **overrides: object) -> Task:
    """A task of mac-01 created ten minutes before NOW."""
    base = Task(
        task_id="task-1",
        task_type=TaskType.CONVERSATION_REPLY,
        status=status,
        owner_id="owner-1",
        project_id="project-1",
        target_project_id="project-1",
        target_thread_id="thread-1",
        device_id="mac-01",
        codex_folder_ref="/repo",
        codex_thread_ref="0199",
        request_message_id="message-1",
        instruction_text="hello",
        dispatch_plan_id="",
        retry_of_task_id="",
        attempt=1,
        worker_id="w1",
        lease_id="lease-1",
        created_at=NOW - timedelta(minutes=10),
        updated_at=NOW - timedelta(minutes=10),
        device_last_seen_at=NOW - timedelta(seconds=5),
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def test_a_claim_whose_lease_ran_out_goes_back_to_the_queue() -> None:
    claimed_at = NOW - timedelta(seconds=31)
    claimed = task(TaskStatus.CLAIMED, claimed_at=claimed_at, lease_expires_at=NOW - timedelta(seconds=1))
    assert decide(claimed, NOW, SETTINGS) == SweepAction(
        SweepKind.REQUEUE,
        "task-1",
        TaskStatus.QUEUED,
        "worker w1 claimed it at 2026-12-01T09:59:29Z but did not start it in time; queued again",
    )
    assert decide(replace(claimed, lease_expires_at=NOW + timedelta(seconds=1)), NOW, SETTINGS) is None


def test_a_run_whose_lease_ran_out_fails_device_lost_at_its_last_heartbeat_or_start() -> None:
    started = NOW - timedelta(seconds=100)
    beat = NOW - timedelta(seconds=40)
    running = task(TaskStatus.RUNNING, started_at=started, heartbeat_at=beat, lease_expires_at=NOW)
    assert decide(running, NOW, SETTINGS) == SweepAction(
        SweepKind.DEVICE_LOST,
        "task-1",
        TaskStatus.FAILED,
        "the device mac-01 stopped answering at 2026-12-01T09:59:20Z",
        FailureKind.DEVICE_LOST,
    )
    never_beat = decide(replace(running, heartbeat_at=None), NOW, SETTINGS)
    assert never_beat is not None
    assert never_beat.status_detail == "the device mac-01 stopped answering at 2026-12-01T09:58:20Z"
    assert decide(replace(running, lease_expires_at=NOW + timedelta(seconds=1)), NOW, SETTINGS) is None


def test_a_queued_task_of_an_online_device_is_left_alone() -> None:
    assert decide(task(TaskStatus.QUEUED, created_at=NOW - timedelta(hours=5)), NOW, SETTINGS) is None


def test_an_offline_device_is_said_once() -> None:
    seen = NOW - timedelta(seconds=90)
    queued = task(TaskStatus.QUEUED, device_last_seen_at=seen)
    assert decide(queued, NOW, SETTINGS) == SweepAction(
        SweepKind.NOTE_OFFLINE, "task-1", TaskStatus.QUEUED, "device mac-01 last seen at 2026-12-01T09:58:30Z"
    )
    assert decide(replace(queued, device_offline=True), NOW, SETTINGS) is None
    never = decide(task(TaskStatus.QUEUED, device_last_seen_at=None), NOW, SETTINGS)
    assert never is not None and never.status_detail == "device mac-01 has not connected yet"


def test_a_notice_is_cleared_when_the_device_is_back() -> None:
    back = task(TaskStatus.QUEUED, device_offline=True, status_detail="device mac-01 last seen at ...")
    assert decide(back, NOW, SETTINGS) == SweepAction(
        SweepKind.CLEAR_OFFLINE, "task-1", TaskStatus.QUEUED, ""
    )


def test_a_task_expires_once_it_waited_the_expiry_while_its_device_was_not_seen() -> None:
    seen = NOW - timedelta(hours=2)
    queued = task(
        TaskStatus.QUEUED,
        created_at=NOW - timedelta(seconds=900),
        device_last_seen_at=seen,
        device_offline=True,
    )
    assert decide(queued, NOW, SETTINGS) == SweepAction(
        SweepKind.EXPIRE,
        "task-1",
        TaskStatus.EXPIRED,
        "expired after waiting 15 min in the queue: device mac-01 was last seen at 2026-12-01T08:00:00Z",
    )
    never = decide(replace(queued, device_last_seen_at=None, device_offline=False), NOW, SETTINGS)
    assert never is not None and never.kind is SweepKind.EXPIRE
    assert (
        never.status_detail
        == "expired after waiting 15 min in the queue: device mac-01 has not connected yet"
    )
    assert decide(replace(queued, created_at=NOW - timedelta(seconds=899)), NOW, SETTINGS) is None


def test_the_wait_for_expiry_counts_from_when_the_device_was_last_seen() -> None:
    recently_seen = NOW - timedelta(seconds=300)
    long_queued = task(
        TaskStatus.QUEUED,
        created_at=NOW - timedelta(hours=3),
        device_last_seen_at=recently_seen,
        device_offline=True,
    )
    assert decide(long_queued, NOW, SETTINGS) is None
    later = NOW + timedelta(seconds=600)
    expired = decide(long_queued, later, SETTINGS)
    assert expired is not None and expired.kind is SweepKind.EXPIRE
    assert expired.status_detail.startswith("expired after waiting 3 h 10 min in the queue")


def test_terminal_tasks_are_never_swept() -> None:
    for status in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.EXPIRED, TaskStatus.CANCELLED):
        old = task(
            status, device_last_seen_at=None, created_at=NOW - timedelta(days=2), lease_expires_at=None
        )
        assert decide(old, NOW, SETTINGS) is None
