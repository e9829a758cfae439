"""The demo model as a real local server process for the master agent's tests (never a patched
client): ``python -m demo_model serve`` on a free port, its Chat Completions endpoint behind
OpenAIMasterModel, and what it was asked (``GET /demo/chat-requests``).

Import the fixture into a test module or ``conftest.py``::

    from tests.master_support import demo_model_process  # noqa: F401  (fixture, found by name)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from services.conversations.master.settings import OPENAI_API, MasterSettings
from tests.conftest import REPOSITORY_ROOT

DEMO_MODEL_NAME = "boss-demo-model"
START_SECONDS = 30.0


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class DemoModelProcess:
    """A running demo model process: its base URL ("http://127.0.0.1:PORT/v1")."""

    base_url: str

    def settings(self, **fields: Any) -> MasterSettings:
        """openai_api settings for this process (short test-sized waits unless `fields` say)."""
        values: dict[str, Any] = {
            "backend": OPENAI_API,
            "base_url": self.base_url,
            "api_key": "demo-key-not-secret",
            "model": DEMO_MODEL_NAME,
            "inline_wait_seconds": 5.0,
            "timeout_seconds": 10.0,
            "abandoned_margin_seconds": 0.5,
        }
        return replace(MasterSettings(**values), **fields)

    def chat_requests(self, user_text: str | None = None) -> list[dict[str, Any]]:
        """The Chat Completions requests it answered (optionally only those whose last user
        message is `user_text`), oldest first."""
        origin = self.base_url.removesuffix("/v1")
        requests = httpx.get(f"{origin}/demo/chat-requests", timeout=5).json()["requests"]
        return [r for r in requests if user_text is None or r["user_text"] == user_text]


@pytest.fixture(scope="session")
def demo_model_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoModelProcess]:
    """`python -m demo_model serve` on a free port for the whole session (its log in a temporary
    folder)."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("demo-model") / "demo-model.log"
    log = log_path.open("wb")
    environment = {**os.environ, "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "demo_model", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPOSITORY_ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + START_SECONDS
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                error = log_path.read_text(errors="replace")[-2000:]
                pytest.fail(f"the demo model did not start: {error}", pytrace=False)
            time.sleep(0.1)
        yield DemoModelProcess(f"http://127.0.0.1:{port}/v1")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
