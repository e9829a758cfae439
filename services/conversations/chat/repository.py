"""SqlAlchemyChatRepository: the chat tables (messages, message_sequences, chat_tasks) inside a
caller's transaction, plus chat_tasks row <-> ChatTask conversions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from sqlalchemy import and_, case, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.tables import chat_tasks, message_sequences, messages, threads
from services.conversations.chat.domain import TERMINAL_STATUSES, ChatTask

Row = Mapping[Any, Any]


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

    # --- messages -----------------------------------------------------------------------------------

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
        and result message)."""
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
        `task`)."""
        earlier = or_(
            chat_tasks.c.created_at < task.created_at,
            and_(chat_tasks.c.created_at == task.created_at, chat_tasks.c.task_id < task.task_id),
        )
        result = await self.connection.execute(
            select(func.count(), func.coalesce(func.sum(case((earlier, 1), else_=0)), 0)).where(
                chat_tasks.c.target_thread_id == task.target_thread_id,
                chat_tasks.c.status.not_in(sorted(TERMINAL_STATUSES)),
            )
        )
        total, before = result.one()
        return int(total), int(before)
