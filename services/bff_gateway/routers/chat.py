"""Chat endpoints (SPEC CHAT-3, CHAT-5, CHAT-6) over the conversations service.

| method and path | what |
|---|---|
| POST /api/v1/projects/{project_id}/messages | send `{text, client_message_id}`: 201 created, 200 repeat |
| GET /api/v1/projects/{project_id}/messages | messages oldest first; `?after=N` exactly those missed |
| GET /api/v1/tasks/{task_id} | one chat task and its project's collaboration gate (polling) |
| POST /api/v1/tasks/{task_id}/retry | a new task for the same user message of an ended one: 201 |

Client tokens only (they act for their own owner): conversations:write to send and retry,
conversations:read to read; any other token is 403 (a worker token lacks the scope:
SCOPE_MISSING; a service token names no person: CLIENT_TOKEN_REQUIRED), checked before a body is
read (request_body.py). Another owner's project or task is 404, as an unknown one.

Conversations' errors come back as problem+json: 422 naming `text`, `client_message_id` or `after`;
404 PROJECT_NOT_FOUND / TASK_NOT_FOUND; 409 with the reason: THREAD_METADATA_INCOMPLETE (with
`missing_fields` and one `errors` entry per missing field; nothing is stored), THREAD_ARCHIVED,
CHAT_PATH_NOT_AVAILABLE (group projects: not built yet; the master agent's project without a
backend configured; nothing is stored),
CLIENT_MESSAGE_ID_REUSED (the key was used for another message), TASK_NOT_RETRYABLE,
TASK_NOT_CANCELLABLE.
"""

from __future__ import annotations

import re
from typing import Annotated

from boss.conversations.v1 import conversations_pb2 as pb
from fastapi import APIRouter, Path, Query, Request, Response

from services.bff_gateway.auth import Caller, CallerDep
from services.bff_gateway.chat.mapping import chat_task_answer, message_page, send_message_answer
from services.bff_gateway.chat.schemas import (
    MAX_TEXT_LENGTH,
    ChatTaskAnswer,
    MessagePage,
    SendMessageAnswer,
    SendMessageBody,
)
from services.bff_gateway.problems import ProblemError, error_responses
from services.bff_gateway.request_body import json_body_openapi, read_json_body
from services.bff_gateway.routers.conversations import conversations_client
from services.bff_gateway.schemas import ID_MAX_LENGTH, JSON_SAFE_INTEGER_MAX
from services.shared.auth import SCOPE_CONVERSATIONS_READ, SCOPE_CONVERSATIONS_WRITE

router = APIRouter(tags=["chat"])

MESSAGES_PATH = re.compile(r"/api/v1/projects/[^/]+/messages")
MESSAGE_BODY_MAX_BYTES = 8 * MAX_TEXT_LENGTH
"""The body limit of a send, in bytes (the gateway's own limit when that is larger): a text of
MAX_TEXT_LENGTH characters fits as UTF-8 (up to 4 bytes a character) or as `\\uXXXX` escapes of
BMP characters, so a text just over the limit is a 422 naming `text`, not a 413."""

ProjectId = Annotated[
    str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The thread's project id.")
]
TaskId = Annotated[str, Path(min_length=1, max_length=ID_MAX_LENGTH, description="The chat task's id.")]

_LIST_FIELDS = {"after_sequence": "after"}


def _authorise(caller: Caller, scope: str) -> None:
    """The scope, then the token's kind (403 problems)."""
    caller.require(scope)
    caller.require_client()


@router.post(
    "/api/v1/projects/{project_id}/messages",
    response_model=SendMessageAnswer,
    status_code=201,
    summary="Send a message to a thread's conversation",
    responses={
        200: {"model": SendMessageAnswer, "description": "A repeat of a client_message_id: nothing new."},
        **error_responses(400, 401, 403, 404, 409, 413, 422, 502, 503),
    },
    openapi_extra=json_body_openapi(SendMessageBody),
)
async def send_message(
    project_id: ProjectId, request: Request, caller: CallerDep, response: Response
) -> SendMessageAnswer:
    """Stores the user message and, in the same transaction, its `conversation_reply` task for the
    project's thread (CHAT-3): 201 with `message`, `masterReply` (null), `dispatchPlan` (null),
    `task` (queued; `taskId`, `taskType`, `status`, the thread's ids and Codex references) and
    `collaborationGate`. The same `client_message_id` again is 200 with the same message and its
    current task (the latest retry, once retried), never a second task. The thread's reply (or a
    system message saying what failed) arrives as a `conversation.message.created` event and in
    `GET .../messages`; `task.updated` events and `GET /api/v1/tasks/{taskId}` follow the task.

    `master-agent` (CHAT-2): the master agent answers instead of a thread; with the openai_api
    backend `masterReply` holds its answer when it came within the inline wait (the task is then
    completed), otherwise the task is queued or running and the `master` message follows; with
    master_codex_node the task runs in the master's own Codex thread.

    Errors: 422 naming `text` (empty, whitespace only, over 100,000 characters) or
    `client_message_id`; 404 PROJECT_NOT_FOUND; 409 THREAD_METADATA_INCOMPLETE (`missing_fields`),
    THREAD_ARCHIVED, CHAT_PATH_NOT_AVAILABLE, CLIENT_MESSAGE_ID_REUSED."""
    # The token before the body: a token that may not send is 403 whatever it sends.
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    body = await read_json_body(request, SendMessageBody)
    answer: pb.PostMessageResponse = await conversations_client(request).call(
        "PostMessage",
        pb.PostMessageRequest(
            project_id=project_id, text=body.text, client_message_id=body.client_message_id
        ),
        caller.token,
    )
    response.status_code = 201 if answer.created else 200
    return send_message_answer(answer)


@router.get(
    "/api/v1/projects/{project_id}/messages",
    response_model=MessagePage,
    summary="A conversation's messages, or exactly those a client missed",
    responses=error_responses(400, 401, 403, 404, 422, 502, 503),
)
async def list_messages(
    project_id: ProjectId,
    request: Request,
    caller: CallerDep,
    after: Annotated[
        int,
        Query(
            ge=0,
            le=JSON_SAFE_INTEGER_MAX,
            description="Only messages with a larger `sequence`: the last sequence the client has.",
        ),
    ] = 0,
    page_size: Annotated[int, Query(ge=0, le=200, description="0 means 50; at most 200.")] = 0,
    page_token: Annotated[
        str, Query(max_length=2000, description="nextPageToken of the previous page.")
    ] = "",
) -> MessagePage:
    """Oldest first, AIP-158 paging (`nextPageToken` null at the end). With `after=N`: the
    messages whose sequence is above N, so a client that reconnects gets exactly what it missed.
    404 PROJECT_NOT_FOUND; 422 naming `after` or `page_size`; 400 for a page_token this API did
    not hand out."""
    _authorise(caller, SCOPE_CONVERSATIONS_READ)
    try:
        answer = await conversations_client(request).call(
            "ListMessages",
            pb.ListMessagesRequest(
                project_id=project_id, after_sequence=after, page_size=page_size, page_token=page_token
            ),
            caller.token,
        )
    except ProblemError as problem:
        problem.with_fields_renamed(_LIST_FIELDS).as_invalid_request("page_token")
        raise
    return message_page(answer)


@router.get(
    "/api/v1/tasks/{task_id}",
    response_model=ChatTaskAnswer,
    summary="One chat task and its project's collaboration gate (polling)",
    responses=error_responses(401, 403, 404, 422, 502, 503),
)
async def get_task(task_id: TaskId, request: Request, caller: CallerDep) -> ChatTaskAnswer:
    """`{task, collaborationGate}`: the task's status, failure kind and detail in words, the
    message that ended it (`resultMessageId`, once terminal). 404 TASK_NOT_FOUND for an unknown
    task or another owner's."""
    _authorise(caller, SCOPE_CONVERSATIONS_READ)
    answer = await conversations_client(request).call(
        "GetChatTask", pb.GetChatTaskRequest(task_id=task_id), caller.token
    )
    return chat_task_answer(answer)


@router.post(
    "/api/v1/tasks/{task_id}/retry",
    response_model=ChatTaskAnswer,
    status_code=201,
    summary="Retry a task that ended without a reply",
    responses=error_responses(401, 403, 404, 409, 422, 502, 503),
)
async def retry_task(task_id: TaskId, request: Request, caller: CallerDep) -> ChatTaskAnswer:
    """201 `{task, collaborationGate}` with the new task (queued, `retryOfTaskId` = this task) for
    the same user message of a failed, timed out, cancelled or expired task; the old one is never
    run again (its `retriedByTaskId` names the new one). 409 TASK_NOT_RETRYABLE for a task in
    another status or retried already, or the send's THREAD_ARCHIVED, THREAD_METADATA_INCOMPLETE,
    CHAT_PATH_NOT_AVAILABLE; 404 TASK_NOT_FOUND."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    answer = await conversations_client(request).call(
        "RetryChatTask", pb.RetryChatTaskRequest(task_id=task_id), caller.token
    )
    return chat_task_answer(answer)


@router.post(
    "/api/v1/tasks/{task_id}/cancel",
    response_model=ChatTaskAnswer,
    status_code=202,
    summary="Cancel a task that has not started",
    responses=error_responses(401, 403, 404, 409, 422, 502, 503),
)
async def cancel_task(task_id: TaskId, request: Request, caller: CallerDep) -> ChatTaskAnswer:
    """202 `{task, collaborationGate}` for a queued or claimed task: the cancel is on its way to the
    scheduler, and the task as it is now (still queued or claimed). The outcome follows as a
    `task.updated` event (and on `GET /api/v1/tasks/{taskId}`): status cancelled with one system
    message, or, when Codex started the task meanwhile, a `statusDetail` saying it runs to its end.
    A repeat answers the same; a task cancelled already answers it as is. 409 TASK_NOT_CANCELLABLE
    for a task that is running or has ended; 404 TASK_NOT_FOUND."""
    _authorise(caller, SCOPE_CONVERSATIONS_WRITE)
    answer = await conversations_client(request).call(
        "CancelChatTask", pb.CancelChatTaskRequest(task_id=task_id), caller.token
    )
    return chat_task_answer(answer)
