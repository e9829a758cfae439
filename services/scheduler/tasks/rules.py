"""Pure task rules: which tasks a node may claim, what a `task.requested` payload must hold, what a
finish may say, why a fenced call is refused, and the words of the status details.

One active task per Codex thread, strictly in order: a task is claimable only when it is queued, is
the oldest open (queued, claimed or running) task of its `target_thread_id`, and no task of that
thread is claimed or running. So a thread's second task waits while the first is claimed or
running, and runs once the first is terminal, whatever its outcome. `claimable` states the rule;
the repository's claim statement implements it in SQL (with a partial unique index of one claimed
or running task per thread behind it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from services.scheduler.tasks.model import (
    ACTIVE,
    OPEN,
    TERMINAL,
    FailureKind,
    Task,
    TaskRequest,
    TaskStatus,
    TaskType,
    can_transition,
)
from services.shared.errors import (
    TASK_NOT_FOUND,
    BossError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.shared.identifiers import MAX_ID_LENGTH, id_problem
from services.shared.time import isoformat_utc

MAX_ID_CHARS = MAX_ID_LENGTH
MAX_LEASE_CHARS = 64
MAX_REPLY_CHARS = 100_000
MAX_DETAIL_CHARS = 2_000
MAX_WAIT_SECONDS = 60.0
LEASE_LOST = "LEASE_LOST"

FINISH_STATUSES = frozenset(status for status in TaskStatus if can_transition(TaskStatus.RUNNING, status))
"""What an agent may finish a running task as: completed, failed or timed_out."""

TIMEOUT_KINDS = frozenset({FailureKind.STALLED, FailureKind.TIMED_OUT})
"""The failure kinds of a timed_out task: the agent's stall timeout or turn cap stopped the run."""

_REQUIRED_FIELDS = (
    "task_id",
    "owner_id",
    "project_id",
    "target_project_id",
    "target_thread_id",
    "device_id",
    "codex_folder_ref",
    "codex_thread_ref",
    "request_message_id",
    "instruction_text",
)
_ID_FIELDS = (
    "task_id",
    "owner_id",
    "project_id",
    "target_project_id",
    "target_thread_id",
    "device_id",
    "codex_thread_ref",
    "request_message_id",
    "retry_of_task_id",
    "dispatch_plan_id",
)


# ---- claim order ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueEntry:
    """What the claim rule looks at of a task: its place in the queue (creation order), thread,
    device and status."""

    position: int
    task_id: str
    target_thread_id: str
    device_id: str
    status: TaskStatus


def claimable(entries: Iterable[QueueEntry], device_id: str) -> list[QueueEntry]:
    """The tasks of `device_id` claimable now, in claim order (oldest first): queued tasks that are
    the oldest open task of their thread. A thread with a claimed or running task has none."""
    ordered = sorted(entries, key=lambda e: e.position)
    busy = {e.target_thread_id for e in ordered if e.status in ACTIVE}
    first_open: dict[str, QueueEntry] = {}
    for entry in ordered:
        if entry.status in OPEN and entry.target_thread_id not in first_open:
            first_open[entry.target_thread_id] = entry
    return [
        entry
        for entry in first_open.values()
        if entry.status is TaskStatus.QUEUED
        and entry.device_id == device_id
        and entry.target_thread_id not in busy
    ]


def handed_to_waiting_claims(
    created: Iterable[Task], open_threads: set[str], waiting: Mapping[tuple[str, str], int]
) -> list[Task]:
    """Of the tasks an enqueue creates (in creation order), those it hands straight to a claim
    waiting on their node (`TaskHandlers.claim`), in order: queued tasks whose thread has no open
    task stored (`open_threads`: the threads with a queued, claimed or running task before this
    enqueue) and no earlier task in `created`, at most `waiting[(owner_id, device_id)]` per owner's
    node. Such a task is what a claim of its node would take first among its thread's tasks, so
    handing it over keeps every thread's order; the others stay queued for the claims to come."""
    taken_threads: set[str] = set()
    left = dict(waiting)
    handed: list[Task] = []
    for task in created:
        if task.status is not TaskStatus.QUEUED:
            continue  # created failed or cancelled: it holds no thread
        thread = task.target_thread_id
        first_of_thread = thread not in open_threads and thread not in taken_threads
        taken_threads.add(thread)
        device = (task.owner_id, task.device_id)
        if not first_of_thread or left.get(device, 0) <= 0:
            continue
        left[device] -= 1
        handed.append(task)
    return handed


def claimed_by(task: Task, worker_id: str, lease_id: str, now: datetime, claim_lease: timedelta) -> Task:
    """`task` (queued) as a claim of `worker_id` under `lease_id` leaves it at database time `now`:
    claimed, attempt + 1, the claim lease running out `claim_lease` after `now`, its status detail
    and offline flag cleared (what the repository's claim statement writes)."""
    return replace(
        task,
        status=TaskStatus.CLAIMED,
        lease_id=lease_id,
        attempt=task.attempt + 1,
        worker_id=worker_id,
        claimed_at=now,
        lease_expires_at=now + claim_lease,
        updated_at=now,
        status_detail="",
        device_offline=False,
    )


def started(task: Task, now: datetime, run_lease: timedelta) -> Task:
    """`task` (claimed) as its start leaves it at database time `now`: running, the run lease
    running out `run_lease` after `now` (what the repository's start statement writes)."""
    return replace(
        task, status=TaskStatus.RUNNING, started_at=now, lease_expires_at=now + run_lease, updated_at=now
    )


# ---- task requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RejectedRequest:
    """A `task.requested` payload that names its task but cannot run: the task is stored failed
    (kind other) with `detail`, so the conversation still ends in a system message."""

    task_id: str
    owner_id: str
    project_id: str
    target_project_id: str
    target_thread_id: str
    device_id: str
    request_message_id: str
    detail: str


def parse_task_request(payload: Mapping[str, Any]) -> TaskRequest | RejectedRequest | None:
    """The request in a `task.requested` payload (see services/scheduler/README.md for its keys).

    Returns a TaskRequest when every required field is present (non-empty strings, ids at most
    200 characters, no NUL characters anywhere: PostgreSQL text cannot store them, task_type
    conversation_reply or dispatch_execution, dispatch_execution with its dispatch_plan_id; a
    dispatch_execution may have no codex_thread_ref: a group's relay target, for which the local
    agent starts a new Codex thread in codex_folder_ref); a RejectedRequest naming what is missing
    or wrong otherwise (its fields only those that can be stored); None when there is no usable
    task_id (nothing can be stored)."""

    def text(name: str) -> str:
        value = payload.get(name)
        return value.strip() if isinstance(value, str) and name != "instruction_text" else str(value or "")

    values = {name: text(name) for name in (*_REQUIRED_FIELDS, "task_type", "retry_of_task_id")}
    values["dispatch_plan_id"] = text("dispatch_plan_id")
    task_id = values["task_id"]
    if _id_violation("task_id", task_id, MAX_ID_CHARS) is not None:
        return None
    relay = values["task_type"] == TaskType.DISPATCH_EXECUTION.value
    problems = [
        f"no {name}"
        for name in _REQUIRED_FIELDS
        if not values[name].strip() and not (relay and name == "codex_thread_ref")
    ]
    problems += [
        f"{name} longer than {MAX_ID_CHARS} characters"
        for name in _ID_FIELDS
        if len(values[name]) > MAX_ID_CHARS
    ]
    problems += [f"{name} contains a NUL character" for name, value in values.items() if "\x00" in value]
    try:
        task_type = TaskType(values["task_type"])
    except ValueError:
        task_type = None
        shown = values["task_type"][:40].replace("\x00", "")
        problems.append(f"unknown task_type {shown!r}")
    if task_type is TaskType.DISPATCH_EXECUTION and not values["dispatch_plan_id"]:
        problems.append("no dispatch_plan_id")
    if problems or task_type is None:
        fitting = {
            name: (value if len(value) <= MAX_ID_CHARS and "\x00" not in value else "")
            for name, value in values.items()
        }
        return RejectedRequest(
            task_id=task_id,
            owner_id=fitting["owner_id"],
            project_id=fitting["project_id"],
            target_project_id=fitting["target_project_id"],
            target_thread_id=fitting["target_thread_id"],
            device_id=fitting["device_id"],
            request_message_id=fitting["request_message_id"],
            detail=f"the task request could not run: {', '.join(problems)}",
        )
    return TaskRequest(
        task_id=task_id,
        owner_id=values["owner_id"],
        task_type=task_type,
        project_id=values["project_id"],
        target_project_id=values["target_project_id"],
        target_thread_id=values["target_thread_id"],
        device_id=values["device_id"],
        codex_folder_ref=values["codex_folder_ref"],
        codex_thread_ref=values["codex_thread_ref"],
        request_message_id=values["request_message_id"],
        instruction_text=values["instruction_text"],
        retry_of_task_id=values["retry_of_task_id"],
        dispatch_plan_id=values["dispatch_plan_id"],
    )


# ---- calls from the local agent --------------------------------------------------------------------


def check_wait(wait_seconds: float) -> float:
    """The ClaimTask wait in seconds (0-60). Raises InvalidArgument naming `wait_seconds`."""
    if not 0 <= wait_seconds <= MAX_WAIT_SECONDS:
        raise InvalidArgument([FieldViolation("wait_seconds", "must be from 0 to 60 seconds")])
    return wait_seconds


def _id_violation(name: str, value: str, limit: int) -> FieldViolation | None:
    """Why `value` cannot be the id named `name` (`id_problem`: empty, over `limit` characters, or
    holding a control character, which PostgreSQL text cannot store if NUL, or a bidirectional
    formatting one), or None. The value itself is never echoed."""
    problem = id_problem(value, limit)
    return FieldViolation(name, problem) if problem is not None else None


def check_task_id(task_id: str) -> None:
    """Raises InvalidArgument naming `task_id` when it cannot be a task's id."""
    violation = _id_violation("task_id", task_id, MAX_ID_CHARS)
    if violation is not None:
        raise InvalidArgument([violation])


def check_agent(worker_id: str, node_id: str) -> None:
    """Raises InvalidArgument naming `worker_id` / `node_id` when either cannot be an agent's id
    (`_id_violation`), before a token check would quote it."""
    found = (
        _id_violation("worker_id", worker_id, MAX_ID_CHARS),
        _id_violation("node_id", node_id, MAX_ID_CHARS),
    )
    violations = [violation for violation in found if violation is not None]
    if violations:
        raise InvalidArgument(violations)


def check_lease_call(task_id: str, lease_id: str) -> None:
    """Raises InvalidArgument naming `task_id` / `lease_id` when either cannot be a task's id or a
    lease's (`_id_violation`; at most 200 and 64 characters)."""
    found = (
        _id_violation("task_id", task_id, MAX_ID_CHARS),
        _id_violation("lease_id", lease_id, MAX_LEASE_CHARS),
    )
    violations = [violation for violation in found if violation is not None]
    if violations:
        raise InvalidArgument(violations)


@dataclass(frozen=True)
class FinishOutcome:
    """How an agent finished a task: completed with `reply_text`, or failed / timed_out with
    `failure_kind` and `status_detail`."""

    status: TaskStatus
    reply_text: str = ""
    failure_kind: FailureKind = FailureKind.NONE
    status_detail: str = ""
    codex_session_id: str = ""


def check_finish(outcome: FinishOutcome) -> FinishOutcome:
    """Returns `outcome` when it is a valid finish; raises InvalidArgument naming every bad field:
    `status` not completed, failed or timed_out; completed without `reply_text` (1-100,000
    characters) or with a `failure_kind`; failed or timed_out with a `reply_text`, without a
    `failure_kind` or with `device_lost` (the scheduler's own verdict); timed_out with a kind other
    than stalled or timed_out; `status_detail` over 2,000 characters; `codex_session_id` over 200;
    any of the three texts holding a NUL (PostgreSQL text cannot store it)."""
    violations: list[FieldViolation] = []
    if outcome.status not in FINISH_STATUSES:
        violations.append(FieldViolation("status", "must be completed, failed or timed_out"))
    elif outcome.status is TaskStatus.COMPLETED:
        if not outcome.reply_text:
            violations.append(FieldViolation("reply_text", "required when completed"))
        if outcome.failure_kind is not FailureKind.NONE:
            violations.append(FieldViolation("failure_kind", "must be unset when completed"))
    else:
        if outcome.reply_text:
            violations.append(FieldViolation("reply_text", f"only for completed, not {outcome.status.value}"))
        if outcome.failure_kind is FailureKind.NONE:
            violations.append(FieldViolation("failure_kind", f"required when {outcome.status.value}"))
        elif outcome.failure_kind is FailureKind.DEVICE_LOST:
            violations.append(FieldViolation("failure_kind", "device_lost is set by the scheduler only"))
        elif outcome.status is TaskStatus.TIMED_OUT and outcome.failure_kind not in TIMEOUT_KINDS:
            violations.append(FieldViolation("failure_kind", "must be stalled or timed_out when timed_out"))
    limits = (
        ("reply_text", outcome.reply_text, MAX_REPLY_CHARS),
        ("status_detail", outcome.status_detail, MAX_DETAIL_CHARS),
        ("codex_session_id", outcome.codex_session_id, MAX_ID_CHARS),
    )
    for name, value, limit in limits:
        if len(value) > limit:
            violations.append(FieldViolation(name, f"at most {limit:,} characters"))
        elif "\x00" in value:
            violations.append(FieldViolation(name, "must not contain NUL characters"))
    if violations:
        raise InvalidArgument(violations)
    return outcome


def is_same_outcome(task: Task, outcome: FinishOutcome) -> bool:
    """True when a finished task already holds `outcome` (a repeated FinishTask)."""
    return (
        task.status is outcome.status
        and task.failure_kind is outcome.failure_kind
        and task.reply_text == outcome.reply_text
    )


def refusal(
    task: Task | None, task_id: str, node_id: str, worker_id: str, expected: TaskStatus, owner_id: str
) -> BossError:
    """The error for a fenced call (start, heartbeat, finish) of `worker_id` on `node_id`, enrolled
    for `owner_id`, whose update matched nothing: NotFound (TASK_NOT_FOUND) for an unknown task or
    another owner's (the same answer: nothing of another owner's task is told), PermissionDenied
    (NODE_MISMATCH) for another node's, otherwise FailedPrecondition (LEASE_LOST): the lease is
    not the task's current one or another worker holds it, or the task is no longer `expected`."""
    if task is None or task.owner_id != owner_id:
        return NotFound(f"task {task_id} not found", reason=TASK_NOT_FOUND)
    if task.device_id != node_id:
        return PermissionDenied(
            f"task {task_id} runs on another node, not {node_id!r}", reason="NODE_MISMATCH"
        )
    if task.status in TERMINAL:
        state = f"it is {task.status.value} already"
    elif task.worker_id != worker_id:
        state = "another worker holds it"
    elif task.status is expected:
        state = "another claim holds it now"
    else:
        state = f"it is {task.status.value}, not {expected.value}"
    return FailedPrecondition(f"the lease on task {task_id} is no longer valid: {state}", reason=LEASE_LOST)


# ---- device presence and words -------------------------------------------------------------------


def is_offline(last_seen_at: datetime | None, now: datetime, window: timedelta) -> bool:
    """True when a device's local agent was never seen, or not within `window` of `now`."""
    return last_seen_at is None or now - last_seen_at >= window


def span_in_words(span: timedelta) -> str:
    """A span for people: "45 s", "15 min", "2 h 5 min", "3 d 4 h" (rounded down)."""
    seconds = max(0, int(span.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86_400
    if hours == 0:
        return f"{minutes} min"
    if days == 0:
        rest = minutes % 60
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    rest = hours % 24
    return f"{days} d {rest} h" if rest else f"{days} d"


def offline_detail(device_id: str, last_seen_at: datetime | None) -> str:
    """What a queued task says while its device is offline."""
    if last_seen_at is None:
        return f"device {device_id} has not connected yet"
    return f"device {device_id} last seen at {isoformat_utc(last_seen_at)}"


def expired_detail(device_id: str, waited: timedelta, last_seen_at: datetime | None) -> str:
    """What an expired task says: how long it waited and when its device was last seen."""
    seen = (
        "has not connected yet" if last_seen_at is None else f"was last seen at {isoformat_utc(last_seen_at)}"
    )
    return f"expired after waiting {span_in_words(waited)} in the queue: device {device_id} {seen}"


def device_lost_detail(device_id: str, last_sign_of_life: datetime | None) -> str:
    """What a running task failed with `device_lost` says: when its device last answered (its last
    heartbeat, or the start)."""
    when = isoformat_utc(last_sign_of_life) if last_sign_of_life is not None else "an unknown time"
    return f"the device {device_id} stopped answering at {when}"


CANCELLED_DETAIL = "cancelled by its owner before it ran"
CANCEL_TOO_LATE_DETAIL = "a cancel came after Codex had started this message; it runs to its end"


def requeued_detail(worker_id: str, claimed_at: datetime | None) -> str:
    """What a claimed task sent back to the queue says (its claim's lease ran out, never started)."""
    when = f" at {isoformat_utc(claimed_at)}" if claimed_at is not None else ""
    return f"worker {worker_id} claimed it{when} but did not start it in time; queued again"


def released_detail(worker_id: str) -> str:
    """What a task says when the claim that started it never reached its agent (the agent's call
    was cancelled, e.g. as its worker stopped): it goes back to the queue, never run."""
    return f"worker {worker_id} went away before it received this task; queued again"


# ---- new tasks -----------------------------------------------------------------------------------


def new_task(
    request: TaskRequest | RejectedRequest,
    now: datetime,
    device_last_seen_at: datetime | None,
    presence_window: timedelta,
) -> Task:
    """The task a request creates at database time `now`: queued (saying so when its device is
    offline already: `offline_detail`), or, for a rejected request, failed (kind other) with the
    rejection's detail, so the conversation still gets its system message."""
    if isinstance(request, RejectedRequest):
        return Task(
            task_id=request.task_id,
            task_type=TaskType.CONVERSATION_REPLY,
            status=TaskStatus.FAILED,
            owner_id=request.owner_id,
            project_id=request.project_id,
            target_project_id=request.target_project_id,
            target_thread_id=request.target_thread_id,
            device_id=request.device_id,
            codex_folder_ref="",
            codex_thread_ref="",
            request_message_id=request.request_message_id,
            instruction_text="",
            dispatch_plan_id="",
            retry_of_task_id="",
            attempt=0,
            worker_id="",
            lease_id="",
            created_at=now,
            updated_at=now,
            finished_at=now,
            failure_kind=FailureKind.OTHER,
            status_detail=request.detail,
            device_last_seen_at=device_last_seen_at,
        )
    offline = is_offline(device_last_seen_at, now, presence_window)
    return Task(
        task_id=request.task_id,
        task_type=request.task_type,
        status=TaskStatus.QUEUED,
        owner_id=request.owner_id,
        project_id=request.project_id,
        target_project_id=request.target_project_id,
        target_thread_id=request.target_thread_id,
        device_id=request.device_id,
        codex_folder_ref=request.codex_folder_ref,
        codex_thread_ref=request.codex_thread_ref,
        request_message_id=request.request_message_id,
        instruction_text=request.instruction_text,
        dispatch_plan_id=request.dispatch_plan_id,
        retry_of_task_id=request.retry_of_task_id,
        attempt=0,
        worker_id="",
        lease_id="",
        created_at=now,
        updated_at=now,
        status_detail=offline_detail(request.device_id, device_last_seen_at) if offline else "",
        device_offline=offline,
        device_last_seen_at=device_last_seen_at,
    )


def parse_cancel_request(payload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(task_id, owner_id) of a `task.cancel_requested` payload, or None when either is missing."""
    task_id = payload.get("task_id")
    owner_id = payload.get("owner_id")
    if not isinstance(task_id, str) or not task_id or not isinstance(owner_id, str) or not owner_id:
        return None
    return task_id, owner_id


def cancelled_at_once(task: Task, cancels: Mapping[str, str]) -> Task:
    """A task being created whose owner's cancel came in the same batch: cancelled at creation
    (never claimable); any other task unchanged."""
    if cancels.get(task.task_id) != task.owner_id or task.status is not TaskStatus.QUEUED:
        return task
    return replace(
        task,
        status=TaskStatus.CANCELLED,
        status_detail=CANCELLED_DETAIL,
        device_offline=False,
        finished_at=task.created_at,
    )


def status_changed_payload(task: Task) -> dict[str, Any]:
    """The `task.status_changed` payload: the proto's Task with its field names as keys, enums as
    lower-case suffixes ("" when unspecified), instants as RFC 3339 UTC text ending in Z or None.
    The lease id is never in it (it is the holder's fencing token)."""
    return {
        "task_id": task.task_id,
        "task_type": task.task_type.value,
        "status": task.status.value,
        "owner_id": task.owner_id,
        "project_id": task.project_id,
        "target_project_id": task.target_project_id,
        "target_thread_id": task.target_thread_id,
        "device_id": task.device_id,
        "codex_folder_ref": task.codex_folder_ref,
        "codex_thread_ref": task.codex_thread_ref,
        "request_message_id": task.request_message_id,
        "instruction_text": task.instruction_text,
        "dispatch_plan_id": task.dispatch_plan_id,
        "retry_of_task_id": task.retry_of_task_id,
        "attempt": task.attempt,
        "worker_id": task.worker_id,
        "created_at": isoformat_utc(task.created_at),
        "claimed_at": isoformat_utc(task.claimed_at),
        "started_at": isoformat_utc(task.started_at),
        "finished_at": isoformat_utc(task.finished_at),
        "lease_expires_at": isoformat_utc(task.lease_expires_at),
        "heartbeat_at": isoformat_utc(task.heartbeat_at),
        "reply_text": task.reply_text,
        "failure_kind": task.failure_kind.value,
        "status_detail": task.status_detail,
        "device_last_seen_at": isoformat_utc(task.device_last_seen_at),
        "codex_session_id": task.codex_session_id,
        "updated_at": isoformat_utc(task.updated_at),
    }
