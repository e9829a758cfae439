"""The demo model's chat tasks: which deterministic handler answers a Chat Completions request.

Tag convention: the first line of a request's first system message is ``[boss:NAME]`` (for example
``[boss:master_chat]``); NAME (lower-case letters, digits, ``_``) picks the handler registered
under it. A request without a tag, or with a tag nobody registered, gets the plain echo
(``Demo model (not a real model): you said: …``). Boss's own prompts carry these tags:

- ``master_chat``: the master agent's chat (:mod:`demo_model.master_answers`);
- ``dispatch_drafts`` / ``dispatch_summary``: a group's dispatch plan (its drafts and summary).

Adding a handler takes one line here plus the handler itself: write a module whose functions are
decorated ``@chat_task("NAME")`` and add the module's name to :data:`HANDLER_MODULES`::

    # demo_model/dispatch_drafts.py
    from demo_model.chat_tasks import ChatRequest, chat_task

    @chat_task("dispatch_drafts")
    def drafts(request: ChatRequest) -> str:
        return '{"instructions": [...]}'

A handler is pure: it gets the request (its system text, its messages, the last user message and
whether a JSON object was asked for) and returns the answer's text. Marker handling (failures,
waits) happens before it is called (:mod:`demo_model.chat_completions`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TAG_PATTERN = re.compile(r"\A\s*\[boss:([a-z0-9_]+)\]")
"""``[boss:NAME]`` at the start of the system text."""

HANDLER_MODULES: tuple[str, ...] = ("demo_model.master_answers", "demo_model.dispatch_drafts")
"""Modules whose ``@chat_task`` handlers are registered (imported on first use)."""


@dataclass(frozen=True)
class ChatRequest:
    """A Chat Completions request as handlers see it.

    Attributes:
        system_text: the system messages' text, joined by blank lines ("" when none).
        messages: every message as (role, text), in order.
        user_text: the last user message's text ("" when none).
        json_answer: the request asked for a JSON object (``response_format`` json_object or
            json_schema).
        model: the model name the request named.
    """

    system_text: str
    messages: tuple[tuple[str, str], ...]
    user_text: str
    json_answer: bool = False
    model: str = ""

    @property
    def tag(self) -> str:
        """The task's NAME from ``[boss:NAME]``, "" when untagged."""
        match = TAG_PATTERN.match(self.system_text)
        return match.group(1) if match else ""


ChatTaskHandler = Callable[[ChatRequest], str]

_HANDLERS: dict[str, ChatTaskHandler] = {}
_loaded = False


def chat_task(tag: str) -> Callable[[ChatTaskHandler], ChatTaskHandler]:
    """Registers the decorated function as the handler of ``[boss:tag]`` requests.

    Raises:
        ValueError: the tag is malformed or taken by another handler.
    """
    if not re.fullmatch(r"[a-z0-9_]+", tag):
        raise ValueError(f"a chat task tag is lower-case letters, digits and _, not {tag!r}")

    def register(handler: ChatTaskHandler) -> ChatTaskHandler:
        existing = _HANDLERS.get(tag)
        if existing is not None and existing is not handler:
            raise ValueError(
                f"chat task {tag!r} is handled already by {existing.__module__}.{existing.__name__}"
            )
        _HANDLERS[tag] = handler
        return handler

    return register


def handlers(modules: Sequence[str] = HANDLER_MODULES) -> dict[str, ChatTaskHandler]:
    """Every registered handler by tag (the modules of :data:`HANDLER_MODULES` imported first)."""
    global _loaded
    if not _loaded:
        for name in modules:
            importlib.import_module(name)
        _loaded = True
    return dict(_HANDLERS)


def handler_for(request: ChatRequest) -> ChatTaskHandler | None:
    """The handler of the request's tag, None when untagged or unknown."""
    tag = request.tag
    return handlers().get(tag) if tag else None
