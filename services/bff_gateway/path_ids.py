"""Ids in request paths: a path parameter holding a control or bidirectional formatting character
(a NUL sent as `%00`, say) is refused with 422 problem+json naming the parameter, before any
backend sees it (PostgreSQL cannot even hold NUL in text, which a backend would otherwise answer
as an internal error, 502 here). Installed for every route by `create_app`."""

from __future__ import annotations

from fastapi import Request

from services.bff_gateway.problems import ProblemError, ProblemFieldError
from services.shared.identifiers import control_character_problem


async def refuse_malformed_path_ids(request: Request) -> None:
    """Raises 422 (validation-error, reason INVALID_ARGUMENT) naming every path parameter that
    holds a control or bidirectional formatting character."""
    errors = [
        ProblemFieldError(field=name, detail=problem)
        for name, value in request.path_params.items()
        if isinstance(value, str) and (problem := control_character_problem(value)) is not None
    ]
    if errors:
        raise ProblemError(
            422,
            "validation-error",
            "; ".join(f"{error.field}: {error.detail}" for error in errors),
            title="Validation failed",
            errors=errors,
            reason="INVALID_ARGUMENT",
        )
