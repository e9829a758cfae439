"""The Codex command lines the runner builds, its settings' checks, and the pure parts of the thread
guard and the binary lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.local_agent.codex_exec import CodexRunSettings, new_thread_command, resume_command
from worker.local_agent.codex_guard import is_codex_command, lock_path
from worker.local_agent.codex_install import native_binary_relpath

THREAD = "01a23357-c8b7-7e23-8886-07fd278f6424"
CODEX = Path("/opt/codex/bin/codex")


def test_resume_passes_only_flags_exec_resume_accepts() -> None:
    argv = resume_command(CODEX, THREAD, CodexRunSettings())
    assert argv == [
        "/opt/codex/bin/codex",
        "exec",
        "resume",
        "--json",
        "--skip-git-repo-check",
        "-c",
        'approval_policy="never"',
        "-c",
        'sandbox_mode="workspace-write"',
        "--disable",
        "unbounded_connection_retries",
        THREAD,
        "-",
    ]
    for rejected in ("-s", "--sandbox", "-C", "--cd", "--color", "-a", "--full-auto"):
        assert rejected not in argv


def test_sandbox_and_extra_overrides_are_passed_as_config() -> None:
    settings = CodexRunSettings(sandbox="read-only", config_overrides=('model="gpt-5.5"',))
    argv = new_thread_command(CODEX, settings)
    assert argv[:2] == ["/opt/codex/bin/codex", "exec"]
    assert 'sandbox_mode="read-only"' in argv
    assert argv[-3:] == ["-c", 'model="gpt-5.5"', "-"]
    assert "resume" not in argv


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"sandbox": "full"}, "sandbox"),
        ({"approval_policy": "always"}, "approval_policy"),
        ({"stall_timeout_s": 0}, "stall_timeout_s"),
        ({"turn_timeout_s": -1}, "turn_timeout_s"),
        ({"kill_grace_s": 0}, "kill_grace_s"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CodexRunSettings(**options)  # type: ignore[arg-type]


def test_an_explicit_codex_home_wins() -> None:
    assert CodexRunSettings(codex_home=Path("/srv/codex")).resolved_codex_home() == Path("/srv/codex")


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/local/bin/codex", "exec", "resume", "--json", THREAD, "-"],
        ["node", "/usr/lib/node_modules/@openai/codex/bin/codex.js", "resume", THREAD],
        ["C:\\tools\\codex.exe", "exec", "resume", THREAD],
        ["codex", "resume", THREAD],
    ],
)
def test_codex_on_the_thread_is_recognised(argv: list[str]) -> None:
    assert is_codex_command(argv, THREAD)


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/local/bin/codex", "exec", "resume", "--json", "01a23357-0000-7000-8000-000000000000", "-"],
        ["vim", f"notes-{THREAD}.md"],
        ["grep", THREAD, "rollout.jsonl"],
        ["python", "-m", "worker", THREAD],
        ["codex"],
    ],
)
def test_other_commands_are_not(argv: list[str]) -> None:
    assert not is_codex_command(argv, THREAD)


def test_the_lock_lives_under_the_codex_home() -> None:
    expected = Path(f"/home/me/.codex/boss/thread-locks/{THREAD}.lock")
    assert lock_path(Path("/home/me/.codex"), THREAD) == expected


@pytest.mark.parametrize("session_id", ["", "../x", "a/b", "x" * 200, ".hidden"])
def test_a_session_id_that_is_not_a_plain_name_has_no_lock(session_id: str) -> None:
    with pytest.raises(ValueError, match="not a Codex session id"):
        lock_path(Path("/c"), session_id)


@pytest.mark.parametrize(
    ("system", "machine", "relpath"),
    [
        ("Linux", "x86_64", "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"),
        ("Linux", "aarch64", "@openai/codex-linux-arm64/vendor/aarch64-unknown-linux-musl/bin/codex"),
        ("Darwin", "arm64", "@openai/codex-darwin-arm64/vendor/aarch64-apple-darwin/bin/codex"),
        ("Darwin", "x86_64", "@openai/codex-darwin-x64/vendor/x86_64-apple-darwin/bin/codex"),
        ("Windows", "AMD64", "@openai/codex-win32-x64/vendor/x86_64-pc-windows-msvc/bin/codex.exe"),
    ],
)
def test_the_native_binary_path_follows_the_npm_wrapper(system: str, machine: str, relpath: str) -> None:
    assert native_binary_relpath(system, machine) == Path(relpath)


def test_a_platform_without_a_codex_build_has_no_native_path() -> None:
    assert native_binary_relpath("FreeBSD", "riscv64") is None
