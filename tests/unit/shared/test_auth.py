"""Tokens: a worker token is bound to its worker and node, tokens expire, and a token signed with
another secret or of an unknown kind is refused."""

from __future__ import annotations

from datetime import timedelta

import jwt
import pytest

from services.shared.auth import (
    HANDOFF_CONSUME_SCOPES,
    SCOPE_CONTEXT_READ,
    SCOPE_CONTEXT_REPORT,
    SCOPE_SCHEDULER_READ,
    TokenAuthority,
)
from services.shared.errors import PermissionDenied, Unauthenticated

SECRET = "a-test-secret-of-enough-length-for-hs256"


def test_worker_token_is_bound_to_its_worker_and_node() -> None:
    authority = TokenAuthority(SECRET)
    principal = authority.verify(authority.issue_worker("worker-mac-01", "mac-01"))

    assert principal.kind == "worker"
    assert SCOPE_CONTEXT_REPORT in principal.scopes
    principal.require_worker("worker-mac-01", "mac-01")
    with pytest.raises(PermissionDenied, match="not 'worker-other'"):
        principal.require_worker("worker-other", "mac-01")
    with pytest.raises(PermissionDenied, match="not 'mac-02'"):
        principal.require_worker("worker-mac-01", "mac-02")
    principal.require_worker("worker-mac-01")  # the worker alone, its node not known yet
    with pytest.raises(PermissionDenied, match="not 'worker-other'"):
        principal.require_worker("worker-other")


def test_client_token_cannot_report_for_a_worker() -> None:
    authority = TokenAuthority(SECRET)
    principal = authority.verify(authority.issue_client("owner-1"))

    assert principal.owner_id == "owner-1"
    principal.require(SCOPE_CONTEXT_READ)
    with pytest.raises(PermissionDenied):
        principal.require(SCOPE_CONTEXT_REPORT)
    with pytest.raises(PermissionDenied):
        principal.require_worker("worker-mac-01", "mac-01")


def test_any_one_of_several_scopes_is_enough_and_none_names_them_all() -> None:
    authority = TokenAuthority(SECRET)
    worker = authority.verify(authority.issue_worker("worker-mac-01", "mac-01"))
    reader = authority.verify(
        authority.issue(kind="client", subject="client:r", scopes=[SCOPE_SCHEDULER_READ], owner_id="r")
    )

    worker.require_any(HANDOFF_CONSUME_SCOPES)  # handoff:write
    with pytest.raises(PermissionDenied) as refused:
        reader.require_any(HANDOFF_CONSUME_SCOPES)
    assert refused.value.reason == "SCOPE_MISSING"
    assert refused.value.message == (
        "token lacks scope 'scheduler:admin', 'handoff:write' or 'conversations:write'"
    )


def test_expired_and_foreign_tokens_are_refused() -> None:
    authority = TokenAuthority(SECRET)
    expired = authority.issue_worker("w", "n", lifetime=timedelta(seconds=-1))
    with pytest.raises(Unauthenticated, match="expired"):
        authority.verify(expired)

    foreign = TokenAuthority("another-secret-entirely-also-long-enough").issue_client("owner-1")
    with pytest.raises(Unauthenticated, match="invalid token"):
        authority.verify(foreign)


def test_unknown_kind_and_malformed_headers_are_refused() -> None:
    authority = TokenAuthority(SECRET)
    forged = jwt.encode(
        {"iss": "boss", "aud": "boss", "sub": "x", "exp": 4_102_444_800, "kind": "root"},
        SECRET,
        algorithm="HS256",
    )
    with pytest.raises(Unauthenticated, match="unknown kind"):
        authority.verify(forged)
    with pytest.raises(Unauthenticated, match="missing authorization"):
        authority.verify_header(None)
    with pytest.raises(Unauthenticated, match="Bearer"):
        authority.verify_header("Basic abc")


def test_short_secret_is_rejected() -> None:
    with pytest.raises(ValueError, match="too short"):
        TokenAuthority("short")
