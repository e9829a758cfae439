"""What the demo model answers to one request: pure planning and the Responses API event shapes.

:func:`plan_response` turns a request body into a :class:`ResponsePlan` (an HTTP error, or the
Server-Sent Events to stream, possibly after a wait, possibly followed by a stall). No I/O: the
Starlette app in :mod:`demo_model.app` only carries a plan out. Reply texts are deterministic, so a
test can assert the exact reply a thread gets (:func:`reply_text`).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from demo_model.conversation import SUMMARY_TAG, RequestKind, RequestView, read_request
from demo_model.markers import Directives, Failure, parse_directives
from demo_model.usage import Usage, UsageModel

REPLY_PREFIX = "Demo model (not a real model): "
"""Every reply starts with it, so nobody takes a demo reply for a real model's."""

MAX_QUOTE_CHARS = 500
"""A reply quotes at most this many characters of the user's message (then "…")."""

DELTA_CHARS = 40
"""The reply text is streamed in ``response.output_text.delta`` chunks of this many characters."""

MODEL_NAME = "boss-demo-model"
"""The model name the responses carry."""

_EXIT_CODE = re.compile(r"Process exited with code (-?\d+)")


def quote(text: str) -> str:
    """The user's message as a reply quotes it: trimmed, cut at :data:`MAX_QUOTE_CHARS` with "…"."""
    stripped = text.strip()
    if len(stripped) <= MAX_QUOTE_CHARS:
        return stripped
    return stripped[:MAX_QUOTE_CHARS] + "…"


def reply_text(user_text: str) -> str:
    """The demo model's reply to a user message: ``Demo model (not a real model): you said: <quote>``."""
    return f"{REPLY_PREFIX}you said: {quote(user_text)}"


def tool_reply_text(user_text: str, command: str, tool_output: str) -> str:
    """The reply after the ``[[demo:shell=CMD]]`` tool call ran: names the command and its exit code.

    The exit code comes from Codex's "Process exited with code N" line in the tool output; when
    that line is missing (the sandbox refused the command, say) the reply says "no exit code".
    """
    match = _EXIT_CODE.search(tool_output)
    outcome = f"exit code {match.group(1)}" if match else "no exit code"
    return f"{REPLY_PREFIX}ran `{command}` ({outcome}); you said: {quote(user_text)}"


def summary_text(view: RequestView) -> str:
    """The compaction summary: how many user turns it covers and the latest message, tagged as the demo's."""
    return f"{SUMMARY_TAG}: {view.user_turns} user turns so far; the latest said: {quote(view.user_text)}"


@dataclass(frozen=True)
class MasterPromptReply:
    """A master agent prompt that came through Codex (master_codex_node): its question (markers are
    read there only: the state it carries quotes other messages) and the demo's answer."""

    question: str
    reply: str


def master_prompt_reply(user_text: str) -> MasterPromptReply | None:
    """The answer to a ``[boss:master_chat]`` prompt (:mod:`demo_model.master_answers`), None for
    any other message."""
    from demo_model.master_answers import codex_master_reply, question_of  # it imports this module

    reply = codex_master_reply(user_text)
    return MasterPromptReply(question_of(user_text), reply) if reply is not None else None


@dataclass(frozen=True)
class HttpError:
    """An HTTP error answer: ``status`` and the JSON ``body`` (OpenAI's ``{"error": {...}}`` shape)."""

    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class ResponsePlan:
    """How to answer one request.

    Attributes:
        view: what was read from the request.
        directives: what the markers of the latest user message asked for.
        usage: the usage reported (also when no ``response.completed`` is sent).
        delay_seconds: seconds to wait before answering.
        http_error: answer with this error instead of a stream.
        events: the SSE events to send (each a JSON object with a ``type``), in order.
        stall: after ``events``, send nothing more and hold the connection until the client leaves.
    """

    view: RequestView
    directives: Directives
    usage: Usage
    delay_seconds: float = 0.0
    http_error: HttpError | None = None
    events: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    stall: bool = False


def plan_response(body: Mapping[str, Any], usage_model: UsageModel) -> ResponsePlan:
    """Decides the answer to one ``POST /v1/responses`` body.

    Compaction requests always get a summary. A turn request follows the markers of the latest
    own user message (see :mod:`demo_model`): a failure, a wait, a tool call first, or the reply.

    Args:
        body: the decoded JSON request body.
        usage_model: the token usage rule.

    Returns:
        The plan; ids in it are fresh random ones, everything else is a function of the body.
    """
    view = read_request(body)
    usage = usage_model.usage(view.user_turns)
    response_id = f"resp_{uuid.uuid4().hex}"
    if view.kind is RequestKind.LOCAL_COMPACTION:
        item = message_item(summary_text(view))
        return ResponsePlan(view, Directives(), usage, events=completed_stream(response_id, [item], usage))
    if view.kind is RequestKind.REMOTE_COMPACTION:
        item = compaction_item(summary_text(view))
        return ResponsePlan(view, Directives(), usage, events=completed_stream(response_id, [item], usage))
    master = master_prompt_reply(view.user_text)
    directives = parse_directives(master.question if master else view.user_text)
    plan = ResponsePlan(view, directives, usage, delay_seconds=directives.slow_seconds)
    if directives.failure is not None:
        return _failure_plan(plan, directives.failure, response_id)
    if directives.shell_command is not None and view.tool_output is None:
        item = function_call_item(directives.shell_command)
        return replace(plan, events=completed_stream(response_id, [item], usage))
    if directives.shell_command is not None and view.tool_output is not None:
        text = tool_reply_text(view.user_text, directives.shell_command, view.tool_output)
    elif master is not None:
        text = master.reply
    else:
        text = reply_text(view.user_text)
    return replace(plan, events=completed_stream(response_id, [message_item(text)], usage))


def _failure_plan(plan: ResponsePlan, failure: Failure, response_id: str) -> ResponsePlan:
    if failure is Failure.HTTP401:
        return replace(plan, http_error=_http_error(401, "invalid_api_key", "HTTP 401 (API key refused)"))
    if failure is Failure.HTTP500:
        return replace(plan, http_error=_http_error(500, "server_error", "HTTP 500"))
    if failure is Failure.HTTP400:
        return replace(plan, http_error=_http_error(400, "invalid_request_error", "HTTP 400"))
    if failure is Failure.HTTP429:
        return replace(plan, http_error=_http_error(429, "rate_limit_exceeded", "HTTP 429"))
    created = _event("response.created", response=_response(response_id, "in_progress", []))
    if failure is Failure.RESPONSE_FAILED:
        failed = _response(response_id, "failed", [])
        failed["error"] = {"code": "server_error", "message": _failure_message("response.failed")}
        return replace(plan, events=(created, _event("response.failed", response=failed)))
    if failure is Failure.STALL:
        return replace(plan, events=(created,), stall=True)
    return replace(plan, events=completed_stream(response_id, [], plan.usage))


def _failure_message(what: str) -> str:
    return f"{REPLY_PREFIX}{what} on purpose, as the message's [[demo:...]] marker asked"


def _http_error(status: int, error_type: str, what: str) -> HttpError:
    message = _failure_message(what)
    return HttpError(status, {"error": {"message": message, "type": error_type, "code": error_type}})


def message_item(text: str) -> dict[str, Any]:
    """A completed assistant message output item holding ``text``."""
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{uuid.uuid4().hex}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(command: str) -> dict[str, Any]:
    """A completed ``exec_command`` tool call output item running ``command``."""
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",
        "call_id": f"call_{uuid.uuid4().hex}",
        "name": "exec_command",
        "arguments": json.dumps({"cmd": command}),
        "status": "completed",
    }


def compaction_item(summary: str) -> dict[str, Any]:
    """The one ``compaction`` output item a remote (v2) compaction must return; opaque content."""
    encoded = base64.b64encode(summary.encode("utf-8")).decode("ascii")
    return {"type": "compaction", "id": f"cmp_{uuid.uuid4().hex}", "encrypted_content": encoded}


def completed_stream(
    response_id: str, items: list[dict[str, Any]], usage: Usage
) -> tuple[dict[str, Any], ...]:
    """The events of a successful response: created, each item added (text in deltas) and done, completed."""
    events: list[dict[str, Any]] = [
        _event("response.created", response=_response(response_id, "in_progress", []))
    ]
    for index, item in enumerate(items):
        events.append(_event("response.output_item.added", output_index=index, item=_in_progress(item)))
        if item["type"] == "message":
            text = item["content"][0]["text"]
            for start in range(0, len(text), DELTA_CHARS):
                events.append(
                    _event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=text[start : start + DELTA_CHARS],
                    )
                )
        events.append(_event("response.output_item.done", output_index=index, item=item))
    completed = _response(response_id, "completed", items)
    completed["usage"] = usage.as_response_usage()
    events.append(_event("response.completed", response=completed))
    return tuple(events)


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item


def _response(response_id: str, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": status, "model": MODEL_NAME, "output": output}


def _event(event_type: str, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, **fields}
