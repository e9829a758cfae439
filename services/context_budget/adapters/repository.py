"""SQLAlchemy repository of the context budget: every statement the service runs.

Each method takes the caller's connection, so a handler composes several of them in one transaction.

Ingest runs a fixed handful of bulk statements per batch, never one round trip per snapshot. On
PostgreSQL the hot ones bypass SQLAlchemy's per-row parameter handling: the current heads and the
existing snapshot ids are read with one `= ANY(%b)` array parameter each; history rows are written
with binary COPY; current rows are COPYed into a session-local temporary staging table and merged
with one `INSERT ... SELECT ... ON CONFLICT DO UPDATE`. (Measured on the 2-core target with 2,000-row
batches: COPY costs about a third of the server time of `unnest` arrays and a sixth of the client CPU
of executemany.) Batches under COPY_MIN_ROWS rows write history and current rows with one
statement instead, as round trips dominate there: its rows travel as one JSON array
(`json_to_recordset`), which costs less client CPU than psycopg's adaptation of an array per
column. On SQLite, the embedded default, they are plain Core statements with executemany.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from services.context_budget.adapters.tables import (
    thread_context_alerts,
    thread_context_snapshots,
    thread_context_threshold_policies,
    thread_contexts,
)
from services.context_budget.domain.ingest import StoredSnapshot
from services.context_budget.domain.model import (
    Alert,
    AlertStatus,
    AlertType,
    CompactionLimitSource,
    ContextBudgetLevel,
    Snapshot,
    SourceKind,
    ThreadHead,
    ThreadState,
    ThresholdPolicy,
)
from services.shared.sql_types import (
    CarriedWrites,
    column_list,
    driver_connection,
    fetch_driver_rows,
    run_driver_sql,
)

_READING_FIELDS = (
    "project_id",
    "task_id",
    "node_id",
    "worker_id",
    "context_budget_remaining_pct",
    "compaction_expected_at",
    "must_finish_before_compaction",
    "must_finish_reason",
    "estimated_remaining_turns",
    "estimated_remaining_large_messages",
    "last_compaction_at",
    "compaction_count",
    "snapshot_version",
    "captured_at",
    "last_total_tokens",
    "model_context_window",
    "auto_compact_token_limit",
    "codex_context_left_pct",
    "codex_folder",
)

# Columns of one reading in the order `_reading_values` returns them, with their PostgreSQL types.
_READING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("thread_id", "text"),
    ("snapshot_id", "text"),
    ("project_id", "text"),
    ("task_id", "text"),
    ("node_id", "text"),
    ("worker_id", "text"),
    ("source_kind", "text"),
    ("context_budget_remaining_pct", "float8"),
    ("context_budget_level", "text"),
    ("reported_context_budget_level", "text"),
    ("compaction_expected_at", "timestamptz"),
    ("must_finish_before_compaction", "bool"),
    ("must_finish_reason", "text"),
    ("estimated_remaining_turns", "int4"),
    ("estimated_remaining_large_messages", "int4"),
    ("last_compaction_at", "timestamptz"),
    ("compaction_count", "int4"),
    ("snapshot_version", "int8"),
    ("captured_at", "timestamptz"),
    ("last_total_tokens", "int8"),
    ("model_context_window", "int8"),
    ("auto_compact_token_limit", "int8"),
    ("codex_context_left_pct", "int4"),
    ("codex_folder", "text"),
)
# Added by migration 0003, so last in both reading tables (in `_limit_values` order).
_LIMIT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("compaction_limit_source", "text"),
    ("awaiting_reading_after_compaction", "bool"),
)
_LIMIT_NAMES = ", ".join(name for name, _type in _LIMIT_COLUMNS)
_SNAPSHOT_COLUMNS = (
    *_READING_COLUMNS,
    ("superseded", "bool"),
    ("received_at", "timestamptz"),
    *_LIMIT_COLUMNS,
)
_STATE_COLUMNS = (
    *_READING_COLUMNS,
    ("level_alert_id", "text"),
    ("compaction_risk_alert_id", "text"),
    ("updated_at", "timestamptz"),
    ("owner_id", "text"),
    *_LIMIT_COLUMNS,
)
_ALERT_COLUMNS = (
    ("alert_id", "text"),
    ("thread_id", "text"),
    ("project_id", "text"),
    ("alert_type", "text"),
    ("alert_status", "text"),
    ("reason", "text"),
    ("opened_at", "timestamptz"),
    ("acked_at", "timestamptz"),
    ("resolved_at", "timestamptz"),
)
_ALERT_NAMES = ", ".join(name for name, _type in _ALERT_COLUMNS)
_HEAD_COLUMNS = (
    "thread_id",
    "context_budget_level",
    "captured_at",
    "snapshot_version",
    "compaction_count",
    "level_alert_id",
    "compaction_risk_alert_id",
    "owner_id",
    "node_id",
    "worker_id",
)


def _reading_values(snapshot: Snapshot, level: ContextBudgetLevel) -> tuple[Any, ...]:
    """One reading's column values, in `_READING_COLUMNS` order."""
    reported = snapshot.reported_level
    return (
        snapshot.thread_id,
        snapshot.snapshot_id,
        snapshot.project_id,
        snapshot.task_id,
        snapshot.node_id,
        snapshot.worker_id,
        snapshot.source_kind.value,
        snapshot.context_budget_remaining_pct,
        level.value,
        None if reported is None else reported.value,
        snapshot.compaction_expected_at,
        snapshot.must_finish_before_compaction,
        snapshot.must_finish_reason,
        snapshot.estimated_remaining_turns,
        snapshot.estimated_remaining_large_messages,
        snapshot.last_compaction_at,
        snapshot.compaction_count,
        snapshot.snapshot_version,
        snapshot.captured_at,
        snapshot.last_total_tokens,
        snapshot.model_context_window,
        snapshot.auto_compact_token_limit,
        snapshot.codex_context_left_pct,
        snapshot.codex_folder,
    )


def _limit_values(snapshot: Snapshot) -> tuple[Any, ...]:
    """A reading's `_LIMIT_COLUMNS` values, in order."""
    source = snapshot.compaction_limit_source
    return (None if source is None else source.value, snapshot.awaiting_reading_after_compaction)


# A reading as the small-batch write receives it: flagged when it is its thread's new current row,
# with that row's alert ids.
_FLAGGED_READING_COLUMNS: tuple[tuple[str, str], ...] = (
    *_READING_COLUMNS,
    ("superseded", "bool"),
    ("is_current", "bool"),
    ("level_alert_id", "text"),
    ("compaction_risk_alert_id", "text"),
    ("owner_id", "text"),
    *_LIMIT_COLUMNS,
)
_FLAGGED_READING_NAMES = tuple(name for name, _type in _FLAGGED_READING_COLUMNS)

_STAGING_TABLE = "thread_contexts_incoming"
# Below this many rows a batch is written without COPY set-up or staging table (one statement per
# table, or with `write_readings` one for both): small batches are dominated by round trips.
COPY_MIN_ROWS = 64


def _unnest_select(columns: Sequence[tuple[str, str]]) -> str:
    """`SELECT * FROM unnest(%b::type[], ...)`: one binary array parameter per column."""
    return "SELECT * FROM unnest(" + ", ".join(f"%b::{pg_type}[]" for _name, pg_type in columns) + ")"


def _as_columns(rows: Sequence[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    return tuple(list(column) for column in zip(*rows, strict=True))


async def _copy_rows(
    connection: AsyncConnection,
    table: str,
    columns: Sequence[tuple[str, str]],
    rows: Iterable[tuple[Any, ...]],
) -> None:
    """Binary COPY of `rows` into `table` in the connection's transaction (PostgreSQL only)."""
    names = ", ".join(name for name, _type in columns)
    driver = await driver_connection(connection)
    async with (
        driver.cursor() as cursor,
        cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types([pg_type for _name, pg_type in columns])
        for row in rows:
            await copy.write_row(row)


def _head_of(row: Sequence[Any]) -> ThreadHead:
    """A head from `_HEAD_COLUMNS` values in order."""
    captured_at: datetime = row[2]
    return ThreadHead(
        level=ContextBudgetLevel(row[1]),
        captured_at=captured_at.astimezone(UTC),
        snapshot_version=row[3],
        compaction_count=row[4],
        level_alert_id=row[5],
        compaction_risk_alert_id=row[6],
        device=(row[7], row[8], row[9]),
    )


def _snapshot_of(row: RowMapping) -> Snapshot:
    reported = row["reported_context_budget_level"]
    limit_source = row["compaction_limit_source"]
    return Snapshot(
        snapshot_id=row["snapshot_id"],
        thread_id=row["thread_id"],
        source_kind=SourceKind(row["source_kind"]),
        reported_level=None if reported is None else ContextBudgetLevel(reported),
        compaction_limit_source=None if limit_source is None else CompactionLimitSource(limit_source),
        awaiting_reading_after_compaction=bool(row["awaiting_reading_after_compaction"]),
        **{name: row[name] for name in _READING_FIELDS},
    )


def _state_of(row: RowMapping) -> ThreadState:
    snapshot = _snapshot_of(row)
    snapshot.owner_id = row["owner_id"]
    return ThreadState(
        snapshot=snapshot,
        level=ContextBudgetLevel(row["context_budget_level"]),
        level_alert_id=row["level_alert_id"],
        compaction_risk_alert_id=row["compaction_risk_alert_id"],
        updated_at=row["updated_at"],
    )


def _alert_of(row: Mapping[Any, Any]) -> Alert:
    return Alert(
        alert_id=row["alert_id"],
        thread_id=row["thread_id"],
        project_id=row["project_id"],
        alert_type=AlertType(row["alert_type"]),
        alert_status=AlertStatus(row["alert_status"]),
        opened_at=row["opened_at"],
        acked_at=row["acked_at"],
        resolved_at=row["resolved_at"],
        reason=row["reason"],
    )


def _alert_row(alert: Alert) -> dict[str, Any]:
    return {
        "alert_id": alert.alert_id,
        "thread_id": alert.thread_id,
        "project_id": alert.project_id,
        "alert_type": alert.alert_type.value,
        "alert_status": alert.alert_status.value,
        "reason": alert.reason,
        "opened_at": alert.opened_at,
        "acked_at": alert.acked_at,
        "resolved_at": alert.resolved_at,
    }


def _policy_of(row: RowMapping) -> ThresholdPolicy:
    return ThresholdPolicy(
        project_id=row["project_id"],
        safe_min_pct=row["safe_min_pct"],
        watch_min_pct=row["watch_min_pct"],
        urgent_min_pct=row["urgent_min_pct"],
        updated_at=row["updated_at"],
    )


class SqlAlchemyContextRepository:
    """Reads and writes the context budget tables on SQLite or PostgreSQL (`dialect`)."""

    def __init__(self, dialect: str) -> None:
        self._postgres = dialect == "postgresql"
        dialect_insert = postgresql.insert if self._postgres else sqlite.insert
        table = thread_contexts
        upsert = dialect_insert(table)
        excluded = upsert.excluded
        # The guard keeps a newer current row when another process raced us (domain/ingest.py: an
        # older reading never overwrites a newer one), and never hands the thread to another device
        # (two devices reporting one new thread at once in two processes: the first row stays).
        self._upsert_state = upsert.on_conflict_do_update(
            index_elements=[table.c.thread_id],
            set_={c.name: excluded[c.name] for c in table.columns if c.name != "thread_id"},
            where=and_(
                or_(
                    table.c.captured_at < excluded.captured_at,
                    and_(
                        table.c.captured_at == excluded.captured_at,
                        table.c.snapshot_version < excluded.snapshot_version,
                    ),
                ),
                table.c.owner_id == excluded.owner_id,
                table.c.node_id == excluded.node_id,
                table.c.worker_id == excluded.worker_id,
            ),
        )
        policy_upsert = dialect_insert(thread_context_threshold_policies)
        self._upsert_policy = policy_upsert.on_conflict_do_update(
            index_elements=[thread_context_threshold_policies.c.project_id],
            set_={
                name: policy_upsert.excluded[name]
                for name in ("safe_min_pct", "watch_min_pct", "urgent_min_pct", "updated_at")
            },
        )
        # PostgreSQL bulk statements (module docstring). The three reads of a batch share one
        # statement (one round trip): kind 1 rows are heads (locked), 2 stored snapshot ids, 3 policies.
        self._pg_batch_context = (
            f"WITH heads AS (SELECT {', '.join(_HEAD_COLUMNS)} FROM thread_contexts "
            "WHERE thread_id = ANY(%b::text[]) ORDER BY thread_id FOR UPDATE) "
            "SELECT 1, thread_id, context_budget_level, captured_at, snapshot_version, compaction_count, "
            "level_alert_id, compaction_risk_alert_id, owner_id, node_id, worker_id, "
            "NULL::float8, NULL::float8, NULL::float8 FROM heads "
            "UNION ALL SELECT 2, snapshot_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
            "NULL, NULL, NULL FROM thread_context_snapshots WHERE snapshot_id = ANY(%b::text[]) "
            "UNION ALL SELECT 3, project_id, NULL, updated_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
            "safe_min_pct, watch_min_pct, urgent_min_pct FROM thread_context_threshold_policies "
            "WHERE project_id = ANY(%b::text[])"
        )
        # Created when missing in every ingest transaction (cheap when it exists), so it survives a
        # rolled-back creation and needs no per-connection bookkeeping; emptied at every commit.
        self._pg_create_staging = (
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING_TABLE} "
            "(LIKE thread_contexts INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
        names = ", ".join(name for name, _type in _STATE_COLUMNS)
        # Current rows are written in thread_id order, the order in which heads are locked, so two
        # processes writing the same new threads cannot deadlock on each other's inserts. The whole
        # row is replaced with `ROW(EXCLUDED.*)` (_STATE_COLUMNS are the table's columns in table
        # order; thread_id is set to itself), which keeps the upserts run on their own under
        # psycopg's 4,096-character query cache limit (MAX_CACHED_STATEMENT_LENGTH), over which it
        # parses a statement anew on every execution.
        # As on SQLite, the guard keeps a newer row and the thread's device.
        on_conflict = (
            f" ON CONFLICT (thread_id) DO UPDATE SET ({names}) = ROW(EXCLUDED.*)"
            " WHERE (thread_contexts.captured_at, thread_contexts.snapshot_version)"
            " < (EXCLUDED.captured_at, EXCLUDED.snapshot_version)"
            " AND (thread_contexts.owner_id, thread_contexts.node_id, thread_contexts.worker_id)"
            " = (EXCLUDED.owner_id, EXCLUDED.node_id, EXCLUDED.worker_id)"
        )
        self._pg_merge_staging = (
            f"INSERT INTO thread_contexts ({names}) SELECT {names} FROM {_STAGING_TABLE} ORDER BY thread_id"
            + on_conflict
        )
        self._pg_upsert_unnest = (
            f"INSERT INTO thread_contexts ({names}) " + _unnest_select(_STATE_COLUMNS) + on_conflict
        )
        # Small batches write history and current rows with one statement over one JSON array of
        # rows (one parameter: psycopg's adaptation of an array per column cost more client CPU than
        # the statement's other work): every history row, flagged when it is also its thread's new
        # current row.
        reading = ", ".join(name for name, _type in _READING_COLUMNS)
        definitions = ", ".join(f"{name} {pg_type}" for name, pg_type in _FLAGGED_READING_COLUMNS)
        # As WITH clauses (`CarriedWrites`): ingest hands them to its outbox append, which makes them
        # in its own statement (a round trip fewer per batch).
        self._pg_write_small = (
            ("incoming", f"SELECT * FROM json_to_recordset(%(readings)s::json) AS t({definitions})"),
            (
                "history",
                f"INSERT INTO thread_context_snapshots ({reading}, superseded, received_at, {_LIMIT_NAMES}) "
                f"SELECT {reading}, superseded, %(received_at)b::timestamptz, {_LIMIT_NAMES} FROM incoming "
                "RETURNING 1",
            ),
            (
                "current_rows",
                f"INSERT INTO thread_contexts ({names}) SELECT {reading}, level_alert_id, "
                "compaction_risk_alert_id, %(received_at)b::timestamptz, owner_id, "
                f"{_LIMIT_NAMES} FROM incoming WHERE is_current ORDER BY thread_id{on_conflict} RETURNING 1",
            ),
        )
        snapshot_names = ", ".join(name for name, _type in _SNAPSHOT_COLUMNS)
        self._pg_insert_unnest = f"INSERT INTO thread_context_snapshots ({snapshot_names}) " + _unnest_select(
            _SNAPSHOT_COLUMNS
        )

    # --- ingest ---------------------------------------------------------------------------------

    async def load_batch_context(
        self,
        connection: AsyncConnection,
        thread_ids: Collection[str],
        snapshot_ids: Collection[str],
        project_ids: Collection[str],
    ) -> tuple[dict[str, ThreadHead], dict[str, Snapshot], dict[str, ThresholdPolicy]]:
        """What ingest needs before planning a batch, in one round trip on PostgreSQL (two when
        some snapshot ids are stored already):

        - the heads of `thread_ids` that have a current state, by thread_id; on PostgreSQL their rows
          stay locked until commit (taken in thread_id order), so concurrent writers of one thread
          in several processes serialise and each sees the other's committed row;
        - the stored readings of those of `snapshot_ids` that are stored already, by snapshot_id
          (to tell an exact repeat from a different reading under a reused id);
        - the stored policies of `project_ids` and the stored default ("" key), by project_id.
        """
        ordered = sorted(thread_ids)
        wanted_projects = sorted({"", *project_ids})
        if not self._postgres:
            columns = [thread_contexts.c[name] for name in _HEAD_COLUMNS]
            result = await connection.execute(
                select(*columns).where(thread_contexts.c.thread_id.in_(ordered))
            )
            heads = {row[0]: _head_of(row) for row in result}
            existing = await self.stored_snapshots(connection, list(snapshot_ids))
            return heads, existing, await self.load_policies(connection, wanted_projects)
        rows = await run_driver_sql(
            connection, self._pg_batch_context, (ordered, list(snapshot_ids), wanted_projects)
        )
        heads = {}
        existing_ids = []
        policies = {}
        for row in rows:
            kind = row[0]
            if kind == 1:
                heads[row[1]] = _head_of(row[1:])
            elif kind == 2:
                existing_ids.append(row[1])
            else:
                policies[row[1]] = ThresholdPolicy(row[1], row[11], row[12], row[13], row[3].astimezone(UTC))
        existing = await self.stored_snapshots(connection, existing_ids) if existing_ids else {}
        return heads, existing, policies

    async def stored_snapshots(
        self, connection: AsyncConnection, snapshot_ids: Collection[str]
    ) -> dict[str, Snapshot]:
        """The history rows of those of `snapshot_ids` that are stored, as readings by snapshot_id."""
        if not snapshot_ids:
            return {}
        table = thread_context_snapshots
        rows = (
            await connection.execute(select(table).where(table.c.snapshot_id.in_(list(snapshot_ids))))
        ).mappings()
        return {row["snapshot_id"]: _snapshot_of(row) for row in rows}

    async def load_policies(
        self, connection: AsyncConnection, project_ids: Iterable[str]
    ) -> dict[str, ThresholdPolicy]:
        """Stored policies of `project_ids` and the stored default ("" key), by project_id."""
        table = thread_context_threshold_policies
        wanted = sorted({"", *project_ids})
        rows = (await connection.execute(select(table).where(table.c.project_id.in_(wanted)))).mappings()
        return {row["project_id"]: _policy_of(row) for row in rows}

    async def write_readings(
        self,
        connection: AsyncConnection,
        snapshots: Sequence[StoredSnapshot],
        states: Sequence[ThreadState],
        received_at: datetime,
        *,
        carried: bool = False,
    ) -> CarriedWrites | None:
        """Appends the history rows and writes the current rows of a batch (`states`' snapshots are
        among `snapshots`, and their updated_at is `received_at`). One statement for a small batch
        on PostgreSQL, which with `carried` is not run here but returned, for the outbox append to
        make (`EventLog.append(carrying=)`); otherwise insert_snapshots then upsert_states, and
        None."""
        if not (self._postgres and 0 < len(snapshots) < COPY_MIN_ROWS):
            await self.insert_snapshots(connection, snapshots, received_at)
            await self.upsert_states(connection, states)
            return None
        current = {id(state.snapshot): state for state in states}
        names = _FLAGGED_READING_NAMES
        rows = []
        for stored in snapshots:
            state = current.get(id(stored.snapshot))
            values = (
                *_reading_values(stored.snapshot, stored.level),
                stored.superseded,
                state is not None,
                None if state is None else state.level_alert_id,
                None if state is None else state.compaction_risk_alert_id,
                stored.snapshot.owner_id,
                *_limit_values(stored.snapshot),
            )
            rows.append(dict(zip(names, values, strict=True)))
        encoded = orjson.dumps(rows, option=orjson.OPT_NAIVE_UTC).decode()
        writes = CarriedWrites(
            self._pg_write_small,
            ("history", "current_rows"),
            {"readings": encoded, "received_at": received_at},
        )
        if carried:
            return writes
        await writes.run(connection)
        return None

    async def insert_snapshots(
        self, connection: AsyncConnection, snapshots: Sequence[StoredSnapshot], received_at: datetime
    ) -> None:
        """Appends history rows (one COPY on PostgreSQL, one executemany elsewhere)."""
        if not snapshots:
            return
        rows = [
            (*_reading_values(s.snapshot, s.level), s.superseded, received_at, *_limit_values(s.snapshot))
            for s in snapshots
        ]
        if self._postgres:
            if len(rows) < COPY_MIN_ROWS:
                await run_driver_sql(connection, self._pg_insert_unnest, _as_columns(rows))
            else:
                await _copy_rows(connection, "thread_context_snapshots", _SNAPSHOT_COLUMNS, rows)
            return
        names = [name for name, _type in _SNAPSHOT_COLUMNS]
        await connection.execute(
            insert(thread_context_snapshots), [dict(zip(names, row, strict=True)) for row in rows]
        )

    async def upsert_states(self, connection: AsyncConnection, states: Sequence[ThreadState]) -> None:
        """Writes current rows, one per thread; a stored newer reading is kept (the upsert's guard)."""
        if not states:
            return
        rows = [
            (
                *_reading_values(state.snapshot, state.level),
                state.level_alert_id,
                state.compaction_risk_alert_id,
                state.updated_at,
                state.snapshot.owner_id,
                *_limit_values(state.snapshot),
            )
            for state in sorted(states, key=lambda state: state.snapshot.thread_id)
        ]
        if self._postgres:
            if len(rows) < COPY_MIN_ROWS:
                await run_driver_sql(connection, self._pg_upsert_unnest, _as_columns(rows))
            else:
                await run_driver_sql(connection, self._pg_create_staging)
                await _copy_rows(connection, _STAGING_TABLE, _STATE_COLUMNS, rows)
                await run_driver_sql(connection, self._pg_merge_staging)
            return
        names = [name for name, _type in _STATE_COLUMNS]
        await connection.execute(self._upsert_state, [dict(zip(names, row, strict=True)) for row in rows])

    async def insert_alerts(self, connection: AsyncConnection, alerts: Sequence[Alert]) -> None:
        """Inserts new alerts: one INSERT from arrays on PostgreSQL (driver SQL: ingest writes them
        in its transaction), one executemany elsewhere."""
        if not alerts:
            return
        rows = [_alert_row(alert) for alert in alerts]
        if self._postgres:
            values = [tuple(row[name] for name, _type in _ALERT_COLUMNS) for row in rows]
            await run_driver_sql(
                connection,
                f"INSERT INTO thread_context_alerts ({_ALERT_NAMES}) " + _unnest_select(_ALERT_COLUMNS),
                _as_columns(values),
            )
            return
        await connection.execute(insert(thread_context_alerts), rows)

    async def resolve_alerts(
        self, connection: AsyncConnection, alert_ids: Collection[str], now: datetime
    ) -> list[Alert]:
        """Resolves the listed alerts that are not resolved yet; returns those it changed."""
        if not alert_ids:
            return []
        if self._postgres:
            rows = await fetch_driver_rows(
                connection,
                thread_context_alerts,
                "UPDATE thread_context_alerts SET alert_status = %(resolved)s, resolved_at = %(now)s "
                "WHERE alert_id = ANY(%(ids)s::text[]) AND alert_status <> %(resolved)s "
                f"RETURNING {column_list(thread_context_alerts)}",
                {"resolved": AlertStatus.RESOLVED.value, "now": now, "ids": list(alert_ids)},
            )
            return [_alert_of(row) for row in rows]
        table = thread_context_alerts
        statement = (
            update(table)
            .where(table.c.alert_id.in_(list(alert_ids)), table.c.alert_status != AlertStatus.RESOLVED.value)
            .values(alert_status=AlertStatus.RESOLVED.value, resolved_at=now)
            .returning(*table.columns)
        )
        return [_alert_of(row) for row in (await connection.execute(statement)).mappings()]

    # --- alerts ---------------------------------------------------------------------------------

    async def get_alert(
        self, connection: AsyncConnection, alert_id: str, *, for_update: bool = False
    ) -> Alert | None:
        """One alert, or None. With `for_update` the row is locked until commit (PostgreSQL)."""
        query = select(thread_context_alerts).where(thread_context_alerts.c.alert_id == alert_id)
        if for_update and self._postgres:
            query = query.with_for_update()
        row = (await connection.execute(query)).mappings().first()
        return None if row is None else _alert_of(row)

    async def save_alert(self, connection: AsyncConnection, alert: Alert) -> None:
        """Writes an existing alert's status and times."""
        table = thread_context_alerts
        await connection.execute(
            update(table)
            .where(table.c.alert_id == alert.alert_id)
            .values(
                alert_status=alert.alert_status.value, acked_at=alert.acked_at, resolved_at=alert.resolved_at
            )
        )

    async def open_alerts_of(
        self, connection: AsyncConnection, thread_ids: Collection[str]
    ) -> dict[str, list[Alert]]:
        """Opened or acked alerts of `thread_ids`, oldest first, by thread_id."""
        if not thread_ids:
            return {}
        table = thread_context_alerts
        query = (
            select(table)
            .where(
                table.c.thread_id.in_(list(thread_ids)),
                table.c.alert_status.in_([AlertStatus.OPENED.value, AlertStatus.ACKED.value]),
            )
            .order_by(table.c.opened_at, table.c.alert_id)
        )
        found: dict[str, list[Alert]] = {}
        for row in (await connection.execute(query)).mappings():
            found.setdefault(row["thread_id"], []).append(_alert_of(row))
        return found

    async def list_alerts(
        self,
        connection: AsyncConnection,
        *,
        thread_id: str,
        project_id: str,
        statuses: Collection[AlertStatus],
        after: tuple[datetime, str] | None,
        limit: int,
        owner_id: str | None = None,
    ) -> list[Alert]:
        """Alerts newest first (opened_at, then alert_id, descending), after the keyset cursor; with
        `owner_id`, only alerts of that owner's threads."""
        table = thread_context_alerts
        query = select(table).order_by(table.c.opened_at.desc(), table.c.alert_id.desc()).limit(limit)
        if owner_id is not None:
            owned = select(thread_contexts.c.thread_id).where(thread_contexts.c.owner_id == owner_id)
            query = query.where(table.c.thread_id.in_(owned))
        if thread_id:
            query = query.where(table.c.thread_id == thread_id)
        if project_id:
            query = query.where(table.c.project_id == project_id)
        if statuses:
            query = query.where(table.c.alert_status.in_([status.value for status in statuses]))
        if after is not None:
            opened_at, alert_id = after
            query = query.where(
                or_(
                    table.c.opened_at < opened_at,
                    and_(table.c.opened_at == opened_at, table.c.alert_id < alert_id),
                )
            )
        return [_alert_of(row) for row in (await connection.execute(query)).mappings()]

    # --- current state reads --------------------------------------------------------------------

    async def get_state(self, connection: AsyncConnection, thread_id: str) -> ThreadState | None:
        """The current state of one thread, or None."""
        row = (
            (
                await connection.execute(
                    select(thread_contexts).where(thread_contexts.c.thread_id == thread_id)
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else _state_of(row)

    async def list_states(
        self,
        connection: AsyncConnection,
        *,
        project_id: str,
        thread_ids: Collection[str],
        after_thread_id: str | None,
        limit: int,
        owner_id: str | None = None,
    ) -> list[ThreadState]:
        """Current states ordered by thread_id, filtered by project and/or thread ids, and with
        `owner_id` to that owner's threads."""
        table = thread_contexts
        query = select(table).order_by(table.c.thread_id).limit(limit)
        if owner_id is not None:
            query = query.where(table.c.owner_id == owner_id)
        if project_id:
            query = query.where(table.c.project_id == project_id)
        if thread_ids:
            query = query.where(table.c.thread_id.in_(list(thread_ids)))
        if after_thread_id is not None:
            query = query.where(table.c.thread_id > after_thread_id)
        return [_state_of(row) for row in (await connection.execute(query)).mappings()]

    async def move_thread(
        self, connection: AsyncConnection, thread_id: str, owner_id: str, node_id: str, worker_id: str
    ) -> bool:
        """Hands `owner_id`'s thread to the device (node_id, worker_id): only that device may report
        it from now on. Returns False when the thread has no current state here or is another
        owner's (nothing changes then)."""
        table = thread_contexts
        result = await connection.execute(
            update(table)
            .where(table.c.thread_id == thread_id, table.c.owner_id == owner_id)
            .values(node_id=node_id, worker_id=worker_id)
        )
        return bool(result.rowcount)

    # --- policies -------------------------------------------------------------------------------

    async def get_policy(self, connection: AsyncConnection, project_id: str) -> ThresholdPolicy | None:
        """The stored policy of `project_id` ("" = default), or None."""
        table = thread_context_threshold_policies
        row = (
            (await connection.execute(select(table).where(table.c.project_id == project_id)))
            .mappings()
            .first()
        )
        return None if row is None else _policy_of(row)

    async def save_policy(self, connection: AsyncConnection, policy: ThresholdPolicy) -> None:
        """Inserts or replaces a policy."""
        await connection.execute(
            self._upsert_policy,
            {
                "project_id": policy.project_id,
                "safe_min_pct": policy.safe_min_pct,
                "watch_min_pct": policy.watch_min_pct,
                "urgent_min_pct": policy.urgent_min_pct,
                "updated_at": policy.updated_at,
            },
        )
