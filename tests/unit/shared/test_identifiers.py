"""`id_problem`: the one rule every service checks an id by (empty, too long, control or
bidirectional formatting characters), `thread_id_problem` built on it, and `folder_problem`."""

from __future__ import annotations

import pytest

from services.shared.identifiers import (
    MAX_FOLDER_LENGTH,
    MAX_ID_LENGTH,
    folder_problem,
    id_problem,
    thread_id_problem,
)


@pytest.mark.parametrize(
    "value", ["task-1", "x" * MAX_ID_LENGTH, "node a", "café", "0199c2a4-5b1e-7c2d-9e3f-a1b2c3d4e5f6"]
)
def test_an_id_of_printable_text_up_to_the_limit_has_no_problem(value: str) -> None:
    assert id_problem(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is required"),
        ("x" * (MAX_ID_LENGTH + 1), "must be at most 200 characters"),
        ("task\x00", "must not contain control characters"),
        ("task\x1b[2J", "must not contain control characters"),
        ("tab\tid", "must not contain control characters"),
        ("del\x7f", "must not contain control characters"),
        ("next\x85line", "must not contain control characters"),
        ("evil\u202etxt", "must not contain bidirectional formatting characters"),
        ("\u2066isolate", "must not contain bidirectional formatting characters"),
        ("mark\u200f", "must not contain bidirectional formatting characters"),
        ("arabic\u061c", "must not contain bidirectional formatting characters"),
    ],
    ids=["empty", "too-long", "nul", "escape", "tab", "del", "c1", "override", "isolate", "rlm", "alm"],
)
def test_an_id_problem_says_what_is_wrong_without_quoting_the_value(value: str, problem: str) -> None:
    assert id_problem(value) == problem


def test_a_limit_of_its_own_replaces_the_default_one() -> None:
    assert id_problem("l" * 64, limit=64) is None
    assert id_problem("l" * 65, limit=64) == "must be at most 64 characters"
    assert id_problem("", limit=64) == "is required"


def test_a_thread_id_has_every_id_problem_and_its_alphabet_besides() -> None:
    assert thread_id_problem("") is None  # required-ness is the caller's
    for value in ("x" * (MAX_ID_LENGTH + 1), "th\x1b", "th\u202e"):
        assert thread_id_problem(value) == id_problem(value)
    assert thread_id_problem("a/b") == "must not contain '/'"
    assert thread_id_problem("café") == "may hold only ASCII letters, digits and - _ . : @ +"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", None),
        ("/home/dev/north line", None),
        ("/home/dev/\u202eenil", None),  # a path's own characters: only control characters are refused
        ("/" + "f" * (MAX_FOLDER_LENGTH - 1), None),
        ("/" + "f" * MAX_FOLDER_LENGTH, f"must be at most {MAX_FOLDER_LENGTH} characters"),
        ("/home/dev/a\x00b", "must not contain control characters"),
        ("/home/dev/a\tb", "must not contain control characters"),
        ("/home/dev/a\x9bb", "must not contain control characters"),
    ],
)
def test_a_codex_folder_is_bounded_and_free_of_control_characters(value: str, problem: str | None) -> None:
    assert folder_problem(value) == problem
