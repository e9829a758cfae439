"""Pure rules of chat: what PostMessage accepts, where a message may be sent, the task projection
driven by the scheduler's status reports, the collaboration gate and the task request payload."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.chat.domain import (
    CHAT_PATH_NOT_AVAILABLE,
    THREAD_ARCHIVED,
    THREAD_METADATA_INCOMPLETE,
    ChatTask,
    ChatThread,
    StatusReport,
    apply_status_report,
    check_after_sequence,
    check_chat_target,
    check_post,
    collaboration_gate,
    missing_metadata,
    new_chat_task,
    parse_status_report,
    task_request_payload,
)
from services.conversations.domain.model import GROUP, MASTER_AGENT, SINGLE_DEVICE
from services.shared.errors import FailedPrecondition, FieldViolation

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
THREAD = ChatThread("th-1", "mac-01", "/Users/dev/north-line", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")


def task(**changes: object) -> ChatTask:
    base = new_chat_task("task-1", "local", "proj-1", THREAD, "msg-1", T0)
    return replace(base, **changes)  # type: ignore[arg-type]


def fields_of(violations: list[FieldViolation]) -> list[str]:
    return [violation.field for violation in violations]


# --- PostMessage fields ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\n\t  \n"])
def test_empty_or_whitespace_text_is_refused(text: str) -> None:
    violations = check_post(text, "c-1")
    assert fields_of(violations) == ["text"]
    assert violations[0].description == "must not be empty or only whitespace"


def test_text_may_hold_100000_characters_and_not_one_more() -> None:
    assert check_post("x" * 100_000, "c-1") == []
    violations = check_post("x" * 100_001, "c-1")
    assert fields_of(violations) == ["text"]
    assert violations[0].description == "must be at most 100,000 characters"


@pytest.mark.parametrize("text", ["\x00", "run\x00the tests", "x" * 99_999 + "\x00"])
def test_text_holding_nul_is_refused(text: str) -> None:
    violations = check_post(text, "c-1")
    assert [(v.field, v.description) for v in violations] == [("text", "must not contain NUL characters")]


@pytest.mark.parametrize("client_message_id", ["a", "A-z_0.9:x", "2026-12-01T10:00:00.123Z", "c" * 200])
def test_client_message_ids_of_the_allowed_characters_pass(client_message_id: str) -> None:
    assert check_post("hello", client_message_id) == []


@pytest.mark.parametrize("client_message_id", ["has space", "slash/no", "ünï", "c" * 201, "tab\t"])
def test_other_client_message_ids_are_refused(client_message_id: str) -> None:
    assert fields_of(check_post("hello", client_message_id)) == ["client_message_id"]


def test_a_missing_client_message_id_and_bad_text_are_reported_together() -> None:
    violations = check_post("  ", "")
    assert [(v.field, v.description) for v in violations] == [
        ("text", "must not be empty or only whitespace"),
        ("client_message_id", "is required"),
    ]


def test_after_sequence_must_not_be_negative() -> None:
    assert check_after_sequence(0) == [] and check_after_sequence(7) == []
    assert fields_of(check_after_sequence(-1)) == ["after_sequence"]


# --- where a message may go -----------------------------------------------------------------------


def refusal(conversation_type: str, archived: bool, thread: ChatThread | None) -> FailedPrecondition:
    with pytest.raises(FailedPrecondition) as raised:
        check_chat_target("proj-1", conversation_type, archived, thread)
    return raised.value


def test_a_single_thread_with_complete_metadata_is_the_target() -> None:
    assert check_chat_target("proj-1", SINGLE_DEVICE, False, THREAD) == THREAD


@pytest.mark.parametrize("conversation_type", [MASTER_AGENT, GROUP])
def test_master_agent_and_group_chats_are_not_available_yet(conversation_type: str) -> None:
    error = refusal(conversation_type, False, None)
    assert error.reason == CHAT_PATH_NOT_AVAILABLE
    assert "not available yet" in error.message and error.violations == []


def test_an_archived_project_or_thread_refuses_before_its_metadata_is_looked_at() -> None:
    assert refusal(SINGLE_DEVICE, True, THREAD).reason == THREAD_ARCHIVED
    bare = ChatThread("th-1", "", "", "", archived=True)
    assert refusal(SINGLE_DEVICE, False, bare).reason == THREAD_ARCHIVED


def test_incomplete_metadata_names_each_missing_field_by_its_seed_name() -> None:
    error = refusal(SINGLE_DEVICE, False, replace(THREAD, codex_folder="", codex_thread_ref=""))
    assert error.reason == THREAD_METADATA_INCOMPLETE
    assert [(v.type, v.subject) for v in error.violations] == [
        ("THREAD_METADATA", "codexFolderRef"),
        ("THREAD_METADATA", "codexThreadRef"),
    ]
    assert "codexFolderRef, codexThreadRef" in error.message and "not stored" in error.message


def test_no_thread_at_all_misses_every_field() -> None:
    assert [v.subject for v in missing_metadata(None)] == ["deviceId", "codexFolderRef", "codexThreadRef"]
    assert [v.subject for v in refusal(SINGLE_DEVICE, False, None).violations] == [
        "deviceId",
        "codexFolderRef",
        "codexThreadRef",
    ]


# --- the task projection --------------------------------------------------------------------------


def report(status: str, seconds: int, **fields: object) -> StatusReport:
    return StatusReport(
        task_id="task-1",
        owner_id="local",
        status=status,
        updated_at=T0 + timedelta(seconds=seconds),
        **fields,  # type: ignore[arg-type]
    )


def test_a_new_task_is_a_queued_conversation_reply_through_the_threads_metadata() -> None:
    created = task()
    assert (created.status, created.task_type, created.target_project_id, created.target_thread_id) == (
        "queued",
        "conversation_reply",
        "proj-1",
        "th-1",
    )
    assert (created.device_id, created.codex_folder_ref, created.codex_thread_ref) == (
        "mac-01",
        "/Users/dev/north-line",
        "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    )


def test_reports_move_the_task_through_its_statuses() -> None:
    claimed = apply_status_report(task(), report("claimed", 1), T0)
    assert claimed is not None and claimed.status == "claimed"
    assert claimed.updated_at == claimed.scheduler_updated_at == T0 + timedelta(seconds=1)
    failed = apply_status_report(
        claimed, report("failed", 5, failure_kind="device_lost", status_detail="lease ran out"), T0
    )
    assert failed is not None
    assert (failed.status, failed.failure_kind, failed.status_detail) == (
        "failed",
        "device_lost",
        "lease ran out",
    )


def test_nothing_changes_after_the_first_terminal_status() -> None:
    completed = task(status="completed", scheduler_updated_at=T0 + timedelta(seconds=9))
    assert apply_status_report(completed, report("running", 20), T0) is None
    assert apply_status_report(completed, report("failed", 20, failure_kind="other"), T0) is None


def test_an_older_report_or_a_repeat_changes_nothing() -> None:
    running = task(status="running", scheduler_updated_at=T0 + timedelta(seconds=5))
    assert apply_status_report(running, report("claimed", 4), T0) is None
    assert apply_status_report(running, report("running", 6), T0) is None


def test_a_queued_task_learns_that_its_device_is_offline() -> None:
    seen = T0 - timedelta(minutes=3)
    offline = report(
        "queued", 2, status_detail="device mac-01 last seen at 09:57:00 UTC", device_last_seen_at=seen
    )
    changed = apply_status_report(task(), offline, T0)
    assert changed is not None
    assert (changed.status, changed.status_detail, changed.device_last_seen_at) == (
        "queued",
        "device mac-01 last seen at 09:57:00 UTC",
        seen,
    )
    later = apply_status_report(changed, report("claimed", 3), T0)
    assert later is not None and later.device_last_seen_at == seen  # null in a report keeps what is known


def test_a_report_without_a_time_takes_the_events_time() -> None:
    received = T0 + timedelta(minutes=1)
    changed = apply_status_report(task(), replace(report("claimed", 0), updated_at=None), received)
    assert changed is not None and changed.updated_at == received and changed.scheduler_updated_at is None


def test_status_reports_are_parsed_from_the_schedulers_task_json() -> None:
    parsed = parse_status_report(
        {
            "task_id": "task-1",
            "owner_id": "local",
            "status": "failed",
            "failure_kind": "session_not_found",
            "status_detail": "no rollout found",
            "reply_text": "",
            "heartbeat_at": None,
            "device_last_seen_at": "2026-12-01T09:59:00Z",
            "finished_at": "2026-12-01T10:00:02.5Z",
            "updated_at": "2026-12-01T10:00:02.5Z",
        }
    )
    assert (parsed.status, parsed.failure_kind, parsed.heartbeat_at) == ("failed", "session_not_found", None)
    assert parsed.device_last_seen_at == datetime(2026, 12, 1, 9, 59, tzinfo=UTC)
    assert parsed.updated_at == datetime(2026, 12, 1, 10, 0, 2, 500_000, tzinfo=UTC)
    assert (parsed.codex_session_id, parsed.worker_id) == ("", "")


def test_a_status_report_names_the_codex_session_and_worker_that_ran_it() -> None:
    parsed = parse_status_report(
        {
            "task_id": "task-1",
            "status": "completed",
            "reply_text": "done",
            "codex_session_id": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "worker_id": "worker-a",
        }
    )
    assert (parsed.codex_session_id, parsed.worker_id) == ("0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "worker-a")


def test_nul_in_a_reports_texts_becomes_the_replacement_character() -> None:
    parsed = parse_status_report(
        {
            "task_id": "task-1",
            "status": "failed",
            "failure_kind": "other\x00",
            "status_detail": "\x00codex said\x00",
            "reply_text": "a\x00b",
        }
    )
    assert (parsed.failure_kind, parsed.status_detail, parsed.reply_text) == (
        "other\ufffd",
        "\ufffdcodex said\ufffd",
        "a\ufffdb",
    )


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        ({"status": "running"}, "no task_id"),
        ({"task_id": "task-1\x00", "status": "running"}, "holds NUL"),
        ({"task_id": "t", "status": "paused"}, "unknown status"),
        ({"task_id": "t", "status": "running", "updated_at": "yesterday"}, "Invalid isoformat"),
        ({"task_id": "t", "status": "running", "updated_at": "2026-12-01T10:00:00"}, "no UTC offset"),
    ],
)
def test_malformed_reports_are_refused(payload: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_status_report(payload)


def test_retryable_means_ended_without_a_reply_and_not_retried_yet() -> None:
    assert [task(status=s).retryable for s in ("queued", "running", "completed")] == [False, False, False]
    assert all(task(status=s).retryable for s in ("failed", "timed_out", "cancelled", "expired"))
    assert not task(status="failed", retried_by_task_id="task-2").retryable


def test_the_task_request_carries_the_seeds_fields_for_the_scheduler() -> None:
    retry = task(task_id="task-2", retry_of_task_id="task-1")
    assert task_request_payload(retry, "run the tests again") == {
        "owner_id": "local",
        "task_id": "task-2",
        "task_type": "conversation_reply",
        "project_id": "proj-1",
        "target_project_id": "proj-1",
        "target_thread_id": "th-1",
        "device_id": "mac-01",
        "codex_folder_ref": "/Users/dev/north-line",
        "codex_thread_ref": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "request_message_id": "msg-1",
        "instruction_text": "run the tests again",
        "retry_of_task_id": "task-1",
        "dispatch_plan_id": "",
    }


def test_the_task_payload_has_every_chat_task_field() -> None:
    payload = task(device_last_seen_at=T0).as_payload()
    assert (
        payload["created_at"] == "2026-12-01T10:00:00Z"
        and payload["device_last_seen_at"] == "2026-12-01T10:00:00Z"
    )
    assert list(payload) == [
        "task_id",
        "task_type",
        "status",
        "project_id",
        "target_project_id",
        "target_thread_id",
        "device_id",
        "codex_folder_ref",
        "codex_thread_ref",
        "request_message_id",
        "result_message_id",
        "failure_kind",
        "status_detail",
        "device_last_seen_at",
        "retry_of_task_id",
        "retried_by_task_id",
        "created_at",
        "updated_at",
    ]


# --- the collaboration gate -----------------------------------------------------------------------


def test_single_thread_chat_is_open_and_says_what_runs_first() -> None:
    assert collaboration_gate(0, 0).as_payload() == {
        "state": "open",
        "tasks_total": 0,
        "tasks_done": 0,
        "detail": "",
    }
    alone = collaboration_gate(1, 0)
    assert (alone.state, alone.tasks_total, alone.tasks_done, alone.detail) == ("open", 1, 0, "")
    assert collaboration_gate(2, 1).detail == "1 earlier message of this thread runs first"
    assert collaboration_gate(4, 3).detail == "3 earlier messages of this thread run first"
