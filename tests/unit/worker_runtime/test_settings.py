"""Worker settings: Codex home checks, identity defaults and where the token comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.shared.auth import TokenAuthority
from worker.__main__ import main
from worker.settings import (
    SettingsError,
    check_codex_home,
    default_codex_home,
    hostname,
    resolve_token,
    settings_from_arguments,
    token_provider,
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


def test_explicit_token_wins_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)

    assert resolve_token("explicit", "w", "n", {"BOSS_WORKER_TOKEN": "from-env"}) == "explicit"
    assert resolve_token(None, "w", "n", {"BOSS_WORKER_TOKEN": "from-env"}) == "from-env"


def test_token_is_minted_from_the_local_secret_and_bound_to_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)

    token = resolve_token(None, "worker-mac", "mac", {})

    principal = TokenAuthority(SECRET).verify(token)
    assert (principal.kind, principal.worker_id, principal.node_id) == ("worker", "worker-mac", "mac")


def test_no_token_and_no_secret_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("BOSS_AUTH_SECRET", raising=False)
    monkeypatch.setenv("BOSS_DATA_DIR", str(tmp_path / "data"))

    with pytest.raises(SettingsError, match="no worker token: pass --token or set BOSS_WORKER_TOKEN"):
        resolve_token(None, "w", "n", {})
    assert not (tmp_path / "data" / "auth-secret").exists()


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


def test_a_minted_token_is_renewed_at_each_connect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)
    monkeypatch.delenv("BOSS_WORKER_TOKEN", raising=False)
    common = {
        "codex_home": codex_home_with_session(tmp_path),
        "worker_id": "worker-mac",
        "node_id": "mac",
        "context_budget_address": "127.0.0.1:1",
        "poll_interval_s": 1.0,
        "once": False,
    }

    minted = settings_from_arguments(token=None, **common)  # type: ignore[arg-type]
    given = settings_from_arguments(token="given", **common)  # type: ignore[arg-type]

    assert minted.token_minted is True and given.token_minted is False
    renew = token_provider(minted)
    first, second = renew(), renew()
    assert first != second
    assert TokenAuthority(SECRET).verify(second).worker_id == "worker-mac"
    assert token_provider(given)() == "given"
    assert "given" not in repr(given)
