"""Chat's use cases on the conversations database and outbox: storing messages (AddMessage,
PostMessage), reading them by sequence, a task's view and its retry, and the projection of the
scheduler's `task.status_changed` events into task rows and result messages.

Each command is one transaction with the events it publishes. Published event types (payloads carry
`owner_id`):

- `conversation.message.created` {owner_id, project_id, conversation_id, latest_reply_at, message:
  {message_id, project_id, author_kind, thread_id, text, created_at, sequence, client_message_id,
  task_id}}: a stored message.
- `task.requested` {owner_id, task_id, task_type, project_id, target_project_id, target_thread_id,
  device_id, codex_folder_ref, codex_thread_ref, request_message_id, instruction_text,
  retry_of_task_id, dispatch_plan_id}: for the scheduler, which creates the task idempotently by
  task_id (the gateway keeps it out of SSE).
- `task.updated` {owner_id, project_id, conversation_id, task: {the ChatTask fields, snake_case},
  collaboration_gate: {state, tasks_total, tasks_done, detail}}: a chat task was created or changed.
- `task.cancel_requested` {owner_id, task_id, requested_at}: for the scheduler, which cancels the
  task if it has not started (the gateway keeps it out of SSE).
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.adapters.repository import SqlAlchemyConversationsRepository
from services.conversations.chat.domain import (
    CANCELLED,
    CLIENT_MESSAGE_ID_REUSED,
    DISPATCH_EXECUTION,
    TASK_NOT_CANCELLABLE,
    TASK_NOT_RETRYABLE,
    ChatTask,
    ChatThread,
    CollaborationGate,
    apply_status_report,
    check_after_sequence,
    check_chat_target,
    check_post,
    collaboration_gate,
    is_terminal,
    new_chat_task,
    parse_status_report,
    task_request_payload,
)
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.chat.wording import result_message
from services.conversations.domain.model import (
    GROUP,
    MASTER_AGENT,
    MASTER_ALIAS,
    conversation_id_of,
    master_project_id,
)
from services.conversations.domain.validation import check_id, check_message, check_page_size, raise_if_any
from services.conversations.master.repository import is_model_task
from services.shared.db import Database
from services.shared.errors import (
    PROJECT_NOT_FOUND,
    TASK_NOT_FOUND,
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
)
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.paging import PageTokenCodec, fingerprint
from services.shared.time import isoformat_utc, utc_now

if TYPE_CHECKING:
    from services.conversations.groups.handlers import GroupHandlers
    from services.conversations.groups.plans import DispatchPlan
    from services.conversations.master.handlers import MasterAgentChat

log = logging.getLogger(__name__)

MESSAGE_CREATED = "conversation.message.created"
TASK_REQUESTED = "task.requested"
TASK_UPDATED = "task.updated"
TASK_CANCEL_REQUESTED = "task.cancel_requested"
CANCELLABLE_STATUSES = frozenset({"queued", "claimed"})
"""The statuses a cancel can still stop: Codex has not been started for the task."""
TASK_STATUS_CHANGED = "task.status_changed"
"""The scheduler's event of a task status change (its Task message as JSON; scheduler.proto)."""

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200

Row = Mapping[Any, Any]


@dataclass(frozen=True)
class SentMessage:
    """What PostMessage answers: the stored user message (`message_view` fields), its current task
    and the project's gate; `created` False when the client_message_id was seen before;
    `master_reply` the master agent's reply when it came within the send's wait (CHAT-2);
    `dispatch_plan` a group's plan proposed for the message (CHAT-4)."""

    message: dict[str, Any]
    task: ChatTask | None
    gate: CollaborationGate
    created: bool
    master_reply: str | None = None
    dispatch_plan: DispatchPlan | None = None


@dataclass(frozen=True)
class TaskView:
    """A chat task with its project's gate (GetChatTask, RetryChatTask)."""

    task: ChatTask
    gate: CollaborationGate


# ---------------------------------------------------------------------------------------------------
# Events


def message_payload(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as JSON: the Message proto's fields, created_at RFC 3339 UTC."""
    return {**message, "created_at": isoformat_utc(message["created_at"])}


def message_created_event(owner_id: str, message: Mapping[str, Any]) -> NewEvent:
    """`conversation.message.created` for a stored message (its time is the conversation's
    latest_reply_at)."""
    project_id = message["project_id"]
    return NewEvent(
        MESSAGE_CREATED,
        {
            "owner_id": owner_id,
            "project_id": project_id,
            "conversation_id": conversation_id_of(project_id),
            "latest_reply_at": isoformat_utc(message["created_at"]),
            "message": message_payload(message),
        },
        thread_id=message["thread_id"],
        project_id=project_id,
    )


def task_updated_event(task: ChatTask, gate: CollaborationGate) -> NewEvent:
    """`task.updated` for a task as it is now."""
    return NewEvent(
        TASK_UPDATED,
        {
            "owner_id": task.owner_id,
            "project_id": task.project_id,
            "conversation_id": conversation_id_of(task.project_id),
            "task": task.as_payload(),
            "collaboration_gate": gate.as_payload(),
        },
        thread_id=task.target_thread_id,
        project_id=task.project_id,
        node_id=task.device_id,
    )


def task_requested_event(task: ChatTask, instruction_text: str) -> NewEvent:
    """`task.requested` for the scheduler."""
    return NewEvent(
        TASK_REQUESTED,
        task_request_payload(task, instruction_text),
        thread_id=task.target_thread_id,
        project_id=task.project_id,
        node_id=task.device_id,
    )


# ---------------------------------------------------------------------------------------------------


async def write_message(
    connection: AsyncConnection,
    project: Row,
    *,
    author_kind: str,
    thread_id: str,
    text: str,
    now: datetime,
    client_message_id: str = "",
    task_id: str = "",
) -> tuple[dict[str, Any], NewEvent]:
    """Stores a message in `project` (a row with its project_id and owner_id) with the
    conversation's next sequence, moves the project's latest_reply_at to `now`, and returns the
    message (`message_view` fields) with its `conversation.message.created` event (for the caller
    to append).

    The project row is updated first, then the sequence taken (`append_message`, one statement on
    PostgreSQL): every writer of a conversation locks the two in that order, so two writers never
    wait for each other crosswise. Raises sqlalchemy.exc.IntegrityError when `client_message_id` is
    taken in the project.
    """
    message = {
        "message_id": f"msg-{uuid.uuid4().hex}",
        "project_id": project["project_id"],
        "author_kind": author_kind,
        "thread_id": thread_id,
        "text": text,
        "created_at": now,
        "sequence": 0,
        "client_message_id": client_message_id,
        "task_id": task_id,
    }
    message["sequence"] = await SqlAlchemyChatRepository(connection).append_message(message)
    return message, message_created_event(project["owner_id"], message)


def chat_thread_of(row: Row | None) -> ChatThread | None:
    """A thread row as the send rules see it."""
    if row is None:
        return None
    return ChatThread(
        thread_id=row["thread_id"],
        node_id=row["node_id"] or "",
        codex_folder=row["codex_folder"] or "",
        codex_thread_ref=row["codex_thread_ref"] or "",
        archived=row["archived_at"] is not None,
    )


async def gate_of(chat: SqlAlchemyChatRepository, task: ChatTask) -> CollaborationGate:
    """The gate of a task's project as seen from that task: the thread's open tasks, and the ones
    ahead of this task while it is open itself."""
    open_tasks, earlier = await chat.open_tasks_of_thread(task)
    return collaboration_gate(open_tasks, 0 if is_terminal(task.status) else earlier)


class ChatHandlers:
    """Chat's use cases (see the module docstring).

    Args:
        database: the conversations database.
        event_log: its outbox.
        page_tokens: signs ListMessages page tokens (a codec with a random key when None).

    Attributes:
        master: the master agent's chat (services/conversations/master), set by the composition
            root; messages to the master conversation and retries of its tasks go to it. None:
            the master conversation refuses messages (CHAT_PATH_NOT_AVAILABLE).
        groups: the group chat (services/conversations/groups), set by the composition root:
            messages to a group and its dispatch tasks' status reports go to it. None: a group
            refuses messages (CHAT_PATH_NOT_AVAILABLE).
    """

    def __init__(
        self, database: Database, event_log: EventLog, page_tokens: PageTokenCodec | None = None
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.page_tokens = page_tokens or PageTokenCodec(secrets.token_urlsafe(32), "conversations")
        self.master: MasterAgentChat | None = None
        self.groups: GroupHandlers | None = None

    # --- messages -----------------------------------------------------------------------------------

    async def add_message(
        self, owner: str, project_id: str, author_kind: str, thread_id: str, text: str
    ) -> dict[str, Any]:
        """AddMessage: stores a message (any author kind, no task) with the next sequence and moves
        the conversation's latest_reply_at to now (UTC). Returns the message (`message_view` fields).

        Raises InvalidArgument (project_id, author_kind, text, thread_id) and NotFound
        (PROJECT_NOT_FOUND)."""
        violations = _project_id_violations(project_id)
        check_message(author_kind, text, violations)
        check_id("thread_id", thread_id, violations, required=author_kind == "thread")
        raise_if_any(violations)
        async with self.database.transaction() as connection:
            project = await _owned_project(SqlAlchemyConversationsRepository(connection), owner, project_id)
            message, event = await write_message(
                connection, project, author_kind=author_kind, thread_id=thread_id, text=text, now=utc_now()
            )
            appended = await self.event_log.append(connection, [event])
        self.event_log.kick(appended)
        return message

    async def list_messages(
        self, owner: str, project_id: str, page_size: int, page_token: str, after_sequence: int = 0
    ) -> tuple[list[dict[str, Any]], str]:
        """A project's messages with sequence > `after_sequence`, oldest first, `page_size` at a time
        (0: 50, at most 200). Returns (messages, next page token; "" on the last page). A page token
        holds to the request's project and after_sequence.

        Raises InvalidArgument (project_id, page_size, after_sequence, page_token) and NotFound
        (PROJECT_NOT_FOUND)."""
        violations = [*_project_id_violations(project_id), *check_after_sequence(after_sequence)]
        size = check_page_size(page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, violations)
        after = max(after_sequence, 0)
        filters = fingerprint("messages", project_id, owner, str(after))
        if page_token:
            try:
                (position,) = self.page_tokens.decode(page_token, filters)
                after = int(position)
            except InvalidArgument as error:
                violations.extend(error.violations)
            except ValueError:
                violations.append(FieldViolation("page_token", "is malformed"))
        raise_if_any(violations)
        async with self.database.read() as connection:
            project = await _owned_project(SqlAlchemyConversationsRepository(connection), owner, project_id)
            chat = SqlAlchemyChatRepository(connection)
            rows = await chat.messages_after_sequence(project["project_id"], after, size + 1)
        next_token = ""
        if len(rows) > size:
            rows = rows[:size]
            next_token = self.page_tokens.encode([str(rows[-1]["sequence"])], filters)
        return rows, next_token

    # --- sending ------------------------------------------------------------------------------------

    async def post_message(
        self, owner: str, project_id: str, text: str, client_message_id: str
    ) -> SentMessage:
        """PostMessage (CHAT-3): stores the user message, its queued conversation_reply task and the
        events `conversation.message.created`, `task.requested` and `task.updated` in one
        transaction. The task id is "task-" + a fresh uuid (hex).

        Idempotent by (owner, project, client_message_id): a repeat with the same text answers the
        stored message and its current task (the latest retry, once retried) with `created` False
        and stores nothing, also when it raced the first one (the unique index refuses the second
        insert; the stored one is answered).

        Raises InvalidArgument (project_id, text, client_message_id), NotFound (PROJECT_NOT_FOUND),
        AlreadyExists (CLIENT_MESSAGE_ID_REUSED: the key was sent before with another text) and
        FailedPrecondition (CHAT_PATH_NOT_AVAILABLE, THREAD_ARCHIVED, THREAD_METADATA_INCOMPLETE:
        `check_chat_target`; nothing is stored, so the client keeps its draft). A message to a
        group goes to the group chat instead (`GroupHandlers.post_message`: its dispatch plan).
        """
        raise_if_any([*_project_id_violations(project_id), *check_post(text, client_message_id)])
        if project_id in (MASTER_ALIAS, master_project_id(owner)):  # CHAT-2: the master's own path
            if self.master is not None:
                return await self.master.post_message(owner, text, client_message_id)
            check_chat_target(project_id, MASTER_AGENT, False, None)
        try:
            async with self.database.transaction() as connection:
                sent, appended = await self._post(connection, owner, project_id, text, client_message_id)
        except IntegrityError:
            async with self.database.read() as connection:
                project = await _owned_project(
                    SqlAlchemyConversationsRepository(connection), owner, project_id
                )
                stored = await SqlAlchemyChatRepository(connection).message_by_client_id(
                    project["project_id"], client_message_id
                )
                if stored is None:
                    raise
                log.info(
                    "a repeat of %s in %s raced the first send; answered the stored one",
                    client_message_id,
                    project_id,
                )
                return await answer_repeat(SqlAlchemyChatRepository(connection), stored, text)
        if sent is None and self.groups is not None:  # CHAT-4: a group's own path (nothing written)
            return await self.groups.post_message(owner, project_id, text, client_message_id)
        assert sent is not None
        self.event_log.kick(appended)
        return sent

    async def _post(
        self, connection: AsyncConnection, owner: str, project_id: str, text: str, client_message_id: str
    ) -> tuple[SentMessage | None, list[StoredEvent]]:
        """`post_message` inside its transaction: (the answer, the events appended); (None, []) for
        a group when `groups` is set (nothing written: the group chat answers). On PostgreSQL
        BEGIN, one read (`send_target`), one write of the message (`append_message`), the outbox
        append carrying the task's insert, COMMIT."""
        chat = SqlAlchemyChatRepository(connection)
        target = await chat.send_target(project_id, client_message_id)
        if target is None or target.project["owner_id"] != owner:
            raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
        project = target.project
        if project["conversation_type"] == GROUP and self.groups is not None:
            return None, []
        if target.sent_before:
            stored = await chat.message_by_client_id(project["project_id"], client_message_id)
            if stored is not None:
                return await answer_repeat(chat, stored, text), []
        thread = check_chat_target(
            project["project_id"],
            project["conversation_type"],
            project["archived_at"] is not None,
            chat_thread_of(target.thread),
        )
        now = utc_now()
        task_id = f"task-{uuid.uuid4().hex}"
        message, created = await write_message(
            connection,
            project,
            author_kind="user",
            thread_id="",
            text=text,
            now=now,
            client_message_id=client_message_id,
            task_id=task_id,
        )
        task = new_chat_task(task_id, owner, project["project_id"], thread, message["message_id"], now)
        carrying = None
        if chat.postgres:
            carrying = chat.task_insertion(task)
        else:
            await chat.insert_task(task)
        # The new task runs after the thread's open ones, all of them requested before it.
        gate = collaboration_gate(target.open_tasks + 1, target.open_tasks)
        appended = await self.event_log.append(
            connection,
            [created, task_requested_event(task, text), task_updated_event(task, gate)],
            carrying=carrying,
        )
        return SentMessage(message, task, gate, created=True), appended

    # --- tasks --------------------------------------------------------------------------------------

    async def get_task(self, owner: str, task_id: str) -> TaskView:
        """GetChatTask: the task and its project's gate. Raises InvalidArgument (task_id) and
        NotFound (TASK_NOT_FOUND: unknown or another owner's)."""
        raise_if_any(_task_id_violations(task_id))
        async with self.database.read() as connection:
            chat = SqlAlchemyChatRepository(connection)
            task = await _owned_task(chat, owner, task_id)
            if task.task_type == DISPATCH_EXECUTION and self.groups is not None:
                return TaskView(task, await self.groups.gate_of_task(connection, task))
            return TaskView(task, await gate_of(chat, task))

    async def retry_task(self, owner: str, task_id: str) -> TaskView:
        """RetryChatTask: a new queued task for the same request message (retry_of_task_id set; the
        old task's retried_by_task_id set), its `task.requested` and a `task.updated` for both tasks,
        in one transaction. The new task goes through the thread's current metadata.

        Raises InvalidArgument (task_id), NotFound (TASK_NOT_FOUND), FailedPrecondition
        (TASK_NOT_RETRYABLE: not failed, timed_out, cancelled or expired, or retried already; and
        the send checks of `check_chat_target`; a group's dispatch_execution task is never retried
        alone). A task of the master conversation is retried by the master agent's chat
        (`MasterAgentChat.retry_task`)."""
        raise_if_any(_task_id_violations(task_id))
        if self.master is not None:
            async with self.database.read() as connection:
                asked = await _owned_task(SqlAlchemyChatRepository(connection), owner, task_id)
            if asked.project_id == master_project_id(owner):
                return await self.master.retry_task(owner, task_id)
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            chat = SqlAlchemyChatRepository(connection)
            old = await _owned_task(chat, owner, task_id)
            if not old.retryable:
                raise not_retryable_error(old)
            if old.task_type == DISPATCH_EXECUTION:
                raise FailedPrecondition(
                    f"task {task_id!r} ran a group's dispatch plan; it is not retried alone: send the "
                    "message to the group again for a new plan",
                    reason=TASK_NOT_RETRYABLE,
                )
            project = await repository.project(old.project_id)
            request = await chat.message(old.request_message_id)
            if project is None or request is None:
                raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
            thread = check_chat_target(
                project["project_id"],
                project["conversation_type"],
                project["archived_at"] is not None,
                chat_thread_of(await repository.thread(old.target_thread_id)),
            )
            now = utc_now()
            new = new_chat_task(
                f"task-{uuid.uuid4().hex}",
                owner,
                old.project_id,
                thread,
                old.request_message_id,
                now,
                retry_of_task_id=old.task_id,
            )
            retried = replace(old, retried_by_task_id=new.task_id, updated_at=now)
            if not await chat.mark_retried(retried, new.task_id):  # a concurrent retry won
                raise not_retryable_error(await chat.task(old.task_id) or old)
            await chat.insert_task(new)
            gate = await gate_of(chat, new)
            appended = await self.event_log.append(
                connection,
                [
                    task_requested_event(new, request["text"]),
                    task_updated_event(retried, await gate_of(chat, retried)),
                    task_updated_event(new, gate),
                ],
            )
        self.event_log.kick(appended)
        return TaskView(new, gate)

    async def cancel_task(self, owner: str, task_id: str) -> TaskView:
        """CancelChatTask: appends `task.cancel_requested` for a task that is queued or claimed (and,
        once cancelled, answers it as it is). The scheduler decides: a task it still holds queued or
        claimed becomes cancelled, and its `task.status_changed` brings the status and one system
        message here; a task Codex started meanwhile runs to its end, its status_detail saying so.

        Raises InvalidArgument (task_id), NotFound (TASK_NOT_FOUND: unknown or another owner's) and
        FailedPrecondition (TASK_NOT_CANCELLABLE: running, or ended other than cancelled). A task the
        master agent's model answers is cancelled here, by the master agent's chat
        (`MasterAgentChat.cancel_task`): the scheduler never held it."""
        raise_if_any(_task_id_violations(task_id))
        if self.master is not None:
            async with self.database.read() as connection:
                asked = await _owned_task(SqlAlchemyChatRepository(connection), owner, task_id)
            if is_model_task(asked):
                return await self.master.cancel_task(owner, task_id)
        async with self.database.transaction() as connection:
            chat = SqlAlchemyChatRepository(connection)
            task = await _owned_task(chat, owner, task_id)
            gate = await gate_of(chat, task)
            if task.status == CANCELLED:
                return TaskView(task, gate)
            if task.status not in CANCELLABLE_STATUSES:
                raise FailedPrecondition(
                    f"task {task_id!r} cannot be cancelled: it is {task.status.replace('_', ' ')}"
                    + (
                        " (Codex is running it; a turn that has started runs to its end)"
                        if task.status == "running"
                        else ""
                    ),
                    reason=TASK_NOT_CANCELLABLE,
                )
            requested = NewEvent(
                TASK_CANCEL_REQUESTED,
                {"owner_id": owner, "task_id": task_id, "requested_at": isoformat_utc(utc_now())},
            )
            appended = await self.event_log.append(connection, [requested])
        self.event_log.kick(appended)
        log.info("cancel of task %s requested by its owner", task_id)
        return TaskView(task, gate)

    # --- projection of the scheduler's task events (inside the consumer's transaction) ---------------

    async def apply_task_events(
        self, connection: AsyncConnection, events: list[StoredEvent]
    ) -> list[NewEvent]:
        """Applies `task.status_changed` events (the scheduler's Task as JSON) to the chat tasks.

        Each report that changes a task (`apply_status_report`: not after a terminal status, not
        older than the last one applied, not a repeat) updates its row and publishes `task.updated`.
        The first terminal status also writes exactly one message into the task's
        target_project_id (`result_message`: the thread's raw reply, or a system message), stores
        its id as the task's result_message_id and publishes `conversation.message.created`; a
        replayed event finds the task terminal and writes nothing. Events of tasks this service
        does not know (or of another owner), and malformed ones, are skipped and logged. A group's
        dispatch_execution task is applied by the group chat (`GroupHandlers.apply_dispatch_task`:
        its message is named by its thread, and its plan moves).
        """
        chat = SqlAlchemyChatRepository(connection)
        published: list[NewEvent] = []
        for event in events:
            try:
                report = parse_status_report(event.payload)
            except ValueError as error:
                log.warning("task event %s skipped: %s", event.sequence, error)
                continue
            view = await chat.task_in_view(report.task_id)
            task = view.task if view is not None else None
            if view is None or task is None or (report.owner_id and report.owner_id != task.owner_id):
                log.info("task event %s for task %s unknown here skipped", event.sequence, report.task_id)
                continue
            changed = apply_status_report(task, report, event.occurred_at)
            if changed is None:
                continue
            if task.task_type == DISPATCH_EXECUTION and self.groups is not None:  # CHAT-4: a plan's task
                published += await self.groups.apply_dispatch_task(connection, changed, report, view.project)
                continue
            open_tasks, earlier = view.open_tasks, view.earlier_open_tasks
            if is_terminal(changed.status):
                open_tasks, earlier = open_tasks - (0 if is_terminal(task.status) else 1), 0
                if view.project is None:
                    log.error(
                        "task %s ended, but its project %s is unknown", task.task_id, task.target_project_id
                    )
                else:
                    result = result_message(changed, report)
                    message, created = await write_message(
                        connection,
                        view.project,
                        author_kind=result.author_kind,
                        thread_id=result.thread_id,
                        text=result.text,
                        now=utc_now(),
                        task_id=changed.task_id,
                    )
                    changed = replace(changed, result_message_id=message["message_id"])
                    published.append(created)
            await chat.save_status(changed)
            published.append(task_updated_event(changed, collaboration_gate(open_tasks, earlier)))
        return published


# ---------------------------------------------------------------------------------------------------


async def _owned_project(repository: SqlAlchemyConversationsRepository, owner: str, project_id: str) -> Row:
    """The owner's project ("master-agent": their master agent project). Raises NotFound
    (PROJECT_NOT_FOUND) for an unknown or another owner's project."""
    if project_id == MASTER_ALIAS:
        project_id = master_project_id(owner)
    project = await repository.project(project_id) if project_id else None
    if project is None or project["owner_id"] != owner:
        raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
    return project


async def _owned_task(chat: SqlAlchemyChatRepository, owner: str, task_id: str) -> ChatTask:
    """The owner's task. Raises NotFound (TASK_NOT_FOUND) for an unknown or another owner's task."""
    task = await chat.task(task_id)
    if task is None or task.owner_id != owner:
        raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
    return task


async def answer_repeat(chat: SqlAlchemyChatRepository, stored: dict[str, Any], text: str) -> SentMessage:
    """The answer to a PostMessage whose client_message_id is stored already: the stored message
    and its current task when the text is the same. Raises AlreadyExists (CLIENT_MESSAGE_ID_REUSED)
    otherwise."""
    check_repeat_text(stored, text)
    task = await chat.current_task_of_message(stored["message_id"])
    gate = await gate_of(chat, task) if task is not None else collaboration_gate(0, 0)
    return SentMessage(stored, task, gate, created=False)


def check_repeat_text(stored: Mapping[str, Any], text: str) -> None:
    """A repeat of a stored message's client_message_id must carry the same text. Raises
    AlreadyExists (CLIENT_MESSAGE_ID_REUSED, naming client_message_id) otherwise."""
    if stored["text"] != text:
        raise AlreadyExists(
            f"client_message_id {stored['client_message_id']!r} was sent before with another text",
            reason=CLIENT_MESSAGE_ID_REUSED,
            violations=[
                FieldViolation(
                    "client_message_id", "was used for another message of this project; use a new one"
                )
            ],
        )


def _project_id_violations(project_id: str) -> list[FieldViolation]:
    """A project id no project has (empty, over 200 characters, control characters such as NUL,
    surrounding spaces) is a bad argument, not an unknown project: PostgreSQL could not even
    compare a NUL."""
    violations: list[FieldViolation] = []
    check_id("project_id", project_id, violations)
    return violations


def _task_id_violations(task_id: str) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    check_id("task_id", task_id, violations)
    return violations


def not_retryable_error(task: ChatTask) -> FailedPrecondition:
    """TASK_NOT_RETRYABLE for `task`, saying why (its status, or the retry it had already)."""
    why = (
        f"it was retried as {task.retried_by_task_id}" if task.retried_by_task_id else f"it is {task.status}"
    )
    return FailedPrecondition(
        f"task {task.task_id!r} cannot be retried: {why} (only failed, timed out, cancelled or expired "
        "tasks are retried, once)",
        reason=TASK_NOT_RETRYABLE,
    )
