"""Errors carry the offending fields as google.rpc.BadRequest and exactly one ErrorInfo."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2

from services.shared.errors import (
    THREAD_NOT_FOUND,
    FieldViolation,
    InvalidArgument,
    NotFound,
    field_violations_of,
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
