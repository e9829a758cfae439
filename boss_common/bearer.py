"""The caller's side of Boss's bearer tokens: the gRPC call metadata that carries one.

Services verify the token (services/shared/auth.py, which also issues them); a worker, the gateway
and the services as callers send it as `authorization: Bearer <token>` metadata.
"""

from __future__ import annotations


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying `token`."""
    return (("authorization", f"Bearer {token}"),)
