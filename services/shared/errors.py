"""Errors that name the offending field, as gRPC rich status (google.rpc.BadRequest + ErrorInfo).

Domain and validation code raises these plain exceptions; the gRPC faces turn them into a
`google.rpc.Status` (AIP-193: exactly one ErrorInfo, plus BadRequest field violations for bad
input), and the gateway turns that into `application/problem+json`.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from boss_common.status_details import FieldViolation, PreconditionViolation

# What a caller reads from a status is in boss_common/status_details.py (the worker reads it too);
# the services import it from here.
from boss_common.status_details import field_violations_of as field_violations_of
from boss_common.status_details import precondition_violations_of as precondition_violations_of
from boss_common.status_details import reason_of as reason_of

ERROR_DOMAIN = "boss.dev"

# ErrorInfo reasons of NotFound, one per kind of resource. Every service raises NotFound with the
# reason of the resource it could not find, and the gateway passes it on as the problem's `reason`,
# so a client tells an unknown thread from an unknown project the same way over gRPC and HTTP.
THREAD_NOT_FOUND = "THREAD_NOT_FOUND"
PROJECT_NOT_FOUND = "PROJECT_NOT_FOUND"
PACKAGE_NOT_FOUND = "PACKAGE_NOT_FOUND"
ALERT_NOT_FOUND = "ALERT_NOT_FOUND"
COMMAND_NOT_FOUND = "COMMAND_NOT_FOUND"
TASK_NOT_FOUND = "TASK_NOT_FOUND"
MESSAGE_NOT_FOUND = "MESSAGE_NOT_FOUND"


class BossError(Exception):
    """Base of errors that map to one gRPC status code and an ErrorInfo `reason`."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason

    def to_status(self) -> status_pb2.Status:
        """The google.rpc.Status for this error."""
        info = any_pb2.Any()
        info.Pack(error_details_pb2.ErrorInfo(reason=self.reason, domain=ERROR_DOMAIN))
        return status_pb2.Status(code=self.code.value[0], message=self.message, details=[info])


class InvalidArgument(BossError):
    """Bad input; carries every field violation found (INVALID_ARGUMENT)."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, violations: list[FieldViolation]) -> None:
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        super().__init__(f"invalid argument: {summary}")
        self.violations = violations

    def to_status(self) -> status_pb2.Status:
        status = super().to_status()
        status.details.append(_bad_request(self.violations))
        return status


def _bad_request(violations: list[FieldViolation]) -> any_pb2.Any:
    """A google.rpc.BadRequest detail naming `violations`, packed."""
    bad_request = any_pb2.Any()
    bad_request.Pack(
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in violations
            ]
        )
    )
    return bad_request


class PermissionDenied(BossError):
    """The caller's token does not allow this (PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class Unauthenticated(BossError):
    """No valid token (UNAUTHENTICATED)."""

    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class ResourceExhausted(BossError):
    """Too many attempts or requests; try again later (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class NotFound(BossError):
    """The named resource does not exist (NOT_FOUND). Raise it with the resource's own reason
    (THREAD_NOT_FOUND, PROJECT_NOT_FOUND, ...); plain "NOT_FOUND" is left for anything else."""

    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"


class FailedPrecondition(BossError):
    """The resource is not in a state that allows this (FAILED_PRECONDITION), e.g. an illegal
    status transition. `violations`, when given, name each unmet precondition; the status then
    carries them as a google.rpc.PreconditionFailure detail after the ErrorInfo."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        violations: list[PreconditionViolation] | None = None,
    ) -> None:
        super().__init__(message, reason=reason)
        self.violations = list(violations or [])

    def to_status(self) -> status_pb2.Status:
        status = super().to_status()
        if self.violations:
            failure = any_pb2.Any()
            failure.Pack(
                error_details_pb2.PreconditionFailure(
                    violations=[
                        error_details_pb2.PreconditionFailure.Violation(
                            type=v.type, subject=v.subject, description=v.description
                        )
                        for v in self.violations
                    ]
                )
            )
            status.details.append(failure)
        return status


class AlreadyExists(BossError):
    """The resource exists already (ALREADY_EXISTS). `violations`, when given, name the request
    fields that clash with what exists (packed as a google.rpc.BadRequest after the ErrorInfo, so
    clients name the field as they do for bad input)."""

    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"

    def __init__(
        self, message: str, *, reason: str | None = None, violations: list[FieldViolation] | None = None
    ) -> None:
        super().__init__(message, reason=reason)
        self.violations = list(violations or [])

    def to_status(self) -> status_pb2.Status:
        status = super().to_status()
        if self.violations:
            status.details.append(_bad_request(self.violations))
        return status


THREAD_BOUND_TO_OTHER_DEVICE = "THREAD_BOUND_TO_OTHER_DEVICE"
# The master agent runs on another device of its owner: only that device registers its next thread.
MASTER_ON_OTHER_DEVICE = "MASTER_ON_OTHER_DEVICE"


def thread_bound_to_other_device(thread_id: str) -> PermissionDenied:
    """The refusal of a report or registration of a thread by a device it does not belong to (a
    thread belongs to the device that first reported or registered it, or the one its owner moved
    it to). Names neither that device nor its owner."""
    return PermissionDenied(
        f"thread {thread_id!r} belongs to another device: only that device may report or register "
        "it, unless its owner moves the thread to this one",
        reason=THREAD_BOUND_TO_OTHER_DEVICE,
    )


def grpc_status_of(error: BossError) -> grpc.Status:
    """The grpc.Status (code, message, details trailer) to abort an RPC with."""
    return rpc_status.to_status(error.to_status())


def ok_status() -> status_pb2.Status:
    """An OK google.rpc.Status."""
    return status_pb2.Status(code=code_pb2.OK)
