"""Fixtures shared by the whole suite.

Storage tests take the `database_target` fixture, parametrised over the embedded SQLite default and a
real PostgreSQL server (BOSS_TEST_POSTGRES_URL, default the local server's `test` database). Each
test gets its own SQLite file or its own PostgreSQL schema, dropped afterwards, so tests never see
each other's rows. PostgreSQL being down is a failure, not a skip: set BOSS_TEST_SKIP_POSTGRES=1 to
run the SQLite half alone on a machine without it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

POSTGRES_URL = os.environ.get("BOSS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPOSITORY_ROOT.parent / "shared" / "samples"


@dataclass(frozen=True)
class DatabaseTarget:
    """Where a test's service database lives: a SQLAlchemy async URL and a PostgreSQL schema."""

    backend: str
    url: str
    schema: str


def _postgres_sync_url() -> str:
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DatabaseTarget]:
    """A fresh, empty database for one test, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield DatabaseTarget("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'test.sqlite3'}", "")
        return
    if os.environ.get("BOSS_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("BOSS_TEST_SKIP_POSTGRES=1")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    engine = create_engine(_postgres_sync_url())
    try:
        with engine.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as error:  # a clear message beats a stack of driver frames
        pytest.fail(
            f"PostgreSQL at {POSTGRES_URL} is not reachable ({error}); start it or set "
            "BOSS_TEST_SKIP_POSTGRES=1",
            pytrace=False,
        )
    try:
        yield DatabaseTarget("postgresql", POSTGRES_URL, schema)
    finally:
        drop_schema(engine, schema)
        engine.dispose()


def drop_schema(engine: Engine, schema: str) -> None:
    """Drops a test schema without ever hanging: a connection a test left idle inside a transaction
    would hold locks that make DROP wait for ever, so DROP gives up after 10 s, such connections of
    this database are ended, and DROP runs again."""
    statement = text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    try:
        with engine.begin() as connection:
            connection.execute(text("SET LOCAL lock_timeout = '10s'"))
            connection.execute(statement)
        return
    except OperationalError:
        pass
    with engine.begin() as connection:
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
            )
        )
    with engine.begin() as connection:
        connection.execute(statement)


@pytest.fixture
def samples_dir() -> Path:
    """The real Codex session files shared with the project (read-only, never copied into it)."""
    path = SAMPLES_DIR / "codex"
    if not path.is_dir():
        pytest.fail(f"sample Codex sessions not found at {path}", pytrace=False)
    return path
