"""Finding the Codex binary: BOSS_CODEX_BIN, the project's install (native binary first), PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.local_agent.codex_install import (
    PROJECT_CODEX_DIR,
    CodexNotFoundError,
    find_codex_binary,
    native_beside_wrapper,
    native_binary_relpath,
)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def _npm_install(root: Path) -> tuple[Path, Path]:
    """The layout `npm install @openai/codex` leaves: the wrapper script and the native binary."""
    relpath = native_binary_relpath()
    assert relpath is not None
    node_modules = root / "node_modules"
    script = _executable(node_modules / "@openai" / "codex" / "bin" / "codex.js")
    (node_modules / ".bin").mkdir(parents=True)
    (node_modules / ".bin" / "codex").symlink_to(script)
    return node_modules / ".bin" / "codex", _executable(node_modules / relpath)


def _no_path(command: str) -> str | None:
    return None


def test_boss_codex_bin_wins(tmp_path: Path) -> None:
    chosen = _executable(tmp_path / "my-codex")
    _npm_install(tmp_path / "tools")
    environ = {"BOSS_CODEX_BIN": str(chosen)}
    assert find_codex_binary(environ, project_codex_dir=tmp_path / "tools", which=_no_path) == chosen


def test_a_boss_codex_bin_that_is_not_executable_is_an_error_naming_it(tmp_path: Path) -> None:
    plain = tmp_path / "codex.txt"
    plain.write_text("not a program")
    with pytest.raises(CodexNotFoundError, match=f"BOSS_CODEX_BIN={plain} is not an executable file"):
        find_codex_binary({"BOSS_CODEX_BIN": str(plain)}, project_codex_dir=tmp_path, which=_no_path)


def test_the_projects_native_binary_is_preferred_to_its_wrapper(tmp_path: Path) -> None:
    _, native = _npm_install(tmp_path)
    assert find_codex_binary({}, project_codex_dir=tmp_path, which=_no_path) == native


def test_the_projects_wrapper_is_used_when_the_native_binary_is_missing(tmp_path: Path) -> None:
    wrapper, native = _npm_install(tmp_path)
    native.unlink()
    assert find_codex_binary({}, project_codex_dir=tmp_path, which=_no_path) == wrapper


def test_an_npm_codex_on_path_resolves_to_its_native_binary(tmp_path: Path) -> None:
    wrapper, native = _npm_install(tmp_path / "global" / "lib")
    found = find_codex_binary({}, project_codex_dir=tmp_path / "none", which=lambda name: str(wrapper))
    assert found == native
    assert native_beside_wrapper(native) is None


def test_another_codex_on_path_is_used_as_is(tmp_path: Path) -> None:
    other = _executable(tmp_path / "bin" / "codex")
    assert find_codex_binary({}, project_codex_dir=tmp_path / "none", which=lambda name: str(other)) == other


def test_nothing_found_says_what_was_tried_and_how_to_install_or_name_codex(tmp_path: Path) -> None:
    with pytest.raises(CodexNotFoundError) as raised:
        find_codex_binary({}, project_codex_dir=tmp_path / "tools", which=_no_path)
    message = str(raised.value)
    assert "BOSS_CODEX_BIN (not set)" in message
    assert str(tmp_path / "tools" / "node_modules" / ".bin" / "codex") in message
    assert "`codex` on PATH" in message
    assert "npm install -g @openai/codex" in message and "`make codex`" in message
    assert "BOSS_WORKER_CODEX_BIN" in message  # the setting worker.env names


def test_the_pinned_install_is_the_native_binary() -> None:
    """`make codex` has run (the test target depends on it): the default lookup finds the native binary."""
    relpath = native_binary_relpath()
    assert relpath is not None
    environ = {key: value for key, value in os.environ.items() if key != "BOSS_CODEX_BIN"}
    found = find_codex_binary(environ)
    assert found == PROJECT_CODEX_DIR / "node_modules" / relpath, "run `make codex`"
