"""Every error the gateway answers is `application/problem+json` (RFC 9457).

Body: `type` (a URI naming the kind of problem), `title`, `status`, `detail`, `instance` (the
request path), `errors` (one `{field, detail}` per bad field, field names as in the JSON body;
empty when no field is to blame) and, when known, `reason` (the machine-readable ErrorInfo reason,
e.g. "WORKER_MISMATCH"). A 409 whose backend attached a google.rpc.PreconditionFailure lists each
violation in `errors` (`field` = the violation's subject); for THREAD_METADATA_INCOMPLETE,
`missing_fields` names the thread's missing metadata fields as well (e.g. `["codexThreadRef"]`).

Status mapping (ARCHITECTURE.md "Contracts"):

| cause | HTTP |
|---|---|
| malformed JSON, path/body disagreement | 400 |
| no or bad token; gRPC UNAUTHENTICATED | 401 + `WWW-Authenticate: Bearer` |
| token not allowed; gRPC PERMISSION_DENIED | 403 |
| unknown route or resource; gRPC NOT_FOUND | 404 |
| gRPC FAILED_PRECONDITION, ALREADY_EXISTS, ABORTED | 409 |
| body over the limit (64 KiB by default; 800,000 bytes for a chat send) | 413 |
| wrong type, out of range, unknown enum or field; gRPC INVALID_ARGUMENT, OUT_OF_RANGE | 422 |
| gRPC RESOURCE_EXHAUSTED | 429 + `Retry-After` |
| gRPC UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS | 502 |
| gRPC UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED | 503 + `Retry-After` |

A backend's ErrorInfo reason is passed on unchanged, so gRPC and HTTP callers see the same one. A 404
names what is unknown (services/shared/errors.py):

| unknown | reason |
|---|---|
| thread (never reported, never registered, or another owner's) | THREAD_NOT_FOUND |
| project (or another owner's) | PROJECT_NOT_FOUND |
| handoff package (or one of another owner's thread) | PACKAGE_NOT_FOUND |
| chat task (or another owner's) | TASK_NOT_FOUND |
| alert | ALERT_NOT_FOUND |
| worker command | COMMAND_NOT_FOUND |
| route | none |
"""

from __future__ import annotations

import http
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from google.rpc import status_pb2
from grpc_status import rpc_status
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from services.bff_gateway.mapping import json_field_of
from services.shared.errors import BossError, field_violations_of, precondition_violations_of, reason_of

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://boss.dev/problems/"
DEFAULT_RETRY_AFTER_SECONDS = 5
THREAD_METADATA_INCOMPLETE = "THREAD_METADATA_INCOMPLETE"


class ProblemFieldError(BaseModel):
    """One offending field: its name as in the JSON body (or the path parameter) and why."""

    field: str
    detail: str


class Problem(BaseModel):
    """RFC 9457 problem details, plus the offending fields and the machine-readable reason."""

    type: str = Field(description="URI naming the kind of problem.")
    title: str = Field(description="Short summary of the kind of problem.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong with this request.")
    instance: str = Field(description="The request path.")
    errors: list[ProblemFieldError] = Field(default_factory=list, description="Offending fields, if any.")
    reason: str | None = Field(default=None, description="Machine-readable reason, e.g. WORKER_MISMATCH.")
    missing_fields: list[str] | None = Field(
        default=None,
        description=(
            "THREAD_METADATA_INCOMPLETE only: the thread's missing metadata fields, as the chat "
            "task names them (deviceId, codexFolderRef, codexThreadRef)."
        ),
    )


class ProblemError(StarletteHTTPException):
    """An error answered as problem+json. Subclasses Starlette's HTTPException so that FastAPI lets
    it through unchanged even when raised while the request body is read."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        errors: Sequence[ProblemFieldError] = (),
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
        missing_fields: Sequence[str] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=dict(headers or {}))
        self.status = status
        self.type = PROBLEM_TYPE_BASE + slug
        self.title = title or http.HTTPStatus(status).phrase
        self.errors = list(errors)
        self.reason = reason
        self.missing_fields = list(missing_fields) if missing_fields is not None else None

    def to_problem(self, instance: str) -> Problem:
        """The problem body for the request at path `instance`."""
        return Problem(
            type=self.type,
            title=self.title,
            status=self.status,
            detail=str(self.detail),
            instance=instance,
            errors=self.errors,
            reason=self.reason,
            missing_fields=self.missing_fields,
        )

    def with_fields_renamed(self, names: Mapping[str, str]) -> ProblemError:
        """This problem with the fields of `errors` renamed (a backend's request field -> the REST
        field the caller wrote, e.g. "after_sequence" -> "after"), `detail` following. Returns self."""
        renamed = [
            ProblemFieldError(field=names.get(error.field, error.field), detail=error.detail)
            for error in self.errors
        ]
        if renamed != self.errors:
            self.errors = renamed
            self.detail = "; ".join(f"{e.field}: {e.detail}" for e in renamed)
        return self

    def as_invalid_request(self, field: str) -> ProblemError:
        """A 422 naming `field` becomes 400 invalid-request (a value the caller did not make up,
        such as a page_token this API handed out, is wrong: the request, not a field, is bad).
        Anything else is returned unchanged. Returns self."""
        if self.status == 422 and any(error.field == field for error in self.errors):
            self.status = self.status_code = 400
            self.type = PROBLEM_TYPE_BASE + "invalid-request"
            self.title = "Invalid request"
        return self


def problem_response(error: ProblemError, instance: str) -> Response:
    """The HTTP response for `error` (problem+json, with the error's headers)."""
    body = error.to_problem(instance).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=error.status, headers=error.headers, media_type=PROBLEM_MEDIA_TYPE)


# Constructors for the gateway's own problems -------------------------------------------------------


def unauthenticated(detail: str, *, token_sent: bool, reason: str | None = None) -> ProblemError:
    """401 with the RFC 6750 challenge (`error="invalid_token"` when a token was sent but refused)."""
    challenge = 'Bearer realm="boss", error="invalid_token"' if token_sent else 'Bearer realm="boss"'
    return ProblemError(
        401,
        "unauthenticated",
        detail,
        title="Unauthenticated",
        reason=reason,
        headers={"WWW-Authenticate": challenge},
    )


def forbidden(detail: str, *, reason: str | None = None, fields: Sequence[str] = ()) -> ProblemError:
    """403; `fields` names the body fields the token does not cover (e.g. worker_id, node_id)."""
    errors = [ProblemFieldError(field=name, detail=detail) for name in fields]
    return ProblemError(403, "forbidden", detail, title="Forbidden", errors=errors, reason=reason)


def invalid_request(field: str, detail: str, *, reason: str | None = None) -> ProblemError:
    """400 naming one field (e.g. a path parameter that disagrees with the body)."""
    return ProblemError(
        400,
        "invalid-request",
        f"{field}: {detail}",
        title="Invalid request",
        errors=[ProblemFieldError(field=field, detail=detail)],
        reason=reason,
    )


def content_too_large(max_bytes: int) -> ProblemError:
    """413 for a body over `max_bytes`."""
    return ProblemError(
        413, "content-too-large", f"request body is larger than {max_bytes} bytes", title="Content too large"
    )


def service_unavailable(service: str, retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS) -> ProblemError:
    """503 with Retry-After: a backend the gateway needs cannot be reached."""
    return ProblemError(
        503,
        "service-unavailable",
        f"{service} is unavailable; retry in {retry_after_seconds} s",
        title="Service unavailable",
        headers={"Retry-After": str(retry_after_seconds)},
    )


def problem_for_boss_error(error: BossError) -> ProblemError:
    """The problem for a BossError raised inside the gateway (token checks)."""
    status = _HTTP_STATUS_OF_CODE.get(error.code, 502)
    if status == 401:
        return unauthenticated(error.message, token_sent=error.reason != "TOKEN_MISSING", reason=error.reason)
    slug, title = _SLUG_AND_TITLE[status]
    return ProblemError(status, slug, error.message, title=title, reason=error.reason)


# Request validation ------------------------------------------------------------------------------

_LOCATIONS = {"body", "path", "query", "header", "cookie"}


def _field_of(loc: Sequence[Any]) -> str:
    """The field a pydantic/FastAPI error location names: ("body", "captured_at") -> "captured_at";
    list indices become "[i]"; pydantic's internal type tags are dropped; the body itself -> "body"."""
    parts = list(loc)
    where = parts.pop(0) if parts and parts[0] in _LOCATIONS else "body"
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            name += f".{part}" if name else part
    return name or where


def _detail_of(error: Mapping[str, Any]) -> str:
    """A short reason for one pydantic error, without pydantic's "Value error, " prefix."""
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required"
    message = str(error.get("msg", "invalid"))
    return message.removeprefix("Value error, ")


def problem_for_request_validation(errors: Sequence[Mapping[str, Any]]) -> ProblemError:
    """400 for a body that is not JSON at all (reason MALFORMED_JSON); otherwise 422 with one entry
    per offending field (reason INVALID_ARGUMENT, as a backend's field violations carry)."""
    for error in errors:
        if error.get("type") == "json_invalid":
            position = error["loc"][-1] if error.get("loc") else "?"
            reason = (error.get("ctx") or {}).get("error", "invalid JSON")
            return ProblemError(
                400,
                "malformed-json",
                f"request body is not valid JSON: {reason} at position {position}",
                title="Malformed JSON",
                errors=[ProblemFieldError(field="body", detail=str(reason))],
                reason="MALFORMED_JSON",
            )
    field_errors = [
        ProblemFieldError(field=_field_of(e.get("loc", ())), detail=_detail_of(e)) for e in errors
    ]
    detail = "; ".join(f"{e.field}: {e.detail}" for e in field_errors) or "invalid request"
    return ProblemError(
        422,
        "validation-error",
        detail,
        title="Validation failed",
        errors=field_errors,
        reason="INVALID_ARGUMENT",
    )


# gRPC errors from backends -----------------------------------------------------------------------

_HTTP_STATUS_OF_CODE: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 422,
    grpc.StatusCode.OUT_OF_RANGE: 422,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
    grpc.StatusCode.CANCELLED: 503,
}

_SLUG_AND_TITLE: dict[int, tuple[str, str]] = {
    400: ("invalid-request", "Invalid request"),
    401: ("unauthenticated", "Unauthenticated"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    409: ("conflict", "Conflict"),
    422: ("validation-error", "Validation failed"),
    429: ("too-many-requests", "Too many requests"),
    502: ("upstream-error", "Bad gateway"),
    503: ("service-unavailable", "Service unavailable"),
}


def problem_for_grpc_status(
    service: str,
    code: grpc.StatusCode,
    message: str,
    status: status_pb2.Status | None,
    *,
    retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS,
) -> ProblemError:
    """The problem for a failed call to backend `service` (pure: the caller extracts `status`, the
    rich google.rpc.Status, from the call's trailers; None when there was none).

    Field violations become `errors` with JSON field names (json_field_of); PreconditionFailure
    violations follow them (`field` = the violation's subject), and with reason
    THREAD_METADATA_INCOMPLETE their subjects are the problem's `missing_fields`. Messages of 4xx-class
    codes are passed on (they are written for callers); 5xx-class ones are not (they can carry
    internal addresses or exception text) and are logged instead.
    """
    http_status = _HTTP_STATUS_OF_CODE.get(code, 502)
    reason = reason_of(status)
    if http_status == 503:
        log.warning("%s unavailable (%s): %s", service, code.name, message)
        return service_unavailable(service, retry_after_seconds)
    if http_status == 502:
        log.error("%s failed with %s: %s", service, code.name, message)
        return ProblemError(502, "upstream-error", f"{service} failed ({code.name})", title="Bad gateway")
    if http_status == 401:
        return unauthenticated(message, token_sent=True, reason=reason)
    slug, title = _SLUG_AND_TITLE[http_status]
    violations = field_violations_of(status) if status is not None else []
    errors = [ProblemFieldError(field=json_field_of(v.field), detail=v.description) for v in violations]
    detail = "; ".join(f"{e.field}: {e.detail}" for e in errors) if errors else message or code.name
    preconditions = precondition_violations_of(status) if status is not None else []
    errors += [ProblemFieldError(field=v.subject or v.type, detail=v.description) for v in preconditions]
    missing = [v.subject for v in preconditions] if reason == THREAD_METADATA_INCOMPLETE else None
    headers = {"Retry-After": str(retry_after_seconds)} if http_status == 429 else None
    return ProblemError(
        http_status,
        slug,
        detail,
        title=title,
        errors=errors,
        reason=reason,
        headers=headers,
        missing_fields=missing,
    )


def problem_for_rpc_error(
    service: str, error: grpc.aio.AioRpcError, *, retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS
) -> ProblemError:
    """The problem for a failed grpc.aio call: reads the rich status from the trailers."""
    try:
        status = rpc_status.from_call(error)
    except ValueError:
        status = None
    return problem_for_grpc_status(
        service, error.code(), error.details() or "", status, retry_after_seconds=retry_after_seconds
    )


# Handlers, middleware and OpenAPI ------------------------------------------------------------------


def install_problem_handlers(app: FastAPI) -> None:
    """Makes every error of `app` problem+json: ProblemError, request validation, Starlette's
    HTTPException (404/405 from routing) and, as 500, anything unexpected."""

    async def on_problem(request: Request, error: Exception) -> Response:
        assert isinstance(error, ProblemError)
        return problem_response(error, request.url.path)

    async def on_validation(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        return problem_response(problem_for_request_validation(error.errors()), request.url.path)

    async def on_http(request: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        slug, title = _SLUG_AND_TITLE.get(
            error.status_code, ("http-error", http.HTTPStatus(error.status_code).phrase)
        )
        problem = ProblemError(error.status_code, slug, str(error.detail), title=title, headers=error.headers)
        return problem_response(problem, request.url.path)

    async def on_unexpected(request: Request, error: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
        problem = ProblemError(500, "internal-error", "internal error", title="Internal server error")
        return problem_response(problem, request.url.path)

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


class BodySizeLimit:
    """ASGI middleware: request bodies over `max_bytes` get 413 problem+json. A declared
    Content-Length over the limit is refused before anything is read; a chunked body is counted
    as it is read and refused once it passes the limit.

    `larger` raises the limit for some paths: (a regular expression the whole path matches, its
    limit in bytes), the first match winning; e.g. a chat message of up to 100,000 characters,
    which a 64 KiB limit would cut short of the route's own 422 naming `text`."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, larger: Sequence[tuple[re.Pattern[str], int]] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = tuple(larger)

    def limit_for(self, path: str) -> int:
        """The body limit of a request to `path`, in bytes."""
        for pattern, max_bytes in self.larger:
            if pattern.fullmatch(path):
                return max(max_bytes, self.max_bytes)
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit_for(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            await problem_response(content_too_large(max_bytes), scope["path"])(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise content_too_large(max_bytes)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared Content-Length of a request, or None (absent or unparsable)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON, or a path parameter that disagrees with the body.",
    401: "No valid bearer token.",
    403: "The token does not allow this (wrong kind, scope, worker or node).",
    404: "Unknown resource or route.",
    409: "The resource is not in a state that allows this.",
    413: "Request body too large.",
    422: "A field has the wrong type, is out of range, is unknown or is missing; `errors` names each.",
    429: "The backend is overloaded; retry after Retry-After seconds.",
    502: "A backend failed.",
    503: "A backend is unavailable; retry after Retry-After seconds.",
}

_RETRY_AFTER_HEADER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer challenge (RFC 6750).", "schema": {"type": "string"}}},
    429: _RETRY_AFTER_HEADER,
    503: _RETRY_AFTER_HEADER,
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses, each a problem+json body (see
    use_problem_media_type, which moves the schema to that media type)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": Problem, "description": _DESCRIPTIONS[status]}
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        responses[status] = entry
    return responses


def use_problem_media_type(openapi: dict[str, Any]) -> dict[str, Any]:
    """Rewrites an OpenAPI document in place so that every 4xx/5xx response body is declared as
    `application/problem+json` (FastAPI declares `application/json`). Returns the document."""
    for path_item in openapi.get("paths", {}).values():
        for operation in path_item.values():
            if not isinstance(operation, dict):
                continue
            for status, response in operation.get("responses", {}).items():
                content = response.get("content")
                if status[:1] in {"4", "5"} and content and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    return openapi
