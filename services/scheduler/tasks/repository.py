"""SqlAlchemyTaskRepository: the SQL of tasks, leases and device presence.

Every method takes the caller's connection (one unit of work per transaction). Statements are
written once with psycopg's `%(name)s` placeholders and tokens for database time, and run as driver
SQL on PostgreSQL (`run_driver_sql`: these run on every claim, start and finish) and as the same
text with `:name` placeholders on SQLite.

Database time: lease instants and presence come from the database's clock, never the process's:
PostgreSQL `now()` (the transaction's start: these transactions are a few statements long), SQLite
`strftime('%Y-%m-%d %H:%M:%S', 'now')` plus its milliseconds, written in the six-digit form
SQLAlchemy's UtcDateTime stores, so stored instants compare as text.

Claims: `claim` is one UPDATE of the oldest claimable task of a node (`rules.claimable` in SQL: a
queued task with no open task of its thread before it and none of its thread claimed or running).
On PostgreSQL the candidate is locked with `FOR UPDATE SKIP LOCKED`, so concurrent claimers (and
scheduler processes) take different tasks without waiting on each other; the partial unique index
`ux_tasks_thread_active` refuses a second claimed or running task of one thread whatever happens,
and the claim is then tried again.

Batches (`claim_many`, `start_many`, `heartbeat_many`, `finish_many`, `record_presence_many`): the
agents' calls of one write batch (services/scheduler/tasks/writes.py), one statement per kind on
PostgreSQL (the calls as one JSON array, `json_to_recordset`; the claims as one LATERAL pick per
node), each call's result returned in its place; on SQLite the single statements one after the
other. A batch's claims take, per node, as many of its claimable tasks as it has claims (in claim
order, the claims ranked by their place in the batch): only the oldest open task of a thread is
claimable, so one statement never claims two tasks of a thread.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.tasks.model import FailureKind, Task, TaskSettings, TaskStatus, TaskType
from services.scheduler.tasks.rules import FinishOutcome
from services.scheduler.tasks.sweep import SweepAction, SweepKind
from services.scheduler.tasks.tables import OPEN_ONLY, tasks
from services.shared.auth import DEFAULT_OWNER_ID
from services.shared.sql_types import CarriedWrites, run_driver_sql

SWEEP_LIMIT = 500
"""Most tasks one sweep looks at (the rest are due at the next sweep)."""

_COLUMNS = tuple(column.name for column in tasks.columns)
_TIMES = frozenset(
    (
        "created_at",
        "updated_at",
        "claimed_at",
        "started_at",
        "finished_at",
        "lease_expires_at",
        "heartbeat_at",
    )
)
_INSERTED = tuple(name for name in _COLUMNS if name != "id")
_PRESENCE = (
    "(SELECT p.last_seen_at FROM device_presence p "
    "WHERE p.owner_id = tasks.owner_id AND p.node_id = tasks.device_id)"
)
_RETURNING = ", ".join(f"tasks.{name}" for name in _COLUMNS) + f", {_PRESENCE}"
_SELECTED = ", ".join(f"t.{name}" for name in _COLUMNS)
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%S', 'now'{m}) || substr(strftime('%f', 'now'{m}), 3) || '000'"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_TIME_TOKEN = re.compile(r"\{now(?:([+-])(\w+))?\}")


def _time_expression(postgres: bool, sign: str | None, name: str | None) -> str:
    """The database-time expression of a `{now}` / `{now+name}` / `{now-name}` token (`name` a
    parameter holding seconds)."""
    if postgres:
        return "now()" if sign is None else f"(now() {sign} %({name})s * interval '1 second')"
    return _SQLITE_NOW.format(m="" if sign is None else f", %({name}_modifier)s")


@dataclass(frozen=True)
class RequestLookup:
    """What `lookup` found: database `now`, the task ids stored already, each ever seen device's
    last seen instant, by (owner_id, node_id), and which of the asked threads have an open
    (queued, claimed or running) task."""

    now: datetime
    existing: set[str]
    last_seen: dict[tuple[str, str], datetime]
    open_threads: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class LeaseCall:
    """A fenced call of an agent on one task: who (`worker_id` on `node_id`, enrolled for
    `owner_id`: the token's owner) presents which lease. A task of another owner never matches."""

    task_id: str
    node_id: str
    worker_id: str
    lease_id: str
    owner_id: str = DEFAULT_OWNER_ID


@dataclass(frozen=True)
class ClaimCall:
    """One claim of `worker_id` on `node_id` under a fresh `lease_id`, for the tasks of `owner_id`
    only (the worker token's owner: a device of another owner with the same node id claims none)."""

    node_id: str
    worker_id: str
    lease_id: str
    owner_id: str = DEFAULT_OWNER_ID


@dataclass(frozen=True)
class _Statement:
    """One statement in both dialects' forms (tokens replaced, placeholders converted)."""

    text: str
    modifiers: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, template: str, postgres: bool) -> _Statement:
        """Replaces the time tokens of `template`; on SQLite converts placeholders to `:name` and
        notes which seconds parameters need a strftime modifier (`+30.0 seconds`)."""
        modifiers: list[tuple[str, str]] = []

        def replace(match: re.Match[str]) -> str:
            sign, name = match.group(1), match.group(2)
            if sign is not None and name is not None and not postgres:
                modifiers.append((name, sign))
            return _time_expression(postgres, sign, name)

        text = _TIME_TOKEN.sub(replace, template)
        if not postgres:
            text = _PLACEHOLDER.sub(r":\1", text)
        return cls(text, tuple(dict.fromkeys(modifiers)))


def _sqlite_instant(value: datetime) -> str:
    """An aware instant as SQLite stores UtcDateTime values (UTC wall time, six-digit fraction)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _instant(value: Any) -> datetime | None:
    """A database instant (aware datetime on PostgreSQL, text on SQLite) as an aware UTC datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _call_row(call: LeaseCall) -> dict[str, Any]:
    """A fenced call as a row of the batch statements' JSON array (its position set later)."""
    return {
        "task_id": call.task_id,
        "lease_id": call.lease_id,
        "node_id": call.node_id,
        "worker_id": call.worker_id,
        "owner_id": call.owner_id,
    }


def _in_place(count: int, rows: Sequence[Sequence[Any]]) -> list[Task | None]:
    """The tasks of a batch statement's rows (each led by its call's position) in their calls'
    places; None for a call no row answered."""
    found: list[Task | None] = [None] * count
    for row in rows:
        found[int(row[0])] = task_of(row[1:])
    return found


def task_of(row: Sequence[Any]) -> Task:
    """A Task from a row of every `tasks` column in table order, then the device's last seen."""
    values = dict(zip(_COLUMNS, row, strict=False))
    for name in _TIMES:
        values[name] = _instant(values[name])
    return Task(
        task_id=values["task_id"],
        task_type=TaskType(values["task_type"]),
        status=TaskStatus(values["status"]),
        owner_id=values["owner_id"],
        project_id=values["project_id"],
        target_project_id=values["target_project_id"],
        target_thread_id=values["target_thread_id"],
        device_id=values["device_id"],
        codex_folder_ref=values["codex_folder_ref"],
        codex_thread_ref=values["codex_thread_ref"],
        request_message_id=values["request_message_id"],
        instruction_text=values["instruction_text"],
        dispatch_plan_id=values["dispatch_plan_id"],
        retry_of_task_id=values["retry_of_task_id"],
        attempt=int(values["attempt"]),
        worker_id=values["worker_id"],
        lease_id=values["lease_id"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
        claimed_at=values["claimed_at"],
        started_at=values["started_at"],
        finished_at=values["finished_at"],
        lease_expires_at=values["lease_expires_at"],
        heartbeat_at=values["heartbeat_at"],
        reply_text=values["reply_text"],
        failure_kind=FailureKind(values["failure_kind"]),
        status_detail=values["status_detail"],
        device_offline=bool(values["device_offline"]),
        codex_session_id=values["codex_session_id"],
        device_last_seen_at=_instant(row[len(_COLUMNS)]) if len(row) > len(_COLUMNS) else None,
    )


_CLAIM = f"""
UPDATE tasks SET status = 'claimed', lease_id = %(lease_id)s, attempt = attempt + 1,
  worker_id = %(worker_id)s, claimed_at = {{now}}, lease_expires_at = {{now+lease_seconds}},
  updated_at = {{now}}, status_detail = '', device_offline = FALSE
WHERE id = (
  SELECT t.id FROM tasks t
  WHERE t.device_id = %(node_id)s AND t.owner_id = %(owner_id)s AND t.status = 'queued'
    AND NOT EXISTS (
      SELECT 1 FROM tasks e WHERE e.target_thread_id = t.target_thread_id
        AND e.status IN ('queued', 'claimed', 'running') AND (e.id < t.id OR e.status <> 'queued'))
  ORDER BY t.id LIMIT 1{{skip_locked}})
RETURNING {_RETURNING}"""

_FENCED = (
    "WHERE task_id = %(task_id)s AND lease_id = %(lease_id)s AND device_id = %(node_id)s "
    "AND worker_id = %(worker_id)s AND owner_id = %(owner_id)s"
)

_START = f"""
UPDATE tasks SET status = 'running', started_at = {{now}}, lease_expires_at = {{now+lease_seconds}},
  updated_at = {{now}}
{_FENCED} AND status = 'claimed'
RETURNING {_RETURNING}"""

_HEARTBEAT = f"""
UPDATE tasks SET lease_expires_at = {{now+lease_seconds}}, heartbeat_at = {{now}}, updated_at = {{now}}
{_FENCED} AND status = 'running'
RETURNING {_RETURNING}"""

_FINISH = f"""
UPDATE tasks SET status = %(status)s, finished_at = {{now}}, lease_expires_at = NULL,
  reply_text = %(reply_text)s, failure_kind = %(failure_kind)s, status_detail = %(status_detail)s,
  codex_session_id = CASE WHEN %(codex_session_id)s = '' THEN codex_session_id
    ELSE %(codex_session_id)s END,
  updated_at = {{now}}
{_FENCED} AND status = 'running'
RETURNING {_RETURNING}"""

_CALLS = (
    "json_to_recordset(%(calls)s::json) AS c(position int, task_id text, lease_id text, node_id text, "
    "worker_id text, owner_id text{extra})"
)
_FENCED_MANY = (
    "WHERE tasks.task_id = c.task_id AND tasks.lease_id = c.lease_id AND tasks.device_id = c.node_id "
    "AND tasks.worker_id = c.worker_id AND tasks.owner_id = c.owner_id"
)

_OUTCOME_COLUMNS = (
    ", status text, reply_text text, failure_kind text, status_detail text, codex_session_id text"
)

_START_MANY = f"""
UPDATE tasks SET status = 'running', started_at = {{now}}, lease_expires_at = {{now+lease_seconds}},
  updated_at = {{now}}
FROM {_CALLS.format(extra="")}
{_FENCED_MANY} AND tasks.status = 'claimed'
RETURNING c.position, {_RETURNING}"""

_HEARTBEAT_MANY = f"""
UPDATE tasks SET lease_expires_at = {{now+lease_seconds}}, heartbeat_at = {{now}}, updated_at = {{now}}
FROM {_CALLS.format(extra="")}
{_FENCED_MANY} AND tasks.status = 'running'
RETURNING c.position, {_RETURNING}"""

_FINISH_MANY = f"""
UPDATE tasks SET status = c.status, finished_at = {{now}}, lease_expires_at = NULL,
  reply_text = c.reply_text, failure_kind = c.failure_kind, status_detail = c.status_detail,
  codex_session_id = CASE WHEN c.codex_session_id = '' THEN tasks.codex_session_id
    ELSE c.codex_session_id END,
  updated_at = {{now}}
FROM {_CALLS.format(extra=_OUTCOME_COLUMNS)}
{_FENCED_MANY} AND tasks.status = 'running'
RETURNING c.position, {_RETURNING}"""

_CLAIM_MANY = f"""
WITH requested AS (
  SELECT * FROM json_to_recordset(%(claims)s::json)
    AS r(position int, node_id text, owner_id text, worker_id text, lease_id text, rank int)
), picked AS (
  SELECT n.node_id, n.owner_id, c.id,
    row_number() OVER (PARTITION BY n.node_id, n.owner_id ORDER BY c.id) AS rank
  FROM (SELECT node_id, owner_id, count(*) AS wanted FROM requested GROUP BY node_id, owner_id) AS n
  CROSS JOIN LATERAL (
    SELECT t.id FROM tasks t
    WHERE t.device_id = n.node_id AND t.owner_id = n.owner_id AND t.status = 'queued'
      AND NOT EXISTS (
        SELECT 1 FROM tasks e WHERE e.target_thread_id = t.target_thread_id
          AND e.status IN ('queued', 'claimed', 'running') AND (e.id < t.id OR e.status <> 'queued'))
    ORDER BY t.id LIMIT n.wanted FOR UPDATE SKIP LOCKED) AS c
)
UPDATE tasks SET status = 'claimed', lease_id = r.lease_id, attempt = attempt + 1,
  worker_id = r.worker_id, claimed_at = {{now}}, lease_expires_at = {{now+lease_seconds}},
  updated_at = {{now}}, status_detail = '', device_offline = FALSE
FROM picked JOIN requested r
  ON r.node_id = picked.node_id AND r.owner_id = picked.owner_id AND r.rank = picked.rank
WHERE tasks.id = picked.id
RETURNING r.position, {_RETURNING}"""

_PRESENCE_CONFLICT = (
    "ON CONFLICT (owner_id, node_id) DO UPDATE SET worker_id = excluded.worker_id, "
    "last_seen_at = excluded.last_seen_at"
)
_PRESENCE_WRITE_MANY = f"""
INSERT INTO device_presence (owner_id, node_id, worker_id, last_seen_at)
SELECT p.owner_id, p.node_id, p.worker_id, now()
FROM json_to_recordset(%(seen)s::json) AS p(owner_id text, node_id text, worker_id text)
{_PRESENCE_CONFLICT}"""
# A task's device: its owner's node (two owners' machines may share a node id).
_DEVICE_OF_TASK = "device_presence p ON p.owner_id = t.owner_id AND p.node_id = t.device_id"

_GET = f"""
SELECT {_SELECTED}, p.last_seen_at FROM tasks t LEFT JOIN {_DEVICE_OF_TASK}
WHERE t.task_id = %(task_id)s"""

_PRESENCE_WRITE = f"""
INSERT INTO device_presence (owner_id, node_id, worker_id, last_seen_at)
VALUES (%(owner_id)s, %(node_id)s, %(worker_id)s, {{now}})
{_PRESENCE_CONFLICT}"""

_INSERT = (
    f"INSERT INTO tasks ({', '.join(_INSERTED)}) VALUES ({', '.join(f'%({n})s' for n in _INSERTED)}) "
    "ON CONFLICT (task_id) DO NOTHING RETURNING task_id"
)
_INSERT_MANY_POSTGRES = (
    f"INSERT INTO tasks ({', '.join(_INSERTED)}) SELECT {', '.join(f'r.{n}' for n in _INSERTED)} "
    "FROM json_populate_recordset(NULL::tasks, %(rows)s::json) AS r "
    "ON CONFLICT (task_id) DO NOTHING RETURNING task_id"
)

_SWEEP = f"""
SELECT {_SELECTED}, p.last_seen_at, {{now}} FROM tasks t
  LEFT JOIN {_DEVICE_OF_TASK}
WHERE t.status IN ('claimed', 'running') AND t.lease_expires_at <= {{now}}
UNION ALL
SELECT {_SELECTED}, p.last_seen_at, {{now}} FROM tasks t
  LEFT JOIN {_DEVICE_OF_TASK}
WHERE t.status = 'queued' AND (
  (NOT t.device_offline AND (p.last_seen_at IS NULL OR p.last_seen_at <= {{now-window_seconds}}))
  OR (t.device_offline
    AND (p.last_seen_at > {{now-window_seconds}} OR t.created_at <= {{now-expiry_seconds}})))
LIMIT {SWEEP_LIMIT}"""

_SWEEP_WRITES: dict[SweepKind, str] = {
    SweepKind.REQUEUE: """
UPDATE tasks SET status = 'queued', lease_id = '', lease_expires_at = NULL,
  status_detail = %(status_detail)s, device_offline = FALSE, updated_at = {now}
WHERE task_id = %(task_id)s AND status = 'claimed' AND lease_id = %(lease_id)s
  AND lease_expires_at <= {now}""",
    SweepKind.DEVICE_LOST: """
UPDATE tasks SET status = 'failed', failure_kind = 'device_lost', status_detail = %(status_detail)s,
  finished_at = {now}, lease_expires_at = NULL, updated_at = {now}
WHERE task_id = %(task_id)s AND status = 'running' AND lease_id = %(lease_id)s
  AND lease_expires_at <= {now}""",
    SweepKind.NOTE_OFFLINE: """
UPDATE tasks SET status_detail = %(status_detail)s, device_offline = TRUE, updated_at = {now}
WHERE task_id = %(task_id)s AND status = 'queued' AND NOT device_offline""",
    SweepKind.CLEAR_OFFLINE: """
UPDATE tasks SET status_detail = '', device_offline = FALSE, updated_at = {now}
WHERE task_id = %(task_id)s AND status = 'queued' AND device_offline""",
    SweepKind.EXPIRE: """
UPDATE tasks SET status = 'expired', status_detail = %(status_detail)s, finished_at = {now},
  updated_at = {now}
WHERE task_id = %(task_id)s AND status = 'queued' AND NOT EXISTS (
  SELECT 1 FROM device_presence p WHERE p.owner_id = tasks.owner_id AND p.node_id = tasks.device_id
    AND p.last_seen_at > {now-window_seconds})""",
}

_CANCEL = (
    """
UPDATE tasks SET status = 'cancelled', status_detail = %(status_detail)s, finished_at = {now},
  lease_expires_at = NULL, device_offline = FALSE, updated_at = {now}
WHERE task_id = %(task_id)s AND owner_id = %(owner_id)s AND status IN ('queued', 'claimed')
RETURNING """
    + _RETURNING
)

_RELEASE = (
    """
UPDATE tasks SET status = 'queued', lease_id = '', lease_expires_at = NULL, started_at = NULL,
  status_detail = %(status_detail)s, updated_at = {now}
WHERE task_id = %(task_id)s AND lease_id = %(lease_id)s AND status = 'running' AND heartbeat_at IS NULL
RETURNING """
    + _RETURNING
)

_CANCEL_TOO_LATE = (
    """
UPDATE tasks SET status_detail = %(status_detail)s, updated_at = {now}
WHERE task_id = %(task_id)s AND owner_id = %(owner_id)s AND status = 'running'
  AND status_detail <> %(status_detail)s
RETURNING """
    + _RETURNING
)

# The presence rows of the asked devices, [owner_id, node_id] pairs as one JSON array.
_ASKED_POSTGRES = (
    "FROM device_presence WHERE (owner_id, node_id) IN (SELECT d->>0, d->>1 "
    "FROM json_array_elements(%(devices)s::json) AS d) ORDER BY owner_id, node_id"
)
_LOOKUP_POSTGRES = f"""
SELECT now(), ARRAY(SELECT task_id FROM tasks WHERE task_id = ANY(%(ids)s)),
  ARRAY(SELECT owner_id {_ASKED_POSTGRES}), ARRAY(SELECT node_id {_ASKED_POSTGRES}),
  ARRAY(SELECT last_seen_at {_ASKED_POSTGRES}),
  ARRAY(SELECT DISTINCT target_thread_id FROM tasks
    WHERE target_thread_id = ANY(%(threads)s) AND {OPEN_ONLY})"""
_PRESENCE_AND_NOW_SQLITE = f"""
SELECT {_SQLITE_NOW.format(m="")}, p.owner_id, p.node_id, p.last_seen_at FROM (SELECT 1) AS one
  LEFT JOIN device_presence p ON (p.owner_id, p.node_id) IN
    (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:devices))"""
_EXISTING_SQLITE = "SELECT task_id FROM tasks WHERE task_id IN (SELECT value FROM json_each(:ids))"
_OPEN_THREADS_SQLITE = (
    "SELECT DISTINCT target_thread_id FROM tasks "
    f"WHERE target_thread_id IN (SELECT value FROM json_each(:threads)) AND {OPEN_ONLY}"
)
_NOTIFY = "SELECT pg_notify(%(channel)s, node) FROM unnest(%(nodes)s::text[]) AS node"


class SqlAlchemyTaskRepository:
    """The task SQL for one dialect ("postgresql" or "sqlite")."""

    def __init__(self, dialect: str) -> None:
        self.postgres = dialect == "postgresql"
        skip_locked = " FOR UPDATE SKIP LOCKED" if self.postgres else ""
        self._claim = self._statement(_CLAIM.replace("{skip_locked}", skip_locked))
        self._start = self._statement(_START)
        self._heartbeat = self._statement(_HEARTBEAT)
        self._finish = self._statement(_FINISH)
        self._get = self._statement(_GET)
        self._presence_write = self._statement(_PRESENCE_WRITE)
        self._insert = self._statement(_INSERT)
        self._sweep = self._statement(_SWEEP)
        self._sweep_writes = {
            kind: self._statement(f"{sql}\nRETURNING {_RETURNING}") for kind, sql in _SWEEP_WRITES.items()
        }
        self._cancel = self._statement(_CANCEL)
        self._cancel_too_late = self._statement(_CANCEL_TOO_LATE)
        self._release = self._statement(_RELEASE)
        self._claim_many = self._statement(_CLAIM_MANY)
        self._start_many = self._statement(_START_MANY)
        self._heartbeat_many = self._statement(_HEARTBEAT_MANY)
        self._finish_many = self._statement(_FINISH_MANY)

    def _statement(self, template: str) -> _Statement:
        return _Statement.of(template, self.postgres)

    async def _run(
        self, connection: AsyncConnection, statement: _Statement, parameters: Mapping[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Runs `statement` with `parameters` (seconds parameters as floats) and returns its rows."""
        values = dict(parameters)
        for name, sign in statement.modifiers:
            values[f"{name}_modifier"] = f"{sign}{float(values[name])} seconds"
        if self.postgres:
            return await run_driver_sql(connection, statement.text, values)
        result = await connection.exec_driver_sql(statement.text, values)
        return [tuple(row) for row in result.fetchall()] if result.returns_rows else []

    # ---- creation ------------------------------------------------------------------------------

    async def lookup(
        self,
        connection: AsyncConnection,
        task_ids: Sequence[str],
        devices: Sequence[tuple[str, str]],
        threads: Sequence[str] = (),
    ) -> RequestLookup:
        """What creating tasks needs to know: the database's current time, which of `task_ids`
        are stored already, the last seen instant of each of `devices` ((owner_id, node_id))
        ever seen, and which of `threads` (target_thread_id) have an open task (PostgreSQL: one
        statement)."""
        asked = orjson.dumps(sorted(set(devices))).decode()
        open_threads: list[str] = []
        if self.postgres:
            rows = await run_driver_sql(
                connection,
                _LOOKUP_POSTGRES,
                {"ids": list(task_ids), "devices": asked, "threads": list(threads)},
            )
            now, existing, seen_owners, seen_nodes, seen_at, open_threads = rows[0]
            seen = dict(zip(zip(seen_owners, seen_nodes, strict=True), seen_at, strict=True))
        else:
            if threads:
                result = await connection.exec_driver_sql(
                    _OPEN_THREADS_SQLITE, {"threads": orjson.dumps(list(threads)).decode()}
                )
                open_threads = [row[0] for row in result.fetchall()]
            result = await connection.exec_driver_sql(_PRESENCE_AND_NOW_SQLITE, {"devices": asked})
            presence = [tuple(row) for row in result.fetchall()]
            now = presence[0][0]
            seen = {(row[1], row[2]): row[3] for row in presence if row[2] is not None}
            result = await connection.exec_driver_sql(
                _EXISTING_SQLITE, {"ids": orjson.dumps(list(task_ids)).decode()}
            )
            existing = [row[0] for row in result.fetchall()]
        instant = _instant(now)
        assert instant is not None
        last_seen = {device: _instant(value) for device, value in seen.items()}
        return RequestLookup(
            instant,
            set(existing),
            {device: value for device, value in last_seen.items() if value is not None},
            set(open_threads),
        )

    async def insert(self, connection: AsyncConnection, new_tasks: Sequence[Task]) -> set[str]:
        """Inserts `new_tasks` (ON CONFLICT (task_id) DO NOTHING); returns the ids inserted. On
        PostgreSQL one statement from a JSON array of rows."""
        if not new_tasks:
            return set()
        rows = [self._row_of(task) for task in new_tasks]
        if self.postgres:
            inserted = await run_driver_sql(
                connection, _INSERT_MANY_POSTGRES, {"rows": orjson.dumps(rows).decode()}
            )
            return {row[0] for row in inserted}
        ids: set[str] = set()
        for row in rows:
            ids.update(found[0] for found in await self._run(connection, self._insert, row))
        return ids

    def insertion(self, new_tasks: Sequence[Task], channel: str, nodes: Sequence[str]) -> CarriedWrites:
        """PostgreSQL: the insert of `new_tasks` (as `insert`, ON CONFLICT (task_id) DO NOTHING)
        and the notification of `nodes`, as writes for the outbox append to carry in its own
        statement (two round trips fewer per enqueue)."""
        clauses = [
            (
                "task_inserted",
                _INSERT_MANY_POSTGRES.replace("%(rows)s", "%(task_rows)s"),
            )
        ]
        parameters: dict[str, Any] = {
            "task_rows": orjson.dumps([self._row_of(t) for t in new_tasks]).decode()
        }
        notification = self.notification(channel, nodes)
        if notification is not None:
            clauses.extend(notification.clauses)
            parameters.update(notification.parameters)
        return CarriedWrites(tuple(clauses), tuple(name for name, _ in clauses), parameters)

    def _row_of(self, task: Task) -> dict[str, Any]:
        """The inserted column values of a new task (instants as each dialect takes them)."""
        row: dict[str, Any] = {
            "task_id": task.task_id,
            "task_type": task.task_type.value,
            "status": task.status.value,
            "owner_id": task.owner_id,
            "project_id": task.project_id,
            "target_project_id": task.target_project_id,
            "target_thread_id": task.target_thread_id,
            "device_id": task.device_id,
            "codex_folder_ref": task.codex_folder_ref,
            "codex_thread_ref": task.codex_thread_ref,
            "request_message_id": task.request_message_id,
            "instruction_text": task.instruction_text,
            "dispatch_plan_id": task.dispatch_plan_id,
            "retry_of_task_id": task.retry_of_task_id,
            "attempt": task.attempt,
            "worker_id": task.worker_id,
            "lease_id": task.lease_id,
            "created_at": task.created_at,
            "updated_at": task.updated_at,
            "claimed_at": task.claimed_at,
            "started_at": task.started_at,
            "finished_at": task.finished_at,
            "lease_expires_at": task.lease_expires_at,
            "heartbeat_at": task.heartbeat_at,
            "reply_text": task.reply_text,
            "failure_kind": task.failure_kind.value,
            "status_detail": task.status_detail,
            "device_offline": task.device_offline,
            "codex_session_id": task.codex_session_id,
        }
        for name in _TIMES:
            value = row[name]
            if value is not None:
                row[name] = value.isoformat() if self.postgres else _sqlite_instant(value)
        return row

    async def notify(self, connection: AsyncConnection, channel: str, nodes: Sequence[str]) -> None:
        """PostgreSQL: `pg_notify(channel, node)` for each node, delivered when the transaction
        commits (no-op on SQLite and for no nodes)."""
        if self.postgres and nodes:
            await run_driver_sql(connection, _NOTIFY, {"channel": channel, "nodes": sorted(set(nodes))})

    def notification(self, channel: str, nodes: Sequence[str]) -> CarriedWrites | None:
        """`notify` as writes for the outbox append to carry in its own statement (PostgreSQL;
        None on SQLite and for no nodes): a round trip fewer."""
        if not self.postgres or not nodes:
            return None
        return CarriedWrites(
            clauses=(
                (
                    "task_notified",
                    _NOTIFY.replace("%(channel)s", "%(task_channel)s").replace("%(nodes)s", "%(task_nodes)s"),
                ),
            ),
            writes=("task_notified",),
            parameters={"task_channel": channel, "task_nodes": sorted(set(nodes))},
        )

    # ---- the agent's calls --------------------------------------------------------------------

    async def claim(
        self,
        connection: AsyncConnection,
        node_id: str,
        worker_id: str,
        lease_id: str,
        lease: timedelta,
        owner_id: str = DEFAULT_OWNER_ID,
    ) -> Task | None:
        """Claims the oldest claimable task of `owner_id` on `node_id` for `worker_id` under
        `lease_id`, its lease running out `lease` after database now; None when none is claimable.
        Raises sqlalchemy.exc.IntegrityError when another claim took the thread meanwhile (retry)."""
        rows = await self._run(
            connection,
            self._claim,
            {
                "node_id": node_id,
                "owner_id": owner_id,
                "worker_id": worker_id,
                "lease_id": lease_id,
                "lease_seconds": lease.total_seconds(),
            },
        )
        return task_of(rows[0]) if rows else None

    async def start(
        self,
        connection: AsyncConnection,
        task_id: str,
        node_id: str,
        worker_id: str,
        lease_id: str,
        lease: timedelta,
        owner_id: str = DEFAULT_OWNER_ID,
    ) -> Task | None:
        """claimed -> running under the presented lease (renewed to `lease` from now); None when
        the fence does not hold (unknown task, other node or worker, other lease, not claimed)."""
        rows = await self._run(
            connection,
            self._start,
            {
                "task_id": task_id,
                "node_id": node_id,
                "worker_id": worker_id,
                "lease_id": lease_id,
                "owner_id": owner_id,
                "lease_seconds": lease.total_seconds(),
            },
        )
        return task_of(rows[0]) if rows else None

    async def heartbeat(
        self,
        connection: AsyncConnection,
        task_id: str,
        node_id: str,
        worker_id: str,
        lease_id: str,
        lease: timedelta,
        owner_id: str = DEFAULT_OWNER_ID,
    ) -> Task | None:
        """Renews a running task's lease to `lease` from now and records the heartbeat; None when
        the fence does not hold."""
        rows = await self._run(
            connection,
            self._heartbeat,
            {
                "task_id": task_id,
                "node_id": node_id,
                "worker_id": worker_id,
                "lease_id": lease_id,
                "owner_id": owner_id,
                "lease_seconds": lease.total_seconds(),
            },
        )
        return task_of(rows[0]) if rows else None

    async def finish(
        self,
        connection: AsyncConnection,
        task_id: str,
        node_id: str,
        worker_id: str,
        lease_id: str,
        outcome: FinishOutcome,
        owner_id: str = DEFAULT_OWNER_ID,
    ) -> Task | None:
        """running -> the outcome's status under the presented lease; None when the fence does
        not hold."""
        rows = await self._run(
            connection,
            self._finish,
            {
                "task_id": task_id,
                "node_id": node_id,
                "worker_id": worker_id,
                "lease_id": lease_id,
                "owner_id": owner_id,
                "status": outcome.status.value,
                "reply_text": outcome.reply_text,
                "failure_kind": outcome.failure_kind.value,
                "status_detail": outcome.status_detail,
                "codex_session_id": outcome.codex_session_id,
            },
        )
        return task_of(rows[0]) if rows else None

    async def cancel(
        self, connection: AsyncConnection, task_id: str, owner_id: str, status_detail: str
    ) -> Task | None:
        """queued | claimed -> cancelled for the owner's task (a claim's lease is void: its
        StartTask is refused); None when the task is not the owner's or is past claimed."""
        parameters = {"task_id": task_id, "owner_id": owner_id, "status_detail": status_detail}
        rows = await self._run(connection, self._cancel, parameters)
        return task_of(rows[0]) if rows else None

    async def release(
        self, connection: AsyncConnection, task_id: str, lease_id: str, status_detail: str
    ) -> Task | None:
        """running -> queued for a task that a claim started under `lease_id` and whose answer
        never reached its agent (the call was cancelled first), so no run can have begun; None when
        the task is not running under that lease or has had a heartbeat."""
        parameters = {"task_id": task_id, "lease_id": lease_id, "status_detail": status_detail}
        rows = await self._run(connection, self._release, parameters)
        return task_of(rows[0]) if rows else None

    async def note_cancel_too_late(
        self, connection: AsyncConnection, task_id: str, owner_id: str, status_detail: str
    ) -> Task | None:
        """Sets a running task's status_detail to say a cancel came after Codex had started it
        (its status stays running); None when the task is not the owner's, not running, or says
        so already."""
        parameters = {"task_id": task_id, "owner_id": owner_id, "status_detail": status_detail}
        rows = await self._run(connection, self._cancel_too_late, parameters)
        return task_of(rows[0]) if rows else None

    async def task(self, connection: AsyncConnection, task_id: str) -> Task | None:
        """One task with its device's presence, or None."""
        rows = await self._run(connection, self._get, {"task_id": task_id})
        return task_of(rows[0]) if rows else None

    async def record_presence(
        self, connection: AsyncConnection, owner_id: str, node_id: str, worker_id: str
    ) -> None:
        """Records that `worker_id`'s local agent on `owner_id`'s node `node_id` was seen now
        (database time)."""
        parameters = {"owner_id": owner_id, "node_id": node_id, "worker_id": worker_id}
        await self._run(connection, self._presence_write, parameters)

    # ---- a write batch's agent calls ------------------------------------------------------------

    async def claim_many(
        self, connection: AsyncConnection, calls: Sequence[ClaimCall], lease: timedelta
    ) -> list[Task | None]:
        """`claim` for each of `calls` (the earlier a call, the older its task); each call's task
        in its place, None for a call that found nothing claimable. PostgreSQL: one statement.
        Raises sqlalchemy.exc.IntegrityError as `claim` (the whole statement: retry each alone)."""
        if not self.postgres:
            return [
                await self.claim(connection, c.node_id, c.worker_id, c.lease_id, lease, c.owner_id)
                for c in calls
            ]
        if not calls:
            return []
        ranks: Counter[tuple[str, str]] = Counter()
        claims = []
        for position, call in enumerate(calls):
            ranks[call.node_id, call.owner_id] += 1
            claims.append(
                {
                    "position": position,
                    "node_id": call.node_id,
                    "owner_id": call.owner_id,
                    "worker_id": call.worker_id,
                    "lease_id": call.lease_id,
                    "rank": ranks[call.node_id, call.owner_id],
                }
            )
        rows = await self._run(
            connection,
            self._claim_many,
            {"claims": orjson.dumps(claims).decode(), "lease_seconds": lease.total_seconds()},
        )
        return _in_place(len(calls), rows)

    async def start_many(
        self, connection: AsyncConnection, calls: Sequence[LeaseCall], lease: timedelta
    ) -> list[Task | None]:
        """`start` for each of `calls`: each call's running task in its place, None where the fence
        does not hold (and for all but one of calls repeated within `calls`). PostgreSQL: one
        statement."""
        if not self.postgres:
            return [
                await self.start(connection, c.task_id, c.node_id, c.worker_id, c.lease_id, lease, c.owner_id)
                for c in calls
            ]
        return await self._fenced_many(connection, self._start_many, [_call_row(c) for c in calls], lease)

    async def heartbeat_many(
        self, connection: AsyncConnection, calls: Sequence[LeaseCall], lease: timedelta
    ) -> list[Task | None]:
        """`heartbeat` for each of `calls`, as `start_many`."""
        if not self.postgres:
            return [
                await self.heartbeat(
                    connection, c.task_id, c.node_id, c.worker_id, c.lease_id, lease, c.owner_id
                )
                for c in calls
            ]
        return await self._fenced_many(connection, self._heartbeat_many, [_call_row(c) for c in calls], lease)

    async def finish_many(
        self, connection: AsyncConnection, calls: Sequence[tuple[LeaseCall, FinishOutcome]]
    ) -> list[Task | None]:
        """`finish` for each (call, outcome) of `calls`, as `start_many`."""
        if not self.postgres:
            return [
                await self.finish(
                    connection, c.task_id, c.node_id, c.worker_id, c.lease_id, outcome, c.owner_id
                )
                for c, outcome in calls
            ]
        rows = [
            {
                **_call_row(call),
                "status": outcome.status.value,
                "reply_text": outcome.reply_text,
                "failure_kind": outcome.failure_kind.value,
                "status_detail": outcome.status_detail,
                "codex_session_id": outcome.codex_session_id,
            }
            for call, outcome in calls
        ]
        return await self._fenced_many(connection, self._finish_many, rows, None)

    async def _fenced_many(
        self,
        connection: AsyncConnection,
        statement: _Statement,
        rows: list[dict[str, Any]],
        lease: timedelta | None,
    ) -> list[Task | None]:
        """Runs one of the fenced batch statements over `rows` (each with its `position`)."""
        if not rows:
            return []
        for position, row in enumerate(rows):
            row["position"] = position
        parameters: dict[str, Any] = {"calls": orjson.dumps(rows).decode()}
        if lease is not None:
            parameters["lease_seconds"] = lease.total_seconds()
        return _in_place(len(rows), await self._run(connection, statement, parameters))

    async def record_presence_many(
        self, connection: AsyncConnection, seen: Sequence[tuple[str, str, str]]
    ) -> None:
        """`record_presence` for each (owner_id, node_id, worker_id) of `seen` (the last worker of
        a device named twice wins). PostgreSQL: one statement."""
        latest = {(owner_id, node_id): worker_id for owner_id, node_id, worker_id in seen}
        if not self.postgres:
            for (owner_id, node_id), worker_id in latest.items():
                await self.record_presence(connection, owner_id, node_id, worker_id)
            return
        if latest:
            rows = [
                {"owner_id": owner, "node_id": node, "worker_id": worker}
                for (owner, node), worker in sorted(latest.items())
            ]
            await run_driver_sql(connection, _PRESENCE_WRITE_MANY, {"seen": orjson.dumps(rows).decode()})

    # ---- the sweeper ----------------------------------------------------------------------------

    async def sweep_candidates(
        self, connection: AsyncConnection, settings: TaskSettings
    ) -> tuple[list[Task], datetime | None]:
        """Tasks the sweeper may have to act on (leases run out; queued tasks whose device is
        offline and not said so, or said so and back, or waiting past the expiry), each with its
        device's presence, and the database time of the read (None when nothing was found). One
        statement over the partial indexes; at most SWEEP_LIMIT tasks."""
        rows = await self._run(
            connection,
            self._sweep,
            {
                "window_seconds": settings.presence_window.total_seconds(),
                "expiry_seconds": settings.queue_expiry.total_seconds(),
            },
        )
        if not rows:
            return [], None
        return [task_of(row[: len(_COLUMNS) + 1]) for row in rows], _instant(rows[0][-1])

    async def apply_sweep(
        self, connection: AsyncConnection, action: SweepAction, task: Task, settings: TaskSettings
    ) -> Task | None:
        """Writes one sweeper decision, only if the task is still as the decision saw it (status,
        lease, lease run out, device still offline); returns the task as written, or None."""
        rows = await self._run(
            connection,
            self._sweep_writes[action.kind],
            {
                "task_id": task.task_id,
                "lease_id": task.lease_id,
                "status_detail": action.status_detail,
                "window_seconds": settings.presence_window.total_seconds(),
            },
        )
        return task_of(rows[0]) if rows else None
