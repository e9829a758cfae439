"""Validation of commands: every bad field is reported at once, by name (INVALID_ARGUMENT)."""

from __future__ import annotations

from collections.abc import Sequence

from services.conversations.domain.model import AUTHOR_KINDS, MAX_MESSAGE_LENGTH, MAX_TITLE_LENGTH
from services.shared.errors import FieldViolation, InvalidArgument
from services.shared.identifiers import (
    control_character_problem,
    folder_problem,
    id_problem,
    thread_id_problem,
)


def check_id(name: str, value: str, violations: list[FieldViolation], required: bool = True) -> None:
    """Appends a violation when an id is missing (if required), too long, holds a control (C0,
    DEL, C1) or bidirectional formatting character (services/shared/identifiers.py), or has
    surrounding spaces."""
    if not value and not required:
        return
    if (problem := id_problem(value)) is not None:
        violations.append(FieldViolation(name, problem))
    elif value != value.strip():
        violations.append(FieldViolation(name, "must not have surrounding spaces"))


def check_thread_id(name: str, value: str, violations: list[FieldViolation], required: bool = True) -> None:
    """`check_id`, and the thread-id alphabet (services/shared/identifiers.py): a thread id must be
    one every client can open (no `/`, no bidirectional formatting)."""
    before = len(violations)
    check_id(name, value, violations, required)
    if len(violations) == before and (problem := thread_id_problem(value)) is not None:
        violations.append(FieldViolation(name, problem))


def check_title(name: str, value: str, violations: list[FieldViolation], required: bool = True) -> str:
    """The trimmed title; appends a violation when empty (if required), longer than 200 characters
    or holding a control (C0, DEL, C1) or bidirectional formatting character."""
    title = value.strip()
    if not title and required:
        violations.append(FieldViolation(name, "must not be empty"))
    elif len(title) > MAX_TITLE_LENGTH:
        violations.append(FieldViolation(name, f"must be at most {MAX_TITLE_LENGTH} characters"))
    elif (problem := control_character_problem(title)) is not None:
        violations.append(FieldViolation(name, problem))
    return title


def check_folder(name: str, value: str, violations: list[FieldViolation]) -> None:
    """Appends a violation when a Codex working folder is longer than 4,096 characters or holds a
    control character (services/shared/identifiers.py, as context_budget checks it)."""
    if (problem := folder_problem(value)) is not None:
        violations.append(FieldViolation(name, problem))


def check_page_size(value: int, default: int, maximum: int, violations: list[FieldViolation]) -> int:
    """The effective page size: 0 -> default, capped at maximum; negative is a violation."""
    if value < 0:
        violations.append(FieldViolation("page_size", "must not be negative"))
        return default
    return min(value or default, maximum)


def check_group_threads(thread_ids: Sequence[str], violations: list[FieldViolation]) -> list[str]:
    """Distinct thread ids in the order given; at least 2, at most 100."""
    distinct = list(dict.fromkeys(thread_ids))
    if len(distinct) < 2:
        violations.append(FieldViolation("thread_ids", "a group needs at least 2 distinct threads"))
    elif len(distinct) > 100:
        violations.append(FieldViolation("thread_ids", "a group holds at most 100 threads"))
    for index, thread_id in enumerate(thread_ids):
        check_id(f"thread_ids[{index}]", thread_id, violations)
    return distinct


def check_message(author_kind: str, text: str, violations: list[FieldViolation]) -> None:
    """author_kind one of user|thread|master|system; text 1-100,000 characters without NUL
    (PostgreSQL text cannot hold it; refused on every database alike)."""
    if author_kind not in AUTHOR_KINDS:
        violations.append(FieldViolation("author_kind", f"must be one of {', '.join(AUTHOR_KINDS)}"))
    if not text.strip():
        violations.append(FieldViolation("text", "must not be empty"))
    elif len(text) > MAX_MESSAGE_LENGTH:
        violations.append(FieldViolation("text", f"must be at most {MAX_MESSAGE_LENGTH} characters"))
    elif "\x00" in text:
        violations.append(FieldViolation("text", "must not contain NUL characters"))


def raise_if_any(violations: list[FieldViolation]) -> None:
    """Raises InvalidArgument with every violation, when there is any."""
    if violations:
        raise InvalidArgument(violations)
