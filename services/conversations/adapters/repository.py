"""SqlAlchemyConversationsRepository: reads and writes of the conversations tables inside a caller's
transaction (the unit of work is `Database.transaction()`), plus row -> domain conversions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import ARRAY, String, and_, any_, bindparam, false, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.tables import project_threads, projects, threads
from services.conversations.domain.model import (
    HANDOFF_NONE,
    Indicator,
    SortKey,
    ThreadBudget,
    ThreadView,
)
from services.shared.sql_types import (
    CarriedWrites,
    column_list,
    fetch_driver_row_pairs,
    fetch_driver_rows,
)

# A row as a mapping of column name to value (SQLAlchemy's RowMapping, or a dict on hot reads).
Row = Mapping[Any, Any]
_THREAD_COLUMNS, _THREAD_COLUMNS_OF_T = column_list(threads), column_list(threads, "t")
_PROJECT_COLUMNS, _PROJECT_COLUMNS_OF_P = column_list(projects), column_list(projects, "p")


def _json_value(value: Any) -> Any:
    """JSON form of the column values json cannot encode itself (datetimes: ISO 8601 with offset)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot send {type(value).__name__} as a column value")


def stored_reading_order(row: Mapping[Any, Any]) -> tuple[datetime, int] | None:
    """The `ThreadBudget.reading_order` of the thread's stored reading, without making the budget;
    None before its first report."""
    if row["remaining_pct"] is None or row["captured_at"] is None:
        return None
    return (row["captured_at"], int(row["snapshot_version"] or 0))


def budget_of(row: Mapping[Any, Any]) -> ThreadBudget | None:
    """The thread's latest budget from its row; None before its first report."""
    if stored_reading_order(row) is None:
        return None
    return ThreadBudget(
        remaining_pct=float(row["remaining_pct"]),
        level=row["level"],
        node_id=row["budget_node_id"] or row["node_id"],
        updated_at=row["budget_updated_at"] or row["captured_at"],
        captured_at=row["captured_at"],
        snapshot_version=int(row["snapshot_version"] or 0),
        must_finish_before_compaction=bool(row["must_finish_before_compaction"]),
        must_finish_reason=row["must_finish_reason"] or "",
        compaction_expected_at=row["compaction_expected_at"],
        last_compaction_at=row["last_compaction_at"],
        compaction_count=int(row["compaction_count"] or 0),
        estimated_remaining_turns=row["estimated_remaining_turns"],
        master_actions=tuple(json.loads(row["master_actions_json"] or "[]")),
        awaiting_reading_after_compaction=bool(row["awaiting_reading_after_compaction"]),
        compaction_limit_source=row["compaction_limit_source"] or "",
    )


def budget_columns(budget: ThreadBudget) -> dict[str, Any]:
    """The `threads` columns that store a budget."""
    return {
        "remaining_pct": budget.remaining_pct,
        "level": budget.level,
        "budget_node_id": budget.node_id,
        "must_finish_before_compaction": budget.must_finish_before_compaction,
        "must_finish_reason": budget.must_finish_reason,
        "compaction_expected_at": budget.compaction_expected_at,
        "last_compaction_at": budget.last_compaction_at,
        "compaction_count": budget.compaction_count,
        "estimated_remaining_turns": budget.estimated_remaining_turns,
        "snapshot_version": budget.snapshot_version,
        "captured_at": budget.captured_at,
        "budget_updated_at": budget.updated_at,
        "master_actions_json": json.dumps(list(budget.master_actions)),
        "awaiting_reading_after_compaction": budget.awaiting_reading_after_compaction,
        "compaction_limit_source": budget.compaction_limit_source,
    }


def indicator_columns(indicator: Indicator) -> dict[str, Any]:
    """The `projects` columns that store the ring (the shown thread id is kept even when hidden)."""
    return {
        "indicator_visible": indicator.visible,
        "indicator_percent": indicator.percent,
        "indicator_level": indicator.level,
        "indicator_source_node_id": indicator.source_node_id,
        "indicator_updated_at": indicator.updated_at,
        "indicator_must_finish": indicator.must_finish_before_compaction,
        "indicator_awaiting_reading": indicator.awaiting_reading_after_compaction,
    }


def indicator_of(row: Mapping[Any, Any]) -> Indicator:
    """The ring stored on a project row."""
    if not row["indicator_visible"]:
        return Indicator(visible=False)
    return Indicator(
        visible=True,
        percent=int(row["indicator_percent"]),
        level=row["indicator_level"],
        thread_id=row["indicator_thread_id"],
        source_node_id=row["indicator_source_node_id"],
        updated_at=row["indicator_updated_at"],
        must_finish_before_compaction=bool(row["indicator_must_finish"]),
        awaiting_reading_after_compaction=bool(row["indicator_awaiting_reading"]),
    )


def view_of(row: Mapping[Any, Any]) -> ThreadView:
    """A thread row as the risk rules see it."""
    return ThreadView(
        thread_id=row["thread_id"],
        title=row["title"],
        node_id=row["node_id"],
        worker_id=row["worker_id"],
        budget=budget_of(row),
        handoff_status=row["handoff_status"] or HANDOFF_NONE,
    )


class SqlAlchemyConversationsRepository:
    """Every statement of the conversations context, on one open connection (one transaction)."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    def _among(self, column: Any, values: Sequence[str]) -> Any:
        """`column IN values`; on PostgreSQL `column = ANY(array)`, whose statement text is the same
        whatever the number of values, so the driver's prepared statement and SQLAlchemy's compiled
        form are reused (an IN list renders, parses and plans a new statement per length)."""
        if self.connection.dialect.name == "postgresql":
            return column == any_(bindparam(None, list(values), type_=ARRAY(String)))
        return column.in_(list(values))

    async def thread(self, thread_id: str) -> Row | None:
        """One thread row, or None."""
        result = await self.connection.execute(select(threads).where(threads.c.thread_id == thread_id))
        return result.mappings().one_or_none()

    async def threads_by_id(self, thread_ids: Iterable[str]) -> dict[str, Row]:
        """Thread rows by id (unknown ids are absent)."""
        ids = list(set(thread_ids))
        if not ids:
            return {}
        if self.connection.dialect.name == "postgresql":
            rows = await fetch_driver_rows(
                self.connection,
                threads,
                f"SELECT {_THREAD_COLUMNS} FROM threads WHERE thread_id = ANY(%(ids)b::text[])",
                {"ids": ids},
            )
            return {row["thread_id"]: row for row in rows}
        result = await self.connection.execute(select(threads).where(self._among(threads.c.thread_id, ids)))
        return {row["thread_id"]: row for row in result.mappings()}

    async def insert_thread(self, values: dict[str, Any]) -> None:
        """Inserts a thread row (budget columns take their defaults)."""
        defaults = {
            "remaining_pct": None,
            "level": "",
            "budget_node_id": "",
            "must_finish_before_compaction": False,
            "must_finish_reason": "",
            "compaction_count": 0,
            "snapshot_version": 0,
            "master_actions_json": "[]",
            "awaiting_reading_after_compaction": False,
            "compaction_limit_source": "",
            "handoff_status": HANDOFF_NONE,
            "handoff_package_id": "",
            "handoff_reason": "",
            "checklist_done_json": "[]",
            "archived_at": None,
            "is_master_main_thread": False,
            "single_device_project_id": "",
        }
        await self.connection.execute(insert(threads).values({**defaults, **values}))

    async def update_thread(self, thread_id: str, values: dict[str, Any]) -> None:
        """Updates columns of one thread."""
        await self.connection.execute(update(threads).where(threads.c.thread_id == thread_id).values(values))

    async def update_threads(self, changes: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Updates columns of several threads: one executemany per distinct set of columns (one
        pipelined round trip on PostgreSQL), instead of one statement per thread."""
        await self._update_many(threads, threads.c.thread_id, changes)

    async def _update_many(self, table: Any, key: Any, changes: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Applies `changes` (row id, {column: value}) grouped by their set of columns (see
        `_update_tables`)."""
        await self._update_tables([(table, key, changes)])

    async def _update_tables(
        self,
        work: Sequence[tuple[Any, Any, Sequence[tuple[str, dict[str, Any]]]]],
        *,
        carried: bool = False,
    ) -> CarriedWrites | None:
        """Applies, per (table, key column, changes), the changes (row id, {column: value}) grouped by
        their set of columns. On PostgreSQL every group of every table is a set-based UPDATE from a
        JSON array (`_update_from_json_sql`) and all of them together are one statement (as
        data-modifying WITH clauses, `CarriedWrites`: each row changes at most once, so their order
        does not matter), one round trip whatever the number of rows and tables; elsewhere one
        executemany per group.

        With `carried` on PostgreSQL nothing runs here: the updates come back as `CarriedWrites`
        (None when there is nothing to change) for the outbox append to make. Returns None
        otherwise."""
        postgres = self.connection.dialect.name == "postgresql"
        updates: list[tuple[str, dict[str, Any]]] = []
        for table, key, changes in work:
            groups: dict[tuple[str, ...], list[tuple[str, dict[str, Any]]]] = {}
            for row_id, values in changes:
                if values:
                    groups.setdefault(tuple(sorted(values)), []).append((row_id, values))
            for columns, rows in groups.items():
                if postgres:
                    updates.append(
                        self._update_from_json_sql(table, key, columns, rows, f"rows_{len(updates)}")
                    )
                    continue
                statement = (
                    update(table)
                    .where(key == bindparam("k_id"))
                    .values({column: bindparam(f"v_{column}") for column in columns})
                )
                each = [
                    {"k_id": row_id, **{f"v_{column}": value for column, value in values.items()}}
                    for row_id, values in rows
                ]
                await self.connection.execute(statement, each[0] if len(each) == 1 else each)
        if not updates:
            return None
        parameters: dict[str, Any] = {}
        for _sql, group_parameters in updates:
            parameters.update(group_parameters)
        names = tuple(f"update_{index}" for index in range(len(updates)))
        clauses = tuple((name, f"{sql} RETURNING 1") for name, (sql, _) in zip(names, updates, strict=True))
        writes = CarriedWrites(clauses, names, parameters)
        if carried:
            return writes
        await writes.run(self.connection)
        return None

    def _update_from_json_sql(
        self,
        table: Any,
        key: Any,
        columns: tuple[str, ...],
        rows: list[tuple[str, dict[str, Any]]],
        name: str,
    ) -> tuple[str, dict[str, Any]]:
        """An UPDATE ... FROM json_populate_recordset for many rows (PostgreSQL; driver SQL taking the
        parameters `name` and `name_keys`) and those parameters. An executemany costs a statement
        per row on both sides (~100 us of client CPU each, and the server plans and runs every one);
        this sends the rows as one JSON array, typed by the table's own row type. Datetimes travel
        as ISO 8601 text with their offset.

        The keys also travel as an array matched with `= ANY`: the planner cannot see how many rows
        the JSON holds (it assumes 100) and, without that condition, joins them to a sequential
        scan of the whole table, a cost that grows with the table; with it, it looks the rows up by
        the key's index."""
        quote = self.connection.dialect.identifier_preparer.quote
        key_name, table_name = quote(key.name), quote(table.name)
        assignments = ", ".join(f"{quote(column)} = source.{quote(column)}" for column in columns)
        statement = (
            f"UPDATE {table_name} AS target SET {assignments} "
            f"FROM json_populate_recordset(NULL::{table_name}, %({name})s::json) AS source "
            f"WHERE target.{key_name} = ANY(%({name}_keys)b::text[]) "
            f"AND target.{key_name} = source.{key_name}"
        )
        key_column = str(key.name)  # orjson takes exact str keys only; SQLAlchemy names subclass it
        payload = orjson.dumps(
            [{key_column: row_id, **values} for row_id, values in rows], default=_json_value
        ).decode()
        return statement, {name: payload, f"{name}_keys": [row_id for row_id, _values in rows]}

    async def project(self, project_id: str) -> Row | None:
        """One project row, or None."""
        result = await self.connection.execute(select(projects).where(projects.c.project_id == project_id))
        return result.mappings().one_or_none()

    async def projects_by_id(self, project_ids: Iterable[str]) -> list[Row]:
        """Project rows for the ids (unknown ids are absent), by id."""
        ids = sorted(set(project_ids))
        if not ids:
            return []
        result = await self.connection.execute(
            select(projects).where(self._among(projects.c.project_id, ids)).order_by(projects.c.project_id)
        )
        return list(result.mappings())

    async def insert_project(self, values: dict[str, Any]) -> None:
        """Inserts a project row; the ring starts hidden."""
        defaults = {
            "manual_pinned": False,
            "latest_reply_at": None,
            "archived_at": None,
            "indicator_thread_id": "",
            "indicator_visible": False,
            "indicator_percent": 0,
            "indicator_level": "",
            "indicator_source_node_id": "",
            "indicator_updated_at": None,
            "indicator_must_finish": False,
            "indicator_awaiting_reading": False,
            "strategy_summary": "",
        }
        await self.connection.execute(insert(projects).values({**defaults, **values}))

    async def update_project(self, project_id: str, values: dict[str, Any]) -> None:
        """Updates columns of one project."""
        await self.connection.execute(
            update(projects).where(projects.c.project_id == project_id).values(values)
        )

    async def update_projects(self, changes: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Updates columns of several projects (one executemany per distinct set of columns)."""
        await self._update_many(projects, projects.c.project_id, changes)

    async def update_threads_and_projects(
        self,
        thread_changes: Sequence[tuple[str, dict[str, Any]]],
        project_changes: Sequence[tuple[str, dict[str, Any]]],
        *,
        carried: bool = False,
    ) -> CarriedWrites | None:
        """`update_threads` and `update_projects` together: one statement on PostgreSQL; with
        `carried`, returned for the outbox append to make instead (see `_update_tables`)."""
        return await self._update_tables(
            [
                (threads, threads.c.thread_id, thread_changes),
                (projects, projects.c.project_id, project_changes),
            ],
            carried=carried,
        )

    async def members_and_projects_of_threads(
        self, thread_ids: Iterable[str]
    ) -> tuple[list[tuple[str, Row]], list[Row]]:
        """`members_of_projects_of_threads(thread_ids)` and the rows of those projects and of the
        projects whose ring shows one of `thread_ids` (as `projects_by_id_or_shown_thread`): one
        statement on PostgreSQL (the projection reads both for every batch), two elsewhere."""
        ids = list(set(thread_ids))
        if not ids:
            return [], []
        if self.connection.dialect.name != "postgresql":
            memberships = await self.members_of_projects_of_threads(ids)
            return memberships, await self.projects_by_id_or_shown_thread(
                {project_id for project_id, _row in memberships}, ids
            )
        pairs = await fetch_driver_row_pairs(
            self.connection,
            projects,
            threads,
            "WITH of_threads AS (SELECT DISTINCT project_id FROM project_threads "
            "WHERE thread_id = ANY(%(ids)b::text[])), "
            "wanted AS (SELECT project_id FROM of_threads UNION "
            "SELECT project_id FROM projects WHERE indicator_thread_id = ANY(%(ids)b::text[])) "
            f"SELECT {_PROJECT_COLUMNS_OF_P}, {_THREAD_COLUMNS_OF_T} FROM wanted "
            "JOIN projects AS p ON p.project_id = wanted.project_id "
            "LEFT JOIN of_threads ON of_threads.project_id = p.project_id "
            "LEFT JOIN project_threads AS member "
            "ON member.project_id = of_threads.project_id "
            "LEFT JOIN threads AS t ON t.thread_id = member.thread_id "
            "ORDER BY p.project_id, t.thread_id",
            {"ids": ids},
        )
        members: list[tuple[str, Row]] = []
        rows: dict[str, Row] = {}
        for project, thread in pairs:
            rows.setdefault(project["project_id"], project)
            if thread is not None:
                members.append((project["project_id"], thread))
        return members, list(rows.values())

    async def members_of_projects_of_threads(self, thread_ids: Iterable[str]) -> list[tuple[str, Row]]:
        """(project id, thread row) for every member of every project one of `thread_ids` belongs to,
        in one statement; ordered by project id, then thread id. Membership of the given threads is
        the rows whose thread id is one of them."""
        ids = list(set(thread_ids))
        if not ids:
            return []
        if self.connection.dialect.name == "postgresql":
            rows = await fetch_driver_rows(
                self.connection,
                threads,
                f"SELECT member.project_id, {_THREAD_COLUMNS_OF_T} FROM project_threads AS member "
                "JOIN threads AS t ON t.thread_id = member.thread_id WHERE member.project_id IN "
                "(SELECT project_id FROM project_threads WHERE thread_id = ANY(%(ids)b::text[])) "
                "ORDER BY member.project_id, t.thread_id",
                {"ids": ids},
                "member_project_id",
            )
            return [(row.pop("member_project_id"), row) for row in rows]
        of_threads = select(project_threads.c.project_id).where(self._among(project_threads.c.thread_id, ids))
        result = await self.connection.execute(
            select(project_threads.c.project_id.label("member_project_id"), threads)
            .join(threads, threads.c.thread_id == project_threads.c.thread_id)
            .where(project_threads.c.project_id.in_(of_threads))
            .order_by(project_threads.c.project_id, threads.c.thread_id)
        )
        return [(row["member_project_id"], row) for row in result.mappings()]

    async def projects_by_id_or_shown_thread(
        self, project_ids: Iterable[str], thread_ids: Iterable[str]
    ) -> list[Row]:
        """Projects with one of `project_ids`, or whose ring shows one of `thread_ids`, by id."""
        ids, shown = sorted(set(project_ids)), list(set(thread_ids))
        if not ids and not shown:
            return []
        if self.connection.dialect.name == "postgresql":
            return [
                *await fetch_driver_rows(
                    self.connection,
                    projects,
                    f"SELECT {_PROJECT_COLUMNS} FROM projects WHERE project_id = ANY(%(ids)b::text[]) "
                    "OR indicator_thread_id = ANY(%(shown)s::text[]) ORDER BY project_id",
                    {"ids": ids, "shown": shown},
                )
            ]
        result = await self.connection.execute(
            select(projects)
            .where(
                or_(
                    self._among(projects.c.project_id, ids),
                    self._among(projects.c.indicator_thread_id, shown),
                )
            )
            .order_by(projects.c.project_id)
        )
        return list(result.mappings())

    async def add_member(self, project_id: str, thread_id: str, joined_at: datetime) -> None:
        """Adds a thread to a project (no-op when it is a member already)."""
        exists = await self.connection.execute(
            select(project_threads.c.thread_id).where(
                project_threads.c.project_id == project_id, project_threads.c.thread_id == thread_id
            )
        )
        if exists.first() is None:
            await self.connection.execute(
                insert(project_threads).values(
                    project_id=project_id, thread_id=thread_id, joined_at=joined_at
                )
            )

    async def project_ids_of_threads(self, thread_ids: Sequence[str]) -> dict[str, list[str]]:
        """For each thread id, the projects it belongs to (sorted)."""
        if not thread_ids:
            return {}
        result = await self.connection.execute(
            select(project_threads.c.thread_id, project_threads.c.project_id)
            .where(self._among(project_threads.c.thread_id, list(set(thread_ids))))
            .order_by(project_threads.c.project_id)
        )
        found: dict[str, list[str]] = {thread_id: [] for thread_id in thread_ids}
        for thread_id, project_id in result:
            found[thread_id].append(project_id)
        return found

    async def member_threads(self, project_id: str) -> list[Row]:
        """The thread rows of a project (archived ones included), by thread id."""
        result = await self.connection.execute(
            select(threads)
            .join(project_threads, project_threads.c.thread_id == threads.c.thread_id)
            .where(project_threads.c.project_id == project_id)
            .order_by(threads.c.thread_id)
        )
        return list(result.mappings())

    async def live_threads_of_owner(self, owner_id: str) -> list[Row]:
        """Every unarchived thread row of the owner, by thread id: what the master agent oversees."""
        result = await self.connection.execute(
            select(threads)
            .where(threads.c.owner_id == owner_id, threads.c.archived_at.is_(None))
            .order_by(threads.c.thread_id)
        )
        return list(result.mappings())

    async def projects_showing_thread(self, thread_id: str) -> list[Row]:
        """Projects whose ring shows `thread_id` (its single_device project, the master project)."""
        result = await self.connection.execute(
            select(projects)
            .where(projects.c.indicator_thread_id == thread_id)
            .order_by(projects.c.project_id)
        )
        return list(result.mappings())

    async def master_project(self, owner_id: str, project_id: str) -> Row | None:
        """The owner's master agent project, or None."""
        result = await self.connection.execute(
            select(projects).where(projects.c.project_id == project_id, projects.c.owner_id == owner_id)
        )
        return result.mappings().one_or_none()

    async def home_list(self, owner_id: str, limit: int, after: SortKey | None) -> list[Row]:
        """Up to `limit` live (unarchived) projects of the owner in home-list order, after `after`.

        Order: manual_pinned DESC, sort_at DESC, project_id DESC (one index: ix_projects_home_list).
        """
        query = select(projects).where(projects.c.owner_id == owner_id, projects.c.archived_at.is_(None))
        if after is not None:
            pinned = projects.c.manual_pinned == after.pinned
            query = query.where(
                or_(
                    (projects.c.manual_pinned == False) if after.pinned else false(),  # noqa: E712
                    and_(pinned, projects.c.sort_at < after.sort_at),
                    and_(
                        pinned, projects.c.sort_at == after.sort_at, projects.c.project_id < after.project_id
                    ),
                )
            )
        query = query.order_by(
            projects.c.manual_pinned.desc(), projects.c.sort_at.desc(), projects.c.project_id.desc()
        ).limit(limit)
        return list((await self.connection.execute(query)).mappings())

    async def count_projects(self, owner_id: str) -> int:
        """How many live projects the owner has."""
        result = await self.connection.execute(
            select(func.count())
            .select_from(projects)
            .where(projects.c.owner_id == owner_id, projects.c.archived_at.is_(None))
        )
        return int(result.scalar_one())
