"""JSON request bodies read after the caller is authorised.

FastAPI reads and validates a body parameter declared in a route's signature before any dependency
or route code runs, so a caller whose token lacks the route's scope would be answered 400 (malformed
JSON) or 422 (invalid fields) instead of 401 / 403. Routes with a body therefore take the `Request`,
authenticate (the `CallerDep` dependency) and check the scope first, and only then read the body:

    @router.post("/things", openapi_extra=json_body_openapi(ThingBody))
    async def create_thing(request: Request, caller: CallerDep) -> ...:
        caller.require(SCOPE_THINGS_WRITE)
        body = await read_json_body(request, ThingBody)

The body is read and checked as FastAPI would have done it (same statuses, same problem+json:
400 MALFORMED_JSON, 422 naming each field, 413 from BodySizeLimit), and stays documented in OpenAPI:
`json_body_openapi` gives the operation's `requestBody` and `add_body_schemas` puts the model's
schema in `components/schemas`, normalised as FastAPI normalises the schemas of declared bodies.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.models import Schema
from pydantic import BaseModel, ValidationError

from services.bff_gateway.problems import ProblemError, problem_for_request_validation

ModelT = TypeVar("ModelT", bound=BaseModel)

REF_TEMPLATE = "#/components/schemas/{model}"
"""Where OpenAPI references of request body models point (FastAPI's template)."""

_DOCUMENTED_MODELS: dict[str, type[BaseModel]] = {}
"""Body models documented by `json_body_openapi`, by schema name (the class name)."""


def json_body_openapi(model: type[BaseModel], *, required: bool = True) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads `model` with `read_json_body` (or, when not
    `required`, `read_optional_json_body`): the `requestBody` FastAPI would write for a body
    parameter of type `model` (`model | None = None` when not required). Also records `model` so
    that `add_body_schemas` can put its schema in the document's components.

    Raises ValueError when another model of the same class name (from another module) was
    documented already: their schemas would overwrite each other in components.
    """
    known = _DOCUMENTED_MODELS.get(model.__name__)
    if known is not None and (known.__module__, known.__qualname__) != (model.__module__, model.__qualname__):
        raise ValueError(f"two request body models are named {model.__name__!r}")
    _DOCUMENTED_MODELS[model.__name__] = model
    reference: dict[str, Any] = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    if required:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": reference}}}}
    optional = {"anyOf": [reference, {"type": "null"}], "title": "Body"}
    return {"requestBody": {"content": {"application/json": {"schema": optional}}}}


def add_body_schemas(document: dict[str, Any]) -> dict[str, Any]:
    """Adds to an OpenAPI `document` (in place) the `components/schemas` entries of every model
    `json_body_openapi` documented that a request body of the document references and components
    lack, with the models they nest. Schemas are normalised as FastAPI normalises the schemas it
    generates itself (numbers as floats, no null defaults). Returns the document."""
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    for name in sorted(set(_request_body_references(document))):
        model = _DOCUMENTED_MODELS.get(name)
        if model is None or name in schemas:
            continue
        generated = model.model_json_schema(ref_template=REF_TEMPLATE, mode="validation")
        nested = generated.pop("$defs", {})
        for schema_name, schema in {name: generated, **nested}.items():
            schemas.setdefault(
                schema_name, jsonable_encoder(Schema(**schema), by_alias=True, exclude_none=True)
            )
    document["components"]["schemas"] = dict(sorted(schemas.items()))
    return document


def _request_body_references(document: Mapping[str, Any]) -> Iterator[str]:
    """The component names referenced (`$ref`, at any depth) by the request bodies of `document`."""
    for path_item in document.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict) and "requestBody" in operation:
                yield from _references(operation["requestBody"])


def _references(node: Any) -> Iterator[str]:
    """Component names of every `$ref` in a JSON value."""
    if isinstance(node, dict):
        reference = node.get("$ref")
        if isinstance(reference, str) and reference.startswith("#/components/schemas/"):
            yield reference.removeprefix("#/components/schemas/")
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


async def read_json_body(request: Request, model: type[ModelT]) -> ModelT:
    """The request's JSON body as `model`, read now (call it after the caller was authorised).

    Raises ProblemError: 413 when the body is over the app's limit (BodySizeLimit), 400
    MALFORMED_JSON when a JSON body does not parse, 422 INVALID_ARGUMENT naming every offending
    field (an empty body is `body: required`; a body sent without a JSON Content-Type is checked as
    raw bytes and fails, as with FastAPI's strict content type).
    """
    value = await _decoded_body(request)
    if value is _EMPTY:
        raise problem_for_request_validation([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    return _validated(model, value)


async def read_optional_json_body(request: Request, model: type[ModelT]) -> ModelT | None:
    """Like `read_json_body`, for a body that may be left out: None for an empty body or JSON null.
    Raises ProblemError (413, 400, 422) as `read_json_body` does."""
    value = await _decoded_body(request)
    if value is _EMPTY or value is None:
        return None
    return _validated(model, value)


_EMPTY = object()
"""What `_decoded_body` returns for a request without a body."""


async def _decoded_body(request: Request) -> Any:
    """The body as FastAPI would pass it to validation: `_EMPTY` when there is none, the parsed
    JSON value when the Content-Type is application/json or `+json`, else the raw bytes. Raises
    ProblemError 400 for JSON that does not parse (MALFORMED_JSON) or a body that is not text or
    nests too deep (as FastAPI answers those), and 413 from the size limit while reading."""
    raw = await request.body()
    if not raw:
        return _EMPTY
    content_type = request.headers.get("content-type")
    if not content_type:
        return raw
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    is_json = subtype == "json" or subtype.endswith("+json")
    if message.get_content_maintype() != "application" or not is_json:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise problem_for_request_validation(
            [{"type": "json_invalid", "loc": ("body", error.pos), "ctx": {"error": error.msg}}]
        ) from error
    except (ValueError, RecursionError) as error:  # not UTF-8/16/32 text, or nested too deep
        raise ProblemError(
            400, "invalid-request", "There was an error parsing the body", title="Invalid request"
        ) from error


def _validated(model: type[ModelT], value: Any) -> ModelT:
    """`value` validated as `model`. Raises ProblemError 422 naming each offending field."""
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as error:
        errors = [{**entry, "loc": ("body", *entry["loc"])} for entry in error.errors(include_url=False)]
        raise problem_for_request_validation(errors) from error
