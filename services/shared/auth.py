"""Signed bearer tokens with scopes (HS256 JWTs through PyJWT).

Three kinds of principal:

- **worker**: bound to one `worker_id` and `node_id`; may report budgets, register threads, claim
  tasks and receive commands only for them.
- **client**: the app or the web console of one `owner_id`; reads and writes that owner's data.
- **service**: another Boss service (reads event streams, calls internal RPCs).

gRPC callers send `authorization: Bearer <token>` metadata; HTTP callers the same header (the SSE
endpoint also accepts `?access_token=`, since browsers cannot set headers on EventSource).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import grpc
import jwt

from services.shared.errors import PermissionDenied, Unauthenticated
from services.shared.time import utc_now

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
    """Who is calling, from a verified token."""

    subject: str
    kind: str  # "worker" | "client" | "service"
    scopes: frozenset[str] = field(default_factory=frozenset)
    worker_id: str = ""
    node_id: str = ""
    owner_id: str = ""

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
        if self.kind == "service":
            return
        if self.kind != "worker" or self.worker_id != worker_id:
            raise PermissionDenied(
                f"token is bound to worker {self.worker_id!r}, not {worker_id!r}", reason="WORKER_MISMATCH"
            )
        if node_id is not None and self.node_id != node_id:
            raise PermissionDenied(
                f"token is bound to node {self.node_id!r}, not {node_id!r}", reason="NODE_MISMATCH"
            )


class TokenAuthority:
    """Issues and verifies tokens with one shared HS256 secret."""

    def __init__(self, secret: str) -> None:
        if len(secret.encode()) < 32:
            raise ValueError("auth secret too short: use at least 32 bytes (RFC 7518 §3.2)")
        self._secret = secret

    def issue(
        self,
        *,
        kind: str,
        subject: str,
        scopes: Iterable[str],
        worker_id: str = "",
        node_id: str = "",
        owner_id: str = "",
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
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)

    def issue_worker(self, worker_id: str, node_id: str, lifetime: timedelta = timedelta(days=30)) -> str:
        """A worker token bound to `worker_id` on `node_id`."""
        return self.issue(
            kind="worker",
            subject=f"worker:{worker_id}",
            scopes=WORKER_SCOPES,
            worker_id=worker_id,
            node_id=node_id,
            lifetime=lifetime,
        )

    def issue_client(self, owner_id: str, lifetime: timedelta = timedelta(days=30)) -> str:
        """A client (app, console) token for `owner_id`."""
        return self.issue(
            kind="client",
            subject=f"client:{owner_id}",
            scopes=CLIENT_SCOPES,
            owner_id=owner_id,
            lifetime=lifetime,
        )

    def issue_service(self, service: str, lifetime: timedelta = timedelta(days=365)) -> str:
        """A token for one Boss service calling another."""
        return self.issue(
            kind="service",
            subject=f"service:{service}",
            scopes=SERVICE_SCOPES,
            owner_id="",
            lifetime=lifetime,
        )

    def verify(self, token: str) -> Principal:
        """The principal of a valid token. Raises Unauthenticated (expired, bad signature, malformed)."""
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
        if kind not in {"worker", "client", "service"}:
            raise Unauthenticated("invalid token: unknown kind", reason="TOKEN_INVALID")
        return Principal(
            subject=str(claims["sub"]),
            kind=str(kind),
            scopes=frozenset(claims.get("scopes") or ()),
            worker_id=str(claims.get("worker_id") or ""),
            node_id=str(claims.get("node_id") or ""),
            owner_id=str(claims.get("owner_id") or ""),
        )

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

    def verify_grpc(self, context: grpc.aio.ServicerContext) -> Principal:
        """Verifies the `authorization` metadata of a gRPC call. Raises Unauthenticated."""
        metadata = dict(context.invocation_metadata() or ())
        return self.verify_header(metadata.get("authorization"))

    def authorize_grpc(self, context: grpc.aio.ServicerContext, scope: str) -> Principal:
        """The caller of a gRPC call, who must carry `scope`. Raises Unauthenticated (no or bad
        token) or PermissionDenied (scope missing)."""
        principal = self.verify_grpc(context)
        principal.require(scope)
        return principal


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)
