"""JSON shapes of the chat resources (pydantic models; OpenAPI is generated from them).

The resources keep the seed's camelCase names (issue "Chat, part 1": `masterReply`, `dispatchPlan`,
`task {taskId, taskType, status}`, `collaborationGate`, and the task's `projectId`,
`targetProjectId`, `targetThreadId`, `deviceId`, `codexFolderRef`, `codexThreadRef`,
`requestMessageId`); the send body keeps the issue's `text` and `client_message_id`, so a 422 names
the field the caller wrote. Instants are RFC 3339 UTC with `Z`, null when unset; an optional id or
kind that is not set is null, never "".
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from services.bff_gateway.schemas import JSON_SAFE_INTEGER_MAX, Text

MAX_TEXT_LENGTH = 100_000
"""Longest message text, in characters (the PostMessage contract)."""
CLIENT_MESSAGE_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,200}$"
"""The client's idempotency key: 1-200 characters of [A-Za-z0-9._:-] (the PostMessage contract)."""

AuthorKindName = Literal["user", "thread", "master", "system"]
TaskTypeName = Literal["conversation_reply", "dispatch_execution"]
TaskStatusName = Literal[
    "queued", "claimed", "running", "completed", "failed", "timed_out", "cancelled", "expired"
]
GateStateName = Literal["open", "awaiting_confirmation", "executing", "summarising"]
PlanStatusName = Literal["proposed", "confirmed", "rejected", "expired", "superseded"]
TargetStatusName = Literal["proposed", "dropped", "skipped", "dispatched"]
MAX_DROPPED_TARGETS = 100


def _not_blank(value: str) -> str:
    """Rejects text made of whitespace only."""
    if not value.strip():
        raise ValueError("must not be empty or whitespace only")
    return value


def _matches_client_message_id(value: str) -> str:
    """Rejects keys outside CLIENT_MESSAGE_ID_PATTERN, with the rule in words. (A `pattern`
    constraint would say only "String should match pattern ...".)"""
    if not re.fullmatch(CLIENT_MESSAGE_ID_PATTERN, value):
        raise ValueError("must be 1-200 characters of A-Z, a-z, 0-9, '.', '_', ':' or '-'")
    return value


class SendMessageBody(BaseModel):
    """Body of `POST /api/v1/projects/{project_id}/messages`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "run the tests again", "client_message_id": "c-7f3a.1"}]},
    )

    text: Annotated[Text, AfterValidator(_not_blank)] = Field(
        min_length=1,
        max_length=MAX_TEXT_LENGTH,
        description="The message, 1-100,000 characters, not only whitespace.",
    )
    client_message_id: Annotated[str, AfterValidator(_matches_client_message_id)] = Field(
        min_length=1,
        max_length=200,
        json_schema_extra={"pattern": CLIENT_MESSAGE_ID_PATTERN},
        description=(
            "The client's idempotency key (1-200 characters of A-Z a-z 0-9 . _ : -): sending it again "
            "answers the stored message and task (200), never a second task."
        ),
    )


class ChatView(BaseModel):
    """Base of the chat resources: camelCase JSON names (built in Python by their snake_case names)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class MessageView(ChatView):
    """One stored message of a project conversation."""

    message_id: str
    project_id: str
    author_kind: AuthorKindName = Field(
        description="user, thread (a thread's raw reply), master, or system (what failed, in words)."
    )
    thread_id: str | None = Field(description="The thread that wrote a thread message; null otherwise.")
    text: str
    created_at: datetime | None = Field(description="When it was stored (UTC).")
    sequence: int = Field(
        ge=0,
        le=JSON_SAFE_INTEGER_MAX,
        description=(
            "Position in its conversation: 1, 2, 3, ... without gaps. `GET .../messages?after=` with "
            "the last one a client has returns exactly what it missed."
        ),
    )
    client_message_id: str | None = Field(description="A user message's idempotency key; null otherwise.")
    task_id: str | None = Field(
        description="The task this message requested (user message) or ended (reply or system message)."
    )


class ChatTaskView(ChatView):
    """A chat task as the conversation sees it (the scheduler owns the task and its lease)."""

    task_id: str
    task_type: TaskTypeName
    status: TaskStatusName = Field(
        description=(
            "queued -> claimed -> running -> completed | failed | timed_out | cancelled | expired. "
            "Every terminal status has written exactly one message (`resultMessageId`)."
        )
    )
    project_id: str = Field(description="The conversation the task was asked from.")
    target_project_id: str = Field(description="The project of the thread that runs it.")
    target_thread_id: str
    device_id: str = Field(description="The node that runs the thread.")
    codex_folder_ref: str = Field(description="The Codex working folder on that node.")
    codex_thread_ref: str = Field(description="Codex's session id of the thread (`codex exec resume`).")
    request_message_id: str = Field(description="The user message the task answers.")
    result_message_id: str | None = Field(
        description="The message that ended the task (the reply or a system message); null until then."
    )
    failure_kind: str | None = Field(
        description=(
            "Why it failed, as classified: session_not_found, thread_busy, not_logged_in, "
            "model_error, stalled, timed_out, could_not_start, no_reply, device_lost, interrupted, "
            "other; null when it did not fail."
        )
    )
    status_detail: str | None = Field(
        description="In words: why it failed, or, while queued, that its device is offline; null if none."
    )
    device_last_seen_at: datetime | None = Field(
        description="When the device's local agent was last seen (UTC); null when unknown."
    )
    retry_of_task_id: str | None = Field(description="The task this one retries; null if it is no retry.")
    retried_by_task_id: str | None = Field(description="The retry of this task, once retried; else null.")
    created_at: datetime | None
    updated_at: datetime | None


class CollaborationGateView(ChatView):
    """Where the project's collaboration stands: what the client may do next (CHAT-5)."""

    state: GateStateName = Field(
        description=(
            "open (send freely; a thread's messages run in order), awaiting_confirmation (a dispatch "
            "plan waits for the user), executing (a plan's tasks run), summarising (the master agent "
            "sums up)."
        )
    )
    tasks_total: int = Field(
        ge=0,
        description=(
            "Tasks of the current plan or message and how many of them are done; in a thread chat "
            "(always open): the thread's tasks not yet ended, and 0 done."
        ),
    )
    tasks_done: int = Field(ge=0, description="How many of `tasksTotal` have ended.")
    detail: str = Field(
        description='In words, e.g. "1 earlier message of this thread runs first"; "" when none runs first.'
    )


class DispatchTargetView(ChatView):
    """One thread a dispatch plan sends the group's message to."""

    target_id: str = Field(description='"t1", "t2", ... best first; name it in `dropped_target_ids`.')
    position: int = Field(ge=1)
    kind: Literal["member", "relay"] = Field(
        description="member: a thread of the group; relay: a new Codex thread in a member's folder (no "
        "member could take new work)."
    )
    thread_id: str = Field(description="The member thread's id; a relay's is \"relay-...\" (not registered).")
    thread_title: str
    device_id: str = Field(description="The node that runs it.")
    codex_folder_ref: str
    codex_thread_ref: str | None = Field(description="Codex's session id; null for a relay (a new thread).")
    instruction: str = Field(description="What the thread is sent: the master model's draft or your text.")
    reason: str = Field(description="Why this thread, in words (level, budget left, idle or busy).")
    remaining_pct: float | None = Field(
        ge=0, le=100, description="Its budget at the proposal, percent left (null when not reported)."
    )
    level: str | None = Field(description="safe | watch at the proposal; null when not reported.")
    relay_of_thread_id: str | None = Field(description="A relay's host member; null otherwise.")
    status: TargetStatusName = Field(
        description="proposed, dropped (by you), skipped (could no longer take work at the confirmation: "
        "`statusDetail` says why), dispatched (its task was requested)."
    )
    status_detail: str | None
    task_id: str | None = Field(description="Its dispatch_execution task once dispatched; null before.")
    task_status: TaskStatusName | None = Field(description="That task's status; null before.")


class DispatchLeftOutView(ChatView):
    """A member the plan does not send the message to, and why."""

    thread_id: str
    thread_title: str
    reason: str = Field(description='In words, e.g. "critical (3.2 % left): it wraps up and hands off first"')


class DispatchPlanView(ChatView):
    """The master agent's dispatch plan for a group message (CHAT-4; seed `dispatchPlan`)."""

    plan_id: str
    project_id: str = Field(description="The group.")
    request_message_id: str = Field(description="The user message it answers.")
    status: PlanStatusName = Field(
        description="proposed -> confirmed | rejected | expired | superseded (a newer message replaced it)."
    )
    targets: list[DispatchTargetView]
    left_out: list[DispatchLeftOutView]
    drafted_by: Literal["master_model", "user_text"]
    drafting_note: str | None = Field(
        description="Why your text is used although a model was asked (it failed, was late, or answered "
        "something unusable); null otherwise."
    )
    created_at: datetime | None
    expires_at: datetime | None = Field(description="Confirm before this (UTC).")
    decided_at: datetime | None
    updated_at: datetime | None
    superseded_by_plan_id: str | None
    summary_status: Literal["pending", "posted"] | None = Field(
        description="null while tasks run (or before the confirmation); pending: every task ended and "
        "the master agent summarises; posted: `summaryMessageId` is the summary."
    )
    summary_message_id: str | None


class DispatchPlanAnswer(ChatView):
    """A plan and its group's collaboration gate (get and reject answers)."""

    dispatch_plan: DispatchPlanView
    collaboration_gate: CollaborationGateView


class ConfirmDispatchPlanBody(BaseModel):
    """Body of `POST /api/v1/dispatch-plans/{plan_id}/confirm` (optional: no body keeps every target)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"dropped_target_ids": ["t2"]}]}
    )

    dropped_target_ids: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=MAX_DROPPED_TARGETS,
        description="Targets not to send to (their targetId); at least one target must be kept.",
    )


class ConfirmDispatchPlanAnswer(ChatView):
    """The confirmed plan, its dispatch_execution tasks (plan order) and the group's gate."""

    dispatch_plan: DispatchPlanView
    tasks: list[ChatTaskView]
    collaboration_gate: CollaborationGateView


class SendMessageAnswer(ChatView):
    """Answer of a send (CHAT-5): the seed's four fields plus the stored message."""

    message: MessageView
    master_reply: str | None = Field(description="The master agent's inline reply; null in a thread chat.")
    dispatch_plan: DispatchPlanView | None = Field(
        description="A group's dispatch plan for the message, waiting for your confirmation "
        "(`collaborationGate.state` awaiting_confirmation); null elsewhere, and when no thread could "
        "take the message (the master agent's message says why)."
    )
    task: ChatTaskView | None = Field(description="The task created for the message; null when none was.")
    collaboration_gate: CollaborationGateView


class MessagePage(ChatView):
    """A page of a conversation's messages, oldest first."""

    messages: list[MessageView]
    next_page_token: str | None = Field(description="Pass as page_token for the next page; null at the end.")
    pending_dispatch_plan: DispatchPlanView | None = Field(
        default=None,
        description="Groups: the dispatch plan waiting for your confirmation (the client's "
        "pending_dispatch_plan state after a reconnect or restart); null when none waits.",
    )
    collaboration_gate: CollaborationGateView | None = Field(
        default=None, description="Groups: where the group stands; null for other projects."
    )
    executing_dispatch_plans: list[DispatchPlanView] = Field(
        default_factory=list,
        description="Groups: the confirmed dispatch plans whose summary is not posted yet (newest "
        'first), so a reload or another tab shows their progress "k of N done"; empty otherwise.',
    )


class ChatTaskAnswer(ChatView):
    """One chat task and its project's collaboration gate (polling and retry answers)."""

    task: ChatTaskView
    collaboration_gate: CollaborationGateView
