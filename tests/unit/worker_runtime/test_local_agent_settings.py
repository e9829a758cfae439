"""The local agent's settings (flags, BOSS_WORKER_* variables, defaults, clear errors with exit 2)
and the worker's wiring around it: thread registration sends Codex's session id."""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from worker.__main__ import main
from worker.agent import build_local_agent, registration_callback
from worker.codex_sessions.tracker import ThreadBudgetReading
from worker.settings import (
    LocalAgentSettings,
    SettingsError,
    WorkerSettings,
    local_agent_settings,
    settings_from_arguments,
)

SECRET = "a-test-secret-of-at-least-32-characters"


@pytest.fixture(autouse=True)
def _scheduler_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOSS_SCHEDULER_ADDRESS", "boss.example:50052")


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_defaults_run_the_local_agent_with_two_slots_in_workspace_write() -> None:
    settings = local_agent_settings(enabled=None, environ={})

    assert settings == LocalAgentSettings(
        scheduler_address="boss.example:50052",
        codex_bin=None,
        codex_sandbox="workspace-write",
        stall_timeout_s=300.0,
        turn_cap_s=1800.0,
        max_concurrent_tasks=2,
    )


def test_environment_sets_every_value_and_flags_win_over_it(tmp_path: Path) -> None:
    from_env = executable(tmp_path / "codex-env")
    from_flag = executable(tmp_path / "codex-flag")
    environ = {
        "BOSS_WORKER_CODEX_BIN": str(from_env),
        "BOSS_WORKER_CODEX_SANDBOX": "read-only",
        "BOSS_WORKER_TASK_STALL_TIMEOUT": "45",
        "BOSS_WORKER_TASK_TURN_CAP": "600.5",
        "BOSS_WORKER_MAX_CONCURRENT_TASKS": "4",
    }

    assert local_agent_settings(enabled=None, environ=environ) == LocalAgentSettings(
        "boss.example:50052", from_env, "read-only", 45.0, 600.5, 4
    )
    flagged = local_agent_settings(
        enabled=True,
        codex_bin=from_flag,
        codex_sandbox="danger-full-access",
        task_stall_timeout_s=5.0,
        task_turn_cap_s=60.0,
        max_concurrent_tasks=1,
        environ=environ,
    )
    assert flagged == LocalAgentSettings("boss.example:50052", from_flag, "danger-full-access", 5.0, 60.0, 1)


def test_no_local_agent_by_flag_or_environment() -> None:
    assert local_agent_settings(enabled=False, environ={}) is None
    assert local_agent_settings(enabled=None, environ={"BOSS_WORKER_LOCAL_AGENT": "off"}) is None
    assert local_agent_settings(enabled=None, environ={"BOSS_WORKER_LOCAL_AGENT": "1"}) is not None
    with pytest.raises(SettingsError, match=r"^BOSS_WORKER_LOCAL_AGENT must be on or off, got 'maybe'$"):
        local_agent_settings(enabled=None, environ={"BOSS_WORKER_LOCAL_AGENT": "maybe"})


@pytest.mark.parametrize(
    ("arguments", "environ", "message"),
    [
        (
            {"codex_sandbox": "yolo"},
            {},
            "--codex-sandbox must be one of read-only, workspace-write, danger-full-access, got 'yolo'",
        ),
        (
            {},
            {"BOSS_WORKER_CODEX_SANDBOX": "none"},
            "BOSS_WORKER_CODEX_SANDBOX must be one of read-only, workspace-write, danger-full-access, "
            "got 'none'",
        ),
        ({"task_stall_timeout_s": 0.0}, {}, "--task-stall-timeout must be > 0 seconds, got 0.0"),
        ({"task_turn_cap_s": -5.0}, {}, "--task-turn-cap must be > 0 seconds, got -5.0"),
        (
            {},
            {"BOSS_WORKER_TASK_STALL_TIMEOUT": "soon"},
            "BOSS_WORKER_TASK_STALL_TIMEOUT must be a number of seconds, got 'soon'",
        ),
        ({}, {"BOSS_WORKER_TASK_TURN_CAP": "nan"}, "BOSS_WORKER_TASK_TURN_CAP must be > 0 seconds, got nan"),
        ({"max_concurrent_tasks": 0}, {}, "--max-concurrent-tasks must be from 1 to 32, got 0"),
        (
            {},
            {"BOSS_WORKER_MAX_CONCURRENT_TASKS": "33"},
            "BOSS_WORKER_MAX_CONCURRENT_TASKS must be from 1 to 32, got 33",
        ),
        (
            {},
            {"BOSS_WORKER_MAX_CONCURRENT_TASKS": "two"},
            "BOSS_WORKER_MAX_CONCURRENT_TASKS must be a whole number, got 'two'",
        ),
    ],
)
def test_bad_values_are_clear_errors_naming_the_flag_or_variable(
    arguments: dict[str, object], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(SettingsError) as error:
        local_agent_settings(enabled=None, environ=environ, **arguments)  # type: ignore[arg-type]

    assert str(error.value) == message


def test_a_codex_bin_must_be_an_executable_file_or_a_program_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "codex-not-executable"
    plain.write_text("")
    executable(tmp_path / "codex")
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(
        SettingsError, match=r"^--codex-bin: .*codex-not-executable is not an executable file$"
    ):
        local_agent_settings(enabled=None, codex_bin=plain, environ={})
    with pytest.raises(SettingsError, match=r"^BOSS_WORKER_CODEX_BIN: .*missing is not an executable file$"):
        local_agent_settings(enabled=None, environ={"BOSS_WORKER_CODEX_BIN": str(tmp_path / "missing")})
    with pytest.raises(SettingsError, match=r"^--codex-bin: no program 'codex-nowhere' on PATH$"):
        local_agent_settings(enabled=None, codex_bin=Path("codex-nowhere"), environ={})
    found = local_agent_settings(enabled=None, codex_bin=Path("codex"), environ={})
    assert found is not None and found.codex_bin == tmp_path / "codex"


def codex_home(root: Path) -> Path:
    (root / "sessions").mkdir(parents=True)
    return root


def resolve(home: Path, **arguments: object) -> WorkerSettings:
    values: dict[str, object] = {
        "codex_home": home,
        "worker_id": "worker-a",
        "node_id": "node-a",
        "context_budget_address": None,
        "token": "a-token",
        "poll_interval_s": 1.0,
        "once": False,
        "environ": {"BOSS_GRPC_TLS": "on"},  # the scheduler is on another machine: over TLS
    }
    values.update(arguments)
    return settings_from_arguments(**values)  # type: ignore[arg-type]


def test_the_worker_runs_its_local_agent_unless_told_not_to_or_once(tmp_path: Path) -> None:
    home = codex_home(tmp_path / "home")
    (home / "sessions" / "rollout-x.jsonl").write_text("")

    assert resolve(home).local_agent == LocalAgentSettings("boss.example:50052")
    assert resolve(home, local_agent=False).local_agent is None
    assert resolve(home, once=True).local_agent is None
    assert resolve(home, max_concurrent_tasks=5).local_agent == LocalAgentSettings(
        "boss.example:50052", max_concurrent_tasks=5
    )


def test_a_bad_local_agent_flag_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    home = codex_home(tmp_path / "home")

    code = main(["run", "--codex-home", str(home), "--max-concurrent-tasks", "0"])

    assert code == 2
    assert capsys.readouterr().err == "worker: --max-concurrent-tasks must be from 1 to 32, got 0\n"


def test_a_bad_sandbox_in_the_environment_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    monkeypatch.setenv("BOSS_WORKER_CODEX_SANDBOX", "full")
    home = codex_home(tmp_path / "home")

    assert main(["run", "--codex-home", str(home)]) == 2
    assert "BOSS_WORKER_CODEX_SANDBOX must be one of" in capsys.readouterr().err


def test_no_local_agent_is_built_without_its_settings(tmp_path: Path) -> None:
    settings = resolve(codex_home(tmp_path / "home"), local_agent=False)

    assert build_local_agent(settings) is None


class RecordingRegistrar:
    def __init__(self) -> None:
        self.noted: list[tuple[str, str, str]] = []

    def note(
        self, thread_id: str, *, codex_folder: str = "", codex_thread_ref: str = "", title: str = ""
    ) -> None:
        self.noted.append((thread_id, codex_folder, codex_thread_ref))


def test_a_new_thread_is_registered_with_its_session_id_as_the_codex_thread_reference() -> None:
    registrar = RecordingRegistrar()
    register = registration_callback(registrar)
    thread_id = "019c8a4d-8f45-7010-8b5d-7fad920aa6f9"
    reading = ThreadBudgetReading(
        codex_thread_id=thread_id,
        cwd="/home/dev/repo",
        model="gpt-5.5",
        last_total_tokens=40_000,
        model_context_window=258_400,
        context_window=272_000,
        auto_compact_token_limit=244_800,
        codex_context_left_pct=88,
        context_budget_remaining_pct=87.6,
        compaction_count=0,
        last_compaction_at=None,
        estimated_remaining_turns=None,
        estimated_remaining_large_messages=None,
        compaction_expected_at=None,
        captured_at=datetime(2026, 12, 1, 10, 0, tzinfo=UTC),
        reading_sequence=1,
    )

    register(thread_id, reading, Path(f"/home/dev/.codex/sessions/rollout-x-{thread_id}.jsonl"))

    assert registrar.noted == [(thread_id, "/home/dev/repo", thread_id)]
