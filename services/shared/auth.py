"""Signed bearer tokens with scopes (HS256 JWTs through PyJWT).

Three kinds of principal:

- **worker**: a device's worker, bound to one `worker_id` and `node_id` and enrolled for one
  `owner_id` (the owner comes from the token, never from a request); may report budgets, register
  threads, claim tasks and receive commands only for them and only for that owner's threads. A
  worker token issued before tokens carried an owner belongs to the default owner "local". A token
  from enrollment by pairing code also names its `device_id`, so its owner can revoke it
  (`DeviceRevocations`).
- **client**: the app or the web console of one `owner_id`; reads and writes that owner's data.
- **service**: another Boss service (reads event streams, calls internal RPCs).

Who may call which RPC is one table in docs/architecture.md ("Trust boundaries"); every service
enforces its rows itself.

gRPC callers send `authorization: Bearer <token>` metadata (`bearer_metadata`, from
boss_common/bearer.py: the worker sends it too); HTTP callers the same header (the SSE endpoint also
accepts `?access_token=`, since browsers cannot set headers on EventSource).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import grpc
import jwt

from boss_common.bearer import bearer_metadata as bearer_metadata  # the services import it from here
from services.shared.devices import revoked_error
from services.shared.errors import PermissionDenied, Unauthenticated
from services.shared.metrics import meter
from services.shared.time import utc_now

log = logging.getLogger(__name__)
REFUSALS = meter.create_counter(
    "boss.auth.refusals",
    unit="{call}",
    description="gRPC calls refused for their credential, by reason (TOKEN_MISSING, TOKEN_INVALID, "
    "TOKEN_EXPIRED, DEVICE_REVOKED, ...)",
)

if TYPE_CHECKING:
    from services.shared.devices import DeviceRevocations

ISSUER = "boss"
AUDIENCE = "boss"
ALGORITHM = "HS256"

# Scopes. A token carries the ones its kind needs.
SCOPE_CONTEXT_REPORT = "context:report"
SCOPE_CONTEXT_READ = "context:read"
SCOPE_CONTEXT_ADMIN = "context:admin"
SCOPE_THREADS_REGISTER = "threads:register"
SCOPE_TASKS_CLAIM = "tasks:claim"
SCOPE_HANDOFF_WRITE = "handoff:write"
SCOPE_CONVERSATIONS_READ = "conversations:read"
SCOPE_CONVERSATIONS_WRITE = "conversations:write"
SCOPE_SCHEDULER_READ = "scheduler:read"
SCOPE_SCHEDULER_ADMIN = "scheduler:admin"
SCOPE_EVENTS_READ = "events:read"

WORKER = "worker"
CLIENT = "client"
SERVICE = "service"
KINDS = (WORKER, CLIENT, SERVICE)

DEFAULT_OWNER_ID = "local"
"""The owner of worker tokens that carry none (issued before tokens named their owner)."""

HANDOFF_CONSUME_SCOPES = (SCOPE_SCHEDULER_ADMIN, SCOPE_HANDOFF_WRITE, SCOPE_CONVERSATIONS_WRITE)
"""Any one of these lets a caller mark a handoff package consumed: the master agent
(scheduler:admin), a worker's relay thread (handoff:write) or the user through the gateway
(conversations:write)."""

WORKER_SCOPES = (SCOPE_CONTEXT_REPORT, SCOPE_THREADS_REGISTER, SCOPE_TASKS_CLAIM, SCOPE_HANDOFF_WRITE)
CLIENT_SCOPES = (
    SCOPE_CONTEXT_READ,
    SCOPE_CONVERSATIONS_READ,
    SCOPE_CONVERSATIONS_WRITE,
    SCOPE_SCHEDULER_READ,
    SCOPE_EVENTS_READ,
)
SERVICE_SCOPES = (
    SCOPE_CONTEXT_READ,
    SCOPE_CONTEXT_ADMIN,
    SCOPE_CONVERSATIONS_READ,
    SCOPE_CONVERSATIONS_WRITE,
    SCOPE_SCHEDULER_READ,
    SCOPE_SCHEDULER_ADMIN,
    SCOPE_EVENTS_READ,
    SCOPE_THREADS_REGISTER,
    SCOPE_HANDOFF_WRITE,
)


@dataclass(frozen=True)
class Principal:
    """Who is calling, from a verified token.

    Attributes:
        kind: "worker" | "client" | "service".
        owner_id: the owner a client or worker token acts for ("" for service tokens).
        device_id: the enrolled device of a worker token from a pairing code ("" otherwise).
        expires_at: when the token expires (UTC, its `exp`); None for a principal made in process.
            A call is verified once, so a long stream ends itself at this instant
            (`seconds_until_expiry`).
    """

    subject: str
    kind: str
    scopes: frozenset[str] = field(default_factory=frozenset)
    worker_id: str = ""
    node_id: str = ""
    owner_id: str = ""
    device_id: str = ""
    expires_at: datetime | None = None

    def seconds_until_expiry(self, now: datetime | None = None) -> float:
        """Seconds from `now` (UTC, default the current time) until the token expires; infinity
        without an expiry, 0 once expired."""
        if self.expires_at is None:
            return math.inf
        return max(0.0, (self.expires_at - (now or datetime.now(UTC))).total_seconds())

    @property
    def owner_scope(self) -> str | None:
        """The owner whose data this caller may see: its own owner for client and worker tokens,
        None (every owner) for service tokens."""
        return None if self.kind == SERVICE else self.owner_id

    def require_kind(self, *kinds: str) -> None:
        """Raises PermissionDenied (reason TOKEN_KIND_NOT_ALLOWED) unless the token is one of
        `kinds` ("worker", "client", "service"), naming the kinds the call takes."""
        if self.kind not in kinds:
            names = " or ".join(f"a {kind}" for kind in kinds)
            raise PermissionDenied(
                f"this call takes {names} token, not a {self.kind} token", reason="TOKEN_KIND_NOT_ALLOWED"
            )

    def require(self, scope: str) -> None:
        """Raises PermissionDenied unless the token carries `scope`."""
        if scope not in self.scopes:
            raise PermissionDenied(f"token lacks scope {scope!r}", reason="SCOPE_MISSING")

    def require_any(self, scopes: Sequence[str]) -> None:
        """Raises PermissionDenied (reason SCOPE_MISSING, naming every scope in order) unless the
        token carries at least one of `scopes`."""
        if self.scopes.isdisjoint(scopes):
            names = [repr(scope) for scope in scopes]
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
            raise PermissionDenied(f"token lacks scope {listed}", reason="SCOPE_MISSING")

    def require_worker(self, worker_id: str, node_id: str | None = None) -> None:
        """Raises PermissionDenied (reason WORKER_MISMATCH or NODE_MISMATCH) unless this is the
        worker token of `worker_id` on `node_id` (service tokens may act for any worker). With
        `node_id` None only the worker is checked, e.g. against a URL path before the body that
        names the node is read."""
        if self.kind == SERVICE:
            return
        if self.kind != WORKER or self.worker_id != worker_id:
            raise PermissionDenied(
                f"token is bound to worker {self.worker_id!r}, not {worker_id!r}", reason="WORKER_MISMATCH"
            )
        if node_id is not None and self.node_id != node_id:
            raise PermissionDenied(
                f"token is bound to node {self.node_id!r}, not {node_id!r}", reason="NODE_MISMATCH"
            )


class TokenAuthority:
    """Issues and verifies tokens with one shared HS256 secret.

    Args:
        secret: the shared secret, at least 32 bytes (RFC 7518 §3.2). Raises ValueError otherwise.
        revocations: the devices whose tokens are refused (UNAUTHENTICATED, reason DEVICE_REVOKED);
            a service keeps it current from the conversations service's `device.revoked` events.
            None: no device is revoked (tools that only issue tokens).
    """

    def __init__(self, secret: str, revocations: DeviceRevocations | None = None) -> None:
        if len(secret.encode()) < 32:
            raise ValueError("auth secret too short: use at least 32 bytes (RFC 7518 §3.2)")
        self._secret = secret
        self.revocations = revocations
        self._revoked_logged: dict[str, float] = {}

    def issue(
        self,
        *,
        kind: str,
        subject: str,
        scopes: Iterable[str],
        worker_id: str = "",
        node_id: str = "",
        owner_id: str = "",
        device_id: str = "",
        lifetime: timedelta = timedelta(days=30),
    ) -> str:
        """A signed token. `lifetime` is how long it stays valid."""
        now = utc_now()
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": subject,
            "jti": str(uuid.uuid4()),
            "iat": now,
            "exp": now + lifetime,
            "kind": kind,
            "scopes": sorted(set(scopes)),
            "worker_id": worker_id,
            "node_id": node_id,
            "owner_id": owner_id,
        }
        if device_id:
            claims["device_id"] = device_id
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)

    def issue_worker(
        self,
        worker_id: str,
        node_id: str,
        lifetime: timedelta = timedelta(days=30),
        *,
        owner_id: str = DEFAULT_OWNER_ID,
        device_id: str = "",
    ) -> str:
        """A worker token bound to `worker_id` on `node_id`, acting for `owner_id`; `device_id`
        names the enrolled device (a token from a pairing code), so revoking it refuses the token."""
        return self.issue(
            kind=WORKER,
            subject=f"worker:{worker_id}",
            scopes=WORKER_SCOPES,
            worker_id=worker_id,
            node_id=node_id,
            owner_id=owner_id,
            device_id=device_id,
            lifetime=lifetime,
        )

    def issue_client(self, owner_id: str, lifetime: timedelta = timedelta(days=30)) -> str:
        """A client (app, console) token for `owner_id`."""
        return self.issue(
            kind=CLIENT,
            subject=f"client:{owner_id}",
            scopes=CLIENT_SCOPES,
            owner_id=owner_id,
            lifetime=lifetime,
        )

    def issue_service(self, service: str, lifetime: timedelta = timedelta(days=365)) -> str:
        """A token for one Boss service calling another."""
        return self.issue(
            kind=SERVICE,
            subject=f"service:{service}",
            scopes=SERVICE_SCOPES,
            owner_id="",
            lifetime=lifetime,
        )

    def verify(self, token: str) -> Principal:
        """The principal of a valid token. Raises Unauthenticated (expired, bad signature,
        malformed; reason DEVICE_REVOKED for the token of a device its owner revoked)."""
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                issuer=ISSUER,
                options={"require": ["exp", "sub", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as error:
            raise Unauthenticated("token expired", reason="TOKEN_EXPIRED") from error
        except jwt.PyJWTError as error:
            raise Unauthenticated(f"invalid token: {error}", reason="TOKEN_INVALID") from error
        kind = claims.get("kind")
        if kind not in KINDS:
            raise Unauthenticated("invalid token: unknown kind", reason="TOKEN_INVALID")
        owner_id = str(claims.get("owner_id") or "")
        if kind == WORKER and not owner_id:
            owner_id = DEFAULT_OWNER_ID
        principal = Principal(
            subject=str(claims["sub"]),
            kind=str(kind),
            scopes=frozenset(claims.get("scopes") or ()),
            worker_id=str(claims.get("worker_id") or ""),
            node_id=str(claims.get("node_id") or ""),
            owner_id=owner_id,
            device_id=str(claims.get("device_id") or ""),
            expires_at=datetime.fromtimestamp(float(claims["exp"]), UTC),
        )
        self.check_not_revoked(principal)
        return principal

    def check_not_revoked(self, principal: Principal) -> None:
        """Raises Unauthenticated (reason DEVICE_REVOKED) when `principal` is a device its owner
        revoked (see `revocations`)."""
        if principal.device_id and self.revocations is not None and principal.device_id in self.revocations:
            raise revoked_error(principal.device_id)

    def verify_header(self, authorization: str | None) -> Principal:
        """Verifies an `Authorization: Bearer <token>` value. Raises Unauthenticated."""
        if not authorization:
            raise Unauthenticated(
                "missing authorization: send 'authorization: Bearer <token>'", reason="TOKEN_MISSING"
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization must be 'Bearer <token>'", reason="TOKEN_MISSING")
        return self.verify(token.strip())

    def _log_revoked_caller(self, message: str) -> None:
        """Logs a revoked device's call, at most once a minute per message (which names the device)."""
        now = time.monotonic()
        last = self._revoked_logged.get(message)
        if last is not None and now - last < 60.0:
            return
        if len(self._revoked_logged) > 1000:  # bounded, whatever number of devices keeps calling
            self._revoked_logged.clear()
        self._revoked_logged[message] = now
        log.info("refused a call: %s", message)

    def verify_grpc(self, context: grpc.aio.ServicerContext) -> Principal:
        """Verifies the `authorization` metadata of a gRPC call. Raises Unauthenticated."""
        metadata = dict(context.invocation_metadata() or ())
        return self.verify_header(metadata.get("authorization"))

    def authorize_grpc(self, context: grpc.aio.ServicerContext, scope: str, *kinds: str) -> Principal:
        """The caller of a gRPC call, who must carry `scope` and, when `kinds` are given, be of one
        of them ("worker", "client", "service"). Raises Unauthenticated (no or bad token) or
        PermissionDenied (scope missing: SCOPE_MISSING; another kind: TOKEN_KIND_NOT_ALLOWED).

        A refused credential is counted (`boss.auth.refusals{reason}`); a revoked device still
        calling is also logged, once a minute per device, so an operator sees who keeps trying."""
        try:
            principal = self.verify_grpc(context)
        except Unauthenticated as error:
            REFUSALS.add(1, {"reason": error.reason})
            if error.reason == "DEVICE_REVOKED":
                self._log_revoked_caller(error.message)
            raise
        principal.require(scope)
        if kinds:
            principal.require_kind(*kinds)
        return principal
