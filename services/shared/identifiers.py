"""The alphabet of thread ids, and the characters no id may hold.

A thread id travels in URL paths (`/api/v1/threads/{thread_id}/...`), SQL text columns, event
payloads and the console, so every service accepts only thread ids that each of those carries
unchanged and every client can open:

- 1 to 200 characters from THREAD_ID_CHARACTERS: ASCII letters and digits and `- _ . : @ +`
  (Codex's thread ids are UUIDs, which fit);
- no `/` (a path segment could not name it), no control character (C0, DEL, C1; PostgreSQL text
  cannot hold NUL), no Unicode bidirectional control (they make a listed id display as another).

Any other id (project, node, worker, task, package, device, ...) is 1 to 200 characters of any text
but control and bidirectional formatting characters (`id_problem`).

Titles (of threads, projects, devices) follow the same character rule (`control_character_problem`);
a Codex working folder, a path on the worker's node, is at most MAX_FOLDER_LENGTH characters
without control characters (`folder_problem`: bidirectional formatting is a path's own business).
"""

from __future__ import annotations

import re
import string

MAX_ID_LENGTH = 200
MAX_FOLDER_LENGTH = 4_096
THREAD_ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_.:@+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069 (Unicode bidirectional formatting).
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def control_character_problem(value: str) -> str | None:
    """Why `value` may not be an id, or None: a control or bidirectional formatting character."""
    if _CONTROL.search(value):
        return "must not contain control characters"
    if _BIDI.search(value):
        return "must not contain bidirectional formatting characters"
    return None


def folder_problem(value: str) -> str | None:
    """Why `value` may not be a Codex working folder (module docstring), or None; an empty value is
    not checked here (required-ness is the caller's)."""
    if len(value) > MAX_FOLDER_LENGTH:
        return f"must be at most {MAX_FOLDER_LENGTH} characters"
    if _CONTROL.search(value):
        return "must not contain control characters"
    return None


def id_problem(value: str, limit: int = MAX_ID_LENGTH) -> str | None:
    """Why `value` may not be an id (module docstring) at most `limit` characters long, or None:
    empty ("is required"), too long, or holding a control or bidirectional formatting character.
    The value itself is never quoted, so the answer fits in any error."""
    if not value:
        return "is required"
    if len(value) > limit:
        return f"must be at most {limit} characters"
    return control_character_problem(value)


def thread_id_problem(value: str) -> str | None:
    """Why `value` may not be a thread id (module docstring), or None. An empty value is not
    checked here (required-ness is the caller's)."""
    if not value:
        return None
    unknown = id_problem(value)
    if unknown is not None:
        return unknown
    if "/" in value:
        return "must not contain '/'"
    if not set(value) <= THREAD_ID_CHARACTERS:
        return "may hold only ASCII letters, digits and - _ . : @ +"
    return None
