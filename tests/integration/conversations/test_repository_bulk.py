"""The conversations repository's batch statements on SQLite and PostgreSQL: several rows updated in
one go (on PostgreSQL one UPDATE ... FROM json_populate_recordset) store exactly what one update per row
would, datetimes and NULLs included, and touch no other row; id lists of any length select the same
rows (on PostgreSQL `= ANY(array)`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from services.conversations.adapters.repository import SqlAlchemyConversationsRepository
from services.conversations.server import migrate
from services.shared.db import Database
from tests.conftest import DatabaseTarget

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


async def seeded(target: DatabaseTarget, count: int) -> Database:
    await migrate(target.url, target.schema or "conversations")
    database = Database.connect(target.url, target.schema or "conversations")
    async with database.transaction() as connection:
        repository = SqlAlchemyConversationsRepository(connection)
        for index in range(count):
            await repository.insert_thread(
                {
                    "thread_id": f"th-{index}",
                    "owner_id": "local",
                    "node_id": "node-a",
                    "worker_id": "worker-a",
                    "codex_folder": f"/work/{index}",
                    "codex_thread_ref": "",
                    "title": f"thread {index}",
                    "registered_at": T0,
                }
            )
    return database


async def test_several_rows_in_one_update_store_what_each_update_would(
    database_target: DatabaseTarget,
) -> None:
    database = await seeded(database_target, 4)
    expected_at = datetime(2026, 11, 30, 9, 30, tzinfo=timezone(timedelta(hours=2)))
    try:
        async with database.transaction() as connection:
            await SqlAlchemyConversationsRepository(connection).update_threads(
                [
                    (
                        "th-0",
                        {"remaining_pct": 41.5, "level": "watch", "compaction_expected_at": expected_at},
                    ),
                    ("th-1", {"remaining_pct": 12.25, "level": "critical", "compaction_expected_at": None}),
                    (
                        "th-2",
                        {"must_finish_before_compaction": True, "must_finish_reason": "patch half applied"},
                    ),
                    ("th-3", {}),
                ]
            )
        async with database.read() as connection:
            rows = await SqlAlchemyConversationsRepository(connection).threads_by_id(
                ["th-0", "th-1", "th-2", "th-3", "th-missing"]
            )
    finally:
        await database.dispose()

    assert sorted(rows) == ["th-0", "th-1", "th-2", "th-3"]
    assert (rows["th-0"]["remaining_pct"], rows["th-0"]["level"]) == (41.5, "watch")
    assert rows["th-0"]["compaction_expected_at"] == expected_at  # same instant, stored in UTC
    assert rows["th-0"]["compaction_expected_at"].utcoffset() == timedelta(0)
    assert (rows["th-1"]["remaining_pct"], rows["th-1"]["level"]) == (12.25, "critical")
    assert rows["th-1"]["compaction_expected_at"] is None
    assert rows["th-2"]["must_finish_before_compaction"] is True
    assert rows["th-2"]["must_finish_reason"] == "patch half applied"
    assert rows["th-2"]["remaining_pct"] is None, "a column not named is left as it was"
    assert rows["th-3"]["remaining_pct"] is None and rows["th-3"]["level"] == ""
    assert rows["th-3"]["codex_folder"] == "/work/3"


async def test_id_lists_of_any_length_select_the_same_rows(database_target: DatabaseTarget) -> None:
    database = await seeded(database_target, 30)
    try:
        async with database.read() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            one = await repository.threads_by_id(["th-7"])
            many = await repository.threads_by_id([f"th-{index}" for index in range(0, 30, 3)] + ["th-x"])
            none = await repository.threads_by_id([])
    finally:
        await database.dispose()

    assert list(one) == ["th-7"]
    assert sorted(many) == sorted(f"th-{index}" for index in range(0, 30, 3))
    assert none == {}
