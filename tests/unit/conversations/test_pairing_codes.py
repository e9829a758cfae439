"""Pairing codes: their alphabet and shape, how an entered code is read, what is stored of it, and the
cut-off of a peer that keeps guessing."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.devices import (
    CODE_ALPHABET,
    FailedAttempts,
    code_hash,
    new_pairing_code,
    normalised_code,
    peer_address,
)
from services.shared.errors import ResourceExhausted


def test_a_code_is_eight_crockford_characters_with_a_dash() -> None:
    letters = itertools.cycle("K7QXM2PD")
    code = new_pairing_code(lambda alphabet: next(letters))
    assert code == "K7QX-M2PD"
    assert len(CODE_ALPHABET) == 32 and not set("ILOU") & set(CODE_ALPHABET)
    real = new_pairing_code()
    assert len(real) == 9 and real[4] == "-" and set(real.replace("-", "")) <= set(CODE_ALPHABET)


@pytest.mark.parametrize(
    ("entered", "stored"),
    [
        ("K7QX-M2PD", "K7QXM2PD"),
        ("k7qx m2pd", "K7QXM2PD"),
        ("O1IL-0000", "01110000"),  # Crockford's look-alikes
        ("K7QX-M2P", None),
        ("K7QX-M2PDX", None),
        ("K7QX-M2PU", None),  # U is not in the alphabet
        ("K7QX-M2P\x00", None),
    ],
)
def test_an_entered_code_is_read_as_crockford_base32(entered: str, stored: str | None) -> None:
    assert normalised_code(entered) == stored


def test_only_a_hash_of_the_code_is_stored() -> None:
    stored = code_hash("K7QXM2PD")
    assert len(stored) == 64 and "K7QXM2PD" not in stored
    assert stored == code_hash(normalised_code("k7qx-m2pd") or "")


def test_an_address_with_ten_wrong_codes_in_a_minute_is_cut_off_until_the_minute_has_passed() -> None:
    now = [datetime(2027, 1, 10, 12, 0, tzinfo=UTC)]
    attempts = FailedAttempts(limit=10, window=timedelta(seconds=60), clock=lambda: now[0])
    for port in range(10):
        now[0] += timedelta(seconds=1)
        attempts.begin(f"ipv4:10.0.0.1:{40000 + port}")  # a new connection, a new port, each time
    with pytest.raises(ResourceExhausted) as cut_off:
        attempts.begin("ipv4:10.0.0.1:50000")
    assert cut_off.value.reason == "PAIRING_ATTEMPTS_EXCEEDED"
    attempts.begin("ipv4:10.0.0.2:40000")  # another address is not affected
    now[0] += timedelta(seconds=51)  # the first failure is now a minute old
    attempts.begin("ipv4:10.0.0.1:50001")


def test_an_attempt_that_was_no_wrong_code_is_forgiven() -> None:
    attempts = FailedAttempts(limit=2, window=timedelta(seconds=60))
    for _ in range(5):
        attempts.forgive(attempts.begin("ipv4:10.0.0.1:40000"))
    attempts.begin("ipv4:10.0.0.1:40000")
    attempts.begin("ipv4:10.0.0.1:40001")  # counted from the start, before any answer: concurrent guesses too
    with pytest.raises(ResourceExhausted):
        attempts.begin("ipv4:10.0.0.1:40002")


def test_all_addresses_together_are_cut_off_after_the_overall_limit() -> None:
    now = [datetime(2027, 1, 10, 12, 0, tzinfo=UTC)]
    attempts = FailedAttempts(limit=10, overall_limit=100, window=timedelta(seconds=60), clock=lambda: now[0])
    for host in range(100):
        attempts.begin(f"ipv6:%5B2001:db8::{host:x}%5D:40000")
    with pytest.raises(ResourceExhausted) as cut_off:
        attempts.begin("ipv4:10.0.0.9:40000")
    assert "all addresses" in str(cut_off.value)
    now[0] += timedelta(seconds=60)
    attempts.begin("ipv4:10.0.0.9:40000")


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:127.0.0.1:46812", "ipv4:127.0.0.1"),
        ("ipv6:%5B::1%5D:33610", "ipv6:::1"),
        ("ipv6:[2001:db8::1]:33610", "ipv6:2001:db8::1"),
        ("ipv6:%5B::ffff:10.0.0.1%5D:33610", "ipv4:10.0.0.1"),  # IPv4-mapped: the same client as over IPv4
        ("unix:", "unix:"),
        ("unix:/run/boss.sock", "unix:/run/boss.sock"),
        ("", ""),
    ],
)
def test_the_address_of_a_peer_leaves_its_port_out(peer: str, address: str) -> None:
    assert peer_address(peer) == address
