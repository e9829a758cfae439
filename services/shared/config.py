"""Configuration from the environment, with defaults that run everything on one machine.

| variable | default | meaning |
|---|---|---|
| BOSS_DATA_DIR | ./var | where the embedded SQLite files, the local auth secret and logs live |
| BOSS_DATABASE_URL | (unset) | one SQLAlchemy URL for every service (each gets its own PostgreSQL schema) |
| BOSS_<SERVICE>_DATABASE_URL | (unset) | per-service URL; wins over BOSS_DATABASE_URL |
| BOSS_AUTH_SECRET | contents of $BOSS_DATA_DIR/auth-secret | HS256 signing key for tokens |
| BOSS_<SERVICE>_LISTEN | 127.0.0.1:<port> | where a service listens |
| BOSS_<SERVICE>_ADDRESS | 127.0.0.1:<port> | where clients find a service |
| BOSS_MIGRATE_ON_START | true | apply Alembic migrations when a service starts (false in production) |
| BOSS_LOG_LEVEL | INFO | Python logging level |
| BOSS_DEFAULT_OWNER_ID | local | owner of threads registered without one (one person's installation) |

Services are named `context_budget`, `scheduler`, `conversations` and `gateway`.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORTS: dict[str, int] = {
    "context_budget": 50051,
    "scheduler": 50052,
    "conversations": 50053,
    "gateway": 8080,
}


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def data_dir() -> Path:
    """The folder for embedded databases and local secrets (created on first use)."""
    path = Path(_env("BOSS_DATA_DIR") or "var").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_url(service: str) -> str:
    """The SQLAlchemy URL of a service's database.

    Order: BOSS_<SERVICE>_DATABASE_URL, then BOSS_DATABASE_URL, then an embedded SQLite file
    `$BOSS_DATA_DIR/<service>.sqlite3`. PostgreSQL URLs use the psycopg 3 driver; a plain
    `postgresql://` URL is rewritten to `postgresql+psycopg://`.
    """
    url = _env(f"BOSS_{service.upper()}_DATABASE_URL") or _env("BOSS_DATABASE_URL")
    if url is None:
        return f"sqlite+aiosqlite:///{data_dir() / f'{service}.sqlite3'}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def listen_address(service: str) -> str:
    """host:port a service binds to."""
    return _env(f"BOSS_{service.upper()}_LISTEN") or f"127.0.0.1:{DEFAULT_PORTS[service]}"


def service_address(service: str) -> str:
    """host:port (or a gRPC target such as dns:///name:port) where clients reach a service."""
    return _env(f"BOSS_{service.upper()}_ADDRESS") or f"127.0.0.1:{DEFAULT_PORTS[service]}"


def default_owner_id() -> str:
    """The owner of threads that workers register without naming one, and of `make run`'s client
    token: a one-person installation has a single owner."""
    return _env("BOSS_DEFAULT_OWNER_ID") or "local"


def migrate_on_start() -> bool:
    """Whether services apply their migrations at start (local mode) or leave it to `migrate`."""
    return (_env("BOSS_MIGRATE_ON_START") or "true").lower() in {"1", "true", "yes"}


def auth_secret(create: bool = True) -> str:
    """The HS256 signing key: BOSS_AUTH_SECRET, else `$BOSS_DATA_DIR/auth-secret`.

    With `create`, a missing file is made with 256 random bits (mode 0600), the way a local
    notebook server makes its token. Raises RuntimeError when no secret exists and create is False.
    """
    configured = _env("BOSS_AUTH_SECRET")
    if configured:
        return configured
    path = data_dir() / "auth-secret"
    if path.exists():
        return path.read_text().strip()
    if not create:
        raise RuntimeError(f"no auth secret: set BOSS_AUTH_SECRET or create {path}")
    secret = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(secret + "\n")
    return secret


@dataclass(frozen=True)
class ServiceSettings:
    """Everything one service process needs to start."""

    service: str
    database_url: str
    listen: str
    migrate_on_start: bool
    auth_secret: str

    @classmethod
    def from_environment(cls, service: str) -> ServiceSettings:
        """Reads the settings of `service` from the environment (see the module table)."""
        return cls(
            service=service,
            database_url=database_url(service),
            listen=listen_address(service),
            migrate_on_start=migrate_on_start(),
            auth_secret=auth_secret(),
        )
