"""Files that hold an installation's data or secrets are readable by their owner only: SQLite
databases (with their -wal and -shm files), the auth secret, the data folder and the client token."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from services.context_budget.server import migrate
from services.shared import config
from services.shared.db import Database


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_sqlite_database_and_its_journal_files_are_owner_only(tmp_path: Path) -> None:
    file = tmp_path / "context_budget.sqlite3"
    url = f"sqlite+aiosqlite:///{file}"
    await migrate(url)
    database = Database.connect(url, "context_budget")
    try:
        async with database.transaction() as connection:
            await connection.execute(text("CREATE TABLE probe (x INTEGER)"))
            await connection.execute(text("INSERT INTO probe VALUES (1)"))
        async with database.read() as connection:
            assert (await connection.execute(text("SELECT x FROM probe"))).scalar_one() == 1
            files = sorted(tmp_path.glob("context_budget.sqlite3*"))
            assert [path.name for path in files][:1] == ["context_budget.sqlite3"]
            assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
    finally:
        await database.dispose()


async def test_an_existing_database_that_others_may_read_is_narrowed(tmp_path: Path) -> None:
    file = tmp_path / "old.sqlite3"
    file.touch()
    file.chmod(0o644)
    database = Database.connect(f"sqlite+aiosqlite:///{file}", "x")
    await database.dispose()
    assert mode(file) == 0o600


def test_the_auth_secret_the_data_folder_and_private_files_are_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "var"
    monkeypatch.setenv("BOSS_DATA_DIR", str(data))
    monkeypatch.delenv("BOSS_AUTH_SECRET", raising=False)
    secret = config.auth_secret()
    assert len(secret) >= 32
    assert mode(data) == 0o700 and mode(data / "auth-secret") == 0o600

    (data / "auth-secret").chmod(0o644)  # e.g. copied in by hand
    assert config.auth_secret() == secret
    assert mode(data / "auth-secret") == 0o600

    token = data / "client-token"
    token.write_text("old\n")
    token.chmod(0o644)
    config.write_private(token, "new\n")
    assert (token.read_text(), mode(token)) == ("new\n", 0o600)
