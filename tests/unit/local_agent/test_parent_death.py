"""`parent_death_prefix`: Codex starts under setpriv's parent-death signal only where that works."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from worker.local_agent.codex_exec import SETPRIV, parent_death_prefix


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_an_executable_codex_starts_under_setpriv_when_setpriv_is_there(tmp_path: Path) -> None:
    codex = executable(tmp_path / "codex")
    setpriv = executable(tmp_path / "setpriv")

    assert parent_death_prefix(str(codex), str(setpriv)) == [str(setpriv), "--pdeathsig", "KILL", "--"]


def test_without_setpriv_or_an_executable_codex_it_starts_directly(tmp_path: Path) -> None:
    codex = executable(tmp_path / "codex")
    not_executable = tmp_path / "plain"
    not_executable.write_text("")

    assert parent_death_prefix(str(codex), str(tmp_path / "no-setpriv")) == []
    assert parent_death_prefix(str(tmp_path / "missing-codex"), SETPRIV) == []
    assert parent_death_prefix(str(not_executable), SETPRIV) == []
