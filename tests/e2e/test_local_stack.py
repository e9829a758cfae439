"""`make run` end to end: the launcher starts every service and a worker on the embedded SQLite
default, the worker follows Boss's demo sessions, and the gateway answers every thread's context
budget. Runs on free loopback ports and a temporary data folder so it never meets a running stack."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPOSITORY_ROOT

SERVICES = ("CONTEXT_BUDGET", "SCHEDULER", "CONVERSATIONS", "GATEWAY")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_local_stack_shows_budgets_from_demo_sessions(tmp_path: Path) -> None:
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("BOSS_") and key != "CODEX_HOME"
    }
    environment["BOSS_DATA_DIR"] = str(tmp_path / "var")
    environment["HOME"] = str(tmp_path)  # no ~/.codex: the launcher must fall back to demo sessions
    for service in SERVICES:
        address = f"127.0.0.1:{free_port()}"
        environment[f"BOSS_{service}_LISTEN"] = address
        environment[f"BOSS_{service}_ADDRESS"] = address

    result = subprocess.run(
        [sys.executable, "-m", "services.local_stack", "--until-ready", "90", "--refresh", "1"],
        cwd=REPOSITORY_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Every thread has a budget" in result.stdout
    assert "Demo mode (no Codex sessions" in result.stdout
    table_rows = [line for line in result.stdout.splitlines() if "%" in line and line.startswith("  0")]
    assert table_rows, result.stdout[-3000:]
    assert (tmp_path / "var" / "client-token").read_text().strip()
