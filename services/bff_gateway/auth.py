"""Bearer-token authentication for the REST API (a FastAPI dependency).

Tokens are the HS256 JWTs of services.shared.auth, verified with the one shared secret. A missing or
refused token is 401 problem+json with `WWW-Authenticate: Bearer`; what a verified token may do is
checked by each route (403), before the route reads its request body (request_body.py), so a token
without the route's scope is refused whatever the body. The raw token is kept so it can be
forwarded to the backends, which enforce their own rules on the same caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.bff_gateway.problems import forbidden, problem_for_boss_error, unauthenticated
from services.bff_gateway.state import GatewayDep
from services.shared.auth import Principal
from services.shared.errors import BossError

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    bearerFormat="JWT",
    description=(
        "A Boss token: `python -m services.bff_gateway token --worker W --node N` or `--client OWNER`."
    ),
)


@dataclass(frozen=True)
class Caller:
    """A verified caller: who they are and the token to forward to backends."""

    principal: Principal
    token: str

    def require(self, scope: str) -> None:
        """Raises 403 problem unless the token carries `scope`."""
        try:
            self.principal.require(scope)
        except BossError as error:
            raise problem_for_boss_error(error) from error

    def require_client(self) -> None:
        """Raises 403 problem (reason CLIENT_TOKEN_REQUIRED) unless this is a client (app, console)
        token: routes that act for one person take no owner from the request, and a service token
        has none of its own."""
        if self.principal.kind != "client":
            raise forbidden(
                f"this route takes a client token, not a {self.principal.kind} token",
                reason="CLIENT_TOKEN_REQUIRED",
            )

    def require_any(self, scopes: Sequence[str]) -> None:
        """Raises 403 problem (reason SCOPE_MISSING) unless the token carries one of `scopes`."""
        try:
            self.principal.require_any(scopes)
        except BossError as error:
            raise problem_for_boss_error(error) from error


async def authenticated_caller(
    gateway: GatewayDep,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Caller:
    """The caller of this request. Raises 401 problem when the `Authorization: Bearer` token is
    missing (TOKEN_MISSING), sent with another scheme (TOKEN_SCHEME_UNSUPPORTED), or malformed,
    expired or badly signed."""
    if credentials is None:
        scheme = request.headers.get("authorization", "").strip().partition(" ")[0]
        if scheme and scheme.lower() != "bearer":
            raise unauthenticated(
                f"unsupported authorization scheme {scheme!r}: send 'Authorization: Bearer <token>'",
                token_sent=True,
                reason="TOKEN_SCHEME_UNSUPPORTED",
            )
        raise unauthenticated(
            "missing bearer token: send 'Authorization: Bearer <token>'",
            token_sent=False,
            reason="TOKEN_MISSING",
        )
    try:
        principal = gateway.authority.verify(credentials.credentials)
    except BossError as error:
        raise problem_for_boss_error(error) from error
    return Caller(principal=principal, token=credentials.credentials)


CallerDep = Annotated[Caller, Depends(authenticated_caller)]
