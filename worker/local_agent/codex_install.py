"""Finding the Codex CLI binary the local agent runs.

Tried in order (:func:`find_codex_binary`):

1. ``BOSS_CODEX_BIN``: a path to use as is (an error when it is not an executable file);
2. the project's own install (``make codex`` puts npm ``@openai/codex`` into ``.tools/codex``):
   its **native** binary ``node_modules/@openai/codex-<os>-<arch>/vendor/<target>/bin/codex``, then
   the npm wrapper ``node_modules/.bin/codex``;
3. ``codex`` on ``PATH``; when that is the npm wrapper, the native binary installed beside it.

The native binary is preferred because the npm wrapper (Node 20) spawns it as a child instead of
replacing itself: a SIGKILL to the wrapper leaves the native process running, and the wrapper adds
about 70 ms to every run.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

ENV_VAR = "BOSS_CODEX_BIN"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROJECT_CODEX_DIR = PROJECT_ROOT / ".tools" / "codex"
"""Where ``make codex`` installs the pinned Codex CLI."""

_TARGETS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("linux", "amd64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("linux", "arm64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
    ("windows", "amd64"): ("codex-win32-x64", "x86_64-pc-windows-msvc"),
    ("windows", "x86_64"): ("codex-win32-x64", "x86_64-pc-windows-msvc"),
    ("windows", "arm64"): ("codex-win32-arm64", "aarch64-pc-windows-msvc"),
}
"""(OS, machine) -> (npm platform package under ``@openai/``, vendor target), as ``codex.js`` maps them."""


class CodexNotFoundError(Exception):
    """No usable Codex binary; the message names everything that was tried and what to do."""


def native_binary_relpath(system: str | None = None, machine: str | None = None) -> Path | None:
    """The native binary's path relative to a ``node_modules`` folder, for this (or the given) platform.

    Args:
        system: ``platform.system()`` (e.g. "Linux", "Darwin", "Windows"); None for this machine's.
        machine: ``platform.machine()`` (e.g. "x86_64", "arm64"); None for this machine's.

    Returns:
        e.g. ``@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex``, or None for a
        platform Codex ships no binary for.
    """
    os_name = (system or platform.system()).lower()
    arch = (machine or platform.machine()).lower()
    target = _TARGETS.get((os_name, arch))
    if target is None:
        return None
    package, triple = target
    executable = "codex.exe" if os_name == "windows" else "codex"
    return Path("@openai") / package / "vendor" / triple / "bin" / executable


def find_codex_binary(
    environ: Mapping[str, str] | None = None,
    *,
    project_codex_dir: Path = PROJECT_CODEX_DIR,
    which: Callable[[str], str | None] = shutil.which,
) -> Path:
    """The Codex binary to run, chosen as the module docstring says.

    Args:
        environ: the environment to read ``BOSS_CODEX_BIN`` and ``PATH`` from (default ``os.environ``).
        project_codex_dir: the project's install folder (``.tools/codex``).
        which: looks a command up on ``PATH`` (``shutil.which``).

    Returns:
        An existing executable file.

    Raises:
        CodexNotFoundError: ``BOSS_CODEX_BIN`` names no executable file, or nothing was found; the
            message lists what was tried and says to run ``make codex``.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_VAR, "").strip()
    if explicit:
        path = Path(explicit).expanduser()
        if _is_executable(path):
            return path
        raise CodexNotFoundError(f"{ENV_VAR}={explicit} is not an executable file; fix or unset it")
    tried: list[str] = [f"{ENV_VAR} (not set)"]
    node_modules = project_codex_dir / "node_modules"
    relpath = native_binary_relpath()
    if relpath is not None:
        native = node_modules / relpath
        if _is_executable(native):
            return native
        tried.append(str(native))
    wrapper = node_modules / ".bin" / "codex"
    if _is_executable(wrapper):
        return wrapper
    tried.append(str(wrapper))
    on_path = which("codex")
    if on_path is not None:
        return native_beside_wrapper(Path(on_path)) or Path(on_path)
    tried.append("`codex` on PATH")
    raise CodexNotFoundError(
        "Codex CLI not found; tried " + ", ".join(tried) + ". Install Codex (`npm install -g "
        "@openai/codex`; in a clone of Boss, `make codex` installs the pinned version), or name it "
        f"with the worker's --codex-bin / BOSS_WORKER_CODEX_BIN (or {ENV_VAR})."
    )


def native_beside_wrapper(command: Path) -> Path | None:
    """The native binary an npm-installed ``codex`` command would start, when it is there.

    ``command`` is a ``codex`` found on PATH; when it resolves to the npm package's ``bin/codex.js``,
    the platform package sits in that package's own ``node_modules`` or beside it under ``@openai``.

    Returns:
        The native binary, or None when ``command`` is not the npm wrapper or none is installed.
    """
    relpath = native_binary_relpath()
    try:
        script = command.resolve()
    except OSError:
        return None
    if relpath is None or script.name != "codex.js" or script.parent.name != "bin":
        return None
    package_root = script.parent.parent
    for candidate in (
        package_root / "node_modules" / relpath,
        package_root.parent.parent / relpath,
    ):
        if _is_executable(candidate):
            return candidate
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
