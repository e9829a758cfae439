"""The device registry: pairing codes, enrollment, the owner's device list and revocation.

How a device is enrolled (the way Happy and Vibe Kanban pair devices):

1. The owner asks for a pairing code (`CreatePairingCode`, from the console or the gateway's CLI):
   8 characters of Crockford base32 (40 bits from `secrets`), shown as XXXX-XXXX, valid for
   PAIRING_CODE_LIFETIME (10 minutes). Only its SHA-256 is stored, so a copy of the database
   holds no usable code.
2. On the node, `python -m worker enroll CODE` calls `EnrollDevice` with the code, its node id and
   worker id. In one transaction the code is marked used (only if unused and unexpired: a code
   works once, also when two nodes race with it) and the device is stored; after the commit the
   node gets its credential, a worker token bound to the node, the worker and the code's owner
   that names the new device_id (DEVICE_TOKEN_LIFETIME, 365 days). The owner therefore comes from
   the code, never from the node.
3. The owner lists devices (`ListDevices`) and revokes one (`RevokeDevice`): the revocation is
   stored with a `device.revoked` event in one transaction; this service refuses the device's
   token right after the commit, and context_budget and the scheduler as soon as they apply the
   event (services/shared/devices.py), ending the device's open streams too.

Guessing codes: an unknown, used or expired code is refused with one and the same answer
(PERMISSION_DENIED, reason PAIRING_CODE_INVALID). Every attempt counts as a wrong code from the
moment it is checked (so concurrent guesses count too) until it turns out not to be one. An address
that sent MAX_FAILED_ATTEMPTS (10) wrong codes within FAILED_ATTEMPT_WINDOW (60 s) is refused
(RESOURCE_EXHAUSTED) until the window has passed; the address is the peer's without its port
(`peer_address`), so a new connection per guess does not start afresh. Since an attacker may hold
many addresses (an IPv6 prefix, a botnet), all addresses together get MAX_FAILED_ATTEMPTS_OVERALL
(100) wrong codes in the window, after which every enrollment waits for the window to pass: a wrong
code names no owner, so there is no finer bound. At 100 guesses a minute, finding one of 1,000 live
codes among 2^40 takes about 20 years; the price is that such a flood delays honest enrollments by
up to a minute at a time.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

from sqlalchemy import and_, insert, select, update
from sqlalchemy.exc import IntegrityError

from services.conversations.adapters.tables import devices, pairing_codes
from services.conversations.domain.validation import check_id, check_title, raise_if_any
from services.shared.auth import TokenAuthority
from services.shared.db import Database
from services.shared.devices import DEVICE_REVOKED_EVENT, DeviceRevocations
from services.shared.errors import (
    AlreadyExists,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from services.shared.outbox import EventLog, NewEvent
from services.shared.time import isoformat_utc, utc_now

log = logging.getLogger(__name__)

CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
"""Crockford's base32: no I, L, O or U, so a code read aloud or retyped is hard to get wrong."""
CODE_LENGTH = 8
PAIRING_CODE_LIFETIME = timedelta(minutes=10)
DEVICE_TOKEN_LIFETIME = timedelta(days=365)
MAX_FAILED_ATTEMPTS = 10
MAX_FAILED_ATTEMPTS_OVERALL = 100
FAILED_ATTEMPT_WINDOW = timedelta(seconds=60)
DEVICE_ENROLLED_EVENT = "device.enrolled"
DEVICE_NOT_FOUND = "DEVICE_NOT_FOUND"
PAIRING_CODE_INVALID = "PAIRING_CODE_INVALID"
# Crockford's decoding of the letters it leaves out.
_LOOKALIKES = str.maketrans({"O": "0", "I": "1", "L": "1"})

Row = dict[str, Any]


def new_pairing_code(choose: Callable[[str], str] = secrets.choice) -> str:
    """A fresh code, e.g. "K7QX-M2PD": CODE_LENGTH characters of CODE_ALPHABET drawn with `choose`
    (`secrets.choice`: 5 bits each, 40 in all), a dash in the middle."""
    characters = "".join(choose(CODE_ALPHABET) for _ in range(CODE_LENGTH))
    return f"{characters[:4]}-{characters[4:]}"


def normalised_code(entered: str) -> str | None:
    """The code as stored (upper case, without dashes or spaces, Crockford's look-alikes mapped:
    O -> 0, I and L -> 1), or None when it cannot be a code (wrong length or characters)."""
    text = entered.replace("-", "").replace(" ", "").upper().translate(_LOOKALIKES)
    if len(text) != CODE_LENGTH or any(character not in CODE_ALPHABET for character in text):
        return None
    return text


def code_hash(normalised: str) -> str:
    """What is stored of a code: SHA-256 of its normalised form, hex."""
    return hashlib.sha256(normalised.encode()).hexdigest()


def peer_address(peer: str) -> str:
    """The client's address in a gRPC peer string, without its port: "ipv4:127.0.0.1:46812" ->
    "ipv4:127.0.0.1"; "ipv6:%5B::1%5D:33610" (or "ipv6:[::1]:33610") -> "ipv6:::1"; an IPv4-mapped
    IPv6 address -> its "ipv4:" form; anything else ("unix:", "unix:/path", "") as it is."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return peer
    host = unquote(rest).rpartition(":")[0].removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return f"ipv{address.version}:{address}"


@dataclass(frozen=True)
class Attempt:
    """One counted attempt: the address it came from and when (what `FailedAttempts.forgive` takes)."""

    address: str
    at: datetime


class FailedAttempts:
    """Wrong pairing codes per address and overall in a sliding window (in memory, per process;
    module docstring).

    Args:
        limit: wrong codes allowed per address (`peer_address`) within `window`.
        overall_limit: wrong codes allowed from all addresses together within `window`.
        window: the sliding window.
        clock: the current instant (aware UTC).
    """

    def __init__(
        self,
        limit: int = MAX_FAILED_ATTEMPTS,
        overall_limit: int = MAX_FAILED_ATTEMPTS_OVERALL,
        window: timedelta = FAILED_ATTEMPT_WINDOW,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._limit = limit
        self._overall_limit = overall_limit
        self._window = window
        self._clock = clock
        self._failures: dict[str, deque[datetime]] = {}
        self._overall: deque[datetime] = deque()

    def begin(self, peer: str) -> Attempt:
        """Counts an attempt of `peer` (a gRPC peer string) as a wrong code until it is forgiven.
        Raises ResourceExhausted (reason PAIRING_ATTEMPTS_EXCEEDED) when its address, or all
        addresses together, used up their wrong codes in the window."""
        now = self._clock()
        address = peer_address(peer)
        self._expire(self._overall, now)
        failures = self._expire(self._failures.get(address, deque()), now)
        for counted, limit, whose in (
            (failures, self._limit, "from this address"),
            (self._overall, self._overall_limit, "from all addresses"),
        ):
            if len(counted) >= limit:
                retry_in = int((counted[0] + self._window - now).total_seconds()) + 1
                raise ResourceExhausted(
                    f"too many wrong pairing codes {whose}: try again in {retry_in} s",
                    reason="PAIRING_ATTEMPTS_EXCEEDED",
                )
        if len(self._failures) > self._overall_limit:
            self._forget_quiet_addresses(now)
        self._failures.setdefault(address, failures).append(now)
        self._overall.append(now)
        return Attempt(address, now)

    def forgive(self, attempt: Attempt) -> None:
        """Stops counting `attempt`: it was no wrong code (enrolled, or refused for another field)."""
        for counted in (self._failures.get(attempt.address), self._overall):
            if counted is not None and attempt.at in counted:
                counted.remove(attempt.at)

    def _expire(self, failures: deque[datetime], now: datetime) -> deque[datetime]:
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        return failures

    def _forget_quiet_addresses(self, now: datetime) -> None:
        """Drops the addresses without a wrong code in the window: at most `overall_limit` have
        one, so the table stays that small."""
        for address in [a for a, failures in self._failures.items() if not self._expire(failures, now)]:
            del self._failures[address]


@dataclass(frozen=True)
class Enrollment:
    """What EnrollDevice answers: the stored device and its credential (a worker token)."""

    device: Row
    worker_token: str
    token_expires_at: datetime


def device_payload(device: Row) -> dict[str, Any]:
    """The payload of `device.enrolled` / `device.revoked`: owner_id, device_id, node_id,
    worker_id, device_name, enrolled_at and revoked_at (RFC 3339 UTC, null while active)."""
    return {
        "owner_id": device["owner_id"],
        "device_id": device["device_id"],
        "node_id": device["node_id"],
        "worker_id": device["worker_id"],
        "device_name": device["device_name"],
        "enrolled_at": isoformat_utc(device["enrolled_at"]),
        "revoked_at": isoformat_utc(device["revoked_at"]),
    }


class DeviceHandlers:
    """The device registry's use cases (module docstring), each one transaction.

    Args:
        database / event_log: the conversations service's.
        authority: signs the credentials of enrolled devices.
        revocations: this process's revoked devices (its TokenAuthority refuses their tokens).
        clock: the current instant (aware UTC).
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        authority: TokenAuthority,
        revocations: DeviceRevocations,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.authority = authority
        self.revocations = revocations
        self._clock = clock
        self.failed_attempts = FailedAttempts(clock=clock)

    async def load_revocations(self) -> int:
        """Loads every revoked device into `revocations` (before the first call is served);
        returns how many."""
        async with self.database.read() as connection:
            query = select(devices.c.device_id).where(devices.c.revoked_at.is_not(None))
            revoked = list((await connection.execute(query)).scalars())
        self.revocations.revoke(revoked)
        return len(revoked)

    async def create_pairing_code(self, owner_id: str) -> tuple[str, datetime]:
        """A new one-time code for `owner_id` and when it expires (UTC). Raises InvalidArgument for
        a malformed owner id."""
        violations: list[FieldViolation] = []
        check_id("owner_id", owner_id, violations)
        raise_if_any(violations)
        code = new_pairing_code()
        now = self._clock()
        expires_at = now + PAIRING_CODE_LIFETIME
        async with self.database.transaction() as connection:
            await connection.execute(
                insert(pairing_codes).values(
                    code_hash=code_hash(normalised_code(code) or ""),
                    owner_id=owner_id,
                    created_at=now,
                    expires_at=expires_at,
                )
            )
        log.info("pairing code created for owner %s (expires %s)", owner_id, isoformat_utc(expires_at))
        return code, expires_at

    async def enroll(
        self, entered_code: str, node_id: str, worker_id: str, device_name: str, peer: str
    ) -> Enrollment:
        """Trades a pairing code for a device and its credential (module docstring).

        Raises:
            InvalidArgument: naming pairing_code (not a code), node_id, worker_id or device_name.
            PermissionDenied: PAIRING_CODE_INVALID (unknown, used or expired; one answer for all).
            AlreadyExists: DEVICE_ALREADY_ENROLLED, naming node_id: an active device of the owner
                has this node and worker.
            ResourceExhausted: PAIRING_ATTEMPTS_EXCEEDED when the peer's address, or all
                addresses together, sent too many wrong codes (FailedAttempts).
        """
        attempt = self.failed_attempts.begin(peer)
        wrong_code = False
        try:
            return await self._enroll(entered_code, node_id, worker_id, device_name)
        except PermissionDenied:
            wrong_code = True
            raise
        except InvalidArgument as error:
            wrong_code = any(violation.field == "pairing_code" for violation in error.violations)
            raise
        finally:
            if not wrong_code:
                self.failed_attempts.forgive(attempt)

    async def _enroll(self, entered_code: str, node_id: str, worker_id: str, device_name: str) -> Enrollment:
        """`enroll` without the count of wrong codes."""
        violations: list[FieldViolation] = []
        normalised = normalised_code(entered_code)
        if normalised is None:
            violations.append(
                FieldViolation("pairing_code", f"must be {CODE_LENGTH} characters of Crockford base32")
            )
        check_id("node_id", node_id, violations)
        check_id("worker_id", worker_id, violations)
        name = check_title("device_name", device_name, violations, required=False)
        raise_if_any(violations)
        assert normalised is not None
        now = self._clock()
        device_id = uuid.uuid4().hex
        try:
            async with self.database.transaction() as connection:
                claimed = await connection.execute(
                    update(pairing_codes)
                    .where(
                        and_(
                            pairing_codes.c.code_hash == code_hash(normalised),
                            pairing_codes.c.used_at.is_(None),
                            pairing_codes.c.expires_at > now,
                        )
                    )
                    .values(used_at=now, device_id=device_id)
                    .returning(pairing_codes.c.owner_id)
                )
                owner_id = claimed.scalar_one_or_none()
                if owner_id is None:
                    raise PermissionDenied(
                        "this pairing code is unknown, used or expired: ask for a new one",
                        reason=PAIRING_CODE_INVALID,
                    )
                device: Row = {
                    "device_id": device_id,
                    "owner_id": owner_id,
                    "node_id": node_id,
                    "worker_id": worker_id,
                    "device_name": name,
                    "enrolled_at": now,
                    "revoked_at": None,
                }
                await connection.execute(insert(devices).values(**device))
                await self.event_log.append(
                    connection,
                    [NewEvent(DEVICE_ENROLLED_EVENT, device_payload(device), node_id=node_id)],
                )
        except IntegrityError as error:
            raise AlreadyExists(
                f"node {node_id!r} already has an enrolled device {worker_id!r} of this owner: revoke "
                "it first, or enroll with another worker id",
                reason="DEVICE_ALREADY_ENROLLED",
                violations=[FieldViolation("node_id", "already has an active device of this owner")],
            ) from error
        self.event_log.kick()
        token = self.authority.issue_worker(
            worker_id, node_id, DEVICE_TOKEN_LIFETIME, owner_id=device["owner_id"], device_id=device_id
        )
        log.info("device %s enrolled for owner %s on node %s", device_id, device["owner_id"], node_id)
        return Enrollment(device, token, now + DEVICE_TOKEN_LIFETIME)

    async def list_devices(self, owner_id: str) -> list[Row]:
        """The owner's devices, newest first (revoked ones too)."""
        async with self.database.read() as connection:
            rows = await connection.execute(
                select(devices)
                .where(devices.c.owner_id == owner_id)
                .order_by(devices.c.enrolled_at.desc(), devices.c.device_id)
            )
            return [dict(row) for row in rows.mappings()]

    async def revoke(self, owner_id: str, device_id: str) -> Row:
        """Revokes the owner's device (idempotent) and publishes `device.revoked`; the device's
        token is refused here from the commit on. Raises InvalidArgument (device_id) or NotFound
        (DEVICE_NOT_FOUND: unknown or another owner's)."""
        violations: list[FieldViolation] = []
        check_id("device_id", device_id, violations)
        raise_if_any(violations)
        now = self._clock()
        async with self.database.transaction() as connection:
            found = (
                (
                    await connection.execute(
                        select(devices).where(
                            and_(devices.c.device_id == device_id, devices.c.owner_id == owner_id)
                        )
                    )
                )
                .mappings()
                .first()
            )
            if found is None:
                raise NotFound(f"device {device_id!r} not found", reason=DEVICE_NOT_FOUND)
            device = dict(found)
            if device["revoked_at"] is not None:
                return device
            device["revoked_at"] = now
            await connection.execute(
                update(devices).where(devices.c.device_id == device_id).values(revoked_at=now)
            )
            await self.event_log.append(
                connection,
                [NewEvent(DEVICE_REVOKED_EVENT, device_payload(device), node_id=device["node_id"])],
            )
        self.revocations.revoke([device_id])
        self.event_log.kick()
        log.info("device %s of owner %s revoked", device_id, owner_id)
        return device

    async def is_active_device(self, owner_id: str, node_id: str, worker_id: str) -> bool:
        """Whether the owner has an active enrolled device with this node and worker."""
        async with self.database.read() as connection:
            found = await connection.execute(
                select(devices.c.device_id).where(
                    and_(
                        devices.c.owner_id == owner_id,
                        devices.c.node_id == node_id,
                        devices.c.worker_id == worker_id,
                        devices.c.revoked_at.is_(None),
                    )
                )
            )
            return found.first() is not None
