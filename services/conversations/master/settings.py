"""The master agent's configuration, read from the environment.

| variable | default | meaning |
|---|---|---|
| BOSS_MASTER_BACKEND | none | who answers: `openai_api`, `master_codex_node` or `none` |
| BOSS_MASTER_OPENAI_BASE_URL | (unset) | OpenAI-compatible endpoint, e.g. https://api.openai.com/v1 |
| BOSS_MASTER_OPENAI_API_KEY | (unset) | its API key (never logged; unset when the endpoint needs none) |
| BOSS_MASTER_MODEL | (unset) | the model name sent with each request |
| BOSS_MASTER_INLINE_WAIT_SECONDS | 3 | how long a send waits for the reply before it answers the task |
| BOSS_MASTER_TIMEOUT_SECONDS | 60 | how long one answer may take in all, its one retry included |
| BOSS_MASTER_CONTEXT_WINDOW_TOKENS | (unset) | the model's context window (the master ring, openai_api) |

`openai_api` needs the base URL and the model; `master_codex_node` needs nothing here (it runs in
the Codex thread registered with `is_master_main_thread`); `none` refuses master messages with
CHAT_PATH_NOT_AVAILABLE, saying how to configure one. Keep the inline wait below the gateway's
BOSS_GATEWAY_RPC_TIMEOUT_SECONDS (5 s by default), or the gateway gives up on the send first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

Backend = Literal["openai_api", "master_codex_node", "none"]
OPENAI_API: Backend = "openai_api"
MASTER_CODEX_NODE: Backend = "master_codex_node"
NO_BACKEND: Backend = "none"
BACKENDS: tuple[Backend, ...] = (OPENAI_API, MASTER_CODEX_NODE, NO_BACKEND)

DEFAULT_INLINE_WAIT_SECONDS = 3.0
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_ABANDONED_MARGIN_SECONDS = 10.0
MAX_INLINE_WAIT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 600.0


class MasterSettingsError(ValueError):
    """A BOSS_MASTER_* setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class MasterSettings:
    """How the master agent answers.

    Attributes:
        backend: openai_api | master_codex_node | none.
        base_url: the OpenAI-compatible endpoint (openai_api), e.g. "http://127.0.0.1:8123/v1".
        api_key: its key; kept out of repr and logs.
        model: the model name sent with each request (openai_api).
        inline_wait_seconds: how long a send waits for the model's reply before it answers with
            the queued task instead (seconds).
        timeout_seconds: how long one answer may take in all, its one retry included (seconds).
        context_window_tokens: the model's context window (tokens), when known: the master
            conversation's ring shows the share of it the last answer left unused.
        abandoned_margin_seconds: a model call still marked running this long after its
            `timeout_seconds` ran out was lost with its process (a restart): it is failed with a
            system message (seconds).
    """

    backend: Backend = NO_BACKEND
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    model: str = ""
    inline_wait_seconds: float = DEFAULT_INLINE_WAIT_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    context_window_tokens: int | None = None
    abandoned_margin_seconds: float = DEFAULT_ABANDONED_MARGIN_SECONDS

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise MasterSettingsError(
                f"BOSS_MASTER_BACKEND must be one of {', '.join(BACKENDS)}, not {self.backend!r}"
            )
        if self.backend == OPENAI_API:
            if not self.base_url:
                raise MasterSettingsError("BOSS_MASTER_OPENAI_BASE_URL is required with openai_api")
            if not self.base_url.startswith(("http://", "https://")):
                raise MasterSettingsError("BOSS_MASTER_OPENAI_BASE_URL must start with http:// or https://")
            if not self.model:
                raise MasterSettingsError("BOSS_MASTER_MODEL is required with openai_api")
        _check_seconds("BOSS_MASTER_INLINE_WAIT_SECONDS", self.inline_wait_seconds, MAX_INLINE_WAIT_SECONDS)
        _check_seconds("BOSS_MASTER_TIMEOUT_SECONDS", self.timeout_seconds, MAX_TIMEOUT_SECONDS)
        if self.timeout_seconds <= 0:
            raise MasterSettingsError("BOSS_MASTER_TIMEOUT_SECONDS must be above 0")
        if self.context_window_tokens is not None and self.context_window_tokens <= 0:
            raise MasterSettingsError("BOSS_MASTER_CONTEXT_WINDOW_TOKENS must be a positive number of tokens")
        if not math.isfinite(self.abandoned_margin_seconds) or self.abandoned_margin_seconds < 0:
            raise MasterSettingsError("the abandoned-call margin must be 0 seconds or more")

    @property
    def abandoned_after_seconds(self) -> float:
        """How long after its start a model call still marked running is taken for lost (seconds)."""
        return self.timeout_seconds + self.abandoned_margin_seconds

    @classmethod
    def from_environment(cls, environment: Mapping[str, str] | None = None) -> MasterSettings:
        """The settings of the module table from `environment` (default os.environ).

        Raises:
            MasterSettingsError: a value is missing or malformed (naming the variable).
        """
        env = os.environ if environment is None else environment

        def value(name: str) -> str:
            return (env.get(name) or "").strip()

        backend = value("BOSS_MASTER_BACKEND") or NO_BACKEND
        window = value("BOSS_MASTER_CONTEXT_WINDOW_TOKENS")
        return cls(
            backend=cast(Backend, backend),
            base_url=value("BOSS_MASTER_OPENAI_BASE_URL").rstrip("/"),
            api_key=value("BOSS_MASTER_OPENAI_API_KEY"),
            model=value("BOSS_MASTER_MODEL"),
            inline_wait_seconds=_number(
                "BOSS_MASTER_INLINE_WAIT_SECONDS",
                value("BOSS_MASTER_INLINE_WAIT_SECONDS"),
                DEFAULT_INLINE_WAIT_SECONDS,
            ),
            timeout_seconds=_number(
                "BOSS_MASTER_TIMEOUT_SECONDS", value("BOSS_MASTER_TIMEOUT_SECONDS"), DEFAULT_TIMEOUT_SECONDS
            ),
            context_window_tokens=int(_number("BOSS_MASTER_CONTEXT_WINDOW_TOKENS", window, 0))
            if window
            else None,
        )


def _number(name: str, text: str, default: float) -> float:
    """`text` as a number of the variable `name`, `default` when empty. Raises MasterSettingsError."""
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise MasterSettingsError(f"{name} must be a number, not {text!r}") from None


def _check_seconds(name: str, seconds: float, most: float) -> None:
    if not math.isfinite(seconds) or not 0 <= seconds <= most:
        raise MasterSettingsError(f"{name} must be from 0 to {most:g} seconds, not {seconds!r}")
