"""The demo model's HTTP face: a Starlette app speaking the part of the OpenAI Responses API Codex uses.

Routes:

- ``POST /v1/responses``: answers with Server-Sent Events (``event: <type>`` / ``data: <json>``) as
  planned by :func:`demo_model.responses.plan_response`, or with an HTTP error a marker asked for.
  A body that is not a JSON object is 400.
- ``GET /v1/responses`` (Codex's WebSocket attempt with the built-in provider): 426 Upgrade
  Required, which makes Codex fall back to HTTPS at once.
- ``POST /v1/chat/completions``: the Chat Completions API, non-streaming (the ``openai`` client's
  ``chat.completions.create``), as planned by :func:`demo_model.chat_completions.plan_chat_completion`:
  Boss's master agent and dispatch plans talk to it (``[boss:NAME]`` tasks, :mod:`demo_model.chat_tasks`).
- ``GET /demo/chat-requests``: the Chat Completions requests answered so far, oldest first, as JSON
  ``{"requests": [{tag, user_text, status, failure, total_tokens}]}`` (for tests that run the demo
  model as a process).
- ``GET /healthz``: 200 ``{"status": "ok", "model": "boss-demo-model"}``.

Every answered request is recorded (:class:`RecordedRequest`, :class:`RecordedChatRequest`) and passed
to ``on_request`` / ``on_chat_request``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from demo_model.chat_completions import body_bytes, plan_chat_completion
from demo_model.conversation import RequestKind
from demo_model.markers import Failure
from demo_model.responses import MODEL_NAME, ResponsePlan, plan_response
from demo_model.usage import UsageModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedRequest:
    """One ``POST /v1/responses`` the demo model answered.

    Attributes:
        thread_id: Codex's ``thread-id`` header (its session id), "" when absent.
        kind: turn, local or remote compaction.
        user_text: the latest own user message of the request.
        user_turns: user messages since the last compaction summary.
        failure: the failure produced, or None.
        tool_call: the request was answered with the ``[[demo:shell=...]]`` tool call.
        total_tokens: the usage reported for it.
    """

    thread_id: str
    kind: RequestKind
    user_text: str
    user_turns: int
    failure: Failure | None
    tool_call: bool
    total_tokens: int


@dataclass(frozen=True)
class RecordedChatRequest:
    """One ``POST /v1/chat/completions`` the demo model answered.

    Attributes:
        tag: the chat task (``[boss:NAME]``), "" when untagged.
        user_text: the last user message.
        status: the HTTP status answered.
        failure: the marker that shaped the answer ("" when none).
        total_tokens: the usage reported (0 for an error).
    """

    tag: str
    user_text: str
    status: int
    failure: str
    total_tokens: int


def create_app(
    usage_model: UsageModel | None = None,
    on_request: Callable[[RecordedRequest], None] | None = None,
    on_chat_request: Callable[[RecordedChatRequest], None] | None = None,
) -> Starlette:
    """Builds the demo model's ASGI app.

    Args:
        usage_model: the token usage rule (defaults: :class:`demo_model.usage.UsageModel`).
        on_request: called with each answered Responses request (from the server's event loop;
            keep it quick).
        on_chat_request: called with each answered Chat Completions request.
    """
    model = usage_model or UsageModel()
    chat_records: list[RecordedChatRequest] = []

    async def chat_completions(request: Request) -> Response:
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            body = None
        plan = plan_chat_completion(body)
        usage = plan.body.get("usage") if isinstance(plan.body, dict) else None
        record = RecordedChatRequest(
            tag=plan.request.tag if plan.request else "",
            user_text=plan.request.user_text if plan.request else "",
            status=plan.status,
            failure=plan.failure,
            total_tokens=int(usage["total_tokens"]) if isinstance(usage, dict) else 0,
        )
        chat_records.append(record)
        if on_chat_request is not None:
            on_chat_request(record)
        if plan.delay_seconds > 0:
            await asyncio.sleep(plan.delay_seconds)
        if plan.stall:
            while not await request.is_disconnected():
                await asyncio.sleep(0.2)
            return Response(status_code=499)
        media_type = "text/plain" if isinstance(plan.body, str) else "application/json"
        return Response(body_bytes(plan), status_code=plan.status, media_type=media_type)

    async def chat_requests(request: Request) -> Response:
        return JSONResponse({"requests": [asdict(record) for record in chat_records]})

    async def responses(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "the body must be a JSON object"}}, status_code=400)
        plan = plan_response(body, model)
        record = _record(request.headers.get("thread-id", ""), plan)
        logger.debug("answering %s request of thread %s", record.kind, record.thread_id)
        if on_request is not None:
            on_request(record)
        if plan.http_error is not None:
            await asyncio.sleep(plan.delay_seconds)
            return JSONResponse(plan.http_error.body, status_code=plan.http_error.status)
        return StreamingResponse(_stream(plan), media_type="text/event-stream")

    async def refuse_upgrade(request: Request) -> Response:
        return JSONResponse(
            {"error": {"message": "the demo model speaks HTTPS streaming only, not WebSocket"}},
            status_code=426,
        )

    async def refuse_websocket(websocket: WebSocket) -> None:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(Response(status_code=426))
        else:
            await websocket.close()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": MODEL_NAME})

    return Starlette(
        routes=[
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/demo/chat-requests", chat_requests, methods=["GET"]),
            Route("/v1/responses", refuse_upgrade, methods=["GET"]),
            WebSocketRoute("/v1/responses", refuse_websocket),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


async def _stream(plan: ResponsePlan) -> AsyncIterator[str]:
    if plan.delay_seconds > 0:
        await asyncio.sleep(plan.delay_seconds)
    for event in plan.events:
        yield _sse(event)
    if plan.stall:
        # Held until the client goes away (Starlette then cancels this generator) or the server stops.
        await asyncio.Event().wait()


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _record(thread_id: str, plan: ResponsePlan) -> RecordedRequest:
    tool_call = any(
        event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call"
        for event in plan.events
    )
    return RecordedRequest(
        thread_id=thread_id,
        kind=plan.view.kind,
        user_text=plan.view.user_text,
        user_turns=plan.view.user_turns,
        failure=plan.directives.failure,
        tool_call=tool_call,
        total_tokens=plan.usage.total_tokens,
    )
