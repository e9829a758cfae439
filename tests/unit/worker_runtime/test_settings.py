"""Worker settings: Codex home checks, identity defaults and where the token comes from (never
signed by the worker: `make run` gives its worker one, a node enrolls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.local_stack import WORKER_TOKEN_LIFETIME, worker_environment
from services.shared.auth import TokenAuthority
from worker.__main__ import main
from worker.enrollment import Credential, write_credential
from worker.settings import (
    SettingsError,
    check_codex_home,
    default_codex_home,
    hostname,
    resolve_token,
    settings_from_arguments,
)

SECRET = "a-test-secret-of-at-least-32-characters"


def codex_home_with_session(root: Path) -> Path:
    day = root / "sessions" / "2026" / "02" / "23"
    day.mkdir(parents=True)
    (day / "rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl").write_text("")
    return root


def test_default_codex_home_is_codex_home_env_else_dot_codex() -> None:
    assert default_codex_home({"CODEX_HOME": "/srv/codex"}) == Path("/srv/codex")
    assert default_codex_home({}) == Path.home() / ".codex"


def test_missing_sessions_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as error:
        check_codex_home(tmp_path, require_sessions=False)

    assert str(error.value) == (
        f"no Codex sessions under {tmp_path / 'sessions'}: point --codex-home at your ~/.codex"
    )


def test_once_needs_at_least_one_rollout_file(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()

    check_codex_home(tmp_path, require_sessions=False)
    with pytest.raises(SettingsError, match="no Codex sessions under"):
        check_codex_home(tmp_path, require_sessions=True)
    codex_home_with_session(tmp_path / "other")
    check_codex_home(tmp_path / "other", require_sessions=True)


def test_explicit_token_wins_then_environment() -> None:
    assert resolve_token("explicit", {"BOSS_WORKER_TOKEN": "from-env"}) == "explicit"
    assert resolve_token(None, {"BOSS_WORKER_TOKEN": "from-env"}) == "from-env"


def test_the_worker_signs_no_token_even_beside_the_auth_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    monkeypatch.setenv("BOSS_DATA_DIR", str(tmp_path / "data"))

    with pytest.raises(
        SettingsError, match=r"no worker token: enroll this node .*\(boss-worker enroll CODE\)"
    ):
        resolve_token(None, {})
    assert not (tmp_path / "data").exists()


def test_defaults_name_the_worker_after_the_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BOSS_CONTEXT_BUDGET_ADDRESS", raising=False)
    home = codex_home_with_session(tmp_path)

    settings = settings_from_arguments(
        codex_home=home,
        worker_id=None,
        node_id=None,
        context_budget_address=None,
        token="t",
        poll_interval_s=1.0,
        once=False,
    )

    assert settings.worker_id == f"worker-{hostname()}"
    assert settings.node_id == hostname()
    assert settings.context_budget_address == "127.0.0.1:50051"
    assert settings.codex_home == home.resolve()
    assert settings.poll_interval_s == 1.0


def test_bad_poll_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="--poll-interval must be > 0"):
        settings_from_arguments(
            codex_home=codex_home_with_session(tmp_path),
            worker_id="w",
            node_id="n",
            context_budget_address="127.0.0.1:1",
            token="t",
            poll_interval_s=0.0,
            once=False,
        )


def test_cli_reports_a_missing_codex_home_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--codex-home", str(tmp_path / "nowhere"), "--token", "t"])

    assert code == 2
    sessions = tmp_path / "nowhere" / "sessions"
    assert capsys.readouterr().err == (
        f"worker: no Codex sessions under {sessions}: point --codex-home at your ~/.codex\n"
    )


def test_run_without_a_token_or_credential_exits_2_saying_how_to_enroll(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    monkeypatch.delenv("BOSS_WORKER_TOKEN", raising=False)
    monkeypatch.setenv("BOSS_WORKER_CREDENTIAL", str(tmp_path / "no-credential.json"))

    code = main(["run", "--codex-home", str(codex_home_with_session(tmp_path / "codex"))])

    assert code == 2
    assert capsys.readouterr().err.startswith("worker: no worker token: enroll this node")


def test_make_runs_worker_gets_a_token_for_this_machine_unless_it_has_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("BOSS_DEFAULT_OWNER_ID", raising=False)
    authority = TokenAuthority(SECRET)
    environment = {"BOSS_DATA_DIR": str(tmp_path)}

    given = worker_environment(authority, environment)

    principal = authority.verify(given["BOSS_WORKER_TOKEN"])
    assert (principal.kind, principal.worker_id, principal.node_id, principal.owner_id) == (
        "worker",
        f"worker-{hostname()}",
        hostname(),
        "local",
    )
    assert WORKER_TOKEN_LIFETIME.days == 365
    assert environment == {"BOSS_DATA_DIR": str(tmp_path)}
    with_token = {**environment, "BOSS_WORKER_TOKEN": "mine"}
    assert worker_environment(authority, with_token) == with_token
    credential = Credential("enrolled", "device-1", "local", "n", "w", "2027-01-01T00:00:00Z")
    write_credential(tmp_path / "worker-credential.json", credential)
    assert worker_environment(authority, environment) == environment
