"""Page tokens (AIP-158): keyset positions bound to the collection and owner they were made for.

A token is URL-safe base64 of JSON `{"k": kind, "v": [...position...], "o": owner digest}`. A token
made for another collection kind or owner, or malformed, is rejected with ValueError, which callers
turn into INVALID_ARGUMENT on `page_token`. Tokens are not signed: an edited token can only name a
position inside the caller's own list (reads are scoped by owner regardless), so it grants nothing;
context_budget's signed codec is the one to share when both move to services/shared.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any


def _owner_digest(owner_id: str) -> str:
    return hashlib.sha1(owner_id.encode()).hexdigest()[:12]


def encode_page_token(kind: str, owner_id: str, position: list[Any]) -> str:
    """A token that resumes `kind` (e.g. "conversations") for `owner_id` after `position`."""
    body = json.dumps({"k": kind, "o": _owner_digest(owner_id), "v": position}, separators=(",", ":"))
    return base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")


def decode_page_token(token: str, kind: str, owner_id: str, arity: int) -> list[Any]:
    """The position inside a token. Raises ValueError when the token is malformed, was made for
    another collection or owner, or does not hold `arity` values."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError) as error:
        raise ValueError("page_token is not a token this API handed out") from error
    if not isinstance(body, dict) or body.get("k") != kind or body.get("o") != _owner_digest(owner_id):
        raise ValueError("page_token belongs to another list")
    position = body.get("v")
    if not isinstance(position, list) or len(position) != arity:
        raise ValueError("page_token is not a token this API handed out")
    return position
