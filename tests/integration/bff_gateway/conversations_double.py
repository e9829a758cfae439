"""A test double of the conversations gRPC peer for the gateway's owner check (ownership.py) and
its chat routes (routers/chat.py).

A real grpc.aio server (ServiceHost, rich errors) with the conversations service's owner rule: the
bearer token is verified, conversations:read (conversations:write to send or retry) is required, a
client token acts for its own owner_id (a service token names the owner in the request, empty
meaning "local"), and another owner's thread, project or task is NOT_FOUND as an unknown one.

- GetThreadContextBudget: which thread belongs to which owner is set by the test in `owners`;
  `calls` records (thread_id, token) of every call.
- PostMessage, ListMessages, GetChatTask, RetryChatTask (`chat`, a ChatLedger in memory): every
  project id is a single-thread project of the first owner that uses it, except "master-agent"
  (FAILED_PRECONDITION CHAT_PATH_NOT_AVAILABLE) and the ids in `incomplete_projects` (FAILED_PRECONDITION
  THREAD_METADATA_INCOMPLETE with a PreconditionFailure naming the missing fields). A send stores
  the message with the next sequence and a queued task; the same client_message_id again answers
  both (created false), with another text it is ALREADY_EXISTS CLIENT_MESSAGE_ID_REUSED. A task the
  test marks failed (`ChatLedger.finish`) can be retried once.

It is NOT the conversations service, whose own rules are tested in tests/integration/conversations.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc

from services.shared.auth import (
    SCOPE_CONVERSATIONS_READ,
    SCOPE_CONVERSATIONS_WRITE,
    Principal,
    TokenAuthority,
)
from services.shared.errors import (
    PROJECT_NOT_FOUND,
    TASK_NOT_FOUND,
    THREAD_NOT_FOUND,
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PreconditionViolation,
)
from services.shared.grpc_server import ServiceHost, translate_errors
from services.shared.time import to_timestamp, utc_now

CONVERSATIONS_SERVICE = pb.DESCRIPTOR.services_by_name["ConversationsService"].full_name
MASTER_AGENT = "master-agent"
RETRYABLE = ("failed", "timed_out", "cancelled", "expired")


def _owner_of(principal: Principal, requested: str) -> str:
    """The owner a call acts for: a client token's own, else the request's (empty: "local")."""
    return principal.owner_id if principal.kind == "client" else (requested or "local")


@dataclass
class ChatLedger:
    """The double's chat state: project owners, messages by project, tasks by id, sends by key."""

    incomplete_projects: dict[str, list[str]] = field(default_factory=dict)
    send_delay_seconds: float = 0.0
    """How long a send takes before it stores anything (a master model drafting a plan, say)."""
    project_owners: dict[str, str] = field(default_factory=dict)
    messages: dict[str, list[pb.Message]] = field(default_factory=dict)
    tasks: dict[str, tuple[str, pb.ChatTask]] = field(default_factory=dict)
    sends: dict[tuple[str, str], tuple[pb.Message, pb.ChatTask]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def project(self, owner: str, project_id: str) -> str:
        """The owner's project (claimed by its first owner); NOT_FOUND for another owner's."""
        if self.project_owners.setdefault(project_id, owner) != owner:
            raise NotFound(f"project {project_id!r} not found", reason=PROJECT_NOT_FOUND)
        return project_id

    def task(self, owner: str, task_id: str) -> pb.ChatTask:
        """The owner's task; NOT_FOUND (TASK_NOT_FOUND) for an unknown or another owner's."""
        found = self.tasks.get(task_id)
        if found is None or found[0] != owner:
            raise NotFound(f"task {task_id!r} not found", reason=TASK_NOT_FOUND)
        return found[1]

    def new_task(
        self, owner: str, project_id: str, request_message_id: str, retry_of: str = ""
    ) -> pb.ChatTask:
        """A queued conversation_reply task for the project's thread."""
        now = to_timestamp(utc_now())
        task = pb.ChatTask(
            task_id=f"task-{next(self.ids)}",
            task_type="conversation_reply",
            status="queued",
            project_id=project_id,
            target_project_id=project_id,
            target_thread_id=f"thread-of-{project_id}",
            device_id="node-a",
            codex_folder_ref="/srv/work",
            codex_thread_ref="019b0000-0000-7000-8000-000000000001",
            request_message_id=request_message_id,
            retry_of_task_id=retry_of,
            created_at=now,
            updated_at=now,
        )
        self.tasks[task.task_id] = (owner, task)
        return task

    def finish(self, task_id: str, status: str, failure_kind: str = "", detail: str = "") -> None:
        """Ends a task as the scheduler would (for retry tests)."""
        task = self.tasks[task_id][1]
        task.status, task.failure_kind, task.status_detail = status, failure_kind, detail

    @staticmethod
    def gate() -> pb.CollaborationGate:
        """The gate of a thread chat with one task queued."""
        return pb.CollaborationGate(state="open", tasks_total=1, tasks_done=0)


@dataclass
class ConversationsDouble(pb_grpc.ConversationsServiceServicer):
    """The controllable peer: `owners` maps thread_id -> owner_id."""

    authority: TokenAuthority
    owners: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    chat: ChatLedger = field(default_factory=ChatLedger)

    @translate_errors
    async def GetThreadContextBudget(
        self, request: pb.GetThreadContextBudgetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetThreadContextBudgetResponse:
        """A minimal thread page of the caller's owner's thread; NOT_FOUND otherwise."""
        principal = self.authority.verify_grpc(context)
        header = dict(context.invocation_metadata() or ())["authorization"]
        self.calls.append((request.thread_id, header.partition(" ")[2]))
        principal.require(SCOPE_CONVERSATIONS_READ)
        owner = principal.owner_id if principal.kind == "client" else (request.owner_id or "local")
        if self.owners.get(request.thread_id) != owner:
            raise NotFound(f"thread {request.thread_id!r} not found", reason=THREAD_NOT_FOUND)
        return pb.GetThreadContextBudgetResponse(
            thread_context_budget=pb.ThreadContextBudget(
                thread=pb.Thread(thread_id=request.thread_id, owner_id=owner),
                context=pb.ThreadContextSummary(thread_id=request.thread_id),
                handoff_status="none",
            )
        )

    def _caller(self, context: grpc.aio.ServicerContext, scope: str, requested_owner: str) -> str:
        principal = self.authority.verify_grpc(context)
        principal.require(scope)
        return _owner_of(principal, requested_owner)

    @translate_errors
    async def PostMessage(
        self, request: pb.PostMessageRequest, context: grpc.aio.ServicerContext
    ) -> pb.PostMessageResponse:
        """Stores a user message and its queued task, idempotently by client_message_id."""
        owner = self._caller(context, SCOPE_CONVERSATIONS_WRITE, request.owner_id)
        if request.project_id == MASTER_AGENT:
            raise FailedPrecondition(
                "the master agent's chat is not built yet", reason="CHAT_PATH_NOT_AVAILABLE"
            )
        project_id = self.chat.project(owner, request.project_id)
        missing = self.chat.incomplete_projects.get(project_id)
        if missing is not None:
            raise FailedPrecondition(
                f"the thread's metadata is incomplete: {', '.join(missing)}",
                reason="THREAD_METADATA_INCOMPLETE",
                violations=[
                    PreconditionViolation("THREAD_METADATA", name, f"{name} is not set") for name in missing
                ],
            )
        if not request.text.strip():
            raise InvalidArgument([FieldViolation("text", "must not be empty")])
        await asyncio.sleep(self.chat.send_delay_seconds)
        sent = self.chat.sends.get((owner, request.client_message_id))
        if sent is not None:
            message, task = sent
            if message.text != request.text or message.project_id != project_id:
                raise AlreadyExists(
                    "client_message_id was used for another message",
                    reason="CLIENT_MESSAGE_ID_REUSED",
                    violations=[FieldViolation("client_message_id", "already used for another message")],
                )
            return pb.PostMessageResponse(
                message=message, task=task, collaboration_gate=self.chat.gate(), created=False
            )
        stored = self.chat.messages.setdefault(project_id, [])
        message = pb.Message(
            message_id=f"msg-{next(self.chat.ids)}",
            project_id=project_id,
            author_kind="user",
            text=request.text,
            created_at=to_timestamp(utc_now()),
            sequence=len(stored) + 1,
            client_message_id=request.client_message_id,
        )
        task = self.chat.new_task(owner, project_id, message.message_id)
        message.task_id = task.task_id
        stored.append(message)
        self.chat.sends[(owner, request.client_message_id)] = (message, task)
        return pb.PostMessageResponse(
            message=message, task=task, collaboration_gate=self.chat.gate(), created=True
        )

    @translate_errors
    async def ListMessages(
        self, request: pb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMessagesResponse:
        """Messages after `after_sequence`, oldest first; page tokens are "after:<sequence>"."""
        owner = self._caller(context, SCOPE_CONVERSATIONS_READ, request.owner_id)
        project_id = self.chat.project(owner, request.project_id)
        after = request.after_sequence
        if request.page_token:
            prefix, _, number = request.page_token.partition(":")
            if prefix != "after" or not number.isdigit():
                raise InvalidArgument([FieldViolation("page_token", "not a token this call handed out")])
            after = max(after, int(number))
        size = request.page_size or 50
        rest = [m for m in self.chat.messages.get(project_id, []) if m.sequence > after]
        page = rest[:size]
        token = f"after:{page[-1].sequence}" if len(rest) > size else ""
        return pb.ListMessagesResponse(messages=page, next_page_token=token)

    @translate_errors
    async def GetChatTask(
        self, request: pb.GetChatTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetChatTaskResponse:
        """The owner's task and the gate."""
        owner = self._caller(context, SCOPE_CONVERSATIONS_READ, request.owner_id)
        task = self.chat.task(owner, request.task_id)
        return pb.GetChatTaskResponse(task=task, collaboration_gate=self.chat.gate())

    @translate_errors
    async def RetryChatTask(
        self, request: pb.RetryChatTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.RetryChatTaskResponse:
        """A new queued task for a failed, timed out, cancelled or expired task's message, once."""
        owner = self._caller(context, SCOPE_CONVERSATIONS_WRITE, request.owner_id)
        old = self.chat.task(owner, request.task_id)
        if old.status not in RETRYABLE or old.retried_by_task_id:
            raise FailedPrecondition(f"task {old.task_id!r} is {old.status}", reason="TASK_NOT_RETRYABLE")
        task = self.chat.new_task(owner, old.project_id, old.request_message_id, retry_of=old.task_id)
        old.retried_by_task_id = task.task_id
        return pb.RetryChatTaskResponse(task=task, collaboration_gate=self.chat.gate())


@dataclass
class RunningConversations:
    """A started double: its servicer and the address it listens on."""

    servicer: ConversationsDouble
    address: str
    server: grpc.aio.Server

    async def stop(self) -> None:
        """Stops the server at once."""
        await self.server.stop(0)


async def start_conversations(authority: TokenAuthority, owners: dict[str, str]) -> RunningConversations:
    """Starts a double on 127.0.0.1 (a free port) in the running event loop."""
    servicer = ConversationsDouble(authority=authority, owners=dict(owners))
    host = ServiceHost(
        name="conversations_double",
        listen="127.0.0.1:0",
        register=lambda server: pb_grpc.add_ConversationsServiceServicer_to_server(servicer, server),
        service_names=[CONVERSATIONS_SERVICE],
    )
    server, _health, port = await host.start()
    return RunningConversations(servicer=servicer, address=f"127.0.0.1:{port}", server=server)
