"""The real Codex CLI against the demo model, read by Boss (fixtures in tests/codex_support.py)."""

from tests.codex_support import (  # noqa: F401  (fixtures, found by name)
    codex_bin,
    codex_home,
    codex_settings,
    demo_model,
    new_codex_thread,
)
