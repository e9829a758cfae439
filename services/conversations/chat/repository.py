"""SqlAlchemyChatRepository: the chat tables (messages, message_sequences, chat_tasks) inside a
caller's transaction, plus chat_tasks row <-> ChatTask conversions.

The statements of a send and of a task's terminal status (both on the way from a person's message
to the thread's reply) are driver SQL on PostgreSQL, each read or write one round trip
(`send_target`, `append_message`, `task_in_view`, `task_insertion`); SQLite runs the same steps
as several SQLAlchemy statements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, func, insert, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnElement, FromClause

from services.conversations.adapters.tables import chat_tasks, message_sequences, messages, projects, threads
from services.conversations.chat.domain import TERMINAL_STATUSES, ChatTask
from services.shared.sql_types import CarriedWrites, column_list, fetch_driver_rows, run_driver_sql

Row = Mapping[Any, Any]

_TERMINAL = sorted(TERMINAL_STATUSES)
_SEND_PROJECT_COLUMNS = ("project_id", "owner_id", "conversation_type", "archived_at")
_SEND_THREAD_COLUMNS = ("thread_id", "node_id", "codex_folder", "codex_thread_ref", "archived_at")
_MESSAGE_COLUMNS = (
    "message_id",
    "project_id",
    "author_kind",
    "thread_id",
    "text",
    "created_at",
    "client_message_id",
    "task_id",
)


@dataclass(frozen=True)
class SendTarget:
    """What a send to a project needs to know, read together.

    Attributes:
        project: the project's project_id, owner_id, conversation_type and archived_at.
        thread: the thread whose own project it is (thread_id, node_id, codex_folder,
            codex_thread_ref, archived_at), None when there is none.
        sent_before: the project holds a message with the send's client_message_id.
        open_tasks: how many of that thread's tasks are not terminal (0 without a thread).
    """

    project: dict[str, Any]
    thread: dict[str, Any] | None
    sent_before: bool
    open_tasks: int


@dataclass(frozen=True)
class TaskInView:
    """A task with what applying a status report to it needs.

    Attributes:
        task: the task as stored.
        project: its target project's project_id and owner_id, None when that project is unknown.
        open_tasks: the task's thread's tasks that are not terminal (this one included if open).
        earlier_open_tasks: how many of those were created before this task.
    """

    task: ChatTask
    project: dict[str, Any] | None
    open_tasks: int
    earlier_open_tasks: int


def task_of(row: Mapping[Any, Any]) -> ChatTask:
    """A ChatTask from its `chat_tasks` row."""
    return ChatTask(**{name: row[name] for name in ChatTask.__dataclass_fields__})


def message_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A `messages` row as handlers and payloads use it: the Message proto's fields (NULL
    client_message_id as ""), without the internal id."""
    return {
        "message_id": row["message_id"],
        "project_id": row["project_id"],
        "author_kind": row["author_kind"],
        "thread_id": row["thread_id"],
        "text": row["text"],
        "created_at": row["created_at"],
        "sequence": int(row["sequence"]),
        "client_message_id": row["client_message_id"] or "",
        "task_id": row["task_id"] or "",
    }


class SqlAlchemyChatRepository:
    """Every statement of chat, on one open connection (one transaction)."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    @property
    def postgres(self) -> bool:
        """Whether the connection is PostgreSQL's (the driver SQL paths)."""
        return self.connection.dialect.name == "postgresql"

    # --- messages -----------------------------------------------------------------------------------

    async def append_message(self, values: Mapping[str, Any]) -> int:
        """Stores a message as the conversation's next one and returns its sequence.

        `values` holds the `message_view` fields but `sequence` ("" client_message_id is stored
        as NULL). The project's latest_reply_at, sort_at and updated_at move to the message's
        created_at first, then the sequence is taken (`next_sequence`), then the message stored:
        every writer of a conversation locks the project row and then its sequence row, so two
        never wait for each other crosswise. One statement on PostgreSQL.

        Raises:
            sqlalchemy.exc.IntegrityError: the project holds the client_message_id already.
            LookupError: the project does not exist.
        """
        row = {name: values[name] for name in _MESSAGE_COLUMNS}
        row["client_message_id"] = row["client_message_id"] or None
        now = row["created_at"]
        if not self.postgres:
            touched = await self.connection.execute(
                update(projects)
                .where(projects.c.project_id == row["project_id"])
                .values(latest_reply_at=now, sort_at=now, updated_at=now)
            )
            if touched.rowcount != 1:
                raise LookupError(f"project {row['project_id']!r} does not exist")
            sequence = await self.next_sequence(row["project_id"])
            await self.connection.execute(insert(messages).values({**row, "sequence": sequence}))
            return sequence
        statement = (
            "WITH touched AS (UPDATE projects SET latest_reply_at = %(created_at)s, "
            "sort_at = %(created_at)s, updated_at = %(created_at)s WHERE project_id = %(project_id)s "
            "RETURNING project_id), "
            "numbered AS (INSERT INTO message_sequences (project_id, last_sequence) "
            "SELECT project_id, 1 FROM touched ON CONFLICT (project_id) DO UPDATE "
            "SET last_sequence = message_sequences.last_sequence + 1 RETURNING last_sequence) "
            f"INSERT INTO messages ({', '.join(_MESSAGE_COLUMNS)}, sequence) "
            f"SELECT {', '.join(f'%({name})s' for name in _MESSAGE_COLUMNS)}, numbered.last_sequence "
            "FROM numbered RETURNING sequence"
        )
        stored = await run_driver_sql(self.connection, statement, row)
        if not stored:
            raise LookupError(f"project {row['project_id']!r} does not exist")
        return int(stored[0][0])

    async def next_sequence(self, project_id: str) -> int:
        """Takes the conversation's next message sequence (1 for its first message).

        One upsert of the project's `message_sequences` row; its row lock is held until the caller's
        transaction ends, so the next writer of the conversation numbers after this one commits
        (sequences become visible in order) and a rollback gives the number back (no gaps).
        """
        dialect = postgresql if self.connection.dialect.name == "postgresql" else sqlite
        statement = (
            dialect.insert(message_sequences)
            .values(project_id=project_id, last_sequence=1)
            .on_conflict_do_update(
                index_elements=[message_sequences.c.project_id],
                set_={"last_sequence": message_sequences.c.last_sequence + 1},
            )
            .returning(message_sequences.c.last_sequence)
        )
        return int((await self.connection.execute(statement)).scalar_one())

    async def insert_message(self, values: Mapping[str, Any]) -> None:
        """Stores one message (`message_view` fields; "" client_message_id is stored as NULL).

        Raises sqlalchemy.exc.IntegrityError when the project holds the client_message_id already."""
        row = dict(values)
        row["client_message_id"] = row.get("client_message_id") or None
        await self.connection.execute(insert(messages).values(row))

    async def message(self, message_id: str) -> dict[str, Any] | None:
        """One message by id, or None."""
        result = await self.connection.execute(select(messages).where(messages.c.message_id == message_id))
        row = result.mappings().one_or_none()
        return message_view(row) if row is not None else None

    async def message_by_client_id(self, project_id: str, client_message_id: str) -> dict[str, Any] | None:
        """The project's message sent with `client_message_id`, or None."""
        result = await self.connection.execute(
            select(messages).where(
                messages.c.project_id == project_id, messages.c.client_message_id == client_message_id
            )
        )
        row = result.mappings().one_or_none()
        return message_view(row) if row is not None else None

    async def messages_after_sequence(self, project_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` messages of the project with sequence > `after`, oldest first."""
        result = await self.connection.execute(
            select(messages)
            .where(messages.c.project_id == project_id, messages.c.sequence > after)
            .order_by(messages.c.sequence)
            .limit(limit)
        )
        return [message_view(row) for row in result.mappings()]

    # --- sending ------------------------------------------------------------------------------------

    async def send_target(self, project_id: str, client_message_id: str) -> SendTarget | None:
        """The project, its thread, whether `client_message_id` was sent to it, and the thread's
        open tasks (see SendTarget); None for an unknown project. One read on PostgreSQL."""
        if not self.postgres:
            return await self._send_target_in_steps(project_id, client_message_id)
        statement = (
            f"SELECT {', '.join(f'p.{name}' for name in _SEND_PROJECT_COLUMNS)}, "
            f"{', '.join(f't.{name}' for name in _SEND_THREAD_COLUMNS)}, "
            "EXISTS (SELECT 1 FROM messages m WHERE m.project_id = p.project_id "
            "AND m.client_message_id = %(client)s) AS sent_before, "
            "(SELECT count(*) FROM chat_tasks c WHERE c.target_thread_id = t.thread_id "
            "AND c.status <> ALL(%(terminal)s)) AS open_tasks "
            "FROM projects p LEFT JOIN threads t ON t.single_device_project_id = p.project_id "
            "WHERE p.project_id = %(project)s LIMIT 1"
        )
        parameters = {"project": project_id, "client": client_message_id, "terminal": _TERMINAL}
        rows = await run_driver_sql(self.connection, statement, parameters)
        if not rows:
            return None
        values = rows[0]
        split = len(_SEND_PROJECT_COLUMNS)
        end = split + len(_SEND_THREAD_COLUMNS)
        project = _in_utc(dict(zip(_SEND_PROJECT_COLUMNS, values[:split], strict=True)))
        thread = None
        if values[split] is not None:
            thread = _in_utc(dict(zip(_SEND_THREAD_COLUMNS, values[split:end], strict=True)))
        return SendTarget(project, thread, bool(values[end]), int(values[end + 1]))

    async def _send_target_in_steps(self, project_id: str, client_message_id: str) -> SendTarget | None:
        found = await self.connection.execute(
            select(*(projects.c[name] for name in _SEND_PROJECT_COLUMNS)).where(
                projects.c.project_id == project_id
            )
        )
        project = found.mappings().one_or_none()
        if project is None:
            return None
        thread = await self.thread_of_project(project_id)
        sent = await self.message_by_client_id(project_id, client_message_id)
        open_tasks = 0
        if thread is not None:
            counted = await self.connection.execute(
                select(func.count()).where(
                    chat_tasks.c.target_thread_id == thread["thread_id"],
                    chat_tasks.c.status.not_in(_TERMINAL),
                )
            )
            open_tasks = int(counted.scalar_one())
        return SendTarget(
            dict(project),
            {name: thread[name] for name in _SEND_THREAD_COLUMNS} if thread is not None else None,
            sent is not None,
            open_tasks,
        )

    def task_insertion(self, task: ChatTask) -> CarriedWrites:
        """The INSERT of a new task for the outbox append to carry (PostgreSQL: `EventLog.append(
        carrying=...)`, no round trip of its own; `CarriedWrites.run` makes it alone)."""
        row = asdict(task)
        statement = (
            f"INSERT INTO chat_tasks ({', '.join(row)}) "
            f"VALUES ({', '.join(f'%(task_{name})s' for name in row)}) RETURNING 1"
        )
        return CarriedWrites(
            (("task_inserted", statement),),
            ("task_inserted",),
            {f"task_{name}": value for name, value in row.items()},
        )

    # --- threads ------------------------------------------------------------------------------------

    async def thread_of_project(self, project_id: str) -> Row | None:
        """The thread whose own (single_device) project this is, or None."""
        result = await self.connection.execute(
            select(threads).where(threads.c.single_device_project_id == project_id).limit(1)
        )
        return result.mappings().first()

    # --- tasks --------------------------------------------------------------------------------------

    async def insert_task(self, task: ChatTask) -> None:
        """Stores a new task."""
        await self.connection.execute(insert(chat_tasks).values(asdict(task)))

    async def task(self, task_id: str) -> ChatTask | None:
        """One task by id, or None."""
        result = await self.connection.execute(select(chat_tasks).where(chat_tasks.c.task_id == task_id))
        row = result.mappings().one_or_none()
        return task_of(row) if row is not None else None

    async def task_in_view(self, task_id: str) -> TaskInView | None:
        """A task with its target project and its thread's open tasks (see TaskInView), or None.
        One read on PostgreSQL."""
        if not self.postgres:
            task = await self.task(task_id)
            if task is None:
                return None
            found = await self.connection.execute(
                select(projects.c.project_id, projects.c.owner_id).where(
                    projects.c.project_id == task.target_project_id
                )
            )
            target = found.mappings().one_or_none()
            open_tasks, earlier = await self.open_tasks_of_thread(task)
            return TaskInView(task, dict(target) if target is not None else None, open_tasks, earlier)
        statement = (
            "SELECT p.project_id, p.owner_id, "
            f"(SELECT count(*) FROM chat_tasks o WHERE {_OPEN_IN_QUEUE_SQL}), "
            f"(SELECT count(*) FROM chat_tasks o WHERE {_OPEN_IN_QUEUE_SQL} AND ({_CREATED_BEFORE_SQL})), "
            f"{column_list(chat_tasks, 't')} "
            "FROM chat_tasks t LEFT JOIN projects p ON p.project_id = t.target_project_id "
            "WHERE t.task_id = %(task)s"
        )
        rows = await fetch_driver_rows(self.connection, chat_tasks, statement, {"task": task_id}, *_VIEW_LEAD)
        if not rows:
            return None
        row = rows[0]
        project = None
        if row["view_project_id"] is not None:
            project = {"project_id": row["view_project_id"], "owner_id": row["view_owner_id"]}
        return TaskInView(
            task_of(row), project, int(row["view_open_tasks"]), int(row["view_earlier_open_tasks"])
        )

    async def current_task_of_message(self, message_id: str) -> ChatTask | None:
        """The task now answering a request message: the last of its retries (the one not retried),
        or None when the message requested none."""
        result = await self.connection.execute(
            select(chat_tasks)
            .where(chat_tasks.c.request_message_id == message_id, chat_tasks.c.retried_by_task_id == "")
            .order_by(chat_tasks.c.created_at.desc(), chat_tasks.c.task_id.desc())
            .limit(1)
        )
        row = result.mappings().first()
        return task_of(row) if row is not None else None

    async def save_status(self, task: ChatTask) -> None:
        """Writes the status columns of a task (status, failure kind, detail, device presence, times
        and result message). Driver SQL on PostgreSQL."""
        if self.postgres:
            await run_driver_sql(
                self.connection,
                "UPDATE chat_tasks SET status = %(status)s, failure_kind = %(failure_kind)s, "
                "status_detail = %(status_detail)s, device_last_seen_at = %(device_last_seen_at)s, "
                "updated_at = %(updated_at)s, scheduler_updated_at = %(scheduler_updated_at)s, "
                "result_message_id = %(result_message_id)s WHERE task_id = %(task_id)s",
                {name: getattr(task, name) for name in _STATUS_COLUMNS},
            )
            return
        await self.connection.execute(
            update(chat_tasks)
            .where(chat_tasks.c.task_id == task.task_id)
            .values(
                status=task.status,
                failure_kind=task.failure_kind,
                status_detail=task.status_detail,
                device_last_seen_at=task.device_last_seen_at,
                updated_at=task.updated_at,
                scheduler_updated_at=task.scheduler_updated_at,
                result_message_id=task.result_message_id,
            )
        )

    async def mark_retried(self, task: ChatTask, retried_by_task_id: str) -> bool:
        """Records the retry of a task, unless it was retried already (by a concurrent call: the
        conditional update waits for its commit and then finds the column set). True when recorded."""
        result = await self.connection.execute(
            update(chat_tasks)
            .where(chat_tasks.c.task_id == task.task_id, chat_tasks.c.retried_by_task_id == "")
            .values(retried_by_task_id=retried_by_task_id, updated_at=task.updated_at)
        )
        return result.rowcount == 1

    async def open_tasks_of_thread(self, task: ChatTask) -> tuple[int, int]:
        """(The task's thread's tasks that are not terminal, how many of them were created before
        `task`). A task of no thread (the master agent's model answers it) counts the tasks of no
        thread of its project: the master conversation's own queue."""
        earlier = _created_before(chat_tasks, task.created_at, task.task_id)
        result = await self.connection.execute(
            select(func.count(), func.coalesce(func.sum(case((earlier, 1), else_=0)), 0)).where(
                _open_in_queue(chat_tasks, task.target_thread_id, task.project_id)
            )
        )
        total, before = result.one()
        return int(total), int(before)


def _open_in_queue(
    other: FromClause, thread_id: ColumnElement[str] | str, project_id: ColumnElement[str] | str
) -> ColumnElement[bool]:
    """Whether a task of `other` is open in the queue of a task of `thread_id` and `project_id`
    (values, or the columns of the task in view): not terminal and of the same thread; for a task of
    no thread (the master agent's model answers it), of no thread and of the same project: the master
    conversation's own queue."""
    thread = literal(thread_id) if isinstance(thread_id, str) else thread_id
    return and_(
        other.c.target_thread_id == thread,
        or_(thread != "", other.c.project_id == project_id),
        other.c.status.not_in(_TERMINAL),
    )


def _created_before(
    other: FromClause, created_at: ColumnElement[datetime] | datetime, task_id: ColumnElement[str] | str
) -> ColumnElement[bool]:
    """Whether a task of `other` was created before the task of `created_at` and `task_id` (ties by
    task id): it runs first."""
    return or_(
        other.c.created_at < created_at,
        and_(other.c.created_at == created_at, other.c.task_id < task_id),
    )


def _postgres_condition(condition: ColumnElement[bool]) -> str:
    """A condition as PostgreSQL driver SQL, its values inline (compiled once, at import)."""
    return str(condition.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))


# `task_in_view`'s counts on PostgreSQL: the same rules over `chat_tasks o` for the task `chat_tasks t`.
_OTHER, _VIEWED = chat_tasks.alias("o"), chat_tasks.alias("t")
_OPEN_IN_QUEUE_SQL = _postgres_condition(
    _open_in_queue(_OTHER, _VIEWED.c.target_thread_id, _VIEWED.c.project_id)
)
_CREATED_BEFORE_SQL = _postgres_condition(_created_before(_OTHER, _VIEWED.c.created_at, _VIEWED.c.task_id))
_VIEW_LEAD = ("view_project_id", "view_owner_id", "view_open_tasks", "view_earlier_open_tasks")

_STATUS_COLUMNS = (
    "task_id",
    "status",
    "failure_kind",
    "status_detail",
    "device_last_seen_at",
    "updated_at",
    "scheduler_updated_at",
    "result_message_id",
)


def _in_utc(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its datetime values in UTC (as UtcDateTime reads them), in place."""
    for name, value in row.items():
        if isinstance(value, datetime):
            row[name] = value.astimezone(UTC)
    return row
