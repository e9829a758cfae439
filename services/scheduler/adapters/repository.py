"""SqlAlchemySchedulerRepository: rows <-> domain values for the scheduler's tables.

Every method takes the caller's connection, so one unit of work (one transaction) spans the state,
packages, commands, alerts and outbox rows it changes. Upserts use each dialect's
`INSERT ... ON CONFLICT DO UPDATE`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import BigInteger, Boolean, Float, Integer, and_, bindparam, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.adapters.tables import (
    handoff_alerts,
    project_strategies,
    scheduled_threads,
    thread_handoff_packages,
    worker_commands,
)
from services.scheduler.domain.handoff import (
    ChecklistEntry,
    CommandRun,
    HandoffPackage,
    PackageContent,
    TestRun,
)
from services.scheduler.domain.model import PackageStatus, ThreadState, parse_level
from services.shared.sql_types import (
    UtcDateTime,
    column_list,
    driver_connection,
    fetch_driver_rows,
    run_driver_sql,
    upsert,
)
from services.shared.time import isoformat_utc


@dataclass(frozen=True)
class CommandRow:
    """A stored worker command (the `worker_commands` row)."""

    command_id: str
    command_type: str
    thread_id: str
    project_id: str
    node_id: str
    worker_id: str
    handoff_package_id: str
    to_thread_id: str
    codex_folder: str
    reason: str
    command_status: str
    delivery_count: int
    issued_at: datetime
    delivered_at: datetime | None
    acked_at: datetime | None
    outcome: str
    outcome_detail: str
    owner_id: str = ""


@dataclass(frozen=True)
class AlertRow:
    """A stored handoff_missing alert."""

    alert_id: str
    thread_id: str
    project_id: str
    alert_type: str
    alert_status: str
    reason: str
    compaction_count: int
    opened_at: datetime
    resolved_at: datetime | None


def _json_insert(table: Any, columns: Sequence[str], keys: Sequence[str] = ()) -> str:
    """PostgreSQL: one INSERT of many rows passed as one JSON array of objects (parameter `rows`),
    upserting on `keys` when given. One statement and one round trip whatever the row count, and the
    rows are encoded by orjson (C) instead of per-parameter Python adaptation: executemany
    would pipeline one statement per row, each through per-column Python type processing."""
    names = ", ".join(f'"{name}"' for name in columns)
    statement = (
        f'INSERT INTO "{table.name}" ({names}) SELECT {names} '
        f'FROM json_populate_recordset(NULL::"{table.name}", %(rows)s::json)'
    )
    if keys:
        updates = ", ".join(f'"{name}" = EXCLUDED."{name}"' for name in columns if name not in keys)
        statement += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    return statement


def _iso(value: datetime | None) -> str | None:
    """`value` as ISO 8601 text in UTC; ValueError for a naive datetime (as UtcDateTime refuses one)."""
    return None if value is None else _as_utc(value).isoformat()


def _pg_cast(column: Any) -> str:
    """The cast of a text value to `column`'s PostgreSQL type; none for strings (the INSERT's
    assignment then checks their length, as for any insert)."""
    kind = column.type
    if isinstance(kind, UtcDateTime):
        return "::timestamptz"
    if isinstance(kind, BigInteger):
        return "::bigint"
    if isinstance(kind, Integer):
        return "::integer"
    if isinstance(kind, Float):
        return "::float8"
    if isinstance(kind, Boolean):
        return "::boolean"
    return ""


def _json_array_upsert(table: Any, keys: Sequence[str]) -> str:
    """PostgreSQL: one upsert (on `keys`) of many rows of every column of `table`, passed as one JSON
    array of arrays (values in column order; parameter `rows`). Like `_json_insert`, but the rows
    carry no column names, which halves their encoding cost."""
    columns = list(table.columns)
    names = ", ".join(f'"{column.name}"' for column in columns)
    values = ", ".join(f"(item->>{index}){_pg_cast(column)}" for index, column in enumerate(columns))
    updates = ", ".join(
        f'"{column.name}" = EXCLUDED."{column.name}"' for column in columns if column.name not in keys
    )
    return (
        f'INSERT INTO "{table.name}" ({names}) SELECT {values} '
        f"FROM jsonb_array_elements(%(rows)s::jsonb) AS item "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )


_STATE_TIMES = tuple(
    column.name for column in scheduled_threads.columns if isinstance(column.type, UtcDateTime)
)
_STATE_FIELD_TIMES = tuple(name for name in _STATE_TIMES if name in ThreadState.__dataclass_fields__)

# PostgreSQL: at most this many thread states written by this process are kept (then all forgotten).
MAX_WRITTEN_STATES = 200_000


def utc_state(state: ThreadState) -> ThreadState:
    """`state` with every datetime in UTC (`datetime.UTC`), as a read of its stored row returns it:
    the same object when they already are (the usual case). Raises ValueError for a naive datetime
    (as UtcDateTime refuses one)."""
    changes: dict[str, Any] = {}
    for name in _STATE_FIELD_TIMES:
        value = getattr(state, name)
        if value is not None and value.tzinfo is not UTC:
            changes[name] = _as_utc(value)
    return replace(state, **changes) if changes else state


def _as_utc(value: datetime) -> datetime:
    """`value` in UTC (the same object when it already is); ValueError for a naive datetime."""
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None:
        raise ValueError("naive datetime: pass a timezone-aware UTC datetime")
    return value.astimezone(UTC)


def _state_row(state: ThreadState, now: datetime) -> dict[str, Any]:
    return {
        "thread_id": state.thread_id,
        "project_id": state.project_id,
        "task_id": state.task_id,
        "node_id": state.node_id,
        "worker_id": state.worker_id,
        "codex_folder": state.codex_folder,
        "level": state.level.value if state.level is not None else None,
        "remaining_pct": state.remaining_pct,
        "reported_must_finish": state.reported_must_finish,
        "reported_must_finish_reason": state.reported_must_finish_reason,
        "master_must_finish": state.master_must_finish,
        "master_must_finish_reason": state.master_must_finish_reason,
        "compaction_expected_at": state.compaction_expected_at,
        "compaction_count": state.compaction_count,
        "last_compaction_at": state.last_compaction_at,
        "snapshot_version": state.snapshot_version,
        "captured_at": state.captured_at,
        "last_total_tokens": state.last_total_tokens,
        "last_activity_at": state.last_activity_at,
        "task_importance": state.task_importance,
        "unsolidified_patch": state.unsolidified_patch,
        "unsolidified_test_results": state.unsolidified_test_results,
        "hardware_test_in_progress": state.hardware_test_in_progress,
        "busy": state.busy,
        "no_large_context_appends": state.no_large_context_appends,
        "finish_current_subtask": state.finish_current_subtask,
        "context_growth_frozen": state.context_growth_frozen,
        "relay_thread_id": state.relay_thread_id,
        "current_package_id": state.current_package_id,
        "current_package_status": state.current_package_status.value
        if state.current_package_status
        else None,
        "package_epoch": state.package_epoch,
        "epoch": state.epoch,
        "prepare_issued_at": state.prepare_issued_at,
        "prepare_issued_at_critical": state.prepare_issued_at_critical,
        "commands_sent": ",".join(sorted(state.commands_sent)),
        "updated_at": now,
        "owner_id": state.owner_id,
    }


def _state_values(state: ThreadState, now: datetime) -> list[Any]:
    """`_state_row` as a list in `scheduled_threads` column order (`now`: updated_at), for
    `_json_array_upsert`. `state` must be in UTC (`utc_state`): orjson writes its datetimes as
    RFC 3339 text with their offset."""
    level = state.level
    status = state.current_package_status
    return [
        state.thread_id,
        state.project_id,
        state.task_id,
        state.node_id,
        state.worker_id,
        state.codex_folder,
        level.value if level is not None else None,
        state.remaining_pct,
        state.reported_must_finish,
        state.reported_must_finish_reason,
        state.master_must_finish,
        state.master_must_finish_reason,
        state.compaction_expected_at,
        state.compaction_count,
        state.last_compaction_at,
        state.snapshot_version,
        state.captured_at,
        state.last_total_tokens,
        state.last_activity_at,
        state.task_importance,
        state.unsolidified_patch,
        state.unsolidified_test_results,
        state.hardware_test_in_progress,
        state.busy,
        state.no_large_context_appends,
        state.finish_current_subtask,
        state.context_growth_frozen,
        state.relay_thread_id,
        state.current_package_id,
        status.value if status else None,
        state.package_epoch,
        state.epoch,
        state.prepare_issued_at,
        state.prepare_issued_at_critical,
        ",".join(sorted(state.commands_sent)),
        now,
        state.owner_id,
    ]


_UPSERT_THREADS = _json_array_upsert(scheduled_threads, ("thread_id",))


def _state_of(row: Any) -> ThreadState:
    status = row["current_package_status"]
    return ThreadState(
        thread_id=row["thread_id"],
        project_id=row["project_id"],
        task_id=row["task_id"],
        node_id=row["node_id"],
        worker_id=row["worker_id"],
        codex_folder=row["codex_folder"],
        level=parse_level(row["level"]),
        remaining_pct=float(row["remaining_pct"]),
        reported_must_finish=bool(row["reported_must_finish"]),
        reported_must_finish_reason=row["reported_must_finish_reason"],
        master_must_finish=bool(row["master_must_finish"]),
        master_must_finish_reason=row["master_must_finish_reason"],
        compaction_expected_at=row["compaction_expected_at"],
        compaction_count=int(row["compaction_count"]),
        last_compaction_at=row["last_compaction_at"],
        snapshot_version=int(row["snapshot_version"]),
        captured_at=row["captured_at"],
        last_total_tokens=int(row["last_total_tokens"]),
        last_activity_at=row["last_activity_at"],
        task_importance=int(row["task_importance"]),
        unsolidified_patch=bool(row["unsolidified_patch"]),
        unsolidified_test_results=bool(row["unsolidified_test_results"]),
        hardware_test_in_progress=bool(row["hardware_test_in_progress"]),
        busy=bool(row["busy"]),
        no_large_context_appends=bool(row["no_large_context_appends"]),
        finish_current_subtask=bool(row["finish_current_subtask"]),
        context_growth_frozen=bool(row["context_growth_frozen"]),
        relay_thread_id=row["relay_thread_id"],
        current_package_id=row["current_package_id"],
        current_package_status=PackageStatus(status) if status else None,
        package_epoch=int(row["package_epoch"]),
        epoch=int(row["epoch"]),
        prepare_issued_at=row["prepare_issued_at"],
        prepare_issued_at_critical=bool(row["prepare_issued_at_critical"]),
        commands_sent=frozenset(name for name in row["commands_sent"].split(",") if name),
        owner_id=row["owner_id"],
    )


def _dump_runs(runs: Iterable[CommandRun | TestRun | ChecklistEntry]) -> str:
    items = []
    for run in runs:
        item = asdict(run)
        if "ran_at" in item:
            item["ran_at"] = isoformat_utc(item["ran_at"])
        items.append(item)
    return json.dumps(items)


def _parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _package_row(package: HandoffPackage) -> dict[str, Any]:
    content = package.content
    return {
        "handoff_package_id": package.handoff_package_id,
        "project_id": package.project_id,
        "task_id": package.task_id,
        "from_thread_id": package.from_thread_id,
        "to_thread_id": package.to_thread_id,
        "node_id": package.node_id,
        "package_status": package.package_status.value,
        "summary_text": content.summary_text,
        "open_questions": json.dumps(list(content.open_questions)),
        "critical_files": json.dumps(list(content.critical_files)),
        "critical_commands": _dump_runs(content.critical_commands),
        "critical_tests": _dump_runs(content.critical_tests),
        "critical_artifacts": json.dumps(list(content.critical_artifacts)),
        "decision_links": json.dumps(list(content.decision_links)),
        "patches_done": json.dumps(list(content.patches_done)),
        "patches_not_done": json.dumps(list(content.patches_not_done)),
        "suggested_next_actions": json.dumps(list(content.suggested_next_actions)),
        "checklist": _dump_runs(content.checklist),
        "epoch": package.epoch,
        "last_command_id": package.last_command_id,
        "consumed_by_thread_id": package.consumed_by_thread_id,
        "created_at": package.created_at,
        "ready_at": package.ready_at,
        "consumed_at": package.consumed_at,
        "expires_at": package.expires_at,
    }


def _package_of(row: Any) -> HandoffPackage:
    def strings(name: str) -> tuple[str, ...]:
        return tuple(str(item) for item in json.loads(row[name]))

    content = PackageContent(
        summary_text=row["summary_text"],
        open_questions=strings("open_questions"),
        critical_files=strings("critical_files"),
        critical_commands=tuple(
            CommandRun(
                item["command"],
                item.get("exit_code"),
                item.get("output_tail", ""),
                _parse_time(item.get("ran_at")),
            )
            for item in json.loads(row["critical_commands"])
        ),
        critical_tests=tuple(
            TestRun(
                item["command"],
                item.get("outcome", "unknown"),
                item.get("summary", ""),
                _parse_time(item.get("ran_at")),
            )
            for item in json.loads(row["critical_tests"])
        ),
        critical_artifacts=strings("critical_artifacts"),
        decision_links=strings("decision_links"),
        patches_done=strings("patches_done"),
        patches_not_done=strings("patches_not_done"),
        suggested_next_actions=strings("suggested_next_actions"),
        checklist=tuple(
            ChecklistEntry(item["item"], item["status"], item.get("detail", ""))
            for item in json.loads(row["checklist"])
        ),
    )
    return HandoffPackage(
        handoff_package_id=row["handoff_package_id"],
        project_id=row["project_id"],
        task_id=row["task_id"],
        from_thread_id=row["from_thread_id"],
        to_thread_id=row["to_thread_id"],
        node_id=row["node_id"],
        package_status=PackageStatus(row["package_status"]),
        content=content,
        epoch=int(row["epoch"]),
        created_at=row["created_at"],
        ready_at=row["ready_at"],
        consumed_at=row["consumed_at"],
        expires_at=row["expires_at"],
        consumed_by_thread_id=row["consumed_by_thread_id"],
        last_command_id=row["last_command_id"],
    )


def _command_of(row: Any) -> CommandRow:
    return CommandRow(**{name: row[name] for name in CommandRow.__dataclass_fields__})


def _alert_of(row: Any) -> AlertRow:
    return AlertRow(**{name: row[name] for name in AlertRow.__dataclass_fields__})


class SqlAlchemySchedulerRepository:
    """Reads and writes the scheduler's tables on a caller's connection."""

    def __init__(self, dialect: str) -> None:
        """`dialect`: 'sqlite' or 'postgresql' (chooses the upsert form)."""
        self._dialect = dialect
        # PostgreSQL: the thread states this repository wrote, by thread_id, with the id of the
        # transaction that wrote them (the row's `xmin`). A read whose row still carries that xmin
        # returns the kept state instead of converting the row again: any later write of the row,
        # by whichever process, gives it another xmin, and a rolled-back write leaves the older
        # version (another xmin) in place, so a kept state is returned only while it is the row.
        self._written: dict[str, tuple[str, ThreadState]] = {}

    @property
    def keeps_written_states(self) -> bool:
        """True when this repository keeps the states it wrote and returns those very objects
        while their rows are unchanged (PostgreSQL; see `threads_by_id`)."""
        return self._dialect == "postgresql"

    def kept_state(self, thread_id: str) -> ThreadState | None:
        """The state this repository last wrote for a thread, if it keeps it (not checked against
        the row: `threads_by_id` does that)."""
        kept = self._written.get(thread_id)
        return kept[1] if kept is not None else None

    async def threads_by_id(
        self, connection: AsyncConnection, thread_ids: Iterable[str]
    ) -> dict[str, ThreadState]:
        """States of the given threads that exist, by thread_id."""
        ids = list(set(thread_ids))
        if not ids:
            return {}
        if self._dialect == "postgresql":
            return await self._threads_by_id_postgresql(connection, ids)
        rows = await connection.execute(
            select(scheduled_threads).where(scheduled_threads.c.thread_id.in_(ids))
        )
        return {row["thread_id"]: _state_of(row) for row in rows.mappings()}

    async def _threads_by_id_postgresql(
        self, connection: AsyncConnection, ids: list[str]
    ) -> dict[str, ThreadState]:
        """`threads_by_id` on PostgreSQL: the rows' transaction ids first; only rows this repository
        did not write in that version are read whole and converted."""
        driver = await driver_connection(connection)
        # The driver's cursor directly: 500 rows of two texts are cheaper as its tuples than as
        # SQLAlchemy rows (measured: bench/scheduler_handler_bench.py).
        async with driver.cursor() as cursor:
            await cursor.execute(
                f'SELECT thread_id, xmin::text FROM "{scheduled_threads.name}" '
                "WHERE thread_id = ANY(%(values)s::text[])",
                {"values": ids},
            )
            versions = await cursor.fetchall()
        written = self._written
        found: dict[str, ThreadState] = {}
        unknown = []
        for thread_id, version in versions:
            known = written.get(thread_id)
            if known is not None and known[0] == version:
                found[thread_id] = known[1]
            else:
                unknown.append(thread_id)
        if unknown:
            for state in await self._threads_where_postgresql(connection, "thread_id", unknown):
                found[state.thread_id] = state
        return found

    async def _threads_where_postgresql(
        self, connection: AsyncConnection, column: str, values: list[str]
    ) -> list[ThreadState]:
        """Thread states whose `column` is one of `values`, on PostgreSQL without per-column result
        processing (it runs for every consumer batch and strategy recomputation): the values travel
        as one array."""
        rows = await fetch_driver_rows(
            connection,
            scheduled_threads,
            f'SELECT {column_list(scheduled_threads)} FROM "{scheduled_threads.name}" '
            f'WHERE "{column}" = ANY(%(values)s::text[])',
            {"values": values},
        )
        return [_state_of(row) for row in rows]

    async def thread(self, connection: AsyncConnection, thread_id: str) -> ThreadState | None:
        """One thread's state, None when unknown."""
        return (await self.threads_by_id(connection, [thread_id])).get(thread_id)

    async def threads(
        self, connection: AsyncConnection, project_id: str = "", owner_id: str | None = None
    ) -> list[ThreadState]:
        """Every thread's state, or a project's when `project_id` is set; with `owner_id`, only that
        owner's threads."""
        query = select(scheduled_threads)
        if project_id:
            query = query.where(scheduled_threads.c.project_id == project_id)
        if owner_id is not None:
            query = query.where(scheduled_threads.c.owner_id == owner_id)
        return [_state_of(row) for row in (await connection.execute(query)).mappings()]

    async def save_threads(
        self, connection: AsyncConnection, states: Sequence[ThreadState], now: datetime
    ) -> None:
        """Upserts thread states (one executemany)."""
        if not states:
            return
        if self._dialect == "postgresql":
            stamp = _as_utc(now)
            states = [utc_state(state) for state in states]
            encoded = orjson.dumps([_state_values(state, stamp) for state in states])
            written_versions = await run_driver_sql(
                connection,
                f"WITH written AS ({_UPSERT_THREADS} RETURNING xmin) SELECT DISTINCT xmin::text FROM written",
                {"rows": encoded.decode()},
            )
            versions = [version for (version,) in written_versions]
            written = self._written
            if len(written) + len(states) > MAX_WRITTEN_STATES:
                written.clear()
            if len(versions) == 1:
                version = versions[0]
                for state in states:
                    written[state.thread_id] = (version, state)
            else:
                for state in states:
                    written.pop(state.thread_id, None)
            return
        rows = [_state_row(state, now) for state in states]
        await connection.execute(upsert(self._dialect, scheduled_threads, rows[0], ["thread_id"]), rows)

    async def move_thread(
        self, connection: AsyncConnection, thread_id: str, owner_id: str, node_id: str, worker_id: str
    ) -> bool:
        """Routes `owner_id`'s thread to the device (node_id, worker_id): its commands go there
        from now on. False when the scheduler has no such thread of that owner."""
        result = await connection.execute(
            update(scheduled_threads)
            .where(scheduled_threads.c.thread_id == thread_id, scheduled_threads.c.owner_id == owner_id)
            .values(node_id=node_id, worker_id=worker_id)
        )
        return bool(result.rowcount)

    async def threads_of_projects(
        self, connection: AsyncConnection, project_ids: Iterable[str]
    ) -> dict[str, list[ThreadState]]:
        """Thread states of several projects in one query, by project_id."""
        ids = list(set(project_ids))
        grouped: dict[str, list[ThreadState]] = {project_id: [] for project_id in ids}
        if not ids:
            return grouped
        if self._dialect == "postgresql":
            for state in await self._threads_where_postgresql(connection, "project_id", ids):
                grouped[state.project_id].append(state)
            return grouped
        rows = await connection.execute(
            select(scheduled_threads).where(scheduled_threads.c.project_id.in_(ids))
        )
        for row in rows.mappings():
            grouped[row["project_id"]].append(_state_of(row))
        return grouped

    async def insert_packages(self, connection: AsyncConnection, packages: Sequence[HandoffPackage]) -> None:
        """Stores new packages (one executemany)."""
        if not packages:
            return
        rows = [_package_row(p) for p in packages]
        if self._dialect == "postgresql":
            await self._insert_json(connection, thread_handoff_packages, rows)
            return
        await connection.execute(thread_handoff_packages.insert(), rows)

    async def save_package(self, connection: AsyncConnection, package: HandoffPackage) -> None:
        """Overwrites an existing package with `package`."""
        row = _package_row(package)
        await connection.execute(
            update(thread_handoff_packages)
            .where(thread_handoff_packages.c.handoff_package_id == package.handoff_package_id)
            .values(**row)
        )

    async def package(
        self, connection: AsyncConnection, handoff_package_id: str, for_update: bool = False
    ) -> HandoffPackage | None:
        """One package, None when unknown; `for_update` locks its row (PostgreSQL)."""
        query = select(thread_handoff_packages).where(
            thread_handoff_packages.c.handoff_package_id == handoff_package_id
        )
        if for_update:
            query = query.with_for_update()
        row = (await connection.execute(query)).mappings().first()
        return _package_of(row) if row is not None else None

    async def packages_of_thread(self, connection: AsyncConnection, thread_id: str) -> list[HandoffPackage]:
        """Packages whose from_thread_id is `thread_id`, newest first."""
        rows = await connection.execute(
            select(thread_handoff_packages)
            .where(thread_handoff_packages.c.from_thread_id == thread_id)
            .order_by(
                thread_handoff_packages.c.created_at.desc(), thread_handoff_packages.c.handoff_package_id
            )
        )
        return [_package_of(row) for row in rows.mappings()]

    async def set_package_relay(
        self, connection: AsyncConnection, handoff_package_id: str, to_thread_id: str
    ) -> None:
        """Records the pre-created relay thread on a package that has none yet."""
        await connection.execute(
            update(thread_handoff_packages)
            .where(
                and_(
                    thread_handoff_packages.c.handoff_package_id == handoff_package_id,
                    thread_handoff_packages.c.to_thread_id == "",
                )
            )
            .values(to_thread_id=to_thread_id)
        )

    async def set_package_relays(self, connection: AsyncConnection, relays: dict[str, str]) -> None:
        """`set_package_relay` for many packages (handoff_package_id -> to_thread_id) in one
        statement."""
        if not relays:
            return
        if self._dialect == "postgresql":
            await run_driver_sql(
                connection,
                f"UPDATE {thread_handoff_packages.name} AS package SET to_thread_id = item.to_thread_id "
                "FROM unnest(%(ids)s::text[], %(relays)s::text[]) AS item(handoff_package_id, to_thread_id) "
                "WHERE package.handoff_package_id = item.handoff_package_id AND package.to_thread_id = ''",
                {"ids": list(relays), "relays": list(relays.values())},
            )
            return
        await connection.execute(
            update(thread_handoff_packages)
            .where(
                and_(
                    thread_handoff_packages.c.handoff_package_id == bindparam("package_id"),
                    thread_handoff_packages.c.to_thread_id == "",
                )
            )
            .values(to_thread_id=bindparam("relay")),
            [{"package_id": key, "relay": value} for key, value in relays.items()],
        )

    async def _insert_json(
        self,
        connection: AsyncConnection,
        table: Any,
        rows: Sequence[dict[str, Any]],
        keys: Sequence[str] = (),
    ) -> None:
        """PostgreSQL: inserts (upserts on `keys`) rows of `table` in one statement (`_json_insert`);
        datetimes travel as ISO 8601 UTC text."""
        columns = list(rows[0])
        times = [name for name in columns if isinstance(table.c[name].type, UtcDateTime)]
        if times:
            rows = [{**row, **{name: _iso(row[name]) for name in times}} for row in rows]
        await run_driver_sql(
            connection, _json_insert(table, columns, keys), {"rows": orjson.dumps(rows).decode()}
        )

    async def expirable_packages(self, connection: AsyncConnection, now: datetime) -> list[HandoffPackage]:
        """Draft or ready packages whose expires_at has passed."""
        rows = await connection.execute(
            select(thread_handoff_packages).where(
                and_(
                    thread_handoff_packages.c.package_status.in_(
                        [PackageStatus.DRAFT.value, PackageStatus.READY.value]
                    ),
                    thread_handoff_packages.c.expires_at <= now,
                )
            )
        )
        return [_package_of(row) for row in rows.mappings()]

    async def insert_commands(self, connection: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
        """Stores new commands (dicts of `worker_commands` columns)."""
        if not rows:
            return
        if self._dialect == "postgresql":
            await self._insert_json(connection, worker_commands, rows)
            return
        await connection.execute(worker_commands.insert(), list(rows))

    async def command(self, connection: AsyncConnection, command_id: str) -> CommandRow | None:
        """One command, None when unknown."""
        row = (
            (
                await connection.execute(
                    select(worker_commands).where(worker_commands.c.command_id == command_id)
                )
            )
            .mappings()
            .first()
        )
        return _command_of(row) if row is not None else None

    async def due_commands(
        self,
        connection: AsyncConnection,
        worker_id: str,
        node_id: str,
        redeliver_before: datetime,
        include_delivered: bool,
        owner_id: str | None = None,
    ) -> list[CommandRow]:
        """Unacknowledged commands of a worker on a node (with `owner_id`: that owner's device), in
        issue order: pending ones, and delivered ones (all when `include_delivered`, else only
        those last sent before `redeliver_before`)."""
        delivered = worker_commands.c.command_status == "delivered"
        if not include_delivered:
            delivered = and_(delivered, worker_commands.c.delivered_at <= redeliver_before)
        rows = await connection.execute(
            select(worker_commands)
            .where(
                and_(
                    worker_commands.c.worker_id == worker_id,
                    worker_commands.c.node_id == node_id,
                    or_(worker_commands.c.command_status == "pending", delivered),
                    true() if owner_id is None else worker_commands.c.owner_id == owner_id,
                )
            )
            .order_by(worker_commands.c.id)
        )
        return [_command_of(row) for row in rows.mappings()]

    async def mark_delivered(
        self, connection: AsyncConnection, command_ids: Sequence[str], now: datetime
    ) -> None:
        """Counts one more delivery of each command (not for acknowledged ones)."""
        if not command_ids:
            return
        await connection.execute(
            update(worker_commands)
            .where(
                and_(
                    worker_commands.c.command_id.in_(list(command_ids)),
                    worker_commands.c.command_status != "acked",
                )
            )
            .values(
                command_status="delivered",
                delivered_at=now,
                delivery_count=worker_commands.c.delivery_count + 1,
            )
        )

    async def ack_command(
        self, connection: AsyncConnection, command_id: str, outcome: str, detail: str, now: datetime
    ) -> None:
        """Marks a command acknowledged with its outcome."""
        await connection.execute(
            update(worker_commands)
            .where(worker_commands.c.command_id == command_id)
            .values(command_status="acked", acked_at=now, outcome=outcome, outcome_detail=detail)
        )

    async def insert_alert(self, connection: AsyncConnection, alert: AlertRow) -> None:
        """Stores a new alert."""
        await connection.execute(handoff_alerts.insert().values(**asdict(alert)))

    async def resolve_alerts(self, connection: AsyncConnection, thread_id: str, now: datetime) -> int:
        """Resolves a thread's open handoff_missing alerts; returns how many."""
        result = await connection.execute(
            update(handoff_alerts)
            .where(and_(handoff_alerts.c.thread_id == thread_id, handoff_alerts.c.alert_status == "opened"))
            .values(alert_status="resolved", resolved_at=now)
        )
        return int(result.rowcount or 0)

    async def alerts(
        self,
        connection: AsyncConnection,
        thread_id: str = "",
        project_id: str = "",
        open_only: bool = False,
        owner_id: str | None = None,
    ) -> list[AlertRow]:
        """Alerts, newest first, filtered by thread, project and openness; with `owner_id`, only
        alerts of that owner's threads."""
        query = select(handoff_alerts).order_by(handoff_alerts.c.opened_at.desc(), handoff_alerts.c.alert_id)
        if owner_id is not None:
            owned = select(scheduled_threads.c.thread_id).where(scheduled_threads.c.owner_id == owner_id)
            query = query.where(handoff_alerts.c.thread_id.in_(owned))
        if thread_id:
            query = query.where(handoff_alerts.c.thread_id == thread_id)
        if project_id:
            query = query.where(handoff_alerts.c.project_id == project_id)
        if open_only:
            query = query.where(handoff_alerts.c.alert_status == "opened")
        return [_alert_of(row) for row in (await connection.execute(query)).mappings()]

    async def strategies(
        self, connection: AsyncConnection, project_ids: Iterable[str]
    ) -> dict[tuple[str, str], str]:
        """The last published strategy summaries of the projects, by (owner_id, project_id)."""
        ids = list(set(project_ids))
        if not ids:
            return {}
        rows = await connection.execute(
            select(project_strategies).where(project_strategies.c.project_id.in_(ids))
        )
        return {(row["owner_id"], row["project_id"]): row["summary"] for row in rows.mappings()}

    async def save_strategies(
        self, connection: AsyncConnection, summaries: dict[tuple[str, str], str], now: datetime
    ) -> None:
        """Records the summaries just published, by (owner_id, project_id) (one executemany)."""
        if not summaries:
            return
        rows = [
            {"owner_id": owner_id, "project_id": project_id, "summary": summary, "updated_at": now}
            for (owner_id, project_id), summary in summaries.items()
        ]
        await connection.execute(
            upsert(self._dialect, project_strategies, rows[0], ["owner_id", "project_id"]), rows
        )
