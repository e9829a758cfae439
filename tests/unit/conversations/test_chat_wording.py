"""The message that ends a task: the thread's raw reply, or a plain system message per status and
failure kind saying what failed and what the user can do."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.conversations.chat.domain import ChatThread, StatusReport, new_chat_task
from services.conversations.chat.wording import result_message, system_message_text, when

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
FINISHED = datetime(2026, 12, 1, 10, 5, 30, tzinfo=UTC)
REF = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
TASK = new_chat_task(
    "task-1", "local", "proj-1", ChatThread("th-1", "mac-01", "/Users/dev/north", REF), "msg-1", T0
)


def ended(status: str, failure_kind: str = "", **fields: object) -> StatusReport:
    return StatusReport(
        task_id="task-1",
        owner_id="local",
        status=status,
        failure_kind=failure_kind,
        finished_at=FINISHED,
        updated_at=FINISHED,
        **fields,  # type: ignore[arg-type]
    )


def test_a_completed_task_writes_the_threads_raw_reply() -> None:
    reply = "Done.\n\n```diff\n- old\n+ new\n```\n"
    written = result_message(TASK, ended("completed", reply_text=reply))
    assert (written.author_kind, written.thread_id, written.text) == ("thread", "th-1", reply)


def test_a_completed_task_without_a_reply_writes_a_system_message() -> None:
    written = result_message(TASK, ended("completed"))
    assert (written.author_kind, written.thread_id) == ("system", "")
    assert written.text == "Codex on mac-01 finished this message without a reply. You can retry it."


@pytest.mark.parametrize(
    ("status", "kind", "fields", "expected"),
    [
        (
            "failed",
            "session_not_found",
            {},
            f"Codex on mac-01 could not find this thread's session (codex_thread_ref {REF}). Nothing was "
            "run. Retry after the device has the session.",
        ),
        (
            "failed",
            "thread_busy",
            {},
            "This thread is open in another Codex process on mac-01, so this message was not run. Close it "
            "there and retry.",
        ),
        (
            "failed",
            "not_logged_in",
            {},
            "Codex on mac-01 is not logged in (no login or API key). Nothing was run. Log in to Codex on "
            "mac-01 and retry.",
        ),
        (
            "failed",
            "model_error",
            {"status_detail": "exceeded retry limit, last status: 429 Too Many Requests"},
            "The model answered Codex on mac-01 with an error: exceeded retry limit, last status: 429 Too "
            "Many Requests. This message got no reply; you can retry it.",
        ),
        (
            "timed_out",
            "stalled",
            {},
            "Codex on mac-01 stopped producing output and was stopped after its stall timeout; this "
            "message may have been partly run. You can retry it.",
        ),
        (
            "timed_out",
            "timed_out",
            {},
            "Codex on mac-01 ran longer than its time limit for one message and was stopped; this message "
            "may have been partly run. You can retry it.",
        ),
        (
            "timed_out",
            "",
            {},
            "Codex on mac-01 ran longer than its time limit for one message and was stopped; this message "
            "may have been partly run. You can retry it.",
        ),
        (
            "failed",
            "could_not_start",
            {"status_detail": "codex: command not found."},
            "Codex could not be started on mac-01: codex: command not found. Nothing was run. Check the "
            "Codex installation and the thread's folder (/Users/dev/north) on mac-01, then retry.",
        ),
        (
            "failed",
            "no_reply",
            {},
            "Codex on mac-01 finished this message without a reply. You can retry it.",
        ),
        (
            "failed",
            "device_lost",
            {"heartbeat_at": datetime(2026, 12, 1, 10, 4, 5, 900_000, tzinfo=UTC)},
            "The device mac-01 stopped answering at 10:04:05 UTC while running this message; it was not "
            "run again automatically. You can retry it.",
        ),
        (
            "failed",
            "interrupted",
            {},
            "The local agent on mac-01 was stopped while running this message; it was not run again "
            "automatically. You can retry it.",
        ),
        (
            "failed",
            "other",
            {"status_detail": "exit status 2"},
            "Running this message on mac-01 failed: exit status 2. You can retry it.",
        ),
        ("failed", "", {}, "Running this message on mac-01 failed. You can retry it."),
        (
            "expired",
            "",
            {"device_last_seen_at": datetime(2026, 12, 1, 9, 40, tzinfo=UTC)},
            "This message was not run: the device mac-01 was offline (last seen at 09:40:00 UTC) and the "
            "task expired in the queue. Retry it when the device is back online.",
        ),
        (
            "expired",
            "",
            {},
            "This message was not run: the device mac-01 was offline (never seen by Boss) and the task "
            "expired in the queue. Retry it when the device is back online.",
        ),
        ("cancelled", "", {}, "This message was cancelled before it ran; nothing was run. You can retry it."),
    ],
)
def test_each_way_of_failing_has_its_own_plain_sentence(
    status: str, kind: str, fields: dict[str, object], expected: str
) -> None:
    written = result_message(TASK, ended(status, kind, **fields))
    assert (written.author_kind, written.thread_id, written.text) == ("system", "", expected)


def test_device_lost_without_a_heartbeat_uses_the_last_sign_of_the_device() -> None:
    seen = datetime(2026, 12, 1, 10, 1, 2, tzinfo=UTC)
    text = system_message_text(TASK, ended("failed", "device_lost", device_last_seen_at=seen))
    assert "stopped answering at 10:01:02 UTC" in text


def test_an_instant_on_another_day_carries_its_date() -> None:
    assert when(datetime(2026, 11, 30, 23, 59, 1, tzinfo=UTC), FINISHED) == "2026-11-30 23:59:01 UTC"
    assert when(datetime(2026, 12, 1, 10, 4, 5, tzinfo=UTC), FINISHED) == "10:04:05 UTC"
    assert when(None, FINISHED) == "an unknown time"
