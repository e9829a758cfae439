"""Chat events in the gateway's SSE fan-out (pure: envelopes in, queued frames out): REST shapes in
the frames, `task.requested` never handed to a client, and the hub's position still moving past it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from boss.common.v1 import events_pb2

from services.bff_gateway.routers.events import EventHub, hub_event
from services.shared.auth import TokenAuthority
from services.shared.time import to_timestamp

AUTHORITY = TokenAuthority("unit-test-secret-0123456789abcdef-0123")
OCCURRED_AT = datetime(2026, 3, 25, 1, 0, 6, tzinfo=UTC)


def envelope(sequence: int, event_type: str, payload: dict[str, Any]) -> events_pb2.EventEnvelope:
    return events_pb2.EventEnvelope(
        sequence=sequence,
        type=event_type,
        payload_json=json.dumps(payload),
        occurred_at=to_timestamp(OCCURRED_AT),
    )


def frame_data(frame: bytes) -> tuple[str, str, dict[str, Any]]:
    """(id, event, data) of one SSE frame."""
    lines = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n"))
    return lines["id"], lines["event"], json.loads(lines["data"])


MESSAGE = {
    "message_id": "msg-2",
    "project_id": "proj-th-1",
    "author_kind": "thread",
    "thread_id": "th-1",
    "text": "Done: 41 passed.",
    "created_at": "2026-03-25T01:00:06Z",
    "sequence": 2,
    "client_message_id": "",
    "task_id": "task-1",
}


def test_a_message_frame_carries_the_rest_message_with_the_event_sequence() -> None:
    event = hub_event(envelope(12, "conversation.message.created", {"owner_id": "local", "message": MESSAGE}))

    event_id, event_type, data = frame_data(event.frame)

    assert (event_id, event_type) == ("12", "conversation.message.created")
    assert data == {
        "owner_id": "local",
        "message": {
            "messageId": "msg-2",
            "projectId": "proj-th-1",
            "authorKind": "thread",
            "threadId": "th-1",
            "text": "Done: 41 passed.",
            "createdAt": "2026-03-25T01:00:06Z",
            "sequence": 2,
            "clientMessageId": None,
            "taskId": "task-1",
        },
        "sequence": 12,
        "occurred_at": "2026-03-25T01:00:06Z",
    }


def test_task_requested_is_not_handed_out_but_the_position_moves_past_it() -> None:
    hub = EventHub(client=None, authority=AUTHORITY)
    mine, _ = hub.subscribe("local")
    everyone, _ = hub.subscribe(None)

    hub.publish(hub_event(envelope(5, "task.requested", {"owner_id": "local", "instruction_text": "rm -rf"})))
    hub.publish(
        hub_event(envelope(6, "conversation.message.created", {"owner_id": "local", "message": MESSAGE}))
    )

    assert hub.position == 6
    for subscriber in (mine, everyone):
        queued = [subscriber.queue.get_nowait() for _ in range(subscriber.queue.qsize())]
        assert [(e.sequence, e.type) for e in queued if e is not None] == [
            (6, "conversation.message.created")
        ]


def test_a_chat_payload_the_gateway_cannot_read_is_sent_as_it_is_not_dropped() -> None:
    broken = {"owner_id": "local", "message": {**MESSAGE, "sequence": "not a number"}}

    _, event_type, data = frame_data(hub_event(envelope(7, "conversation.message.created", broken)).frame)

    assert event_type == "conversation.message.created"
    assert data["message"]["sequence"] == "not a number"
    assert data["sequence"] == 7
