"""The settings the services and the worker read the same way: where a service is reached, and the
data folder.

| variable | default | meaning |
|---|---|---|
| BOSS_DATA_DIR | ./var | local state: a service's SQLite files and secrets; a worker's credential, journal |
| BOSS_<SERVICE>_ADDRESS | 127.0.0.1:<port> | where clients and workers find a service |

Services are named `context_budget`, `scheduler`, `conversations` and `gateway`; the settings only a
server reads (databases, listen addresses, the auth secret) are in services/shared/config.py.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORTS: dict[str, int] = {
    "context_budget": 50051,
    "scheduler": 50052,
    "conversations": 50053,
    "gateway": 8080,
}


def setting(name: str) -> str | None:
    """The environment variable `name`, or None when it is unset or empty."""
    value = os.environ.get(name)
    return value if value else None


def data_dir() -> Path:
    """The folder for embedded databases and local secrets (created on first use, readable by its
    owner only: mode 0700)."""
    path = Path(setting("BOSS_DATA_DIR") or "var").resolve()
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
    return path


def service_address(service: str) -> str:
    """host:port (or a gRPC target such as dns:///name:port) where clients reach a service."""
    return setting(f"BOSS_{service.upper()}_ADDRESS") or f"127.0.0.1:{DEFAULT_PORTS[service]}"
