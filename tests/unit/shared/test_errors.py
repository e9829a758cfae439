"""Errors carry the offending fields as google.rpc.BadRequest (unmet preconditions as
google.rpc.PreconditionFailure) and exactly one ErrorInfo."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2

from services.shared.errors import (
    THREAD_NOT_FOUND,
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PreconditionViolation,
    field_violations_of,
    precondition_violations_of,
    reason_of,
)


def test_invalid_argument_names_every_field() -> None:
    error = InvalidArgument(
        [
            FieldViolation("snapshot.thread_id", "required"),
            FieldViolation("snapshot.captured_at", "in the future"),
        ]
    )
    status = error.to_status()

    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "snapshot.thread_id: required" in status.message
    assert field_violations_of(status) == error.violations
    infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
    assert len(infos) == 1


def test_not_found_has_no_field_violations() -> None:
    status = NotFound("thread 'x' not found").to_status()
    assert status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert field_violations_of(status) == []


def test_not_found_carries_the_resource_reason() -> None:
    status = NotFound("thread 'x' not found", reason=THREAD_NOT_FOUND).to_status()
    assert reason_of(status) == "THREAD_NOT_FOUND"
    assert reason_of(NotFound("gone").to_status()) == "NOT_FOUND"
    assert reason_of(None) is None


def test_failed_precondition_names_each_unmet_precondition() -> None:
    violations = [
        PreconditionViolation("THREAD_METADATA", "deviceId", "the device is not known"),
        PreconditionViolation("THREAD_METADATA", "codexThreadRef", "the session id is not known"),
    ]
    status = FailedPrecondition(
        "metadata incomplete", reason="THREAD_METADATA_INCOMPLETE", violations=violations
    )
    packed = status.to_status()

    assert packed.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert reason_of(packed) == "THREAD_METADATA_INCOMPLETE"
    assert precondition_violations_of(packed) == violations
    assert [d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR) for d in packed.details] == [True, False]


def test_failed_precondition_without_violations_carries_only_its_reason() -> None:
    packed = FailedPrecondition("already resolved", reason="ALERT_RESOLVED").to_status()
    assert len(packed.details) == 1 and reason_of(packed) == "ALERT_RESOLVED"
    assert precondition_violations_of(packed) == []


def test_already_exists_can_name_the_clashing_field() -> None:
    clash = FieldViolation("client_message_id", "was used for another message")
    packed = AlreadyExists("reused", reason="CLIENT_MESSAGE_ID_REUSED", violations=[clash]).to_status()
    assert packed.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert reason_of(packed) == "CLIENT_MESSAGE_ID_REUSED"
    assert field_violations_of(packed) == [clash]
    assert field_violations_of(AlreadyExists("exists").to_status()) == []
