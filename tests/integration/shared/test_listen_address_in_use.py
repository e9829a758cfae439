"""One process per address: a gRPC service started on an address another server already listens on
fails loudly ("port in use", naming the address) instead of sharing the port (SO_REUSEPORT) and
taking a share of the callers' connections and tokens."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.shared.grpc_server import CannotListen, ServiceHost
from tests.integration.trust_stack import free_port


def host(listen: str) -> ServiceHost:
    """A service host with no servicers of its own (health and reflection only)."""
    return ServiceHost("probe", listen, lambda server: None, [])


@pytest.fixture
async def listening() -> AsyncIterator[str]:
    """The address of a running service host."""
    address = f"127.0.0.1:{free_port()}"
    server, _health, _port = await host(address).start()
    try:
        yield address
    finally:
        await server.stop(0)


async def test_a_second_server_on_an_address_in_use_fails_naming_it(listening: str) -> None:
    with pytest.raises(CannotListen) as refused:
        await host(listening).start()
    assert str(refused.value) == f"probe cannot listen on {listening}: port in use: another process " + (
        "listens there (another instance of this service?)"
    )
    with pytest.raises(SystemExit) as exited:
        await host(listening).run()
    assert str(exited.value) == str(refused.value)


async def test_a_service_process_started_on_an_address_in_use_exits_with_that_error(
    listening: str, tmp_path: Path
) -> None:
    environment = {
        **os.environ,
        "BOSS_DATA_DIR": str(tmp_path),
        "BOSS_AUTH_SECRET": "listen-test-secret-0123456789abcdef0123456789",
        "BOSS_SCHEDULER_LISTEN": listening,
    }
    for name in ("BOSS_DATABASE_URL", "BOSS_SCHEDULER_DATABASE_URL"):
        environment.pop(name, None)
    finished = subprocess.run(
        [sys.executable, "-m", "services.scheduler", "serve"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 1
    last_line = finished.stderr.strip().splitlines()[-1]
    assert last_line == f"scheduler cannot listen on {listening}: port in use: another process " + (
        "listens there (another instance of this service?)"
    )
