"""Fixtures of the worker runtime integration tests (helpers in support.py; the real Codex CLI's
fixtures come from tests/codex_support.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.codex_support import (  # noqa: F401  (fixtures of the real Codex CLI, found by name)
    codex_bin,
    codex_home,
    codex_settings,
    demo_model,
    new_codex_thread,
)
from tests.integration.worker_runtime.support import ContextBudgetHarness


@pytest.fixture
async def context_budget(tmp_path: Path) -> AsyncIterator[ContextBudgetHarness]:
    """A started context_budget service on a fresh SQLite file."""
    harness = ContextBudgetHarness(f"sqlite+aiosqlite:///{tmp_path / 'context_budget.sqlite3'}")
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()
