"""What the demo model answers to one ``POST /v1/chat/completions`` (the OpenAI Chat Completions API,
non-streaming, as the official ``openai`` client sends it): pure planning, no I/O.

The answer's text comes from the chat task the system message names (:mod:`demo_model.chat_tasks`:
``[boss:master_chat]`` answers from Boss's state), else the plain echo. The last user message's
markers switch the answer, as for the Responses API (:mod:`demo_model.markers`):

- ``[[demo:http500]]``, ``[[demo:http400]]``, ``[[demo:http401]]``, ``[[demo:http429]]``: that HTTP
  error with an OpenAI-style error body (the client retries 500 and 429 once);
- ``[[demo:stall]]``: no answer until the client gives up;
- ``[[demo:slow=SECONDS]]``: the answer after SECONDS;
- ``[[demo:no_reply]]``: a completion whose message has no text;
- ``[[demo:malformed]]``: HTTP 200 with a body that is not a chat completion (not JSON);
- ``[[demo:nonsense]]``: a well-formed completion whose text is not what was asked (not JSON, not
  an answer).

Usage is deterministic: ``prompt_tokens`` = the characters of every message / 4, rounded up (the
usual rule of thumb of about four characters a token for English text), ``completion_tokens`` the
same of the answer.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from demo_model.chat_tasks import ChatRequest, handler_for
from demo_model.markers import MARKER_PATTERN, Failure, parse_directives
from demo_model.responses import MODEL_NAME, reply_text

CHARACTERS_PER_TOKEN = 4
MALFORMED_BODY = "Demo model (not a real model): this body is not a chat completion, on purpose"
NONSENSE_TEXT = "Demo model (not a real model): ~~ purple monkey dishwasher ~~ {not json, not an answer"
_CHAT_ONLY = {"malformed", "nonsense"}


@dataclass(frozen=True)
class ChatPlan:
    """How to answer one request.

    Attributes:
        status: the HTTP status.
        body: the JSON body (a dict) or, for ``malformed``, a plain text body.
        delay_seconds: wait this long first.
        stall: answer nothing until the client goes away.
        request: the request as read (None when the body was not a request).
        failure: the marker that shaped the answer ("" when none).
    """

    status: int
    body: dict[str, Any] | str
    delay_seconds: float = 0.0
    stall: bool = False
    request: ChatRequest | None = None
    failure: str = ""


def read_chat_request(body: Mapping[str, Any]) -> ChatRequest | None:
    """The request of a body, None when it has no list of messages."""
    raw = body.get("messages")
    if not isinstance(raw, list):
        return None
    messages: list[tuple[str, str]] = []
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        messages.append((str(item.get("role") or ""), _text(item.get("content"))))
    system = "\n\n".join(text for role, text in messages if role in ("system", "developer"))
    users = [text for role, text in messages if role == "user"]
    response_format = body.get("response_format")
    json_answer = isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_object",
        "json_schema",
    )
    return ChatRequest(
        system_text=system,
        messages=tuple(messages),
        user_text=users[-1] if users else "",
        json_answer=json_answer,
        model=str(body.get("model") or ""),
    )


def _text(content: Any) -> str:
    """A message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def tokens(text: str) -> int:
    """The demo's token count of a text: characters / CHARACTERS_PER_TOKEN, rounded up."""
    return math.ceil(len(text) / CHARACTERS_PER_TOKEN)


def _error(status: int, error_type: str, what: str) -> dict[str, Any]:
    message = f"Demo model (not a real model): {what} on purpose, as the message's [[demo:...]] marker asked"
    return {"error": {"message": message, "type": error_type, "code": error_type}}


def completion_body(request: ChatRequest, text: str) -> dict[str, Any]:
    """A ``chat.completion`` object answering `text`, with the demo's usage."""
    prompt_tokens = sum(tokens(content) for _role, content in request.messages)
    completion_tokens = tokens(text)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def plan_chat_completion(body: Any) -> ChatPlan:
    """Decides the answer to one request body (decoded JSON)."""
    if not isinstance(body, Mapping):
        return ChatPlan(400, _error(400, "invalid_request_error", "the body must be a JSON object; refused"))
    if body.get("stream"):
        message = "Demo model (not a real model): streaming is not served; send stream=false"
        return ChatPlan(400, {"error": {"message": message, "type": "invalid_request_error", "code": None}})
    request = read_chat_request(body)
    if request is None:
        return ChatPlan(400, _error(400, "invalid_request_error", "a request without messages was refused"))
    directives = parse_directives(request.user_text)
    chat_only = [
        name for name, value in MARKER_PATTERN.findall(request.user_text) if name in _CHAT_ONLY and not value
    ]
    delay = directives.slow_seconds
    failure = directives.failure
    if failure is Failure.HTTP500:
        return ChatPlan(500, _error(500, "server_error", "HTTP 500"), delay, request=request, failure=failure)
    if failure is Failure.HTTP400:
        return ChatPlan(
            400, _error(400, "invalid_request_error", "HTTP 400"), delay, request=request, failure=failure
        )
    if failure is Failure.HTTP401:
        return ChatPlan(
            401, _error(401, "invalid_api_key", "HTTP 401"), delay, request=request, failure=failure
        )
    if failure is Failure.HTTP429:
        return ChatPlan(
            429, _error(429, "rate_limit_exceeded", "HTTP 429"), delay, request=request, failure=failure
        )
    if failure is Failure.STALL:
        return ChatPlan(200, {}, delay, stall=True, request=request, failure=failure)
    if failure is Failure.NO_REPLY:
        return ChatPlan(200, completion_body(request, ""), delay, request=request, failure=failure)
    if chat_only and chat_only[0] == "malformed":
        return ChatPlan(200, MALFORMED_BODY, delay, request=request, failure="malformed")
    if chat_only and chat_only[0] == "nonsense":
        return ChatPlan(
            200, completion_body(request, NONSENSE_TEXT), delay, request=request, failure="nonsense"
        )
    handler = handler_for(request)
    text = handler(request) if handler is not None else reply_text(request.user_text)
    return ChatPlan(200, completion_body(request, text), delay, request=request)


def body_bytes(plan: ChatPlan) -> bytes:
    """The plan's body as sent."""
    if isinstance(plan.body, str):
        return plan.body.encode("utf-8")
    return json.dumps(plan.body, ensure_ascii=False).encode("utf-8")
