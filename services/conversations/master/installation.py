"""The master conversation exists from installation on (issue 13): installing the service (its
migrations, `python -m services.conversations migrate`, and every start of `serve`) creates the
master project of the installation's owner (BOSS_DEFAULT_OWNER_ID) and of every owner that has
threads or projects but no master project; a new owner's first registered thread creates theirs.
Reading the master conversation (`GET /api/v1/projects/master-agent`) never creates or changes it.

On `serve` the master ring is also set to what the configured backend shows (CB-16 §7.3, see
answers.ring_follows_main_thread): the main Codex thread's budget, or (openai_api) the
conversation's own context use, hidden until the first answer.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import (
    Row,
    SqlAlchemyConversationsRepository,
    budget_of,
    indicator_columns,
)
from services.conversations.domain.model import HIDDEN, MASTER_AGENT, indicator_for, master_project_id
from services.conversations.master.repository import SqlAlchemyMasterRepository
from services.shared.db import Database
from services.shared.time import utc_now

log = logging.getLogger(__name__)

MASTER_TITLE = "Master agent"


async def ensure_master_project(
    repository: SqlAlchemyConversationsRepository, owner_id: str, now: datetime
) -> tuple[Row, bool]:
    """The owner's master project, created (pinned, titled MASTER_TITLE, ring hidden) when missing.
    Returns (the row, whether it was created). Raises IntegrityError when a concurrent transaction
    created it first (the caller's transaction is then spoilt: retry it)."""
    project_id = master_project_id(owner_id)
    project = await repository.project(project_id)
    if project is not None:
        return project, False
    await repository.insert_project(
        {
            "project_id": project_id,
            "owner_id": owner_id,
            "conversation_type": MASTER_AGENT,
            "title": MASTER_TITLE,
            "manual_pinned": True,
            "sort_at": now,
            "created_at": now,
            "updated_at": now,
        }
    )
    project = await repository.project(project_id)
    assert project is not None
    return project, True


async def install_master_conversations(
    database: Database, default_owner_id: str, ring_follows_main_thread: bool | None = None
) -> list[str]:
    """Creates the missing master projects (the default owner's and those of owners with data but
    none) and, when `ring_follows_main_thread` is given, sets every master ring to what the backend
    shows. Idempotent; safe while another replica does the same (its insert wins, this one retries).
    Returns the owners whose master project was created."""
    for attempt in (1, 2):
        try:
            async with database.transaction() as connection:
                return await _install(connection, default_owner_id, ring_follows_main_thread)
        except IntegrityError:
            if attempt == 2:
                raise
            log.info("another process created a master project at the same time; installing again")
    return []


async def _install(
    connection: AsyncConnection, default_owner_id: str, ring_follows_main_thread: bool | None
) -> list[str]:
    repository = SqlAlchemyConversationsRepository(connection)
    master = SqlAlchemyMasterRepository(connection)
    now = utc_now()
    owners = sorted({default_owner_id, *await master.owners_without_master()})
    created: list[str] = []
    for owner in owners:
        project, new = await ensure_master_project(repository, owner, now)
        if new:
            created.append(owner)
            log.info("created the master conversation of owner %s (%s)", owner, project["project_id"])
        if ring_follows_main_thread is not None:
            await _set_ring(repository, master, project, ring_follows_main_thread)
    return created


async def _set_ring(
    repository: SqlAlchemyConversationsRepository,
    master: SqlAlchemyMasterRepository,
    project: Row,
    follows_main_thread: bool,
) -> None:
    """Shows the main thread's budget on the master ring, or (not following it) takes the thread off
    the ring, leaving the conversation's own ring for its first answer."""
    if not follows_main_thread:
        if project["indicator_thread_id"]:
            await repository.update_project(
                project["project_id"], {"indicator_thread_id": "", **indicator_columns(HIDDEN)}
            )
        return
    thread = await master.master_main_thread(project["owner_id"])
    if thread is None or thread["archived_at"] is not None:
        return
    if project["indicator_thread_id"] == thread["thread_id"]:
        return
    indicator = indicator_for(MASTER_AGENT, thread["thread_id"], budget_of(thread))
    await repository.update_project(
        project["project_id"], {"indicator_thread_id": thread["thread_id"], **indicator_columns(indicator)}
    )
