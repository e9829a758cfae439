"""The task RPCs' cache of verified tokens: verified once, trusted for a while, never past expiry."""

from __future__ import annotations

from datetime import timedelta

import jwt
import pytest

from services.scheduler.tasks.servicer import VerifiedTokens
from services.shared.auth import TokenAuthority
from services.shared.errors import Unauthenticated

SECRET = "unit-secret-for-the-task-tokens-0123456789"


class Context:
    """The part of a gRPC servicer context the cache reads."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


class CountingAuthority(TokenAuthority):
    """A TokenAuthority that counts full verifications."""

    verifications = 0

    def verify_header(self, authorization: str | None):  # type: ignore[no-untyped-def]
        self.verifications += 1
        return super().verify_header(authorization)


def test_a_token_is_verified_once_then_trusted_until_the_ttl() -> None:
    authority = CountingAuthority(SECRET)
    now = [1_000_000.0]
    tokens = VerifiedTokens(authority, ttl=60, clock=lambda: now[0])
    context = Context(authority.issue_worker("w1", "n1"))
    first = tokens.verify(context)  # type: ignore[arg-type]
    assert (first.kind, first.worker_id, first.node_id) == ("worker", "w1", "n1")
    now[0] += 59
    assert tokens.verify(context) == first  # type: ignore[arg-type]
    assert authority.verifications == 1
    now[0] += 2
    assert tokens.verify(context) == first  # type: ignore[arg-type]
    assert authority.verifications == 2


def test_a_token_is_never_trusted_past_its_expiry() -> None:
    authority = CountingAuthority(SECRET)
    token = authority.issue_worker("w1", "n1", lifetime=timedelta(seconds=30))
    expires_at = float(jwt.decode(token, options={"verify_signature": False})["exp"])
    now = [expires_at - 30]
    tokens = VerifiedTokens(authority, ttl=3600, clock=lambda: now[0])
    tokens.verify(Context(token))  # type: ignore[arg-type]
    now[0] = expires_at - 1
    tokens.verify(Context(token))  # type: ignore[arg-type]
    assert authority.verifications == 1
    now[0] = expires_at
    tokens.verify(Context(token))  # type: ignore[arg-type]
    assert authority.verifications == 2


def test_a_bad_token_is_never_kept() -> None:
    authority = CountingAuthority(SECRET)
    tokens = VerifiedTokens(authority)
    forged = TokenAuthority("another-secret-that-is-long-enough-0123").issue_worker("w1", "n1")
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            tokens.verify(Context(forged))  # type: ignore[arg-type]
    assert authority.verifications == 2
