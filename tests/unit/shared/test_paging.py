"""Page sizes and signed page tokens (AIP-158)."""

from __future__ import annotations

import pytest

from services.shared.errors import InvalidArgument
from services.shared.paging import PageTokenCodec, fingerprint, page_size_of


def test_page_size_defaults_and_caps() -> None:
    assert page_size_of(0) == 100
    assert page_size_of(7) == 7
    assert page_size_of(5_000) == 1_000
    with pytest.raises(InvalidArgument) as raised:
        page_size_of(-1)
    assert raised.value.violations[0].field == "page_size"


def test_token_round_trip() -> None:
    codec = PageTokenCodec("secret-secret-secret")
    filters = fingerprint("threads", "p1", ["a", "b"])
    token = codec.encode(["thread-9"], filters)
    assert codec.decode(token, filters) == ["thread-9"]


@pytest.mark.parametrize("token", ["garbage", "abc.def", "", "é.é", "eyJjIjpbXX0.AAAA"])
def test_foreign_or_malformed_tokens_are_rejected_naming_page_token(token: str) -> None:
    codec = PageTokenCodec("secret-secret-secret")
    with pytest.raises(InvalidArgument) as raised:
        codec.decode(token, fingerprint("x"))
    assert [v.field for v in raised.value.violations] == ["page_token"]


def test_tampered_and_foreign_key_tokens_are_rejected() -> None:
    codec = PageTokenCodec("secret-secret-secret")
    filters = fingerprint("x")
    token = codec.encode(["a"], filters)
    body, mac = token.split(".")
    other = PageTokenCodec("another-secret-value").encode(["a"], filters)
    for bad in (body + "x." + mac, other):
        with pytest.raises(InvalidArgument):
            codec.decode(bad, filters)


def test_token_for_other_filters_is_rejected() -> None:
    codec = PageTokenCodec("secret-secret-secret")
    token = codec.encode(["a"], fingerprint("threads", "p1", []))
    with pytest.raises(InvalidArgument) as raised:
        codec.decode(token, fingerprint("threads", "p2", []))
    assert "different filters" in raised.value.violations[0].description


def test_a_token_is_bound_to_its_service_and_its_owner_filters() -> None:
    """Conversations binds the home list's tokens to the owner through the filters fingerprint, and
    each service signs with its own key: neither another owner's nor another service's token works."""
    conversations = PageTokenCodec("the-shared-auth-secret-of-this-installation", "conversations")
    context_budget = PageTokenCodec("the-shared-auth-secret-of-this-installation", "context_budget")
    mine = fingerprint("conversations", "local")
    token = conversations.encode(["1", "2026-03-25T01:00:00+00:00", "proj-1"], mine)

    assert conversations.decode(token, mine) == ["1", "2026-03-25T01:00:00+00:00", "proj-1"]
    with pytest.raises(InvalidArgument, match="different filters"):
        conversations.decode(token, fingerprint("conversations", "mallory"))
    with pytest.raises(InvalidArgument, match="not a page token issued by this service"):
        context_budget.decode(token, mine)
