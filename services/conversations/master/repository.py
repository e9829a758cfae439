"""SqlAlchemyMasterRepository: what the master agent reads and writes inside a caller's transaction:
the owner's whole state for the prompt, the master conversation's history, the master's Codex
thread, and the tasks its model answers (claimed, finished, found abandoned).

A task the master agent's model answers (openai_api) is a `conversation_reply` chat task of a
master project with no device and no thread (`is_model_task`); the conversations service runs it
itself, the scheduler never sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, desc, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import view_of
from services.conversations.adapters.tables import chat_tasks, messages, project_threads, projects, threads
from services.conversations.chat.domain import (
    CONVERSATION_REPLY,
    QUEUED,
    RUNNING,
    TERMINAL_STATUSES,
    ChatTask,
)
from services.conversations.chat.repository import task_of
from services.conversations.master.prompt import HistoryMessage
from services.conversations.master.state import LastMessage, OpenTask, ProjectState, SystemState, ThreadState

Row = Mapping[Any, Any]

MASTER_PROJECT_PREFIX = "master-"
"""Every master project id starts so (domain.model.master_project_id)."""


def is_model_task(task: ChatTask) -> bool:
    """Whether the master agent's model answers this task (no device, no thread, a master project)."""
    return (
        task.task_type == CONVERSATION_REPLY
        and not task.device_id
        and not task.target_thread_id
        and task.project_id.startswith(MASTER_PROJECT_PREFIX)
    )


def _model_tasks() -> Any:
    """The WHERE clause of `is_model_task`."""
    return and_(
        chat_tasks.c.task_type == CONVERSATION_REPLY,
        chat_tasks.c.device_id == "",
        chat_tasks.c.target_thread_id == "",
        chat_tasks.c.project_id.startswith(MASTER_PROJECT_PREFIX),
    )


class SqlAlchemyMasterRepository:
    """The master agent's statements on one open connection."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    # --- the state ----------------------------------------------------------------------------------

    async def system_state(self, owner_id: str, captured_at: datetime) -> SystemState:
        """The owner's live projects and threads, each thread with its open tasks and the latest
        message of its own conversation. Five reads whatever the number of threads."""
        project_rows = list(
            (
                await self.connection.execute(
                    select(projects)
                    .where(projects.c.owner_id == owner_id, projects.c.archived_at.is_(None))
                    .order_by(projects.c.sort_at.desc(), projects.c.project_id)
                )
            ).mappings()
        )
        thread_rows = list(
            (
                await self.connection.execute(
                    select(threads)
                    .where(threads.c.owner_id == owner_id, threads.c.archived_at.is_(None))
                    .order_by(threads.c.thread_id)
                )
            ).mappings()
        )
        live = {row["thread_id"] for row in thread_rows}
        titles = {row["project_id"]: row["title"] for row in project_rows}
        members: dict[str, list[str]] = {row["project_id"]: [] for row in project_rows}
        projects_of: dict[str, list[str]] = {thread_id: [] for thread_id in live}
        if project_rows:
            found = await self.connection.execute(
                select(project_threads.c.project_id, project_threads.c.thread_id)
                .join(projects, projects.c.project_id == project_threads.c.project_id)
                .where(projects.c.owner_id == owner_id, projects.c.archived_at.is_(None))
                .order_by(project_threads.c.project_id, project_threads.c.thread_id)
            )
            for project_id, thread_id in found:
                if thread_id in live:
                    members[project_id].append(thread_id)
                    projects_of[thread_id].append(titles[project_id])
        tasks = await self._open_tasks(owner_id)
        last = await self._last_messages([row["single_device_project_id"] for row in thread_rows])
        thread_states = tuple(
            ThreadState(
                view=view_of(row),
                codex_folder=row["codex_folder"] or "",
                handoff_reason=row["handoff_reason"] or "",
                is_master_main_thread=bool(row["is_master_main_thread"]),
                project_titles=tuple(projects_of.get(row["thread_id"], ())),
                open_tasks=tuple(tasks.get(row["thread_id"], ())),
                last_message=last.get(row["single_device_project_id"] or ""),
            )
            for row in thread_rows
        )
        project_states = tuple(
            ProjectState(
                project_id=row["project_id"],
                title=row["title"],
                conversation_type=row["conversation_type"],
                thread_ids=tuple(members.get(row["project_id"], ())),
                strategy_summary=row["strategy_summary"] or "",
            )
            for row in project_rows
        )
        return SystemState(captured_at=captured_at, threads=thread_states, projects=project_states)

    async def _open_tasks(self, owner_id: str) -> dict[str, list[OpenTask]]:
        """The owner's tasks that have not ended, by target thread, oldest first, each with its
        request message's text."""
        result = await self.connection.execute(
            select(
                chat_tasks.c.task_id,
                chat_tasks.c.task_type,
                chat_tasks.c.status,
                chat_tasks.c.target_thread_id,
                chat_tasks.c.created_at,
                messages.c.text,
            )
            .select_from(
                chat_tasks.outerjoin(messages, messages.c.message_id == chat_tasks.c.request_message_id)
            )
            .where(
                chat_tasks.c.owner_id == owner_id,
                chat_tasks.c.target_thread_id != "",
                chat_tasks.c.status.not_in(sorted(TERMINAL_STATUSES)),
            )
            .order_by(chat_tasks.c.created_at, chat_tasks.c.task_id)
        )
        found: dict[str, list[OpenTask]] = {}
        for task_id, task_type, status, thread_id, created_at, text in result:
            found.setdefault(thread_id, []).append(
                OpenTask(task_id, task_type, status, text or "", created_at)
            )
        return found

    async def _last_messages(self, project_ids: Sequence[str]) -> dict[str, LastMessage]:
        """The latest message of each project, by project id."""
        wanted = sorted({project_id for project_id in project_ids if project_id})
        if not wanted:
            return {}
        latest = (
            select(messages.c.project_id, func.max(messages.c.sequence).label("sequence"))
            .where(messages.c.project_id.in_(wanted))
            .group_by(messages.c.project_id)
            .subquery()
        )
        result = await self.connection.execute(
            select(
                messages.c.project_id, messages.c.author_kind, messages.c.text, messages.c.created_at
            ).join(
                latest,
                and_(messages.c.project_id == latest.c.project_id, messages.c.sequence == latest.c.sequence),
            )
        )
        return {
            project_id: LastMessage(author_kind, text, created_at)
            for project_id, author_kind, text, created_at in result
        }

    async def history_before(self, project_id: str, sequence: int, limit: int) -> list[HistoryMessage]:
        """Up to `limit` messages of the project before `sequence`, oldest first."""
        result = await self.connection.execute(
            select(messages.c.author_kind, messages.c.text)
            .where(messages.c.project_id == project_id, messages.c.sequence < sequence)
            .order_by(desc(messages.c.sequence))
            .limit(limit)
        )
        return [HistoryMessage(author_kind, text) for author_kind, text in reversed(result.all())]

    # --- the master's Codex thread ------------------------------------------------------------------

    async def master_main_thread_ids(self, owner_id: str) -> list[str]:
        """The ids of the owner's threads flagged is_master_main_thread, sorted."""
        result = await self.connection.execute(
            select(threads.c.thread_id)
            .where(threads.c.owner_id == owner_id, threads.c.is_master_main_thread.is_(True))
            .order_by(threads.c.thread_id)
        )
        return [thread_id for (thread_id,) in result]

    async def master_main_thread(self, owner_id: str) -> Row | None:
        """The owner's thread registered with is_master_main_thread (the latest registered when
        there are several), archived or not; None when there is none."""
        result = await self.connection.execute(
            select(threads)
            .where(threads.c.owner_id == owner_id, threads.c.is_master_main_thread.is_(True))
            .order_by(threads.c.registered_at.desc(), threads.c.thread_id)
            .limit(1)
        )
        return result.mappings().first()

    # --- the model's tasks --------------------------------------------------------------------------

    async def queued_model_tasks(self, limit: int) -> list[ChatTask]:
        """Queued model tasks of every owner, oldest first."""
        result = await self.connection.execute(
            select(chat_tasks)
            .where(_model_tasks(), chat_tasks.c.status == QUEUED)
            .order_by(chat_tasks.c.created_at, chat_tasks.c.task_id)
            .limit(limit)
        )
        return [task_of(row) for row in result.mappings()]

    async def projects_answering(self) -> set[str]:
        """The master projects with a model task running (in this process or another)."""
        result = await self.connection.execute(
            select(chat_tasks.c.project_id).where(_model_tasks(), chat_tasks.c.status == RUNNING).distinct()
        )
        return {project_id for (project_id,) in result}

    async def running_model_tasks_since(self, started_before: datetime) -> list[ChatTask]:
        """Model tasks still running that started (were last changed) before `started_before`."""
        result = await self.connection.execute(
            select(chat_tasks)
            .where(_model_tasks(), chat_tasks.c.status == RUNNING, chat_tasks.c.updated_at < started_before)
            .order_by(chat_tasks.c.created_at, chat_tasks.c.task_id)
        )
        return [task_of(row) for row in result.mappings()]

    async def move(self, task: ChatTask, from_status: str) -> bool:
        """Writes the task's status columns if it still has `from_status` (a claim, or the end of
        a run nobody else ended). True when written."""
        result = await self.connection.execute(
            update(chat_tasks)
            .where(chat_tasks.c.task_id == task.task_id, chat_tasks.c.status == from_status)
            .values(
                status=task.status,
                failure_kind=task.failure_kind,
                status_detail=task.status_detail,
                updated_at=task.updated_at,
                result_message_id=task.result_message_id,
            )
        )
        return result.rowcount == 1

    async def set_result_message(self, task_id: str, message_id: str) -> None:
        """Records the message that ended a task."""
        await self.connection.execute(
            update(chat_tasks).where(chat_tasks.c.task_id == task_id).values(result_message_id=message_id)
        )

    async def owners_without_master(self) -> list[str]:
        """Owners of threads or projects that have no master project yet, sorted."""
        owners: set[str] = set()
        for table in (threads, projects):
            owners |= {
                owner for (owner,) in await self.connection.execute(select(table.c.owner_id).distinct())
            }
        masters = await self.connection.execute(
            select(projects.c.owner_id).where(projects.c.project_id.startswith(MASTER_PROJECT_PREFIX))
        )
        return sorted(owners - {owner for (owner,) in masters})
