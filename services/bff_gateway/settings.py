"""The gateway's settings, read from the environment through services.shared.config.

| variable | default | meaning |
|---|---|---|
| BOSS_GATEWAY_LISTEN | 127.0.0.1:8080 | where the HTTP server binds |
| BOSS_CONTEXT_BUDGET_ADDRESS | 127.0.0.1:50051 | gRPC target of context_budget |
| BOSS_AUTH_SECRET | $BOSS_DATA_DIR/auth-secret | HS256 key that signs and verifies tokens |
| BOSS_GATEWAY_MAX_BODY_BYTES | 65536 | request bodies over this get 413 (a chat send: 800,000) |
| BOSS_GATEWAY_RPC_TIMEOUT_SECONDS | 5 | deadline of each backend call |
| BOSS_GATEWAY_SEND_TIMEOUT_SECONDS | 30 | deadline of a chat send (it may wait for the master model) |
| BOSS_GATEWAY_METRICS_LISTEN | (unset) | serve /metrics on this host:port instead of the API's port |
| BOSS_GRPC_TLS, BOSS_TLS_CA_FILE | off, (unset) | TLS to the gRPC services (boss_common/channels.py) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from boss_common.channels import ChannelSettingsError, environment_security
from services.shared import config

DEFAULT_MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway process needs.

    Attributes:
        listen: host:port for the HTTP server.
        context_budget_address: gRPC target of the context_budget service.
        auth_secret: HS256 signing key (at least 16 characters), shared with every service.
        max_body_bytes: largest accepted request body, in bytes.
        rpc_timeout_seconds: deadline of each backend call, in seconds.
        send_timeout_seconds: deadline of a chat send (PostMessage), in seconds: a send may wait for
            the master model, up to BOSS_MASTER_INLINE_WAIT_SECONDS (3) for the master's inline
            reply and BOSS_DISPATCH_MODEL_TIMEOUT_SECONDS (20) for a group plan's drafts; a deadline
            shorter than that would cancel the send before anything is stored.
        readiness_timeout_seconds: deadline of the health check behind /readyz, in seconds.
        retry_after_seconds: the Retry-After sent with 503 answers, in seconds.
        metrics_listen: host:port of a separate Prometheus listener; None serves `/metrics` on the
            API's own port (metrics.py).
    """

    listen: str
    context_budget_address: str
    auth_secret: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    rpc_timeout_seconds: float = 5.0
    send_timeout_seconds: float = 30.0
    readiness_timeout_seconds: float = 1.0
    retry_after_seconds: int = 5
    metrics_listen: str | None = None

    @classmethod
    def from_environment(cls) -> GatewaySettings:
        """Reads the settings (see the module table); creates the local auth secret if needed.
        Raises SystemExit naming the setting when the channels' transport settings are wrong
        (BOSS_GRPC_TLS, BOSS_TLS_CA_FILE: boss_common/channels.py)."""
        try:
            environment_security()
        except ChannelSettingsError as error:
            raise SystemExit(f"gateway: {error}") from None
        return cls(
            listen=config.listen_address("gateway"),
            context_budget_address=config.service_address("context_budget"),
            auth_secret=config.auth_secret(),
            max_body_bytes=int(os.environ.get("BOSS_GATEWAY_MAX_BODY_BYTES") or DEFAULT_MAX_BODY_BYTES),
            rpc_timeout_seconds=float(os.environ.get("BOSS_GATEWAY_RPC_TIMEOUT_SECONDS") or 5.0),
            send_timeout_seconds=float(os.environ.get("BOSS_GATEWAY_SEND_TIMEOUT_SECONDS") or 30.0),
            metrics_listen=os.environ.get("BOSS_GATEWAY_METRICS_LISTEN") or None,
        )


def split_host_port(address: str) -> tuple[str, int]:
    """("127.0.0.1", 8080) from "127.0.0.1:8080"; IPv6 hosts may be bracketed ("[::]:8080").
    Raises ValueError for an address without a numeric port."""
    host, separator, port = address.rpartition(":")
    if not separator or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
