"""Reading a Responses API request the way the demo model needs it: who said what, since when.

Pure functions over the request body Codex sends (``POST /v1/responses``, a JSON object whose
``input`` is the whole history, since Codex's requests are stateless). What Codex puts there (as
observed with Codex 0.169):

- ``developer`` messages (base instructions, permissions), then ``user`` messages that Codex writes
  itself (``<environment_context>…</environment_context>``, ``# AGENTS.md instructions…``,
  ``<turn_aborted>…``), then the person's own ``user`` messages, ``assistant`` messages,
  ``function_call`` / ``function_call_output`` items and, after a remote compaction, a
  ``{"type": "compaction"}`` item;
- after a local compaction, the history is the earlier user messages followed by one user message
  holding the summary this model wrote (it carries :data:`SUMMARY_TAG`);
- a local compaction request ends with a user message starting with :data:`COMPACTION_PROMPT_PREFIX`;
  a remote (v2) one ends with ``{"type": "compaction_trigger"}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

COMPACTION_PROMPT_PREFIX = "You are performing a CONTEXT CHECKPOINT COMPACTION"
"""How Codex's local compaction prompt (the last input item of a compaction request) starts."""

SUMMARY_TAG = "Demo model summary (not a real model)"
"""Every summary this model writes contains it, so the summary is recognised when Codex sends it back."""

_CODEX_CONTEXT_BLOCK = re.compile(r"^<([a-z_]+)>.*</\1>$", re.DOTALL)
_CODEX_CONTEXT_PREFIXES = ("# AGENTS.md instructions",)


class RequestKind(StrEnum):
    """What Codex asks for in one request."""

    TURN = "turn"
    """The next step of a turn: answer the latest user message (or the tool output after it)."""
    LOCAL_COMPACTION = "local_compaction"
    """Summarise the history (custom providers): answer with the summary text."""
    REMOTE_COMPACTION = "remote_compaction"
    """Summarise the history (built-in provider, compaction v2): answer with one compaction item."""


@dataclass(frozen=True)
class RequestView:
    """The facts of one request the demo model answers from.

    Attributes:
        kind: turn or compaction.
        user_text: the person's latest own message ("" when there is none).
        user_turns: the person's own messages since the last compaction summary (all of them when
            the thread was never compacted); a compaction prompt is not one.
        tool_output: the output of the last ``function_call_output`` after the latest own message,
            or None when no tool ran since it.
    """

    kind: RequestKind
    user_text: str
    user_turns: int
    tool_output: str | None


def read_request(body: Mapping[str, Any]) -> RequestView:
    """Reads a ``POST /v1/responses`` body.

    Args:
        body: the decoded JSON body; ``input`` should be a list of items (anything else reads as an
            empty history).

    Returns:
        The request's kind, the latest own user message, the user turns since the last summary and
        any tool output after that message.
    """
    raw_items = body.get("input")
    items: Sequence[Any] = raw_items if isinstance(raw_items, list) else []
    kind = _kind(items)
    history = items[:-1] if kind is not RequestKind.TURN else items
    user_text = ""
    user_turns = 0
    tool_output: str | None = None
    for item in history:
        if not isinstance(item, Mapping):
            continue
        item_type = item.get("type")
        if item_type == "compaction":
            user_turns = 0
        elif item_type == "function_call_output":
            tool_output = _output_text(item.get("output"))
        elif item_type == "message" and item.get("role") == "user":
            text = message_text(item)
            if SUMMARY_TAG in text:
                user_turns = 0
            elif not is_codex_context(text):
                user_text = text
                user_turns += 1
                tool_output = None
    return RequestView(kind=kind, user_text=user_text, user_turns=user_turns, tool_output=tool_output)


def message_text(item: Mapping[str, Any]) -> str:
    """The text of a message item: its ``input_text`` / ``output_text`` parts joined, or a plain string."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    )


def is_codex_context(text: str) -> bool:
    """Whether a user message is one Codex writes itself (environment context, AGENTS.md, aborts)."""
    stripped = text.strip()
    return bool(_CODEX_CONTEXT_BLOCK.match(stripped)) or stripped.startswith(_CODEX_CONTEXT_PREFIXES)


def _kind(items: Sequence[Any]) -> RequestKind:
    last = items[-1] if items else None
    if not isinstance(last, Mapping):
        return RequestKind.TURN
    if last.get("type") == "compaction_trigger":
        return RequestKind.REMOTE_COMPACTION
    if (
        last.get("type") == "message"
        and last.get("role") == "user"
        and message_text(last).lstrip().startswith(COMPACTION_PROMPT_PREFIX)
    ):
        return RequestKind.LOCAL_COMPACTION
    return RequestKind.TURN


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(
            part["text"] for part in output if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""
