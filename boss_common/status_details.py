"""What a caller reads from a Boss error: the details of the google.rpc.Status a service sent
(AIP-193: one ErrorInfo whose `reason` names the error, plus BadRequest field violations for bad
input or PreconditionFailure violations for an unmet precondition).

The services raise these errors (services/shared/errors.py builds the statuses); the gateway, the
tests and the worker read them with the functions here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

Detail = TypeVar("Detail", bound=Message)


@dataclass(frozen=True)
class FieldViolation:
    """One bad field: `field` is its path (e.g. "snapshots[3].captured_at"), `description` why."""

    field: str
    description: str


def field_violations_of(status: status_pb2.Status) -> list[FieldViolation]:
    """The BadRequest field violations inside a google.rpc.Status (empty when none)."""
    return [
        FieldViolation(v.field, v.description)
        for bad_request in details_of(status, error_details_pb2.BadRequest)
        for v in bad_request.field_violations
    ]


@dataclass(frozen=True)
class PreconditionViolation:
    """One unmet precondition (google.rpc.PreconditionFailure.Violation): `type` its kind (e.g.
    "THREAD_METADATA"), `subject` what is missing or wrong (e.g. the field "codexThreadRef"),
    `description` in words how to fix it."""

    type: str
    subject: str
    description: str


def precondition_violations_of(status: status_pb2.Status) -> list[PreconditionViolation]:
    """The PreconditionFailure violations inside a google.rpc.Status (empty when none)."""
    return [
        PreconditionViolation(v.type, v.subject, v.description)
        for failure in details_of(status, error_details_pb2.PreconditionFailure)
        for v in failure.violations
    ]


def reason_of(status: status_pb2.Status | None) -> str | None:
    """The ErrorInfo reason inside a google.rpc.Status (None when there is none)."""
    if status is None:
        return None
    info = next(details_of(status, error_details_pb2.ErrorInfo), None)
    return (info.reason or None) if info is not None else None


def details_of(status: status_pb2.Status, kind: type[Detail]) -> Iterator[Detail]:
    """The details of type `kind` (e.g. google.rpc.BadRequest) inside a google.rpc.Status, unpacked."""
    for packed in status.details:
        if packed.Is(kind.DESCRIPTOR):
            detail = kind()
            packed.Unpack(detail)
            yield detail
