"""Task rules without I/O: the state machine, the per-thread claim order, task requests, finish
outcomes, refusals of fenced calls, new tasks and the `task.status_changed` payload."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from boss.scheduler.v1 import scheduler_pb2

from services.scheduler.tasks.model import (
    TERMINAL,
    FailureKind,
    Task,
    TaskStatus,
    TaskType,
    can_transition,
    check_transition,
)
from services.scheduler.tasks.rules import (
    FinishOutcome,
    QueueEntry,
    RejectedRequest,
    check_finish,
    check_lease_call,
    check_task_id,
    check_wait,
    claimable,
    is_same_outcome,
    new_task,
    parse_task_request,
    refusal,
    span_in_words,
    status_changed_payload,
)
from services.shared.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied

S = TaskStatus
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=90)


def request_payload(**overrides: object) -> dict[str, object]:
    """A complete `task.requested` payload."""
    payload: dict[str, object] = {
        "owner_id": "owner-1",
        "task_id": "task-1",
        "task_type": "conversation_reply",
        "project_id": "project-1",
        "target_project_id": "project-1",
        "target_thread_id": "thread-1",
        "device_id": "mac-01",
        "codex_folder_ref": "/Users/dev/repo",
        "codex_thread_ref": "0199a1b2-c3d4",
        "request_message_id": "message-1",
        "instruction_text": "  run the tests\n",
        "retry_of_task_id": "",
        "dispatch_plan_id": "",
    }
    payload.update(overrides)
    return payload


def queued_task(**overrides: object) -> Task:
    """A queued task created at NOW."""
    request = parse_task_request(request_payload())
    assert request is not None and not isinstance(request, RejectedRequest)
    return replace(new_task(request, NOW, NOW, WINDOW), **overrides)  # type: ignore[arg-type]


def test_the_state_machine_allows_exactly_the_documented_transitions() -> None:
    allowed = {(current, target) for current in S for target in S if can_transition(current, target)}
    assert allowed == {
        (S.QUEUED, S.CLAIMED),
        (S.QUEUED, S.EXPIRED),
        (S.QUEUED, S.CANCELLED),
        (S.CLAIMED, S.RUNNING),
        (S.CLAIMED, S.QUEUED),
        (S.CLAIMED, S.CANCELLED),
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.TIMED_OUT),
    }
    assert not any(can_transition(terminal, target) for terminal in TERMINAL for target in S)
    with pytest.raises(FailedPrecondition, match="task t1 is running; it cannot become queued") as caught:
        check_transition("t1", S.RUNNING, S.QUEUED)
    assert caught.value.reason == "ILLEGAL_TASK_TRANSITION"


def test_statuses_and_kinds_are_the_proto_enums_suffixes() -> None:
    assert {f"TASK_STATUS_{s.value.upper()}" for s in S} == set(scheduler_pb2.TaskStatus.keys()) - {
        "TASK_STATUS_UNSPECIFIED"
    }
    assert {f"FAILURE_KIND_{k.value.upper()}" for k in FailureKind if k.value} == set(
        scheduler_pb2.FailureKind.keys()
    ) - {"FAILURE_KIND_UNSPECIFIED"}
    assert {f"TASK_TYPE_{t.value.upper()}" for t in TaskType} == set(scheduler_pb2.TaskType.keys()) - {
        "TASK_TYPE_UNSPECIFIED"
    }


def entry(position: int, thread: str, status: TaskStatus, device: str = "n1") -> QueueEntry:
    return QueueEntry(position, f"task-{position}", thread, device, status)


def test_a_thread_runs_its_tasks_one_at_a_time_oldest_first() -> None:
    entries = [
        entry(1, "a", S.QUEUED),
        entry(2, "a", S.QUEUED),
        entry(3, "b", S.QUEUED),
        entry(4, "c", S.RUNNING),
        entry(5, "c", S.QUEUED),
        entry(6, "d", S.QUEUED, device="n2"),
    ]
    assert [e.task_id for e in claimable(entries, "n1")] == ["task-1", "task-3"]
    assert [e.task_id for e in claimable(entries, "n2")] == ["task-6"]


def test_a_finished_or_failed_task_does_not_block_the_next_of_its_thread() -> None:
    for status in TERMINAL:
        entries = [entry(1, "a", status), entry(2, "a", S.QUEUED), entry(3, "a", S.QUEUED)]
        assert [e.task_id for e in claimable(entries, "n1")] == ["task-2"]


def test_an_open_task_on_another_node_still_holds_the_thread() -> None:
    entries = [entry(1, "a", S.QUEUED, device="n2"), entry(2, "a", S.QUEUED, device="n1")]
    assert claimable(entries, "n1") == []
    entries = [entry(1, "a", S.QUEUED), entry(2, "a", S.CLAIMED)]
    assert claimable(entries, "n1") == []


def test_a_complete_request_becomes_a_task_request() -> None:
    request = parse_task_request(request_payload(task_id=" task-1 "))
    assert request is not None and not isinstance(request, RejectedRequest)
    assert request.task_id == "task-1" and request.task_type is TaskType.CONVERSATION_REPLY
    assert request.instruction_text == "  run the tests\n"
    assert (request.device_id, request.codex_thread_ref) == ("mac-01", "0199a1b2-c3d4")


def test_an_incomplete_request_is_rejected_naming_what_is_missing() -> None:
    rejected = parse_task_request(
        request_payload(device_id="", codex_thread_ref=None, instruction_text="   ", task_type="chat")
    )
    assert isinstance(rejected, RejectedRequest) and rejected.task_id == "task-1"
    assert rejected.detail == (
        "the task request could not run: no device_id, no codex_thread_ref, no instruction_text, "
        "unknown task_type 'chat'"
    )
    dispatch = parse_task_request(request_payload(task_type="dispatch_execution"))
    assert isinstance(dispatch, RejectedRequest) and dispatch.detail.endswith("no dispatch_plan_id")
    long_id = parse_task_request(request_payload(target_thread_id="t" * 201))
    assert isinstance(long_id, RejectedRequest) and long_id.target_thread_id == ""
    assert long_id.detail == "the task request could not run: target_thread_id longer than 200 characters"
    assert parse_task_request(request_payload(task_id="")) is None
    assert parse_task_request(request_payload(task_id="x" * 201)) is None


def test_a_dispatch_request_without_a_codex_thread_ref_is_a_relay_that_starts_a_new_thread() -> None:
    relay = parse_task_request(
        request_payload(task_type="dispatch_execution", dispatch_plan_id="plan-1", codex_thread_ref="")
    )
    assert relay is not None and not isinstance(relay, RejectedRequest)
    assert relay.task_type is TaskType.DISPATCH_EXECUTION
    assert (relay.codex_thread_ref, relay.codex_folder_ref) == ("", "/Users/dev/repo")
    assert relay.dispatch_plan_id == "plan-1"
    reply = parse_task_request(request_payload(codex_thread_ref=""))
    assert isinstance(reply, RejectedRequest) and reply.detail.endswith("no codex_thread_ref")


def test_a_new_task_is_queued_and_says_when_its_device_is_offline() -> None:
    request = parse_task_request(request_payload())
    assert request is not None
    online = new_task(request, NOW, NOW - timedelta(seconds=10), WINDOW)
    assert online.status is S.QUEUED and online.status_detail == "" and not online.device_offline
    stale = new_task(request, NOW, datetime(2026, 12, 1, 8, 0, tzinfo=UTC), WINDOW)
    assert stale.device_offline and stale.status_detail == "device mac-01 last seen at 2026-12-01T08:00:00Z"
    never = new_task(request, NOW, None, WINDOW)
    assert never.status_detail == "device mac-01 has not connected yet"
    rejected = parse_task_request(request_payload(device_id=""))
    assert rejected is not None
    failed = new_task(rejected, NOW, None, WINDOW)
    assert failed.status is S.FAILED and failed.failure_kind is FailureKind.OTHER
    assert (
        failed.finished_at == NOW and failed.status_detail == "the task request could not run: no device_id"
    )


@pytest.mark.parametrize(
    ("outcome", "fields"),
    [
        (FinishOutcome(S.COMPLETED), ["reply_text"]),
        (FinishOutcome(S.COMPLETED, "x" * 100_001), ["reply_text"]),
        (FinishOutcome(S.COMPLETED, "ok", FailureKind.OTHER), ["failure_kind"]),
        (FinishOutcome(S.FAILED), ["failure_kind"]),
        (FinishOutcome(S.FAILED, "partial", FailureKind.MODEL_ERROR), ["reply_text"]),
        (FinishOutcome(S.FAILED, failure_kind=FailureKind.DEVICE_LOST), ["failure_kind"]),
        (FinishOutcome(S.TIMED_OUT, failure_kind=FailureKind.NO_REPLY), ["failure_kind"]),
        (
            FinishOutcome(S.FAILED, failure_kind=FailureKind.OTHER, status_detail="d" * 2_001),
            ["status_detail"],
        ),
        (FinishOutcome(S.EXPIRED), ["status"]),
        (FinishOutcome(S.COMPLETED, "ok", codex_session_id="s" * 201), ["codex_session_id"]),
    ],
)
def test_a_bad_finish_names_each_bad_field(outcome: FinishOutcome, fields: list[str]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_finish(outcome)
    assert [v.field for v in caught.value.violations] == fields


def test_good_finishes_pass_and_a_repeat_is_recognised() -> None:
    done = FinishOutcome(S.COMPLETED, "x" * 100_000)
    stalled = FinishOutcome(S.TIMED_OUT, failure_kind=FailureKind.STALLED, status_detail="d" * 2_000)
    assert check_finish(done) is done and check_finish(stalled) is stalled
    task = queued_task(status=S.COMPLETED, reply_text="x" * 100_000)
    assert is_same_outcome(task, done) and not is_same_outcome(task, FinishOutcome(S.COMPLETED, "other"))
    assert not is_same_outcome(task, stalled)


def test_wait_is_from_zero_to_sixty_seconds() -> None:
    assert check_wait(0) == 0 and check_wait(60) == 60
    for bad in (-1, 60.5):
        with pytest.raises(InvalidArgument) as caught:
            check_wait(bad)
        assert [v.field for v in caught.value.violations] == ["wait_seconds"]


def test_a_refused_fenced_call_says_why() -> None:
    owner = queued_task().owner_id
    assert isinstance(refusal(None, "t1", "mac-01", "w1", S.CLAIMED, owner), NotFound)
    task = queued_task(status=S.CLAIMED, worker_id="w1")
    other_node = refusal(task, "task-1", "mac-02", "w1", S.CLAIMED, owner)
    assert isinstance(other_node, PermissionDenied) and other_node.reason == "NODE_MISMATCH"
    lost = refusal(task, "task-1", "mac-01", "w1", S.CLAIMED, owner)
    assert isinstance(lost, FailedPrecondition) and lost.reason == "LEASE_LOST"
    assert lost.message == "the lease on task task-1 is no longer valid: another claim holds it now"
    assert refusal(task, "task-1", "mac-01", "w1", S.RUNNING, owner).message.endswith(
        "it is claimed, not running"
    )
    other_worker = refusal(task, "task-1", "mac-01", "w2", S.CLAIMED, owner)
    assert other_worker.reason == "LEASE_LOST" and other_worker.message.endswith("another worker holds it")
    done = replace(task, status=S.FAILED)
    other_owner = refusal(task, "task-1", "mac-01", "w1", S.CLAIMED, "someone-else")
    assert isinstance(other_owner, NotFound) and other_owner.message == "task task-1 not found"
    assert refusal(done, "task-1", "mac-01", "w1", S.RUNNING, owner).message.endswith("it is failed already")


@pytest.mark.parametrize(
    ("task_id", "lease_id", "fields"),
    [
        ("", "", ["task_id", "lease_id"]),
        ("t" * 201, "lease", ["task_id"]),
        ("task-1", "l" * 65, ["lease_id"]),
        ("task\x00", "lease", ["task_id"]),
        ("task-1", "lease\x00", ["lease_id"]),
    ],
)
def test_ids_a_task_or_lease_cannot_have_are_refused(task_id: str, lease_id: str, fields: list[str]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_lease_call(task_id, lease_id)
    assert [v.field for v in caught.value.violations] == fields
    assert all(task_id not in v.description or not task_id for v in caught.value.violations)
    check_lease_call("t" * 200, "l" * 64)
    check_task_id("t" * 200)
    with pytest.raises(InvalidArgument):
        check_task_id("t\x00")


def test_nul_characters_are_refused_in_finishes_and_requests() -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_finish(FinishOutcome(S.COMPLETED, "a\x00b", codex_session_id="s\x00"))
    assert [v.field for v in caught.value.violations] == ["reply_text", "codex_session_id"]
    rejected = parse_task_request(request_payload(instruction_text="run \x00 it", device_id="mac\x00"))
    assert isinstance(rejected, RejectedRequest) and rejected.device_id == ""
    assert rejected.detail == (
        "the task request could not run: device_id contains a NUL character, "
        "instruction_text contains a NUL character"
    )
    assert parse_task_request(request_payload(task_id="task\x00")) is None
    odd_type = parse_task_request(request_payload(task_type="x\x00" + "y" * 100))
    assert isinstance(odd_type, RejectedRequest) and "\x00" not in odd_type.detail
    assert len(odd_type.detail) < 200


def test_spans_in_words() -> None:
    cases = {0: "0 s", 59: "59 s", 60: "1 min", 900: "15 min", 3600: "1 h", 7500: "2 h 5 min", 86_400: "1 d"}
    cases[90_000] = "1 d 1 h"
    assert {seconds: span_in_words(timedelta(seconds=seconds)) for seconds in cases} == cases


def test_the_status_changed_payload_is_the_proto_task_by_field_name() -> None:
    task = queued_task(
        status=S.FAILED,
        attempt=2,
        worker_id="w1",
        lease_id="secret-lease",
        claimed_at=NOW + timedelta(seconds=1),
        started_at=NOW + timedelta(seconds=2, microseconds=500),
        finished_at=NOW + timedelta(seconds=3),
        failure_kind=FailureKind.DEVICE_LOST,
        status_detail="the device mac-01 stopped answering at 2026-12-01T09:00:02.000500Z",
    )
    payload = status_changed_payload(task)
    assert set(payload) == set(scheduler_pb2.Task.DESCRIPTOR.fields_by_name)
    assert payload["status"] == "failed" and payload["failure_kind"] == "device_lost"
    assert payload["task_type"] == "conversation_reply" and payload["attempt"] == 2
    assert payload["created_at"] == "2026-12-01T09:00:00Z"
    assert payload["started_at"] == "2026-12-01T09:00:02.000500Z"
    assert payload["lease_expires_at"] is None and payload["heartbeat_at"] is None
    assert payload["device_last_seen_at"] == "2026-12-01T09:00:00Z"
    assert "secret-lease" not in payload.values()
    assert status_changed_payload(queued_task())["failure_kind"] == ""
