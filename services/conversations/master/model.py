"""The master agent's language model, as the rest of conversations sees it.

A :class:`MasterModel` completes one chat (a list of role/content messages) and answers the text
with the token usage the endpoint reported. The master agent's own chat (CHAT-2) and the group
chat's dispatch plans (CHAT-4: drafting each target's instruction, summarising the results) both use
it; which endpoint stands behind it is configuration (:mod:`services.conversations.master`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat sent to the model."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    """What the model answered.

    Attributes:
        text: the answer's text (may be empty when the model said nothing).
        model: the model that answered, as the endpoint named it.
        prompt_tokens / completion_tokens / total_tokens: the usage the endpoint reported (tokens);
            0 when it reported none.
    """

    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class MasterModelUnavailable(Exception):
    """The model could not answer: unreachable, timed out, refused the request or answered an error.
    Its message says which, in words a person can act on (no secrets, no tracebacks)."""


class MasterModel(Protocol):
    """A chat-completion model the master agent talks to."""

    @property
    def context_window_tokens(self) -> int | None:
        """The model's context window in tokens, when configured or known; None otherwise."""
        ...

    async def complete(
        self, messages: Sequence[ChatMessage], *, timeout_s: float, json_answer: bool = False
    ) -> ModelAnswer:
        """Completes `messages`; with `json_answer` asks the endpoint for a JSON object (the caller
        still validates it). Waits at most `timeout_s` seconds in all (at most one retry inside).

        Raises:
            MasterModelUnavailable: the model did not answer in time or answered an error.
        """
        ...
