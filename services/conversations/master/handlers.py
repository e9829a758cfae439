"""The master agent's chat (CHAT-2): `POST /api/v1/projects/master-agent/messages` and the retry of its
tasks, by backend (BOSS_MASTER_BACKEND, settings.py).

- `openai_api`: the user message and a queued `conversation_reply` task with no device and no thread
  (repository.is_model_task) are stored in one transaction; `MasterModelRunner` (a background task
  of the service) claims it (status running), builds the prompt from the system's state as it is
  then (prompt.py), asks the model (OpenAIMasterModel) and stores the answer as the master's message,
  or a system message saying what failed, with the task's final status, in one transaction. A send
  waits up to BOSS_MASTER_INLINE_WAIT_SECONDS for that: the reply comes back inline as
  `master_reply` (task completed); later, the answer is the task (queued or running), which ends
  the same way afterwards (`conversation.message.created`, `task.updated`).
- `master_codex_node`: the user message and a `conversation_reply` task for the master's own Codex
  thread (the owner's thread registered with is_master_main_thread) go the part-1 way: the
  scheduler hands it to that node's local agent, which runs `codex exec resume` with an instruction
  that carries the state prompt and the question; the reply comes back as the master's message.
- `none`: FAILED_PRECONDITION CHAT_PATH_NOT_AVAILABLE saying how to configure a backend; nothing is
  stored.

A retry is a new task for the same message, run as the backend runs sends now. A model task still
queued can be cancelled here (it ends cancelled with a system message; the model is never asked);
one the model is answering cannot.

Restarts: a model task still queued when a process starts is simply run (a model call has no side
effects). One still running after its whole timeout plus a margin (`abandoned_after_seconds`) lost
its process: it is failed (interrupted) with a system message, so nothing stays pending. The sweep
runs at start and every SWEEP_SECONDS, in every replica; claims and ends are conditional updates,
so two replicas never both answer or both end a task.

Published events are chat's (chat/handlers.py): `conversation.message.created`, `task.updated`,
`task.requested` (master_codex_node only), and `conversation.context_indicator.updated` when the
openai_api ring changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.waiting import wait_until_set
from services.conversations.adapters.repository import (
    Row,
    SqlAlchemyConversationsRepository,
    indicator_columns,
    indicator_of,
)
from services.conversations.chat.domain import (
    CANCELLED,
    CHAT_PATH_NOT_AVAILABLE,
    CONVERSATION_REPLY,
    QUEUED,
    RUNNING,
    TASK_NOT_CANCELLABLE,
    ChatTask,
    ChatThread,
    check_chat_target,
    is_terminal,
    new_chat_task,
)
from services.conversations.chat.handlers import (
    SentMessage,
    TaskView,
    answer_repeat,
    chat_thread_of,
    gate_of,
    not_retryable_error,
    task_requested_event,
    task_updated_event,
    write_message,
)
from services.conversations.chat.repository import SqlAlchemyChatRepository
from services.conversations.domain.model import SINGLE_DEVICE, master_project_id
from services.conversations.master.answers import (
    MasterOutcome,
    conversation_ring,
    outcome_of_answer,
    outcome_of_cancel,
    outcome_of_error,
    outcome_of_failure,
    outcome_of_loss,
)
from services.conversations.master.installation import ensure_master_project
from services.conversations.master.model import ChatMessage, MasterModel, MasterModelUnavailable
from services.conversations.master.prompt import MAX_HISTORY_MESSAGES, chat_messages, codex_instruction
from services.conversations.master.repository import SqlAlchemyMasterRepository, is_model_task
from services.conversations.master.settings import MASTER_CODEX_NODE, NO_BACKEND, OPENAI_API, MasterSettings
from services.conversations.service import indicator_event
from services.shared.db import Database
from services.shared.errors import PROJECT_NOT_FOUND, TASK_NOT_FOUND, FailedPrecondition, NotFound
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.time import utc_now

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_SECONDS = 2.0
"""How often the runner looks for queued model tasks when nothing woke it (another replica's)."""
SWEEP_SECONDS = 5.0
"""How often the runner looks for model tasks whose process was lost."""
MAX_CONCURRENT_CALLS = 4
"""Model calls one process runs at once (each master conversation answers one message at a time)."""
QUEUED_BATCH = 50
RECENT_ANSWERS = 256
"""How many ended tasks the runner remembers for sends that begin waiting after their answer."""


async def to_the_end(step: Awaitable[T]) -> T:
    """Awaits a database step; when the caller is cancelled meanwhile (the service stopping), the
    step still runs to its end before the cancellation goes on: a transaction cut short by a
    cancellation would leave its connection checked out and inside the transaction (PostgreSQL
    shows it "idle in transaction", holding its locks)."""
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


def not_configured_error() -> FailedPrecondition:
    """CHAT_PATH_NOT_AVAILABLE for BOSS_MASTER_BACKEND=none, saying how to configure a backend."""
    return FailedPrecondition(
        "the master agent has no backend configured, so nothing was stored: set BOSS_MASTER_BACKEND="
        "openai_api with BOSS_MASTER_OPENAI_BASE_URL, BOSS_MASTER_MODEL and BOSS_MASTER_OPENAI_API_KEY "
        "(any OpenAI-compatible endpoint), or BOSS_MASTER_BACKEND=master_codex_node with a Codex thread "
        "registered as the master's (is_master_main_thread), and restart conversations",
        reason=CHAT_PATH_NOT_AVAILABLE,
    )


def no_master_thread_error(owner: str) -> FailedPrecondition:
    """CHAT_PATH_NOT_AVAILABLE for master_codex_node without a live master Codex thread."""
    return FailedPrecondition(
        f"the master agent runs in its own Codex thread (master_codex_node), but owner {owner!r} has "
        "no live thread registered with is_master_main_thread; register one from its device's worker "
        "(RegisterThread with is_master_main_thread) and send again; nothing was stored",
        reason=CHAT_PATH_NOT_AVAILABLE,
    )


def model_task(task_id: str, owner: str, project_id: str, request_message_id: str, now: datetime) -> ChatTask:
    """A queued conversation_reply task the master agent's model answers (no device, no thread)."""
    return ChatTask(
        task_id=task_id,
        owner_id=owner,
        task_type=CONVERSATION_REPLY,
        status=QUEUED,
        project_id=project_id,
        target_project_id=project_id,
        target_thread_id="",
        device_id="",
        codex_folder_ref="",
        codex_thread_ref="",
        request_message_id=request_message_id,
        created_at=now,
        updated_at=now,
    )


@dataclass(frozen=True)
class Finished:
    """A model task as it ended, with what it wrote."""

    task: ChatTask
    outcome: MasterOutcome


class MasterAgentChat:
    """The master conversation's sends, and the retries and cancels of its tasks (see the module
    docstring).

    Args:
        database: the conversations database.
        event_log: its outbox.
        settings: the master agent's settings.
        model: the model (openai_api); None for the other backends.
        clock: the time source (UTC), for tests.
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        settings: MasterSettings,
        model: MasterModel | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        if settings.backend == OPENAI_API and model is None:
            raise ValueError("the openai_api backend needs a model")
        self.database = database
        self.event_log = event_log
        self.settings = settings
        self.clock = clock
        self.runner = (
            MasterModelRunner(database, event_log, model, settings, clock)
            if settings.backend == OPENAI_API and model is not None
            else None
        )

    async def post_message(self, owner: str, text: str, client_message_id: str) -> SentMessage:
        """PostMessage to the master conversation (text and client_message_id already checked).

        openai_api: waits up to `inline_wait_seconds` for the reply (`master_reply` set, task
        completed), else answers the queued or running task. master_codex_node: answers the queued
        task of the master's Codex thread. Idempotent by client_message_id as every send (a repeat
        answers the stored message, its current task and, once completed, its reply).

        Raises FailedPrecondition (CHAT_PATH_NOT_AVAILABLE: backend none, or no master Codex thread;
        THREAD_ARCHIVED / THREAD_METADATA_INCOMPLETE for that thread), AlreadyExists
        (CLIENT_MESSAGE_ID_REUSED); nothing is stored then.
        """
        if self.settings.backend == NO_BACKEND:
            raise not_configured_error()
        try:
            async with self.database.transaction() as connection:
                sent, appended = await self._post(connection, owner, text, client_message_id)
        except IntegrityError:  # a repeat raced the first send (unique client_message_id)
            async with self.database.read() as connection:
                stored = await SqlAlchemyChatRepository(connection).message_by_client_id(
                    master_project_id(owner), client_message_id
                )
                if stored is None:
                    raise
                sent = await self._repeat(connection, stored, text)
            return sent
        self.event_log.kick(appended)
        if sent.created and sent.task is not None and self.runner is not None:
            return await self.runner.answer_inline(sent)
        return sent

    async def _post(
        self, connection: AsyncConnection, owner: str, text: str, client_message_id: str
    ) -> tuple[SentMessage, list[StoredEvent]]:
        repository = SqlAlchemyConversationsRepository(connection)
        chat = SqlAlchemyChatRepository(connection)
        now = self.clock()
        project, _created = await ensure_master_project(repository, owner, now)
        stored = await chat.message_by_client_id(project["project_id"], client_message_id)
        if stored is not None:
            return await self._repeat(connection, stored, text), []
        task_id = f"task-{uuid.uuid4().hex}"
        events: list[NewEvent] = []
        if self.settings.backend == MASTER_CODEX_NODE:
            thread = await self._master_thread(connection, owner)
            state = await SqlAlchemyMasterRepository(connection).system_state(owner, now)
            message, created = await self._write_request(
                connection, project, text, client_message_id, task_id
            )
            task = new_chat_task(task_id, owner, project["project_id"], thread, message["message_id"], now)
            events += [created, task_requested_event(task, codex_instruction(state, text))]
        else:
            message, created = await self._write_request(
                connection, project, text, client_message_id, task_id
            )
            task = model_task(task_id, owner, project["project_id"], message["message_id"], now)
            events.append(created)
        await chat.insert_task(task)
        gate = await gate_of(chat, task)
        events.append(task_updated_event(task, gate))
        appended = await self.event_log.append(connection, events)
        return SentMessage(message, task, gate, created=True), appended

    async def _write_request(
        self, connection: AsyncConnection, project: Row, text: str, client_message_id: str, task_id: str
    ) -> tuple[dict[str, Any], NewEvent]:
        return await write_message(
            connection,
            project,
            author_kind="user",
            thread_id="",
            text=text,
            now=self.clock(),
            client_message_id=client_message_id,
            task_id=task_id,
        )

    async def _master_thread(self, connection: AsyncConnection, owner: str) -> ChatThread:
        """The master's Codex thread as chat sends to it. Raises FailedPrecondition (no such
        thread; archived; incomplete metadata)."""
        row = await SqlAlchemyMasterRepository(connection).master_main_thread(owner)
        if row is None:
            raise no_master_thread_error(owner)
        return check_chat_target(master_project_id(owner), SINGLE_DEVICE, False, chat_thread_of(row))

    async def _repeat(self, connection: AsyncConnection, stored: dict[str, Any], text: str) -> SentMessage:
        """`answer_repeat`, with the master's reply when the task completed with one."""
        chat = SqlAlchemyChatRepository(connection)
        sent = await answer_repeat(chat, stored, text)
        if sent.task is None or not sent.task.result_message_id:
            return sent
        result = await chat.message(sent.task.result_message_id)
        if result is not None and result["author_kind"] == "master":
            return replace(sent, master_reply=str(result["text"]))
        return sent

    async def cancel_task(self, owner: str, task_id: str) -> TaskView:
        """CancelChatTask for a task the model answers: a queued one ends cancelled with a system
        message at once (the model is never asked); a cancelled one is answered as it is.

        Raises NotFound (TASK_NOT_FOUND), FailedPrecondition (TASK_NOT_CANCELLABLE: the model is
        answering it, or it ended otherwise)."""
        async with self.database.read() as connection:
            task = await SqlAlchemyChatRepository(connection).task(task_id)
        if task is None or task.owner_id != owner:
            raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
        if task.status == QUEUED and self.runner is not None:
            finished = await self.runner.end(task, outcome_of_cancel(), QUEUED)
            if finished is not None:
                async with self.database.read() as connection:
                    return TaskView(
                        finished.task, await gate_of(SqlAlchemyChatRepository(connection), finished.task)
                    )
        async with self.database.read() as connection:
            chat = SqlAlchemyChatRepository(connection)
            task = await chat.task(task_id) or task
            if task.status == CANCELLED:
                return TaskView(task, await gate_of(chat, task))
        raise FailedPrecondition(
            f"task {task_id!r} cannot be cancelled: it is {task.status.replace('_', ' ')}"
            + (" (the model is answering it)" if task.status == RUNNING else ""),
            reason=TASK_NOT_CANCELLABLE,
        )

    async def retry_task(self, owner: str, task_id: str) -> TaskView:
        """RetryChatTask for a master task: a new task for the same user message, run the way the
        backend runs sends now (openai_api: the runner answers it; master_codex_node: a new task
        for the master's Codex thread with the state as it is now). The old task's
        retried_by_task_id names the new one.

        Raises NotFound (TASK_NOT_FOUND), FailedPrecondition (TASK_NOT_RETRYABLE, and the send's
        CHAT_PATH_NOT_AVAILABLE, THREAD_ARCHIVED, THREAD_METADATA_INCOMPLETE)."""
        if self.settings.backend == NO_BACKEND:
            raise not_configured_error()
        async with self.database.transaction() as connection:
            chat = SqlAlchemyChatRepository(connection)
            old = await chat.task(task_id)
            if old is None or old.owner_id != owner:
                raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
            if not old.retryable:
                raise not_retryable_error(old)
            request = await chat.message(old.request_message_id)
            project = await SqlAlchemyConversationsRepository(connection).project(old.project_id)
            if request is None or project is None:
                raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
            now = self.clock()
            new_id = f"task-{uuid.uuid4().hex}"
            events: list[NewEvent] = []
            if self.settings.backend == MASTER_CODEX_NODE:
                thread = await self._master_thread(connection, owner)
                state = await SqlAlchemyMasterRepository(connection).system_state(owner, now)
                new = new_chat_task(
                    new_id,
                    owner,
                    old.project_id,
                    thread,
                    old.request_message_id,
                    now,
                    retry_of_task_id=old.task_id,
                )
                events.append(task_requested_event(new, codex_instruction(state, str(request["text"]))))
            else:
                new = replace(
                    model_task(new_id, owner, old.project_id, old.request_message_id, now),
                    retry_of_task_id=old.task_id,
                )
            retried = replace(old, retried_by_task_id=new.task_id, updated_at=now)
            if not await chat.mark_retried(retried, new.task_id):
                raise not_retryable_error(await chat.task(old.task_id) or old)
            await chat.insert_task(new)
            gate = await gate_of(chat, new)
            events += [
                task_updated_event(retried, await gate_of(chat, retried)),
                task_updated_event(new, gate),
            ]
            appended = await self.event_log.append(connection, events)
        self.event_log.kick(appended)
        if self.runner is not None:
            self.runner.wake()
        return TaskView(new, gate)


class MasterModelRunner:
    """Runs the model tasks (openai_api): claims queued ones, one per master conversation at a time
    and at most MAX_CONCURRENT_CALLS at once, asks the model and stores the outcome; fails the
    tasks whose process was lost. `run` is the service's background task."""

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        model: MasterModel,
        settings: MasterSettings,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.model = model
        self.settings = settings
        self.clock = clock
        self._wake = asyncio.Event()
        self._waiters: dict[str, list[asyncio.Future[Finished]]] = {}
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._answering: set[str] = set()
        self._recent: dict[str, Finished] = {}

    def wake(self) -> None:
        """Makes the runner look for queued tasks now."""
        self._wake.set()

    async def answer_inline(self, sent: SentMessage) -> SentMessage:
        """`sent` with the reply when the task ends within the inline wait (master_reply set when
        the model answered; the task failed, with its system message stored, when it could not),
        else `sent` with the task as it is now (queued or running)."""
        assert sent.task is not None
        task_id = sent.task.task_id
        future: asyncio.Future[Finished] = asyncio.get_running_loop().create_future()
        if task_id in self._recent:  # answered before this wait began
            future.set_result(self._recent[task_id])
        self._waiters.setdefault(task_id, []).append(future)
        self.wake()
        try:
            async with asyncio.timeout(self.settings.inline_wait_seconds):
                finished = await asyncio.shield(future)
        except TimeoutError:
            async with self.database.read() as connection:
                chat = SqlAlchemyChatRepository(connection)
                task = await chat.task(task_id) or sent.task
                reply = None
                if task.result_message_id:
                    result = await chat.message(task.result_message_id)
                    reply = str(result["text"]) if result and result["author_kind"] == "master" else None
                return replace(sent, task=task, gate=await gate_of(chat, task), master_reply=reply)
        finally:
            waiting = self._waiters.get(task_id, [])
            if future in waiting:
                waiting.remove(future)
            if not waiting:
                self._waiters.pop(task_id, None)
        reply = finished.outcome.text if finished.outcome.author_kind == "master" else None
        async with self.database.read() as connection:
            gate = await gate_of(SqlAlchemyChatRepository(connection), finished.task)
        return replace(sent, task=finished.task, gate=gate, master_reply=reply)

    async def run(self) -> None:
        """Until cancelled: sweeps lost calls (at start, then every SWEEP_SECONDS) and starts the
        queued tasks it may (at start, when woken, and every POLL_SECONDS). Database errors are
        logged and retried on the next round."""
        last_sweep = 0.0
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._wake.clear()
                try:
                    if loop.time() - last_sweep >= SWEEP_SECONDS:
                        await to_the_end(self.sweep_lost_calls())
                        last_sweep = loop.time()
                    await to_the_end(self._start_queued())
                except Exception:  # the database may be away; the next round retries
                    log.exception("the master agent's runner could not look at its tasks")
                await wait_until_set(self._wake, POLL_SECONDS)
        finally:
            calls = list(self._calls.values())
            for call in calls:
                call.cancel()
            for call in calls:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await call

    async def sweep_lost_calls(self) -> list[str]:
        """Fails (interrupted, with a system message) every model task still running
        `abandoned_after_seconds` after its start, when this process is not running it. Returns
        their ids."""
        now = self.clock()
        before = now - timedelta(seconds=self.settings.abandoned_after_seconds)
        async with self.database.read() as connection:
            lost = await SqlAlchemyMasterRepository(connection).running_model_tasks_since(before)
        ended: list[str] = []
        for task in lost:
            if task.task_id in self._calls:
                continue
            log.warning(
                "master task %s was running since %s in a lost process; failing it",
                task.task_id,
                task.updated_at,
            )
            if await self._finish(task, outcome_of_loss(task.updated_at, now), 0) is not None:
                ended.append(task.task_id)
        return ended

    async def _start_queued(self) -> None:
        if len(self._calls) >= MAX_CONCURRENT_CALLS:
            return
        async with self.database.read() as connection:
            masters = SqlAlchemyMasterRepository(connection)
            queued = await masters.queued_model_tasks(QUEUED_BATCH)
            if not queued:
                return
            answering = await masters.projects_answering()
        for task in queued:
            if len(self._calls) >= MAX_CONCURRENT_CALLS:
                return
            if task.project_id in self._answering or task.project_id in answering:
                continue
            claimed = await self._claim(task)
            answering.add(task.project_id)
            if claimed is None:
                continue
            self._answering.add(task.project_id)
            self._calls[task.task_id] = asyncio.create_task(
                self._answer(claimed), name=f"master-{task.task_id}"
            )

    async def _claim(self, task: ChatTask) -> ChatTask | None:
        """queued -> running (conditional, with its `task.updated`); None when another process
        claimed it first."""
        running = replace(task, status=RUNNING, updated_at=self.clock())
        async with self.database.transaction() as connection:
            chat = SqlAlchemyChatRepository(connection)
            if not await SqlAlchemyMasterRepository(connection).move(running, QUEUED):
                return None
            appended = await self.event_log.append(
                connection, [task_updated_event(running, await gate_of(chat, running))]
            )
        self.event_log.kick(appended)
        return running

    async def _answer(self, task: ChatTask) -> None:
        """Asks the model for one task and stores the outcome (any error of Boss's own ends the task
        with a system message too); then hands the result to inline waiters."""
        finished: Finished | None = None
        try:
            total_tokens = 0
            try:
                messages = await to_the_end(self._prompt(task))
                answer = await self.model.complete(messages, timeout_s=self.settings.timeout_seconds)
                outcome = outcome_of_answer(answer)
                total_tokens = answer.total_tokens
            except MasterModelUnavailable as error:
                outcome = outcome_of_failure(str(error))
            except Exception:
                log.exception("asking the master agent's model for task %s failed", task.task_id)
                outcome = outcome_of_error()
            finished = await to_the_end(self._finish(task, outcome, total_tokens))
            if finished is not None:
                self._recent[task.task_id] = finished
                while len(self._recent) > RECENT_ANSWERS:
                    self._recent.pop(next(iter(self._recent)))
        except Exception:
            log.exception(
                "storing the master agent's answer to task %s failed; the sweep will end it", task.task_id
            )
        finally:
            self._calls.pop(task.task_id, None)
            self._answering.discard(task.project_id)
            for future in self._waiters.pop(task.task_id, []):
                if finished is not None and not future.done():
                    future.set_result(finished)
            self.wake()

    async def _prompt(self, task: ChatTask) -> list[ChatMessage]:
        """The chat messages for a task: the state and history as they are now, then its question."""
        async with self.database.read() as connection:
            chat = SqlAlchemyChatRepository(connection)
            request = await chat.message(task.request_message_id)
            if request is None:
                raise LookupError(f"request message {task.request_message_id} of {task.task_id} is gone")
            masters = SqlAlchemyMasterRepository(connection)
            state = await masters.system_state(task.owner_id, self.clock())
            history = await masters.history_before(
                task.project_id, int(request["sequence"]), MAX_HISTORY_MESSAGES
            )
        return chat_messages(state, history, str(request["text"]))

    async def end(self, task: ChatTask, outcome: MasterOutcome, from_status: str) -> Finished | None:
        """Ends a task that still has `from_status` with `outcome` (a cancel of a queued one), as
        `_finish` does; None when it had moved on. Inline waiters get the result."""
        finished = await to_the_end(self._finish(task, outcome, 0, from_status))
        if finished is not None:
            for future in self._waiters.pop(task.task_id, []):
                if not future.done():
                    future.set_result(finished)
        return finished

    async def _finish(
        self, task: ChatTask, outcome: MasterOutcome, total_tokens: int, from_status: str = RUNNING
    ) -> Finished | None:
        """Ends a task that has `from_status` (running) with `outcome` in one transaction: the
        status (conditional: None when it had ended already), the message, the ring when it
        changed, and their events."""
        now = self.clock()
        ended = replace(
            task,
            status=outcome.status,
            failure_kind=outcome.failure_kind,
            status_detail=outcome.status_detail,
            updated_at=now,
        )
        async with self.database.transaction() as connection:
            repository = SqlAlchemyConversationsRepository(connection)
            masters = SqlAlchemyMasterRepository(connection)
            chat = SqlAlchemyChatRepository(connection)
            if not await masters.move(ended, from_status):
                log.info("master task %s had ended already; its late answer is dropped", task.task_id)
                return None
            project = await repository.project(task.target_project_id)
            if project is None:
                raise NotFound(f"project {task.target_project_id!r} not found", reason=PROJECT_NOT_FOUND)
            message, created = await write_message(
                connection,
                project,
                author_kind=outcome.author_kind,
                thread_id="",
                text=outcome.text,
                now=now,
                task_id=task.task_id,
            )
            ended = replace(ended, result_message_id=message["message_id"])
            await masters.set_result_message(task.task_id, message["message_id"])
            events: list[NewEvent] = [created, task_updated_event(ended, await gate_of(chat, ended))]
            ring = conversation_ring(total_tokens, self.model.context_window_tokens, now)
            if ring is not None and not ring.shows_the_same_as(indicator_of(project)):
                await repository.update_project(project["project_id"], indicator_columns(ring))
                shown = await repository.project(project["project_id"])
                assert shown is not None
                events.append(indicator_event(shown, ring))
            appended = await self.event_log.append(connection, events)
        self.event_log.kick(appended)
        assert is_terminal(ended.status) and is_model_task(ended)
        return Finished(ended, outcome)
