"""AIP-158 pagination shared by every service: page sizes and opaque, tamper-proof page tokens.

A token is base64url(JSON {"c": cursor, "f": filter fingerprint}) followed by "." and a truncated
HMAC-SHA256 of that text. The cursor is the sort key of the last item served; the fingerprint binds
the token to the request's filters, so a token reused with other filters is rejected (AIP-158:
"the page token must be used with the same request parameters").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Sequence

from services.shared.errors import FieldViolation, InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1_000
_MAC_BYTES = 16


def page_size_of(requested: int, field: str = "page_size") -> int:
    """The effective page size: 0 means 100, larger than 1,000 is coerced to 1,000 (AIP-158).

    Raises:
        InvalidArgument: naming `field` when negative.
    """
    if requested < 0:
        raise InvalidArgument([FieldViolation(field, "must not be negative")])
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


def fingerprint(*parts: str | Sequence[str]) -> str:
    """A short digest of a request's filters (order of list items matters: sort them first)."""
    digest = hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()
    return digest[:16]


class PageTokenCodec:
    """Signs and checks page tokens with a key derived from the service's secret.

    Args:
        secret: the service's secret (the auth secret); tokens survive restarts as long as it does.
        purpose: which service's tokens these are; a token made by one is refused by another.
    """

    def __init__(self, secret: str, purpose: str = "context_budget") -> None:
        label = f"boss.{purpose}.page_token:".encode()
        self._key = hashlib.sha256(label + secret.encode()).digest()

    def _mac(self, body: bytes) -> str:
        mac = hmac.new(self._key, body, hashlib.sha256).digest()[:_MAC_BYTES]
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def encode(self, cursor: list[str], filters: str) -> str:
        """The token that resumes after `cursor` for requests with the `filters` fingerprint."""
        body = base64.urlsafe_b64encode(
            json.dumps({"c": cursor, "f": filters}, separators=(",", ":")).encode()
        ).rstrip(b"=")
        return f"{body.decode()}.{self._mac(body)}"

    def decode(self, token: str, filters: str, field: str = "page_token") -> list[str]:
        """The cursor inside `token`.

        Raises:
            InvalidArgument: naming `field` when the token is malformed, was not made here, or was
                made for other filters.
        """
        body_text, _, mac = token.partition(".")
        body = body_text.encode()
        if not mac or not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            raise InvalidArgument([FieldViolation(field, "is not a page token issued by this service")])
        try:
            decoded = json.loads(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))
        except (binascii.Error, ValueError) as error:
            raise InvalidArgument([FieldViolation(field, "is malformed")]) from error
        cursor = decoded.get("c") if isinstance(decoded, dict) else None
        if not isinstance(cursor, list) or not all(isinstance(item, str) for item in cursor):
            raise InvalidArgument([FieldViolation(field, "is malformed")])
        if decoded.get("f") != filters:
            raise InvalidArgument(
                [
                    FieldViolation(
                        field, "was issued for different filters: repeat the first request's filters"
                    )
                ]
            )
        return cursor
