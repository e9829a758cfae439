"""Fixtures that run the real Codex CLI against Boss's built-in demo model (not a real model).

Any test folder can use them by importing them into its ``conftest.py``::

    from tests.codex_support import (  # noqa: F401  (fixtures, found by name)
        codex_bin, codex_home, codex_settings, demo_model, new_codex_thread,
    )

- ``codex_bin`` (session): the Codex binary (``BOSS_CODEX_BIN``, else the one ``make codex``
  installs into ``.tools/codex``, else ``codex`` on PATH). When there is none the test **fails**,
  saying to run ``make codex``; it is never skipped.
- ``demo_model`` (session): a :class:`demo_model.DemoModelServer` on a free port (default usage
  model); ``demo_model.requests_of(session_id)`` lists what Codex asked it for one thread.
- ``codex_home`` (per test): a fresh Codex home whose ``config.toml`` points at ``demo_model``.
- ``codex_settings`` (per test): :class:`CodexRunSettings` for that home, with the demo model's
  API key variable set, a 10 s stall timeout and a 30 s turn cap.
- ``new_codex_thread`` (per test): ``await new_codex_thread("first message")`` creates a real
  Codex thread in a fresh folder under the test's ``tmp_path`` and returns a :class:`CodexThread`.

Each Codex turn against the demo model takes about 0.3 s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo_model import DemoModelServer, demo_model_environment, write_codex_home
from worker.local_agent.codex_exec import CodexRunSettings, create_codex_thread
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary

TEST_STALL_TIMEOUT_S = 10.0
TEST_TURN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CodexThread:
    """A real Codex thread made for a test: its session id and its working folder."""

    session_id: str
    folder: Path


NewCodexThread = Callable[..., Awaitable[CodexThread]]
"""``await new_codex_thread(first_message="hello", folder_name="thread-1")``."""


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    """The Codex binary the tests drive; fails (never skips) when Codex is not installed."""
    try:
        return find_codex_binary()
    except CodexNotFoundError as error:
        pytest.fail(f"the real Codex CLI is needed: run `make codex` ({error})", pytrace=False)


@pytest.fixture(scope="session")
def demo_model() -> Iterator[DemoModelServer]:
    """The demo model, served on a free local port for the whole test session."""
    with DemoModelServer() as server:
        yield server


@pytest.fixture
def codex_home(tmp_path: Path, demo_model: DemoModelServer) -> Path:
    """A fresh Codex home using the demo model (32,000-token window, no retries)."""
    home = tmp_path / "codex-home"
    write_codex_home(home, demo_model.base_url)
    return home


@pytest.fixture
def codex_settings(codex_bin: Path, codex_home: Path) -> CodexRunSettings:
    """Runner settings for ``codex_home`` with the demo model's key set; short, test-sized limits."""
    return CodexRunSettings(
        codex_bin=codex_bin,
        codex_home=codex_home,
        extra_env=demo_model_environment(),
        stall_timeout_s=TEST_STALL_TIMEOUT_S,
        turn_timeout_s=TEST_TURN_TIMEOUT_S,
    )


@pytest.fixture
def new_codex_thread(tmp_path: Path, codex_settings: CodexRunSettings) -> NewCodexThread:
    """Creates real Codex threads in ``codex_home``, each in its own new folder under ``tmp_path``."""
    counter = iter(range(1, 1_000_000))

    async def create(first_message: str = "hello", folder_name: str | None = None) -> CodexThread:
        folder = tmp_path / (folder_name or f"thread-{next(counter)}")
        folder.mkdir(parents=True, exist_ok=True)
        session_id = await create_codex_thread(folder, first_message, codex_settings)
        return CodexThread(session_id, folder)

    return create
