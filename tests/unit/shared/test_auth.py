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
from services.shared.devices import DeviceRevocations
from services.shared.errors import PermissionDenied, Unauthenticated
from tests.metrics_support import metric_value, scrape

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


def test_a_worker_token_acts_for_its_owner_and_an_old_one_for_the_default_owner() -> None:
    authority = TokenAuthority(SECRET)
    enrolled = authority.verify(authority.issue_worker("w", "n", owner_id="alice", device_id="dev-1"))
    assert (enrolled.owner_id, enrolled.device_id, enrolled.owner_scope) == ("alice", "dev-1", "alice")
    legacy = authority.verify(
        authority.issue(
            kind="worker", subject="worker:w", scopes=[SCOPE_CONTEXT_REPORT], worker_id="w", node_id="n"
        )
    )
    assert (legacy.owner_id, legacy.device_id) == ("local", "")
    assert authority.verify(authority.issue_service("scheduler")).owner_scope is None


def test_require_kind_names_the_kinds_a_call_takes() -> None:
    authority = TokenAuthority(SECRET)
    client = authority.verify(authority.issue_client("owner-1"))
    client.require_kind("client", "service")
    with pytest.raises(PermissionDenied) as refused:
        client.require_kind("worker")
    assert refused.value.reason == "TOKEN_KIND_NOT_ALLOWED"
    assert refused.value.message == "this call takes a worker token, not a client token"


def test_a_revoked_devices_token_is_refused_and_other_tokens_are_not() -> None:
    revocations = DeviceRevocations()
    authority = TokenAuthority(SECRET, revocations)
    device_token = authority.issue_worker("w", "n", owner_id="alice", device_id="dev-1")
    automation_token = authority.issue_worker("w", "n", owner_id="alice")
    principal = authority.verify(device_token)
    revocations.revoke(["dev-1"])

    with pytest.raises(Unauthenticated) as refused:
        authority.verify(device_token)
    assert refused.value.reason == "DEVICE_REVOKED"
    with pytest.raises(Unauthenticated):
        authority.check_not_revoked(principal)  # a principal verified before the revocation too
    assert authority.verify(automation_token).device_id == ""


class CallContext:
    """The part of a gRPC servicer context `authorize_grpc` reads."""

    def __init__(self, token: str) -> None:
        self.token = token

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)


async def test_refused_credentials_are_counted_and_a_revoked_device_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    revocations = DeviceRevocations(["dev-9"])
    authority = TokenAuthority(SECRET, revocations)
    revoked = authority.issue_worker("w", "n", owner_id="alice", device_id="dev-9")
    expired = authority.issue_client("alice", lifetime=timedelta(seconds=-1))
    before = await scrape()
    caplog.set_level("INFO", logger="services.shared.auth")
    for token in (revoked, revoked, expired):
        with pytest.raises(Unauthenticated):
            authority.authorize_grpc(CallContext(token), SCOPE_CONTEXT_REPORT)  # type: ignore[arg-type]
    after = await scrape()

    def grown(reason: str) -> float:
        name = "boss_auth_refusals_total"
        return (metric_value(after, name, reason=reason) or 0) - (
            metric_value(before, name, reason=reason) or 0
        )

    assert (grown("DEVICE_REVOKED"), grown("TOKEN_EXPIRED")) == (2, 1)
    logged = [record.getMessage() for record in caplog.records if "refused a call" in record.getMessage()]
    assert len(logged) == 1 and "dev-9" in logged[0]
