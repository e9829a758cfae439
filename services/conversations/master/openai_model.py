"""OpenAIMasterModel: the master agent's model behind an OpenAI-compatible Chat Completions endpoint,
through the official `openai` package (its async client).

Chat Completions (`POST {base_url}/chat/completions`, non-streaming) is the common denominator of
OpenAI-compatible servers (OpenAI itself, vLLM, Ollama, LiteLLM, Boss's demo model). The client is
built with a per-request timeout equal to the whole wait and `max_retries=1`: the package retries a
connection error, 408, 409, 429 and 5xx once (after its own short back-off), and the whole call,
retry included, is cut at `timeout_s` (the package's defaults would be 10 minutes and two retries).

Errors become `MasterModelUnavailable` with a sentence a person can act on: it names the endpoint
and the HTTP status or what went wrong, never the API key or a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import openai
from openai import AsyncOpenAI

from services.conversations.master.model import ChatMessage, MasterModelUnavailable, ModelAnswer
from services.conversations.master.settings import MasterSettings

log = logging.getLogger(__name__)

MAX_RETRIES = 1
"""Retries of one call after a retryable failure (connection, 408, 409, 429, 5xx)."""
PLACEHOLDER_API_KEY = "none"
"""Sent when no key is configured: the package refuses an empty key, and keyless local servers
ignore whatever comes."""


class OpenAIMasterModel:
    """A `MasterModel` on an OpenAI-compatible endpoint.

    Args:
        base_url: the endpoint's base URL, e.g. "https://api.openai.com/v1".
        api_key: its key ("" for a server that needs none).
        model: the model name sent with each request.
        context_window_tokens: the model's window in tokens, when known.
        timeout_s: the client's per-request timeout (seconds); each `complete` call is cut at its
            own `timeout_s` in all anyway.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        context_window_tokens: int | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._base_url = base_url
        self._model = model
        self._context_window_tokens = context_window_tokens
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or PLACEHOLDER_API_KEY,
            timeout=timeout_s,
            max_retries=MAX_RETRIES,
        )

    @classmethod
    def from_settings(cls, settings: MasterSettings) -> OpenAIMasterModel:
        """The model of `settings` (backend openai_api)."""
        return cls(
            base_url=settings.base_url,
            api_key=settings.api_key,
            model=settings.model,
            context_window_tokens=settings.context_window_tokens,
            timeout_s=settings.timeout_seconds,
        )

    @property
    def context_window_tokens(self) -> int | None:
        """The configured context window (tokens), or None."""
        return self._context_window_tokens

    async def close(self) -> None:
        """Closes the client's connections."""
        await self._client.close()

    async def complete(
        self, messages: Sequence[ChatMessage], *, timeout_s: float, json_answer: bool = False
    ) -> ModelAnswer:
        """One chat completion of `messages` (see MasterModel.complete).

        Raises:
            MasterModelUnavailable: no answer within `timeout_s` seconds (retry included), the
                endpoint unreachable, an HTTP error after the retry, or an answer that is not a
                chat completion.
        """
        arguments: dict[str, Any] = {
            "model": self._model,
            "messages": [{"role": message.role, "content": message.content} for message in messages],
            "timeout": timeout_s,
        }
        if json_answer:
            arguments["response_format"] = {"type": "json_object"}
        try:
            async with asyncio.timeout(timeout_s):
                completion = await self._client.chat.completions.create(**arguments)
        except TimeoutError:
            raise self._unavailable(f"did not answer within {timeout_s:g} s") from None
        except openai.APITimeoutError:
            raise self._unavailable(f"did not answer within {timeout_s:g} s") from None
        except openai.APIConnectionError as error:
            raise self._unavailable(f"could not be reached ({_cause(error)})") from None
        except openai.APIStatusError as error:
            raise self._unavailable(_status_words(error)) from None
        except openai.OpenAIError as error:
            raise self._unavailable(
                f"answered something that is not a chat completion ({_cause(error)})"
            ) from None
        return self._answer_of(completion)

    def _answer_of(self, completion: Any) -> ModelAnswer:
        """The ModelAnswer of a parsed completion. Raises MasterModelUnavailable for a body that is
        not a chat completion (the package does not validate bodies strictly)."""
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise self._unavailable("answered something that is not a chat completion (no choices)")
        message = getattr(choices[0], "message", None)
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            raise self._unavailable("answered something that is not a chat completion (no text)")
        usage = getattr(completion, "usage", None)
        return ModelAnswer(
            text=content or "",
            model=str(getattr(completion, "model", "") or self._model),
            prompt_tokens=_tokens(usage, "prompt_tokens"),
            completion_tokens=_tokens(usage, "completion_tokens"),
            total_tokens=_tokens(usage, "total_tokens"),
        )

    def _unavailable(self, what: str) -> MasterModelUnavailable:
        log.warning("master model at %s %s", self._base_url, what)
        return MasterModelUnavailable(f"The model at {self._base_url} {what}")


def _tokens(usage: Any, name: str) -> int:
    """A usage count (tokens), 0 when the endpoint reported none or nonsense."""
    value = getattr(usage, name, 0) if usage is not None else 0
    return value if isinstance(value, int) and value >= 0 else 0


def _cause(error: BaseException) -> str:
    """The first line of what went wrong, without the request (it could carry headers)."""
    cause = error.__cause__ or error
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return text[:200]


def _status_words(error: openai.APIStatusError) -> str:
    """An HTTP error in words: the status, what it usually means, and the endpoint's own message."""
    status = error.status_code
    meaning = {
        400: "refused the request",
        401: "refused the API key",
        403: "refused access",
        404: "does not know this model or path",
        429: "is rate limiting or out of quota",
    }.get(status, "failed" if status >= 500 else "refused the request")
    said = ""
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            said = inner["message"].strip()[:300]
    retried = " (after one retry)" if status == 429 or status >= 500 else ""
    return f"answered HTTP {status}{retried}: it {meaning}" + (f" ({said})" if said else "")
