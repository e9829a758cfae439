"""Error mapping of the gateway (pure): gRPC status -> HTTP problem, request validation -> problem,
and the OpenAPI rewrite to application/problem+json."""

from __future__ import annotations

import re

import grpc
import pytest

from services.bff_gateway.problems import (
    PROBLEM_TYPE_BASE,
    BodySizeLimit,
    ProblemError,
    ProblemFieldError,
    problem_for_boss_error,
    problem_for_grpc_status,
    problem_for_request_validation,
    use_problem_media_type,
)
from services.shared.errors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
    Unauthenticated,
)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 422),
        (grpc.StatusCode.OUT_OF_RANGE, 422),
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.PERMISSION_DENIED, 403),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.FAILED_PRECONDITION, 409),
        (grpc.StatusCode.ALREADY_EXISTS, 409),
        (grpc.StatusCode.ABORTED, 409),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 503),
        (grpc.StatusCode.CANCELLED, 503),
        (grpc.StatusCode.INTERNAL, 502),
        (grpc.StatusCode.UNKNOWN, 502),
        (grpc.StatusCode.UNIMPLEMENTED, 502),
        (grpc.StatusCode.DATA_LOSS, 502),
    ],
)
def test_grpc_codes_map_to_http_statuses(code: grpc.StatusCode, status: int) -> None:
    assert problem_for_grpc_status("context_budget", code, "message", None).status == status


def test_field_violations_become_errors_with_json_names_and_reason() -> None:
    status = InvalidArgument(
        [
            FieldViolation("snapshot.context_budget_remaining_pct", "must be a finite percentage in 0..100"),
            FieldViolation("snapshot.captured_at", "is required"),
        ]
    ).to_status()

    problem = problem_for_grpc_status(
        "context_budget", grpc.StatusCode.INVALID_ARGUMENT, status.message, status
    )

    assert problem.status == 422
    assert problem.errors == [
        ProblemFieldError(
            field="context_budget_remaining_pct", detail="must be a finite percentage in 0..100"
        ),
        ProblemFieldError(field="captured_at", detail="is required"),
    ]
    assert problem.reason == "INVALID_ARGUMENT"
    assert problem.type == PROBLEM_TYPE_BASE + "validation-error"
    assert "context_budget_remaining_pct" in problem.detail


def test_unavailable_carries_retry_after_and_hides_the_transport_message() -> None:
    problem = problem_for_grpc_status(
        "context_budget",
        grpc.StatusCode.UNAVAILABLE,
        "failed to connect to 10.0.0.7:50051",
        None,
        retry_after_seconds=9,
    )

    assert dict(problem.headers or {}) == {"Retry-After": "9"}
    assert "10.0.0.7" not in problem.detail
    assert "context_budget" in problem.detail


def test_internal_errors_do_not_leak_their_message() -> None:
    problem = problem_for_grpc_status(
        "context_budget", grpc.StatusCode.UNKNOWN, "Traceback: KeyError 'x'", None
    )

    assert problem.status == 502
    assert "KeyError" not in problem.detail


def test_unauthenticated_from_a_backend_is_a_bearer_challenge() -> None:
    status = Unauthenticated("token expired", reason="TOKEN_EXPIRED").to_status()

    problem = problem_for_grpc_status(
        "context_budget", grpc.StatusCode.UNAUTHENTICATED, "token expired", status
    )

    assert problem.status == 401
    assert (problem.headers or {})["WWW-Authenticate"].startswith("Bearer")
    assert problem.reason == "TOKEN_EXPIRED"


def test_not_found_keeps_the_backend_message_and_reason() -> None:
    status = NotFound("thread 'thread-x' never reported", reason="THREAD_NOT_FOUND").to_status()

    problem = problem_for_grpc_status("context_budget", grpc.StatusCode.NOT_FOUND, status.message, status)

    assert (problem.status, problem.detail, problem.reason) == (
        404,
        "thread 'thread-x' never reported",
        "THREAD_NOT_FOUND",
    )


def test_gateway_side_boss_errors_map_like_their_grpc_codes() -> None:
    assert problem_for_boss_error(PermissionDenied("no", reason="SCOPE_MISSING")).status == 403
    assert problem_for_boss_error(FailedPrecondition("state")).status == 409
    missing = problem_for_boss_error(Unauthenticated("missing", reason="TOKEN_MISSING"))
    assert (missing.headers or {})["WWW-Authenticate"] == 'Bearer realm="boss"'
    invalid = problem_for_boss_error(Unauthenticated("bad", reason="TOKEN_INVALID"))
    assert 'error="invalid_token"' in (invalid.headers or {})["WWW-Authenticate"]


def test_malformed_json_is_400() -> None:
    problem = problem_for_request_validation(
        [
            {
                "type": "json_invalid",
                "loc": ("body", 21),
                "msg": "JSON decode error",
                "ctx": {"error": "Expecting value"},
            }
        ]
    )

    assert problem.status == 400
    assert "position 21" in problem.detail


def test_validation_errors_name_body_and_path_fields() -> None:
    problem = problem_for_request_validation(
        [
            {
                "type": "value_error",
                "loc": ("body", "context_budget_remaining_pct"),
                "msg": "Value error, must be a JSON number",
            },
            {"type": "extra_forbidden", "loc": ("body", "colour"), "msg": "Extra inputs are not permitted"},
            {"type": "missing", "loc": ("body", "thread_id"), "msg": "Field required"},
            {
                "type": "string_too_long",
                "loc": ("path", "worker_id"),
                "msg": "String should have at most 200",
            },
            {
                "type": "int_type",
                "loc": ("body", "estimated_remaining_turns", "function-before[_json_number()]"),
                "msg": "Input should be a valid integer",
            },
            {"type": "model_attributes_type", "loc": ("body",), "msg": "Input should be a valid dictionary"},
        ]
    )

    assert problem.status == 422
    assert [(e.field, e.detail) for e in problem.errors] == [
        ("context_budget_remaining_pct", "must be a JSON number"),
        ("colour", "unknown field"),
        ("thread_id", "required"),
        ("worker_id", "String should have at most 200"),
        ("estimated_remaining_turns", "Input should be a valid integer"),
        ("body", "Input should be a valid dictionary"),
    ]


def test_openapi_error_bodies_are_declared_as_problem_json() -> None:
    document = {
        "paths": {
            "/x": {
                "parameters": [],
                "get": {
                    "responses": {
                        "200": {"content": {"application/json": {"schema": {"$ref": "#/a"}}}},
                        "404": {"content": {"application/json": {"schema": {"$ref": "#/p"}}}},
                        "503": {"content": {"application/json": {"schema": {"$ref": "#/p"}}}},
                    }
                },
            }
        }
    }

    responses = use_problem_media_type(document)["paths"]["/x"]["get"]["responses"]

    assert list(responses["200"]["content"]) == ["application/json"]
    assert list(responses["404"]["content"]) == ["application/problem+json"]
    assert list(responses["503"]["content"]) == ["application/problem+json"]


def test_incomplete_thread_metadata_names_each_missing_field() -> None:
    status = FailedPrecondition(
        "the thread's metadata is incomplete: deviceId, codexThreadRef",
        reason="THREAD_METADATA_INCOMPLETE",
        violations=[
            PreconditionViolation("THREAD_METADATA", "deviceId", "register the thread from its node"),
            PreconditionViolation("THREAD_METADATA", "codexThreadRef", "the thread has no Codex session id"),
        ],
    ).to_status()

    problem = problem_for_grpc_status(
        "conversations", grpc.StatusCode.FAILED_PRECONDITION, status.message, status
    )
    body = problem.to_problem("/api/v1/projects/p/messages").model_dump(mode="json", exclude_none=True)

    assert (body["status"], body["reason"]) == (409, "THREAD_METADATA_INCOMPLETE")
    assert body["missing_fields"] == ["deviceId", "codexThreadRef"]
    assert body["errors"] == [
        {"field": "deviceId", "detail": "register the thread from its node"},
        {"field": "codexThreadRef", "detail": "the thread has no Codex session id"},
    ]
    assert body["detail"] == "the thread's metadata is incomplete: deviceId, codexThreadRef"


def test_other_conflicts_keep_their_reason_and_carry_no_missing_fields() -> None:
    not_retryable = FailedPrecondition("task 'task-1' is running", reason="TASK_NOT_RETRYABLE").to_status()
    reused = AlreadyExists(
        "client_message_id was used for another message",
        reason="CLIENT_MESSAGE_ID_REUSED",
        violations=[FieldViolation("client_message_id", "already used for another message")],
    ).to_status()

    retry = problem_for_grpc_status("conversations", grpc.StatusCode.FAILED_PRECONDITION, "", not_retryable)
    repeat = problem_for_grpc_status("conversations", grpc.StatusCode.ALREADY_EXISTS, "", reused)

    assert (retry.status, retry.reason, retry.errors, retry.missing_fields) == (
        409,
        "TASK_NOT_RETRYABLE",
        [],
        None,
    )
    assert "missing_fields" not in retry.to_problem("/x").model_dump(exclude_none=True)
    assert (repeat.status, repeat.reason, [e.field for e in repeat.errors]) == (
        409,
        "CLIENT_MESSAGE_ID_REUSED",
        ["client_message_id"],
    )


def test_backend_field_names_can_be_renamed_to_the_rest_names() -> None:
    status = InvalidArgument([FieldViolation("after_sequence", "must not be negative")]).to_status()

    problem = problem_for_grpc_status(
        "conversations", grpc.StatusCode.INVALID_ARGUMENT, status.message, status
    ).with_fields_renamed({"after_sequence": "after"})

    assert [(e.field, e.detail) for e in problem.errors] == [("after", "must not be negative")]
    assert problem.detail == "after: must not be negative"


def test_a_bad_page_token_is_an_invalid_request_and_other_fields_stay_422() -> None:
    def invalid(field: str) -> ProblemError:
        status = InvalidArgument([FieldViolation(field, "bad")]).to_status()
        return problem_for_grpc_status("conversations", grpc.StatusCode.INVALID_ARGUMENT, "", status)

    token = invalid("page_token").as_invalid_request("page_token")
    size = invalid("page_size").as_invalid_request("page_token")

    assert (token.status, token.status_code, token.type) == (400, 400, PROBLEM_TYPE_BASE + "invalid-request")
    assert (size.status, size.type) == (422, PROBLEM_TYPE_BASE + "validation-error")


def test_body_limits_can_be_larger_for_some_paths() -> None:
    limit = BodySizeLimit(
        lambda *_: None,  # type: ignore[arg-type, return-value]
        max_bytes=64,
        larger=[(re.compile(r"/api/v1/projects/[^/]+/messages"), 1_000)],
    )

    assert limit.limit_for("/api/v1/projects/p-1/messages") == 1_000
    assert limit.limit_for("/api/v1/projects/p-1/messages/x") == 64
    assert limit.limit_for("/api/v1/projects") == 64
