"""The conversations context's handlers: commands from clients and workers, and the projection of
context_budget's and the scheduler's events.

Every handler runs in one transaction of `Database.transaction()` with the outbox rows it publishes,
so a client never sees a change without its event or an event without its change.

Published event types (payloads always carry `owner_id`, so streams can be filtered per owner):

- `conversation.context_indicator.updated` (CB-15): a home-list ring changed. Payload: conversation_id,
  project_id, conversation_type, thread_id, context_budget_indicator {visible, style, percent, level,
  awaiting_reading_after_compaction}, context_budget_source_node_id, context_budget_updated_at,
  must_finish_before_compaction.
- `project.context_risk.updated` (CB-15): a thread of the project reported or changed handoff state
  (thread_context: that thread), or the scheduler's strategy summary changed (thread_context: the
  project's most-at-risk thread). Payload: project_id, conversation_id, thread_context (the thread's
  summary, as in the project detail), next_compaction_risk_thread_id, threads_requiring_handoff,
  master_context_strategy_summary.
- `thread.handoff.required`, `thread.handoff.ready` (CB-15): relayed from the scheduler with
  thread_id, project_ids, handoff_status, handoff_package_id, handoff_reason (in words),
  to_thread_id.
- `conversation.updated`: created, pinned, renamed, archived (payload `change` and `conversation`).
- `thread.registered`: a thread was registered (payload thread metadata and `project_id`).

Messages and chat (`conversation.message.created`, `task.requested`, `task.updated`) are the chat
sub-package's (services/conversations/chat/handlers.py), reached through `ConversationsHandlers.chat`.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import (
    Row,
    SqlAlchemyConversationsRepository,
    budget_columns,
    budget_of,
    indicator_columns,
    indicator_of,
    stored_reading_order,
    view_of,
)
from services.conversations.adapters.tables import devices, threads
from services.conversations.chat.handlers import TASK_STATUS_CHANGED, ChatHandlers
from services.conversations.domain.model import (
    GROUP,
    HANDOFF_NONE,
    LEVELS,
    MASTER_AGENT,
    MASTER_ALIAS,
    SCHEDULER_HANDOFF_CLOSED,
    SCHEDULER_HANDOFF_EVENTS,
    SINGLE_DEVICE,
    ChecklistEntry,
    HandoffState,
    Indicator,
    Registration,
    SortKey,
    ThreadBudget,
    ThreadView,
    apply_handoff_event,
    conversation_id_of,
    default_title,
    handoff_reason_in_words,
    indicator_for,
    master_project_id,
    next_compaction_risk_thread,
    risk_order,
    single_device_project_id,
    strategy_summary,
    threads_requiring_handoff,
    wrap_up_checklist,
)
from services.conversations.domain.validation import (
    check_folder,
    check_group_threads,
    check_id,
    check_page_size,
    check_thread_id,
    check_title,
    raise_if_any,
)
from services.conversations.groups.relay import RelayThread, TakenIn
from services.conversations.master.installation import ensure_master_project
from services.conversations.master.repository import SqlAlchemyMasterRepository
from services.shared.db import Database
from services.shared.devices import THREAD_MOVED_EVENT
from services.shared.errors import (
    MASTER_ON_OTHER_DEVICE,
    PROJECT_NOT_FOUND,
    THREAD_NOT_FOUND,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
    thread_bound_to_other_device,
)
from services.shared.event_stream import Publication
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.paging import PageTokenCodec, fingerprint
from services.shared.time import isoformat_utc, utc_now

log = logging.getLogger(__name__)

INDICATOR_UPDATED = "conversation.context_indicator.updated"
PROJECT_RISK_UPDATED = "project.context_risk.updated"
HANDOFF_REQUIRED_EVENT = "thread.handoff.required"
HANDOFF_READY_EVENT = "thread.handoff.ready"
STRATEGY_UPDATED_EVENT = "project.context_strategy.updated"
CONVERSATION_UPDATED = "conversation.updated"
THREAD_REGISTERED = "thread.registered"

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


# ---------------------------------------------------------------------------------------------------
# Read models returned by the handlers (the servicer turns them into protobuf messages).


@dataclass(frozen=True)
class ProjectDetailView:
    """CB-13: a project row with its threads, most at risk first."""

    project: Row
    threads: list[ThreadView]
    next_compaction_risk_thread_id: str
    threads_requiring_handoff: list[str]
    master_context_strategy_summary: str


@dataclass(frozen=True)
class ThreadBudgetView:
    """CB-14: a thread row, its budget and checklist, and the projects it is in."""

    thread: Row
    view: ThreadView
    checklist: list[ChecklistEntry]
    project_ids: list[str]


# ---------------------------------------------------------------------------------------------------
# Event payloads (one shape shared by SSE and REST).


def thread_summary_payload(view: ThreadView) -> dict[str, Any]:
    """A thread's budget as JSON: the same fields as `ThreadContextSummary` in the proto."""
    budget = view.budget
    return {
        "thread_id": view.thread_id,
        "title": view.title,
        "node_id": view.node_id,
        "worker_id": view.worker_id,
        "reported": budget is not None,
        "percent": budget.percent if budget else 0,
        "remaining_pct": budget.remaining_pct if budget else 0.0,
        "level": budget.level if budget else "",
        "must_finish_before_compaction": budget.must_finish_before_compaction if budget else False,
        "must_finish_reason": budget.must_finish_reason if budget else "",
        "compaction_expected_at": isoformat_utc(budget.compaction_expected_at) if budget else None,
        "last_compaction_at": isoformat_utc(budget.last_compaction_at) if budget else None,
        "compaction_count": budget.compaction_count if budget else 0,
        "awaiting_reading_after_compaction": budget.awaiting_reading_after_compaction if budget else False,
        "updated_at": isoformat_utc(budget.updated_at) if budget else None,
        "handoff_status": view.handoff_status,
    }


def conversation_payload(project: Mapping[Any, Any]) -> dict[str, Any]:
    """A home-list row as JSON (CB-12 field names)."""
    indicator = indicator_of(project)
    return {
        "conversation_id": conversation_id_of(project["project_id"]),
        "project_id": project["project_id"],
        "conversation_type": project["conversation_type"],
        "project_title": project["title"],
        "manual_pinned": bool(project["manual_pinned"]),
        "latest_reply_at": isoformat_utc(project["latest_reply_at"]),
        "context_budget_indicator": indicator.as_payload(),
        "context_budget_source_node_id": indicator.source_node_id,
        "context_budget_updated_at": isoformat_utc(indicator.updated_at),
        "must_finish_before_compaction": indicator.must_finish_before_compaction,
        "context_budget_thread_id": indicator.thread_id,
    }


def indicator_event(project: Mapping[Any, Any], indicator: Indicator) -> NewEvent:
    """`conversation.context_indicator.updated` for a project row showing `indicator`."""
    payload = {
        "owner_id": project["owner_id"],
        "conversation_id": conversation_id_of(project["project_id"]),
        "project_id": project["project_id"],
        "conversation_type": project["conversation_type"],
        "thread_id": indicator.thread_id,
        "context_budget_indicator": indicator.as_payload(),
        "context_budget_source_node_id": indicator.source_node_id,
        "context_budget_updated_at": isoformat_utc(indicator.updated_at),
        "must_finish_before_compaction": indicator.must_finish_before_compaction,
    }
    return NewEvent(
        INDICATOR_UPDATED,
        payload,
        thread_id=indicator.thread_id,
        project_id=project["project_id"],
        node_id=indicator.source_node_id,
    )


def _conversation_event(project: Mapping[Any, Any], change: str) -> NewEvent:
    return NewEvent(
        CONVERSATION_UPDATED,
        {
            "owner_id": project["owner_id"],
            "project_id": project["project_id"],
            "change": change,
            "conversation": conversation_payload(project),
        },
        project_id=project["project_id"],
    )


# ---------------------------------------------------------------------------------------------------


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"naive timestamp {value!r}")
    return parsed


def budget_from_payload(payload: Mapping[Any, Any], fallback_time: datetime) -> ThreadBudget:
    """A ThreadBudget from a `thread.context.updated` payload of context_budget.

    Raises ValueError (KeyError, TypeError) when the payload lacks the percent or carries an unknown
    level; the caller skips such an event and logs it.
    """
    level = str(payload["context_budget_level"])
    if level not in LEVELS:
        raise ValueError(f"unknown context_budget_level {level!r}")
    captured_at = _parse_time(payload.get("captured_at")) or fallback_time
    turns = payload.get("estimated_remaining_turns")
    return ThreadBudget(
        remaining_pct=float(payload["context_budget_remaining_pct"]),
        level=level,
        node_id=str(payload.get("node_id") or ""),
        updated_at=_parse_time(payload.get("updated_at")) or fallback_time,
        captured_at=captured_at,
        snapshot_version=int(payload.get("snapshot_version") or 0),
        must_finish_before_compaction=bool(payload.get("must_finish_before_compaction")),
        must_finish_reason=str(payload.get("must_finish_reason") or ""),
        compaction_expected_at=_parse_time(payload.get("compaction_expected_at")),
        last_compaction_at=_parse_time(payload.get("last_compaction_at")),
        compaction_count=int(payload.get("compaction_count") or 0),
        estimated_remaining_turns=int(turns) if turns is not None else None,
        master_actions=tuple(str(a) for a in payload.get("master_actions") or ()),
        awaiting_reading_after_compaction=bool(payload.get("awaiting_reading_after_compaction")),
        compaction_limit_source=str(payload.get("compaction_limit_source") or ""),
    )


class ConversationsHandlers:
    """The use cases of the conversations context on one database and outbox.

    Args:
        database: the service's database.
        event_log: the service's outbox.
        default_owner_id: the owner of threads registered without one (and of auto-imported threads).
        master_ring_follows_main_thread: whether the master conversation's ring shows its main
            Codex thread's budget (every master backend but openai_api: answers.py).
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        default_owner_id: str = "local",
        page_tokens: PageTokenCodec | None = None,
        master_ring_follows_main_thread: bool = True,
    ) -> None:
        """`page_tokens` signs page tokens; without one, a codec with a random key is used (tokens
        then do not survive a restart: `serve()` passes one keyed by the auth secret)."""
        self.database = database
        self.event_log = event_log
        self.default_owner_id = default_owner_id
        self.master_ring_follows_main_thread = master_ring_follows_main_thread
        self.page_tokens = page_tokens or PageTokenCodec(secrets.token_urlsafe(32), "conversations")
        self.chat = ChatHandlers(database, event_log, self.page_tokens)

    # --- writes -------------------------------------------------------------------------------------

    async def register_thread(self, registration: Registration) -> tuple[Row, bool, str]:
        """RegisterThread ("device import"). Returns (thread row, created, project id).

        A new thread gets its single_device project (id derived from owner and thread), unless
        `group_project_id` names a group of the owner, which it joins; the thread belongs to the
        registering device (owner, node, worker) from then on. A known thread keeps its project and
        gets its folder, reference and title refreshed, but only by its own device. Raises
        InvalidArgument, NotFound (group), PermissionDenied (THREAD_BOUND_TO_OTHER_DEVICE: the
        thread belongs to another device, or another owner; MASTER_ON_OTHER_DEVICE: see
        `_make_master_thread`; nothing changes). Whether the caller may
        act for the owner, node and worker is the servicer's check.
        """
        violations: list[FieldViolation] = []
        check_thread_id("thread_id", registration.thread_id, violations)
        check_id("node_id", registration.node_id, violations)
        check_id("worker_id", registration.worker_id, violations)
        check_id("owner_id", registration.owner_id, violations)
        check_id("group_project_id", registration.group_project_id, violations, required=False)
        check_title("title", registration.title, violations, required=False)
        check_folder("codex_folder", registration.codex_folder, violations)
        check_id("codex_thread_ref", registration.codex_thread_ref, violations, required=False)
        raise_if_any(violations)
        try:
            async with self.database.transaction() as connection:
                result = await self._register(connection, registration, utc_now())
        except IntegrityError:
            # The thread was inserted meanwhile (its first budget event imported it, or a repeat
            # raced this one): registering it again finds it, and refreshes it or refuses.
            log.info("registration of %s raced its import; registering again", registration.thread_id)
            async with self.database.transaction() as connection:
                result = await self._register(connection, registration, utc_now())
        self.event_log.kick()
        return result

    async def _register(
        self, connection: AsyncConnection, registration: Registration, now: datetime
    ) -> tuple[Row, bool, str]:
        repository = SqlAlchemyConversationsRepository(connection)
        owner = registration.owner_id
        title = registration.title.strip() or default_title(registration.thread_id, registration.codex_folder)
        existing = await repository.thread(registration.thread_id)
        events: list[NewEvent] = []
        if existing is not None:
            if not registered_by_its_device(existing, owner, registration.node_id, registration.worker_id):
                raise thread_bound_to_other_device(registration.thread_id)
            folder = registration.codex_folder or existing["codex_folder"]
            # A title that was only the default (the folder's name, or the thread id while no folder
            # was known) follows the folder; one the worker gave stays until it gives another.
            defaulted = existing["title"] == default_title(registration.thread_id, existing["codex_folder"])
            changes = {
                "node_id": registration.node_id,
                "worker_id": registration.worker_id,
                "codex_folder": folder,
                "codex_thread_ref": registration.codex_thread_ref or existing["codex_thread_ref"],
                "title": registration.title.strip()
                or (default_title(registration.thread_id, folder) if defaulted else existing["title"]),
            }
            if registration.is_master_main_thread:
                changes["is_master_main_thread"] = True
            await repository.update_thread(registration.thread_id, changes)
            project_id = existing["single_device_project_id"]
            if changes["title"] != existing["title"] and project_id:
                # Its own project, titled after it and never renamed, keeps its name in step.
                project = await repository.project(project_id)
                if project is not None and project["title"] == existing["title"]:
                    await repository.update_project(
                        project_id, {"title": changes["title"], "updated_at": now}
                    )
                    renamed = await repository.project(project_id)
                    assert renamed is not None
                    events.append(_conversation_event(renamed, "renamed"))
            if registration.group_project_id:
                await self._require_group(repository, owner, registration.group_project_id)
                await repository.add_member(registration.group_project_id, registration.thread_id, now)
                project_id = registration.group_project_id
            if registration.is_master_main_thread:
                events += await self._make_master_thread(repository, registration, now)
            await self.event_log.append(connection, events)
            thread = await repository.thread(registration.thread_id)
            assert thread is not None
            return thread, False, project_id
        project_id = ""
        if registration.group_project_id:
            await self._require_group(repository, owner, registration.group_project_id)
        else:
            project_id = single_device_project_id(owner, registration.thread_id)
        await repository.insert_thread(
            {
                "thread_id": registration.thread_id,
                "owner_id": owner,
                "node_id": registration.node_id,
                "worker_id": registration.worker_id,
                "codex_folder": registration.codex_folder,
                "codex_thread_ref": registration.codex_thread_ref,
                "title": title,
                "single_device_project_id": project_id,
                "registered_at": now,
            }
        )
        if project_id:
            await repository.insert_project(
                {
                    "project_id": project_id,
                    "owner_id": owner,
                    "conversation_type": SINGLE_DEVICE,
                    "title": title,
                    "sort_at": now,
                    "created_at": now,
                    "updated_at": now,
                    "indicator_thread_id": registration.thread_id,
                }
            )
            await repository.add_member(project_id, registration.thread_id, now)
            project = await repository.project(project_id)
            assert project is not None
            events.append(_conversation_event(project, "created"))
        else:
            project_id = registration.group_project_id
            await repository.add_member(project_id, registration.thread_id, now)
        if registration.is_master_main_thread:
            events += await self._make_master_thread(repository, registration, now)
        else:  # a new owner's first thread brings their master conversation
            await ensure_master_project(repository, owner, now)
        events.append(
            NewEvent(
                THREAD_REGISTERED,
                {
                    "owner_id": owner,
                    "thread_id": registration.thread_id,
                    "project_id": project_id,
                    "node_id": registration.node_id,
                    "worker_id": registration.worker_id,
                    "codex_folder": registration.codex_folder,
                    "codex_thread_ref": registration.codex_thread_ref,
                    "title": title,
                },
                thread_id=registration.thread_id,
                project_id=project_id,
                node_id=registration.node_id,
            )
        )
        await self.event_log.append(connection, events)
        thread = await repository.thread(registration.thread_id)
        assert thread is not None
        return thread, True, project_id

    async def _require_group(
        self, repository: SqlAlchemyConversationsRepository, owner: str, project_id: str
    ) -> Row:
        project = await repository.project(project_id)
        if project is None or project["owner_id"] != owner or project["conversation_type"] != GROUP:
            raise NotFound(f"group project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
        return project

    async def _make_master_thread(
        self, repository: SqlAlchemyConversationsRepository, registration: Registration, now: datetime
    ) -> list[NewEvent]:
        """Makes the registered thread the master agent's current main thread (the one
        master_codex_node runs in); the master ring shows its budget unless the master's model
        answers (openai_api: the ring is the conversation's own, see
        services/conversations/master/answers.py).

        The master agent stays on the device it runs on: while the owner's current main thread is
        live, only that device (node and worker) may register a new one (its relay thread). Another
        device is refused with PermissionDenied (reason MASTER_ON_OTHER_DEVICE) and the whole
        registration rolls back: the master's prompt carries every thread's state, and its answers
        are the owner's master messages. The owner moves the master by archiving its thread."""
        owner, thread_id = registration.owner_id, registration.thread_id
        masters = SqlAlchemyMasterRepository(repository.connection)
        current = await masters.master_main_thread(owner)
        if (
            current is not None
            and current["thread_id"] != thread_id
            and current["archived_at"] is None
            and (current["node_id"], current["worker_id"]) != (registration.node_id, registration.worker_id)
        ):
            raise PermissionDenied(
                "is_master_main_thread: the master agent runs on another device; only that device "
                "registers its next thread, unless the owner archives the current one",
                reason=MASTER_ON_OTHER_DEVICE,
            )
        master, _created = await ensure_master_project(repository, owner, now)
        for previous in await masters.master_main_thread_ids(owner):
            if previous != thread_id:
                await repository.update_thread(previous, {"is_master_main_thread": False})
        await repository.update_thread(thread_id, {"is_master_main_thread": True})
        await repository.add_member(master["project_id"], thread_id, now)
        if not self.master_ring_follows_main_thread:
            return []
        previous = master["indicator_thread_id"]
        thread = await repository.thread(thread_id)
        assert thread is not None
        indicator = indicator_for(MASTER_AGENT, thread_id, budget_of(thread))
        await repository.update_project(
            master["project_id"],
            {"indicator_thread_id": thread_id, **indicator_columns(indicator), "updated_at": now},
        )
        updated = await repository.project(master["project_id"])
        assert updated is not None
        return [indicator_event(updated, indicator)] if indicator.visible or previous else []

    async def take_in_relay_thread(
        self, connection: AsyncConnection, relay: RelayThread, now: datetime
    ) -> TakenIn | None:
        """A group's relay thread taken in as a real thread (groups/relay.py), in the caller's
        transaction: the thread (id = its Codex session id) registered for the group's owner on
        the device that ran it, titled `relay.title`, with its own single_device conversation and
        as a member of the group. Returns its ids and the events to append (`thread.registered`,
        `conversation.updated` created or renamed); None, changing nothing, when the session is a
        thread of another owner or device.

        Idempotent and safe against the device's worker registering the same session: the thread,
        its project and each membership are inserted in a savepoint each, and a conflict (the
        worker's RegisterThread, or an earlier intake, committed the row) reads the stored row
        instead. A thread the worker registered first keeps what it registered, but takes the
        relay's title while its title is the default one (its folder's name)."""
        repository = SqlAlchemyConversationsRepository(connection)
        owner = relay.owner_id
        events: list[NewEvent] = []
        inserted = await _inserted(
            connection,
            repository.insert_thread(
                {
                    "thread_id": relay.thread_id,
                    "owner_id": owner,
                    "node_id": relay.node_id,
                    "worker_id": relay.worker_id,
                    "codex_folder": relay.codex_folder,
                    "codex_thread_ref": relay.thread_id,
                    "title": relay.title,
                    "single_device_project_id": single_device_project_id(owner, relay.thread_id),
                    "registered_at": now,
                }
            ),
        )
        thread = await repository.thread(relay.thread_id)
        assert thread is not None
        if thread["owner_id"] != owner or thread["node_id"] != relay.node_id:
            log.error(
                "relay thread %s of group %s is registered for another owner or device; not taken in",
                relay.thread_id,
                relay.group_project_id,
            )
            return None
        project_id = thread["single_device_project_id"] or single_device_project_id(owner, relay.thread_id)
        renamed_from = ""
        if not inserted:
            changes: dict[str, Any] = {}
            if thread["title"] == default_title(relay.thread_id, thread["codex_folder"]):
                changes["title"] = relay.title
                renamed_from = thread["title"]
            for column, value in (
                ("codex_thread_ref", relay.thread_id),
                ("codex_folder", relay.codex_folder),
                ("worker_id", relay.worker_id),
                ("single_device_project_id", project_id),
            ):
                if not thread[column] and value:
                    changes[column] = value
            if changes:
                await repository.update_thread(relay.thread_id, changes)
        project = await repository.project(project_id)
        if project is None and await _inserted(
            connection,
            repository.insert_project(
                {
                    "project_id": project_id,
                    "owner_id": owner,
                    "conversation_type": SINGLE_DEVICE,
                    "title": relay.title,
                    "sort_at": now,
                    "created_at": now,
                    "updated_at": now,
                    "indicator_thread_id": relay.thread_id,
                }
            ),
        ):
            created = await repository.project(project_id)
            assert created is not None
            events.append(_conversation_event(created, "created"))
        elif project is not None and renamed_from and project["title"] == renamed_from:
            await repository.update_project(project_id, {"title": relay.title, "updated_at": now})
            renamed = await repository.project(project_id)
            assert renamed is not None
            events.append(_conversation_event(renamed, "renamed"))
        for member_of in (project_id, relay.group_project_id):
            await _inserted(connection, repository.add_member(member_of, relay.thread_id, now))
        if inserted:
            await ensure_master_project(repository, owner, now)
            events.append(
                NewEvent(
                    THREAD_REGISTERED,
                    {
                        "owner_id": owner,
                        "thread_id": relay.thread_id,
                        "project_id": project_id,
                        "node_id": relay.node_id,
                        "worker_id": relay.worker_id,
                        "codex_folder": relay.codex_folder,
                        "codex_thread_ref": relay.thread_id,
                        "title": relay.title,
                    },
                    thread_id=relay.thread_id,
                    project_id=project_id,
                    node_id=relay.node_id,
                )
            )
        return TakenIn(relay.thread_id, project_id, events)

    async def move_thread(self, owner: str, thread_id: str, node_id: str, worker_id: str) -> tuple[Row, bool]:
        """Moves the owner's thread to another of the owner's devices (MoveThread; the owner's
        decision): only that device may register, report and receive commands for it from now on.
        Publishes `thread.moved` {owner_id, thread_id, from_node_id, from_worker_id, node_id,
        worker_id, project_ids} (context_budget and the scheduler follow it) and the thread's
        refreshed project risk. Returns (thread as now, moved); moving it to its own device changes
        nothing.

        Raises:
            InvalidArgument: thread_id, node_id or worker_id is not an id.
            NotFound: THREAD_NOT_FOUND, an unknown or another owner's thread.
            FailedPrecondition: UNKNOWN_DEVICE, when the owner has no active enrolled device and no
                thread on that node and worker (a typo would otherwise strand the thread).
        """
        violations: list[FieldViolation] = []
        check_id("thread_id", thread_id, violations)
        check_id("node_id", node_id, violations)
        check_id("worker_id", worker_id, violations)
        raise_if_any(violations)
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            thread = await self._owned_thread(repository, owner, thread_id)
            if (thread["node_id"], thread["worker_id"]) == (node_id, worker_id):
                return thread, False
            if not await _is_device_of(connection, owner, node_id, worker_id):
                raise FailedPrecondition(
                    f"no device of yours is worker {worker_id!r} on node {node_id!r}: enroll it first",
                    reason="UNKNOWN_DEVICE",
                    violations=[
                        PreconditionViolation(
                            "DEVICE", "node_id", "enroll the device, or name a node and worker of yours"
                        )
                    ],
                )
            await repository.update_thread(thread_id, {"node_id": node_id, "worker_id": worker_id})
            project_ids = (await repository.project_ids_of_threads([thread_id]))[thread_id]
            events = [
                NewEvent(
                    THREAD_MOVED_EVENT,
                    {
                        "owner_id": owner,
                        "thread_id": thread_id,
                        "from_node_id": thread["node_id"],
                        "from_worker_id": thread["worker_id"],
                        "node_id": node_id,
                        "worker_id": worker_id,
                        "project_ids": project_ids,
                    },
                    thread_id=thread_id,
                    node_id=node_id,
                )
            ]
            if thread["archived_at"] is None:
                events += await self._publish_thread_change(repository, thread_id)
            await self.event_log.append(connection, events)
            moved = await repository.thread(thread_id)
            assert moved is not None
        self.event_log.kick()
        log.info("thread %s of %s moved to worker %s on node %s", thread_id, owner, worker_id, node_id)
        return moved, True

    async def archive_thread(self, owner: str, thread_id: str) -> Row:
        """Archives a thread and its single_device project (idempotent). NotFound when unknown."""
        violations: list[FieldViolation] = []
        check_id("thread_id", thread_id, violations)
        raise_if_any(violations)
        now = utc_now()
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            thread = await self._owned_thread(repository, owner, thread_id)
            events: list[NewEvent] = []
            if thread["archived_at"] is None:
                await repository.update_thread(thread_id, {"archived_at": now})
                project_id = thread["single_device_project_id"]
                if project_id:
                    await repository.update_project(project_id, {"archived_at": now, "updated_at": now})
                    project = await repository.project(project_id)
                    assert project is not None
                    events.append(_conversation_event(project, "archived"))
                await self.event_log.append(connection, events)
            archived = await repository.thread(thread_id)
            assert archived is not None
        self.event_log.kick()
        return archived

    async def set_pinned(self, owner: str, project_id: str, pinned: bool) -> Row:
        """Pins or unpins a conversation. NotFound for an unknown project."""
        return await self._change_project(
            owner, project_id, {"manual_pinned": pinned}, "pinned" if pinned else "unpinned"
        )

    async def rename_project(self, owner: str, project_id: str, title: str) -> Row:
        """Renames a project. InvalidArgument for a bad title; NotFound for an unknown project."""
        violations: list[FieldViolation] = []
        clean = check_title("title", title, violations)
        raise_if_any(violations)
        return await self._change_project(owner, project_id, {"title": clean}, "renamed")

    async def _change_project(self, owner: str, project_id: str, values: dict[str, Any], change: str) -> Row:
        """Writes `values` to the owner's project and publishes `conversation.updated` (`change`);
        a request that changes nothing (pinning a pinned conversation, the same title) writes and
        publishes nothing and answers the project as it is."""
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            project = await self._owned_project(repository, owner, project_id)
            if all(project[name] == value for name, value in values.items()):
                return project
            await repository.update_project(project["project_id"], {**values, "updated_at": utc_now()})
            changed = await repository.project(project["project_id"])
            assert changed is not None
            appended = await self.event_log.append(connection, [_conversation_event(changed, change)])
        self.event_log.kick(appended)
        return changed

    async def create_group(self, owner: str, title: str, thread_ids: list[str]) -> ProjectDetailView:
        """Creates a group project from the owner's threads. InvalidArgument (title, thread_ids);
        NotFound when a thread is unknown or another owner's."""
        violations: list[FieldViolation] = []
        clean = check_title("title", title, violations)
        distinct = check_group_threads(thread_ids, violations)
        raise_if_any(violations)
        now = utc_now()
        project_id = f"group-{uuid.uuid4().hex[:20]}"
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            found = await repository.threads_by_id(distinct)
            missing = [t for t in distinct if t not in found or found[t]["owner_id"] != owner]
            if missing:
                raise NotFound(f"threads not found: {', '.join(missing)}", reason=THREAD_NOT_FOUND)
            await repository.insert_project(
                {
                    "project_id": project_id,
                    "owner_id": owner,
                    "conversation_type": GROUP,
                    "title": clean,
                    "sort_at": now,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            for thread_id in distinct:
                await repository.add_member(project_id, thread_id, now)
            project = await repository.project(project_id)
            assert project is not None
            appended = await self.event_log.append(connection, [_conversation_event(project, "created")])
            detail = await self._detail(repository, project)
        self.event_log.kick(appended)
        return detail

    # --- reads --------------------------------------------------------------------------------------

    async def list_conversations(self, owner: str, page_size: int, page_token: str) -> tuple[list[Row], str]:
        """The home list (CB-12): pinned first, then latest reply first. Returns (rows, next token).

        Raises InvalidArgument for a negative page_size or a foreign page_token."""
        violations: list[FieldViolation] = []
        size = check_page_size(page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, violations)
        after: SortKey | None = None
        filters = fingerprint("conversations", owner)
        if page_token:
            try:
                pinned, sort_at, project_id = self.page_tokens.decode(page_token, filters)
                after = SortKey(pinned == "1", datetime.fromisoformat(sort_at), project_id)
                if after.sort_at.tzinfo is None:
                    raise ValueError("naive time")
            except InvalidArgument as error:
                violations.extend(error.violations)
            except ValueError:
                violations.append(FieldViolation("page_token", "is malformed"))
        raise_if_any(violations)
        async with self.database.read() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            rows = await repository.home_list(owner, size + 1, after)
        next_token = ""
        if len(rows) > size:
            rows = rows[:size]
            last = rows[-1]
            position = [
                "1" if last["manual_pinned"] else "0",
                last["sort_at"].isoformat(),
                last["project_id"],
            ]
            next_token = self.page_tokens.encode(position, filters)
        return rows, next_token

    async def get_project(self, owner: str, project_id: str) -> ProjectDetailView:
        """The project detail (CB-13); "master-agent" is the owner's master project, which exists
        from installation on (services/conversations/master/installation.py): reading never
        creates or changes anything. NotFound for an unknown or foreign project."""
        async with self.database.read() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            project = await self._owned_project(repository, owner, project_id)
            return await self._detail(repository, project)

    async def get_thread_budget(self, owner: str, thread_id: str) -> ThreadBudgetView:
        """The thread page (CB-14). NotFound for an unknown or foreign thread."""
        async with self.database.read() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            thread = await self._owned_thread(repository, owner, thread_id)
            project_ids = (await repository.project_ids_of_threads([thread_id]))[thread_id]
        view = view_of(thread)
        done = json.loads(thread["checklist_done_json"] or "[]")
        details = json.loads(thread["checklist_details_json"] or "{}")
        return ThreadBudgetView(
            thread, view, wrap_up_checklist(view.budget, view.handoff_status, done, details), project_ids
        )

    async def _owned_project(
        self, repository: SqlAlchemyConversationsRepository, owner: str, project_id: str
    ) -> Row:
        violations: list[FieldViolation] = []
        check_id("project_id", project_id, violations, required=False)
        raise_if_any(violations)  # a malformed id is bad input, not a database error
        if project_id == MASTER_ALIAS:
            project_id = master_project_id(owner)
        project = await repository.project(project_id) if project_id else None
        if project is None or project["owner_id"] != owner:
            raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
        return project

    async def _owned_thread(
        self, repository: SqlAlchemyConversationsRepository, owner: str, thread_id: str
    ) -> Row:
        violations: list[FieldViolation] = []
        check_id("thread_id", thread_id, violations, required=False)
        raise_if_any(violations)  # a malformed id is bad input, not a database error
        thread = await repository.thread(thread_id) if thread_id else None
        if thread is None or thread["owner_id"] != owner:
            raise NotFound(f"thread {thread_id!r} not found", reason=THREAD_NOT_FOUND)
        return thread

    async def _detail(self, repository: SqlAlchemyConversationsRepository, project: Row) -> ProjectDetailView:
        members = await repository.member_threads(project["project_id"])
        return self._detail_of(project, members, overseen=await _overseen_by(repository, project))

    @staticmethod
    def _detail_of(
        project: Row,
        member_rows: Sequence[Mapping[Any, Any]],
        views: Mapping[str, ThreadView] | None = None,
        overseen: Sequence[Mapping[Any, Any]] | None = None,
    ) -> ProjectDetailView:
        """The project's detail from its member thread rows (archived ones are left out). `views`:
        views already made of some of these rows, by thread id (reused, not made again).

        `overseen`: for the master agent's project, every live thread row of its owner. Its threads
        are its own members (the master's own Codex thread, if any), but its risk fields and its
        strategy summary are about every thread the master agent oversees (CB-13): the master's
        page tells the truth about the whole system, not about its own empty membership."""
        known = views or {}
        members = [
            known.get(row["thread_id"]) or view_of(row) for row in member_rows if row["archived_at"] is None
        ]
        judged = members
        if overseen is not None:
            judged = [known.get(row["thread_id"]) or view_of(row) for row in overseen]
        return ProjectDetailView(
            project=project,
            threads=risk_order(members),
            next_compaction_risk_thread_id=next_compaction_risk_thread(judged),
            threads_requiring_handoff=threads_requiring_handoff(judged),
            master_context_strategy_summary=strategy_summary(judged, project["strategy_summary"]),
        )

    # --- projection of upstream events (called by EventConsumer inside its transaction) ------------

    async def apply_budget_events(self, connection: AsyncConnection, batch: list[StoredEvent]) -> Publication:
        """Applies context_budget events: the latest `thread.context.updated` per thread updates the
        thread's budget, the rings showing it and its projects' risk, publishing CB-15 events.

        A thread never registered is imported here (owner: the reporting device's, as the event
        names it) with a single_device project, so a worker that reports before registering still
        shows up; a thread imported from a scheduler event (no worker named) gets its worker and
        folder here. A reading from a device the thread does not belong to (another owner, node or
        worker) is skipped. Older readings than
        the stored one change nothing. Malformed payloads are logged and skipped (never block the
        stream). Other event types only advance the cursor.

        A batch costs a fixed number of statements whatever its size (threads read, budgets
        written, then `_publish_thread_changes`); only importing unknown threads is per thread. On
        PostgreSQL the final update of threads and rings comes back as the publication's
        `carrying`, for the consumer's outbox append to make (`EventConsumer`).
        """
        latest: dict[str, tuple[StoredEvent, ThreadBudget]] = {}
        for event in batch:
            thread_id = str(event.payload.get("thread_id") or "")
            if event.type != "thread.context.updated" or not thread_id:
                continue
            try:
                budget = budget_from_payload(event.payload, event.occurred_at)
            except (KeyError, TypeError, ValueError) as error:
                log.warning("skipping context event %s for %s: %s", event.sequence, thread_id, error)
                continue
            kept = latest.get(thread_id)
            if kept is None or budget.is_newer_than(kept[1]):
                latest[thread_id] = (event, budget)
        if not latest:
            return Publication([])
        await lock_projection(connection)
        repository = SqlAlchemyConversationsRepository(connection)
        memberships, project_rows = await repository.members_and_projects_of_threads(latest)
        known: dict[str, Row] = {
            row["thread_id"]: row for _project, row in memberships if row["thread_id"] in latest
        }
        if len(known) < len(latest):  # threads in no project yet, or never registered
            known.update(await repository.threads_by_id([t for t in latest if t not in known]))
        unknown = [thread_id for thread_id in latest if thread_id not in known]
        for thread_id in unknown:
            payload = latest[thread_id][0].payload
            registration = Registration(
                thread_id=thread_id,
                node_id=str(payload.get("node_id") or ""),
                worker_id=str(payload.get("worker_id") or ""),
                owner_id=event_owner(payload, self.default_owner_id),
                codex_folder=str(payload.get("codex_folder") or ""),
            )
            try:
                # In a savepoint: a RegisterThread committing the same thread meanwhile makes the
                # insert fail; the thread is then known (read below), and the batch goes on.
                async with connection.begin_nested():
                    await self._register(connection, registration, latest[thread_id][0].occurred_at)
            except IntegrityError:
                log.info("importing %s raced its registration; the registered thread is used", thread_id)
        if unknown:
            known.update(await repository.threads_by_id(unknown))
            memberships, project_rows = await repository.members_and_projects_of_threads(latest)
        updates: list[tuple[str, dict[str, Any]]] = []
        written: dict[str, dict[str, Any]] = {}
        changed: dict[str, dict[str, Any]] = {}
        new_level: set[str] = set()
        for thread_id, (event, budget) in latest.items():
            thread = dict(known[thread_id])
            reporter = (
                event_owner(event.payload, self.default_owner_id),
                str(event.payload.get("node_id") or ""),
                str(event.payload.get("worker_id") or ""),
            )
            if not registered_by_its_device(thread, *reporter):
                # Another device's reading (one the thread was moved away from, or one that reported
                # a thread registered here by another device first): never shown on this thread.
                log.warning("budget event %s for %s from another device skipped", event.sequence, thread_id)
                continue
            columns: dict[str, Any] = {}
            if not thread["worker_id"] and event.payload.get("worker_id"):
                columns.update(_reporter_columns(thread, event.payload))
            if budget.comes_after(stored_reading_order(thread)):
                if thread["level"] != budget.level:
                    new_level.add(thread_id)
                columns.update(budget_columns(budget))
                if thread["archived_at"] is None:
                    changed[thread_id] = thread
            if columns:
                thread.update(columns)
                updates.append((thread_id, columns))
                written[thread_id] = thread
        # The memberships were read before the update: the rows written here replace theirs.
        current = [(project_id, written.get(row["thread_id"], row)) for project_id, row in memberships]
        project_rows, summaries_set_aside = _set_aside_stale_summaries(memberships, project_rows, new_level)
        return await self._publish_thread_changes(
            repository,
            changed,
            current,
            project_rows=project_rows,
            thread_updates=updates,
            project_updates=summaries_set_aside,
            carried=True,
        )

    async def _publish_thread_change(
        self, repository: SqlAlchemyConversationsRepository, thread_id: str
    ) -> list[NewEvent]:
        """Refreshes the rings showing the thread and emits indicator and project-risk events."""
        thread = await repository.thread(thread_id)
        assert thread is not None
        return (await self._publish_thread_changes(repository, {thread_id: dict(thread)})).events

    async def _publish_thread_changes(
        self,
        repository: SqlAlchemyConversationsRepository,
        changed: Mapping[str, Mapping[str, Any]],
        memberships: Sequence[tuple[str, Mapping[Any, Any]]] | None = None,
        project_rows: Sequence[Row] | None = None,
        thread_updates: Sequence[tuple[str, dict[str, Any]]] = (),
        project_updates: Mapping[str, dict[str, Any]] | None = None,
        carried: bool = False,
    ) -> Publication:
        """Refreshes the rings showing the `changed` threads (their current rows, as just written)
        and emits, per thread in order, its indicator events (projects by id) and its projects'
        risk events (unarchived projects by id). At most three statements whatever the number of
        threads: the members of their projects (unless the caller passes `memberships`, as
        `members_of_projects_of_threads` returns them, with current rows), those projects and the
        projects showing them (unless the caller passes them as `project_rows`, a superset is
        fine), and one update of the rings, which also writes the caller's `thread_updates` (as
        `update_threads` would) and `project_updates` (columns by project id). With `carried`, on
        PostgreSQL, that update is not run here but handed back with the events, for the outbox
        append to make (`Publication.carrying`: a round trip fewer per projected batch)."""
        if not changed:
            carrying = await repository.update_threads_and_projects(
                thread_updates, list((project_updates or {}).items()), carried=carried
            )
            return Publication([], carrying)
        members: dict[str, list[Mapping[Any, Any]]] = {}
        projects_of_thread: dict[str, list[str]] = {thread_id: [] for thread_id in changed}
        if memberships is None:
            memberships = await repository.members_of_projects_of_threads(changed)
        for project_id, row in memberships:
            members.setdefault(project_id, []).append(row)
            if row["thread_id"] in projects_of_thread:
                projects_of_thread[row["thread_id"]].append(project_id)
        rows = project_rows
        if rows is None:
            rows = await repository.projects_by_id_or_shown_thread(members, changed)
        by_id = {project["project_id"]: project for project in rows}
        showing: dict[str, list[Row]] = {}
        for project in rows:
            showing.setdefault(project["indicator_thread_id"], []).append(project)
        details: dict[str, ProjectDetailView] = {}
        rings: list[tuple[str, dict[str, Any]]] = []
        events: list[NewEvent] = []
        views: dict[str, ThreadView] = {}  # the changed threads' rows are their members' rows too
        for thread_id, thread in changed.items():
            view = views[thread_id] = view_of(thread)
            for project in showing.get(thread_id, []):
                indicator = indicator_for(project["conversation_type"], thread_id, view.budget)
                rings.append((project["project_id"], indicator_columns(indicator)))
                if not indicator.shows_the_same_as(indicator_of(project)):
                    events.append(indicator_event(project, indicator))
            for project_id in projects_of_thread[thread_id]:
                member_of = by_id.get(project_id)
                if member_of is None or member_of["archived_at"] is not None:
                    continue
                if project_id not in details:
                    overseen = await _overseen_by(repository, member_of)  # the master's own thread changed
                    details[project_id] = self._detail_of(member_of, members[project_id], views, overseen)
                events.append(_project_risk_event(member_of, details[project_id], view, thread["node_id"]))
        # One entry per project: a row updated twice in one statement keeps only one of the changes.
        project_changes = {
            project_id: dict(columns) for project_id, columns in (project_updates or {}).items()
        }
        for project_id, columns in rings:
            project_changes.setdefault(project_id, {}).update(columns)
        carrying = await repository.update_threads_and_projects(
            thread_updates, list(project_changes.items()), carried=carried
        )
        return Publication(events, carrying)

    async def apply_scheduler_events(
        self, connection: AsyncConnection, batch: list[StoredEvent]
    ) -> list[NewEvent]:
        """Applies the scheduler's events (payloads as services/scheduler/service.py writes them).

        - `thread.handoff.required` {thread_id, project_id, node_id, reason: context_urgent |
          context_critical | compaction_near | handoff_missing, handoff_package_id, to_thread_id,
          context_budget_level, context_budget_remaining_pct, compaction_expected_at |
          compaction_count}: the thread's handoff is required, with the reason in words.
        - `thread.handoff.ready` {thread_id (= from_thread_id), handoff_package_id, to_thread_id,
          missing_items: scheduler checklist item names, checklist_details: {item: detail in
          words}, current_for_thread}: ready; the checklist is done except the missing items, and
          each item carries the package's detail (the scheduler's checklist, so the thread page
          and `GET .../context-budget` show the same words). A package the scheduler no longer
          presents as the thread's (`current_for_thread` false: a compaction closed it) is not
          shown as ready.
        - `thread.handoff.consumed` / `.expired` (same package payload): back to "none".
        - `thread.handoff.closed` {thread_id, handoff_package_id, package_status, reason
          "compaction", compaction_count}: a compaction ended the handoff cycle; back to "none".
          When the thread's stored reading does not show that compaction yet, the project's risk
          is republished only with that reading (no false "handoff required" in between).
        - `project.context_strategy.updated` {owner_id, project_id, master_context_strategy_summary,
          ranked_thread_ids, ...}: stores the project's summary (CB-13). The scheduler keys it by the
          owner and the `project_id` workers report, which nothing checks: a summary is skipped for
          a project unknown here, of another owner, or naming a thread that is not one of the
          project's members here (`summary_fits_project`).

        Required and ready are relayed as CB-15 events (thread_id, project_ids, handoff_status,
        handoff_package_id, handoff_reason, to_thread_id); every applied change also refreshes the
        projects' `project.context_risk.updated`. Events about an older package than the one the
        thread shows change nothing. A required or ready event for a thread not known yet (its first
        budget event is still behind on the other stream) imports the thread for the owner the event
        names (the default owner for events that name none), as a budget event would, so the
        handoff state is not lost; consumed / expired for an unknown thread are skipped.
        - `task.status_changed` (the scheduler's Task as JSON): a chat task's status; applied by
          `ChatHandlers.apply_task_events` (task row, `task.updated`, and on its first terminal
          status the one message that ends it).

        `thread.schedule.updated` and other types only advance the cursor.
        """
        applied = (TASK_STATUS_CHANGED, STRATEGY_UPDATED_EVENT, *SCHEDULER_HANDOFF_EVENTS)
        if any(event.type in applied for event in batch):
            await lock_projection(connection)
        repository = SqlAlchemyConversationsRepository(connection)
        published: list[NewEvent] = []
        for event in batch:
            if event.type == TASK_STATUS_CHANGED:
                published += await self.chat.apply_task_events(connection, [event])
            elif event.type == STRATEGY_UPDATED_EVENT:
                published += await self._apply_strategy(repository, event)
            elif event.type in SCHEDULER_HANDOFF_EVENTS:
                published += await self._apply_handoff(connection, repository, event)
        return published

    async def _apply_strategy(
        self, repository: SqlAlchemyConversationsRepository, event: StoredEvent
    ) -> list[NewEvent]:
        """Stores a `project.context_strategy.updated` summary; when it changed, publishes the
        project's `project.context_risk.updated` (its thread_context: the project's most-at-risk
        thread) so clients see the new summary."""
        payload = event.payload
        project_id = str(payload.get("project_id") or event.project_id or "")
        summary = str(payload.get("master_context_strategy_summary") or "")
        project = await repository.project(project_id) if project_id else None
        if project is None:
            log.debug("strategy event %s for project %r unknown here skipped", event.sequence, project_id)
            return []
        ranked = payload.get("ranked_thread_ids")
        thread_ids = [str(thread_id) for thread_id in ranked] if isinstance(ranked, list) else []
        members = await repository.member_threads(project_id)
        if not summary_fits_project(
            project, members, event_owner(payload, self.default_owner_id), thread_ids
        ):
            log.warning(
                "strategy event %s for project %s skipped: not of its owner's member threads",
                event.sequence,
                project_id,
            )
            return []
        if project["strategy_summary"] == summary:
            return []
        await repository.update_project(project_id, {"strategy_summary": summary})
        project = await repository.project(project_id)
        assert project is not None
        if project["archived_at"] is not None:
            return []
        detail = self._detail_of(project, members, overseen=await _overseen_by(repository, project))
        if not detail.threads:
            return []
        first = detail.threads[0]
        return [_project_risk_event(project, detail, first, first.node_id)]

    async def _apply_handoff(
        self, connection: AsyncConnection, repository: SqlAlchemyConversationsRepository, event: StoredEvent
    ) -> list[NewEvent]:
        """Applies one handoff event (see `apply_scheduler_events`)."""
        payload = event.payload
        thread_id = str(payload.get("thread_id") or payload.get("from_thread_id") or event.thread_id or "")
        if not thread_id:
            log.warning("handoff event %s names no thread; skipped", event.sequence)
            return []
        thread = await repository.thread(thread_id)
        if thread is None and event.type not in (HANDOFF_REQUIRED_EVENT, HANDOFF_READY_EVENT):
            log.info("%s %s for unknown thread %s skipped", event.type, event.sequence, thread_id)
            return []
        if thread is None:
            registration = Registration(
                thread_id=thread_id,
                node_id=str(payload.get("node_id") or event.node_id or ""),
                worker_id=str(payload.get("worker_id") or ""),
                owner_id=event_owner(payload, self.default_owner_id),
                codex_folder=str(payload.get("codex_folder") or ""),
            )
            await self._register(connection, registration, event.occurred_at)
            thread = await repository.thread(thread_id)
            assert thread is not None
        package_id = str(payload.get("handoff_package_id") or "")
        try:
            reason = handoff_reason_in_words(
                str(payload.get("reason") or ""),
                level=str(payload.get("context_budget_level") or ""),
                remaining_pct=_optional_float(payload.get("context_budget_remaining_pct")),
                compaction_expected_at=_parse_time(payload.get("compaction_expected_at")),
                compaction_count=int(payload.get("compaction_count") or 0),
            )
        except (TypeError, ValueError) as error:
            log.warning("handoff event %s for %s: %s; reason kept as sent", event.sequence, thread_id, error)
            reason = str(payload.get("reason") or "")
        missing = payload.get("missing_items") or []
        details = payload.get("checklist_details") or {}
        current = HandoffState(
            status=thread["handoff_status"] or HANDOFF_NONE,
            handoff_package_id=thread["handoff_package_id"] or "",
            reason=thread["handoff_reason"] or "",
            checklist_done=tuple(json.loads(thread["checklist_done_json"] or "[]")),
            checklist_details=json.loads(thread["checklist_details_json"] or "{}"),
        )
        changed = apply_handoff_event(
            current,
            event.type,
            package_id,
            reason,
            [str(item) for item in missing] if isinstance(missing, list) else [],
            {str(key): str(value) for key, value in details.items()} if isinstance(details, dict) else {},
            current_for_thread=payload.get("current_for_thread") is not False,
        )
        if changed is None:
            log.info(
                "%s of package %s for %s skipped: the thread shows package %s",
                event.type,
                package_id,
                thread_id,
                current.handoff_package_id,
            )
            return []
        await repository.update_thread(
            thread_id,
            {
                "handoff_status": changed.status,
                "handoff_package_id": changed.handoff_package_id,
                "handoff_reason": changed.reason,
                "checklist_done_json": json.dumps(list(changed.checklist_done)),
                "checklist_details_json": json.dumps(dict(changed.checklist_details)),
            },
        )
        published: list[NewEvent] = []
        project_ids = (await repository.project_ids_of_threads([thread_id]))[thread_id]
        if event.type in (HANDOFF_REQUIRED_EVENT, HANDOFF_READY_EVENT):
            published.append(
                NewEvent(
                    event.type,
                    {
                        "owner_id": thread["owner_id"],
                        "thread_id": thread_id,
                        "project_ids": project_ids,
                        "handoff_status": changed.status,
                        "handoff_package_id": changed.handoff_package_id,
                        "handoff_reason": changed.reason,
                        "to_thread_id": str(payload.get("to_thread_id") or ""),
                    },
                    thread_id=thread_id,
                    node_id=thread["node_id"],
                )
            )
        if thread["archived_at"] is None and not _closed_ahead_of_its_reading(event, thread):
            published += await self._publish_thread_change(repository, thread_id)
        return published


PROJECTION_LOCK_KEY = 6_268_001  # any fixed 64-bit number no other lock of this database uses
"""The PostgreSQL advisory lock both upstream consumers take first (`lock_projection`)."""


async def _inserted(connection: AsyncConnection, insertion: Awaitable[None]) -> bool:
    """Runs `insertion` in a savepoint: True when it inserted, False when a row with its key was
    there (committed by another writer; the savepoint is rolled back, the transaction goes on)."""
    try:
        async with connection.begin_nested():
            await insertion
    except IntegrityError:
        return False
    return True


async def lock_projection(connection: AsyncConnection) -> None:
    """Takes the projection's transaction-level advisory lock (PostgreSQL; SQLite's write
    transactions are serial anyway). The consumers of context_budget's and of the scheduler's
    streams both write thread and project rows, each in its own order: taking this lock first puts
    every lock of theirs in one order, so they wait for each other instead of deadlocking (a
    restart, when both catch up with large batches at once, saw a dozen deadlocks in seconds). RPC
    writes do not take it."""
    if connection.dialect.name == "postgresql":
        await connection.execute(select(func.pg_advisory_xact_lock(PROJECTION_LOCK_KEY)))


async def _is_device_of(connection: AsyncConnection, owner: str, node_id: str, worker_id: str) -> bool:
    """Whether the owner has an active enrolled device, or a thread, on this node and worker."""
    enrolled = select(devices.c.device_id).where(
        devices.c.owner_id == owner,
        devices.c.node_id == node_id,
        devices.c.worker_id == worker_id,
        devices.c.revoked_at.is_(None),
    )
    seen = select(threads.c.thread_id).where(
        threads.c.owner_id == owner, threads.c.node_id == node_id, threads.c.worker_id == worker_id
    )
    found = await connection.execute(select(exists(enrolled) | exists(seen)))
    return bool(found.scalar())


def event_owner(payload: Mapping[Any, Any], default_owner_id: str) -> str:
    """The owner an upstream event names; events from before they named one were all the default
    owner's."""
    return str(payload.get("owner_id") or default_owner_id)


def summary_fits_project(
    project: Mapping[Any, Any], members: Sequence[Mapping[Any, Any]], owner_id: str, thread_ids: Sequence[str]
) -> bool:
    """Whether a scheduler strategy summary of `owner_id`'s threads `thread_ids` may be stored on the
    project: the owner is the project's and every thread is one of its members here. The scheduler
    groups readings by the project id their worker names, which nothing checks; the projects a thread
    belongs to are this service's (its own project, its groups, its owner's master project)."""
    member_ids = {row["thread_id"] for row in members if row["owner_id"] == project["owner_id"]}
    return owner_id == project["owner_id"] and all(thread_id in member_ids for thread_id in thread_ids)


def registered_by_its_device(thread: Mapping[Any, Any], owner_id: str, node_id: str, worker_id: str) -> bool:
    """Whether (owner_id, node_id, worker_id) is the device the stored thread belongs to. A thread
    imported from a scheduler event knows no worker yet: its node's worker is its device."""
    return (
        thread["owner_id"] == owner_id
        and thread["node_id"] == node_id
        and thread["worker_id"] in ("", worker_id)
    )


async def _overseen_by(
    repository: SqlAlchemyConversationsRepository, project: Mapping[Any, Any]
) -> list[Row] | None:
    """Every live thread of the owner for the master agent's project (what it oversees), None for
    any other project (its members are what it is about)."""
    if project["conversation_type"] != MASTER_AGENT:
        return None
    return await repository.live_threads_of_owner(project["owner_id"])


def _set_aside_stale_summaries(
    memberships: Sequence[tuple[str, Mapping[Any, Any]]], project_rows: Sequence[Row], new_level: set[str]
) -> tuple[list[Row], dict[str, dict[str, Any]]]:
    """The scheduler's strategy summary describes the readings it had seen. A reading that moves a
    thread to another level arrives here before the scheduler's summary of it, so the projects of
    `new_level` threads drop the stored summary: their risk events and detail state the projection's
    own summary of the current readings (`strategy_summary`) until the scheduler publishes its next
    one. Returns the project rows as they are to be read (copies without the summary where it was
    dropped) and the column changes to store, by project id."""
    stale = {project_id for project_id, row in memberships if row["thread_id"] in new_level}
    rows: list[Row] = []
    changes: dict[str, dict[str, Any]] = {}
    for project in project_rows:
        if project["project_id"] in stale and project["strategy_summary"]:
            project = {**project, "strategy_summary": ""}
            changes[project["project_id"]] = {"strategy_summary": ""}
        rows.append(project)
    return rows, changes


def _closed_ahead_of_its_reading(event: StoredEvent, thread: Mapping[Any, Any]) -> bool:
    """True for a `thread.handoff.closed` whose compaction the thread's stored reading does not show
    yet (that reading is still behind on context_budget's stream). Its project's risk is then not
    republished: it would pair the pre-compaction budget (often critical) with no package, a false
    "handoff required" until the reading arrives, and that reading's own events carry the closed
    cycle."""
    if event.type != SCHEDULER_HANDOFF_CLOSED:
        return False
    try:
        closed_at_count = int(event.payload.get("compaction_count") or 0)
    except (TypeError, ValueError):
        return False
    return stored_reading_order(thread) is not None and int(thread["compaction_count"] or 0) < closed_at_count


def _reporter_columns(thread: Mapping[Any, Any], payload: Mapping[Any, Any]) -> dict[str, Any]:
    """Worker and folder of a thread imported from a scheduler event (which names neither), from
    a budget event."""
    return {
        "worker_id": str(payload["worker_id"]),
        "codex_folder": thread["codex_folder"] or str(payload.get("codex_folder") or ""),
    }


def _optional_float(value: Any) -> float | None:
    """A number from a JSON payload, None for null / absent. Raises ValueError / TypeError."""
    return None if value is None else float(value)


def _project_risk_event(
    project: Mapping[Any, Any], detail: ProjectDetailView, view: ThreadView, node_id: str
) -> NewEvent:
    """`project.context_risk.updated` for a project, with `view` as its thread_context."""
    return NewEvent(
        PROJECT_RISK_UPDATED,
        {
            "owner_id": project["owner_id"],
            "project_id": project["project_id"],
            "conversation_id": conversation_id_of(project["project_id"]),
            "conversation_type": project["conversation_type"],
            "thread_context": thread_summary_payload(view),
            "next_compaction_risk_thread_id": detail.next_compaction_risk_thread_id,
            "threads_requiring_handoff": detail.threads_requiring_handoff,
            "master_context_strategy_summary": detail.master_context_strategy_summary,
            "updated_at": isoformat_utc(utc_now()),
        },
        thread_id=view.thread_id,
        project_id=project["project_id"],
        node_id=node_id,
    )
