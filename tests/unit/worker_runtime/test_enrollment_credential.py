"""The enrolled credential on disk: written whole and owner-only, refused when others may read it,
and what `run` takes from it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from worker.enrollment import Credential, EnrollmentError, credential_path, read_credential, write_credential
from worker.settings import SettingsError, settings_from_arguments

CREDENTIAL = Credential(
    worker_token="token-text",
    device_id="dev-1",
    owner_id="alice",
    node_id="laptop",
    worker_id="worker-laptop",
    token_expires_at="2028-01-10T12:00:00Z",
)


def test_the_credential_is_written_owner_only_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "worker-credential.json"
    write_credential(path, CREDENTIAL)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_credential(path) == CREDENTIAL
    assert "token-text" not in repr(CREDENTIAL)
    write_credential(path, CREDENTIAL)  # enrolling again replaces it
    assert [p.name for p in path.parent.iterdir()] == ["worker-credential.json"]
    assert read_credential(tmp_path / "none.json") is None


def test_a_credential_others_may_read_or_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "worker-credential.json"
    write_credential(path, CREDENTIAL)
    path.chmod(0o644)
    with pytest.raises(EnrollmentError, match="chmod 600"):
        read_credential(path)
    path.write_text("{}")
    path.chmod(0o600)
    with pytest.raises(EnrollmentError, match="not a worker credential"):
        read_credential(path)


def test_run_takes_node_worker_and_token_from_the_credential(tmp_path: Path) -> None:
    path = tmp_path / "worker-credential.json"
    write_credential(path, CREDENTIAL)
    (tmp_path / "codex" / "sessions").mkdir(parents=True)
    environ = {"BOSS_WORKER_CREDENTIAL": str(path)}
    assert credential_path(environ) == path
    assert credential_path({"BOSS_DATA_DIR": str(tmp_path)}) == tmp_path / "worker-credential.json"

    def settings(**given: object) -> object:
        arguments: dict[str, object] = {
            "codex_home": tmp_path / "codex",
            "worker_id": None,
            "node_id": None,
            "context_budget_address": None,
            "token": None,
            "poll_interval_s": 1.0,
            "once": False,
            "local_agent": False,
            "environ": environ,
        }
        return settings_from_arguments(**{**arguments, **given})  # type: ignore[arg-type]

    resolved = settings()
    assert (resolved.worker_id, resolved.node_id, resolved.token) == ("worker-laptop", "laptop", "token-text")  # type: ignore[attr-defined]
    with pytest.raises(SettingsError, match="enrolled as worker 'worker-laptop' on node 'laptop'"):
        settings(node_id="desktop")
    explicit = settings(token="explicit-token", node_id="desktop", worker_id="w")
    assert explicit.token == "explicit-token"  # type: ignore[attr-defined]
