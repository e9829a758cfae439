"""The chat resources' one mapping (pure): conversations protos and event payloads -> the REST shapes
with the seed's camelCase names, and the send body's validation."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, get_args

import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from boss.scheduler.v1 import scheduler_pb2 as scheduler_pb
from pydantic import ValidationError

from services.bff_gateway.chat.mapping import (
    chat_task_answer,
    chat_task_view,
    client_event_data,
    gate_view,
    message_page,
    message_view,
    send_message_answer,
)
from services.bff_gateway.chat.schemas import (
    MAX_TEXT_LENGTH,
    ChatTaskView,
    SendMessageBody,
    TaskStatusName,
    TaskTypeName,
)
from services.conversations.domain.model import MAX_MESSAGE_LENGTH
from services.shared.time import to_timestamp

SENT_AT = datetime(2026, 3, 25, 1, 0, 5, 250_000, tzinfo=UTC)
SEEN_AT = datetime(2026, 3, 25, 1, 0, 1, tzinfo=UTC)


def user_message() -> pb.Message:
    return pb.Message(
        message_id="msg-1",
        project_id="proj-th-1",
        author_kind="user",
        text="run the tests again",
        created_at=to_timestamp(SENT_AT),
        sequence=7,
        client_message_id="c-1",
        task_id="task-1",
    )


def queued_task() -> pb.ChatTask:
    return pb.ChatTask(
        task_id="task-1",
        task_type="conversation_reply",
        status="queued",
        project_id="proj-th-1",
        target_project_id="proj-th-1",
        target_thread_id="th-1",
        device_id="node-a",
        codex_folder_ref="/srv/north-line",
        codex_thread_ref="019b3c2e-0000-7000-8000-0000000000aa",
        request_message_id="msg-1",
        created_at=to_timestamp(SENT_AT),
        updated_at=to_timestamp(SENT_AT),
    )


QUEUED_TASK_JSON = {
    "taskId": "task-1",
    "taskType": "conversation_reply",
    "status": "queued",
    "projectId": "proj-th-1",
    "targetProjectId": "proj-th-1",
    "targetThreadId": "th-1",
    "deviceId": "node-a",
    "codexFolderRef": "/srv/north-line",
    "codexThreadRef": "019b3c2e-0000-7000-8000-0000000000aa",
    "requestMessageId": "msg-1",
    "resultMessageId": None,
    "failureKind": None,
    "statusDetail": None,
    "deviceLastSeenAt": None,
    "retryOfTaskId": None,
    "retriedByTaskId": None,
    "createdAt": "2026-03-25T01:00:05.250000Z",
    "updatedAt": "2026-03-25T01:00:05.250000Z",
}


def as_json(model: Any) -> dict[str, Any]:
    """A view as the REST answer carries it."""
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
    return dumped


def test_a_user_message_has_camel_case_names_and_null_for_what_it_lacks() -> None:
    assert as_json(message_view(user_message())) == {
        "messageId": "msg-1",
        "projectId": "proj-th-1",
        "authorKind": "user",
        "threadId": None,
        "text": "run the tests again",
        "createdAt": "2026-03-25T01:00:05.250000Z",
        "sequence": 7,
        "clientMessageId": "c-1",
        "taskId": "task-1",
    }


def test_a_thread_reply_names_its_thread_and_no_client_key() -> None:
    reply = pb.Message(
        message_id="msg-2",
        project_id="proj-th-1",
        author_kind="thread",
        thread_id="th-1",
        text="All 41 tests pass.",
        sequence=8,
        task_id="task-1",
    )

    view = as_json(message_view(reply))

    assert (view["threadId"], view["clientMessageId"], view["createdAt"]) == ("th-1", None, None)


def test_a_queued_task_has_every_seed_field_and_nulls_for_unset_ones() -> None:
    assert as_json(chat_task_view(queued_task())) == QUEUED_TASK_JSON


def test_a_failed_retried_task_shows_why_and_its_retry() -> None:
    task = queued_task()
    task.status = "failed"
    task.failure_kind = "device_lost"
    task.status_detail = "the device stopped answering at 2026-03-25T01:00:01Z"
    task.result_message_id = "msg-3"
    task.retried_by_task_id = "task-2"
    task.device_last_seen_at.CopyFrom(to_timestamp(SEEN_AT))

    view = as_json(chat_task_view(task))

    assert {key: view[key] for key in view if view[key] != QUEUED_TASK_JSON[key]} == {
        "status": "failed",
        "failureKind": "device_lost",
        "statusDetail": "the device stopped answering at 2026-03-25T01:00:01Z",
        "resultMessageId": "msg-3",
        "retriedByTaskId": "task-2",
        "deviceLastSeenAt": "2026-03-25T01:00:01Z",
    }


def test_an_unknown_status_is_refused_not_passed_on() -> None:
    task = queued_task()
    task.status = "paused"

    with pytest.raises(ValidationError):
        chat_task_view(task)


def test_the_send_answer_always_has_the_seeds_four_fields() -> None:
    response = pb.PostMessageResponse(
        message=user_message(),
        task=queued_task(),
        collaboration_gate=pb.CollaborationGate(state="open", tasks_total=1, detail="queued"),
        created=True,
    )

    answer = as_json(send_message_answer(response))

    assert list(answer) == ["message", "masterReply", "dispatchPlan", "task", "collaborationGate"]
    assert (answer["masterReply"], answer["dispatchPlan"]) == (None, None)
    assert {key: answer["task"][key] for key in ("taskId", "taskType", "status")} == {
        "taskId": "task-1",
        "taskType": "conversation_reply",
        "status": "queued",
    }
    assert answer["collaborationGate"] == {
        "state": "open",
        "tasksTotal": 1,
        "tasksDone": 0,
        "detail": "queued",
    }
    assert answer["message"]["messageId"] == "msg-1"


def test_a_send_without_a_task_answers_null_and_a_master_reply_passes() -> None:
    response = pb.PostMessageResponse(message=user_message(), master_reply="")

    answer = as_json(send_message_answer(response))

    assert (answer["task"], answer["masterReply"]) == (None, "")
    assert answer["collaborationGate"] == {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""}


def test_a_page_of_messages_ends_with_a_null_token() -> None:
    middle = as_json(message_page(pb.ListMessagesResponse(messages=[user_message()], next_page_token="t2")))
    last = as_json(message_page(pb.ListMessagesResponse()))

    assert (middle["nextPageToken"], [m["sequence"] for m in middle["messages"]]) == ("t2", [7])
    assert last == {
        "messages": [],
        "nextPageToken": None,
        "pendingDispatchPlan": None,
        "collaborationGate": None,
        "executingDispatchPlans": [],
    }


def test_task_polling_and_retry_answers_share_one_shape() -> None:
    gate = pb.CollaborationGate(state="open", tasks_total=1, tasks_done=1)
    polled = chat_task_answer(pb.GetChatTaskResponse(task=queued_task(), collaboration_gate=gate))
    retried = chat_task_answer(pb.RetryChatTaskResponse(task=queued_task(), collaboration_gate=gate))

    assert as_json(polled) == as_json(retried)
    assert as_json(polled)["collaborationGate"]["tasksDone"] == 1


def test_the_gate_defaults_to_open() -> None:
    assert gate_view(pb.CollaborationGate()).state == "open"


# --- events --------------------------------------------------------------------------------------


def test_a_message_event_carries_exactly_the_rest_message() -> None:
    payload = {
        "owner_id": "local",
        "project_id": "proj-th-1",
        "conversation_id": "conv-proj-th-1",
        "latest_reply_at": "2026-03-25T01:00:05.250000Z",
        "message": {
            "message_id": "msg-1",
            "project_id": "proj-th-1",
            "author_kind": "user",
            "thread_id": "",
            "text": "run the tests again",
            "created_at": "2026-03-25T01:00:05.250000Z",
            "sequence": 7,
            "client_message_id": "c-1",
            "task_id": "task-1",
        },
    }

    data = client_event_data("conversation.message.created", payload)

    assert data is not None
    assert data["message"] == as_json(message_view(user_message()))
    assert {key: data[key] for key in ("owner_id", "project_id", "latest_reply_at")} == {
        "owner_id": "local",
        "project_id": "proj-th-1",
        "latest_reply_at": "2026-03-25T01:00:05.250000Z",
    }


def test_a_task_event_carries_the_rest_task_and_gate() -> None:
    payload = {
        "owner_id": "local",
        "project_id": "proj-th-1",
        "task": {
            "task_id": "task-1",
            "task_type": "conversation_reply",
            "status": "queued",
            "project_id": "proj-th-1",
            "target_project_id": "proj-th-1",
            "target_thread_id": "th-1",
            "device_id": "node-a",
            "codex_folder_ref": "/srv/north-line",
            "codex_thread_ref": "019b3c2e-0000-7000-8000-0000000000aa",
            "request_message_id": "msg-1",
            "result_message_id": "",
            "failure_kind": "",
            "status_detail": "",
            "device_last_seen_at": None,
            "retry_of_task_id": "",
            "retried_by_task_id": "",
            "created_at": "2026-03-25T01:00:05.250Z",
            "updated_at": "2026-03-25T01:00:05.250Z",
        },
        "collaboration_gate": {"state": "open", "tasks_total": 1, "tasks_done": 0, "detail": ""},
    }

    data = client_event_data("task.updated", payload)

    assert data == {
        "owner_id": "local",
        "project_id": "proj-th-1",
        "task": QUEUED_TASK_JSON,
        "collaborationGate": {"state": "open", "tasksTotal": 1, "tasksDone": 0, "detail": ""},
    }


def test_task_requested_is_never_for_clients_and_other_events_pass_unchanged() -> None:
    assert client_event_data("task.requested", {"owner_id": "local", "instruction_text": "secret"}) is None
    ring = {"owner_id": "local", "context_budget_indicator": {"percent": 52}}
    assert client_event_data("conversation.context_indicator.updated", ring) is ring


# --- the contract ---------------------------------------------------------------------------------


def test_names_follow_the_scheduler_and_conversations_contracts() -> None:
    statuses = {
        v.name.removeprefix("TASK_STATUS_").lower() for v in scheduler_pb.TaskStatus.DESCRIPTOR.values
    }
    types = {v.name.removeprefix("TASK_TYPE_").lower() for v in scheduler_pb.TaskType.DESCRIPTOR.values}
    kinds = {v.name.removeprefix("FAILURE_KIND_").lower() for v in scheduler_pb.FailureKind.DESCRIPTOR.values}

    assert set(get_args(TaskStatusName)) == statuses - {"unspecified"}
    assert set(get_args(TaskTypeName)) == types - {"unspecified"}
    described = ChatTaskView.model_fields["failure_kind"].description or ""
    assert [kind for kind in sorted(kinds - {"unspecified"}) if kind not in described] == []
    assert MAX_TEXT_LENGTH == MAX_MESSAGE_LENGTH


# --- the send body --------------------------------------------------------------------------------


def rejected(body: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        SendMessageBody.model_validate(body)
    return [".".join(str(part) for part in error["loc"]) for error in caught.value.errors()]


@pytest.mark.parametrize("text", ["", "   ", "\n\t ", "a\x00b", "x" * (MAX_TEXT_LENGTH + 1), 5, None])
def test_bad_text_names_text(text: object) -> None:
    assert rejected({"text": text, "client_message_id": "c-1"}) == ["text"]


@pytest.mark.parametrize("key", ["", "has space", "ü", "x" * 201, "a/b", "trailing\n", 12])
def test_bad_client_message_ids_name_the_field(key: object) -> None:
    assert rejected({"text": "hello", "client_message_id": key}) == ["client_message_id"]


def test_a_good_body_keeps_its_text_as_written() -> None:
    body = SendMessageBody.model_validate(
        {"text": "  indented\nline ", "client_message_id": "c-2026.03:25_a-1"}
    )

    assert (body.text, body.client_message_id) == ("  indented\nline ", "c-2026.03:25_a-1")
    assert SendMessageBody.model_validate({"text": "x" * MAX_TEXT_LENGTH, "client_message_id": "k"})
    assert rejected({"text": "hi", "client_message_id": "k", "extra": 1}) == ["extra"]
