"""A Codex home that points the real Codex CLI at the demo model.

:func:`write_codex_home` writes ``<home>/config.toml`` with one custom model provider (see
``real-codex.md`` §2, verified on Codex 0.169):

- ``wire_api = "responses"`` (the only one Codex still accepts), ``base_url`` = the demo model's;
- ``env_key``: Codex sends ``Authorization: Bearer $<env_key>`` and refuses to run when the variable
  is unset ("Missing environment variable"). The demo model checks nothing, so any value works:
  run Codex with :func:`demo_model_environment` added to its environment. No ``auth.json`` or login;
- ``request_max_retries = 0`` and ``stream_max_retries = 0``: a failure the demo model was asked for
  ends the turn at once instead of after about 25 s of retries;
- ``model = "gpt-5.5"`` (a slug in Codex's catalogue, so no metadata warning) and
  ``model_context_window`` (Codex reports 95 % of it and compacts at 90 %);
- update checks and analytics off (the machine may be offline).

With ``provider = "openai"`` the home uses Codex's built-in OpenAI provider instead, pointed at the
demo model (``openai_base_url``), with the key in ``CODEX_API_KEY``
(:func:`openai_provider_environment`): then Codex compacts remotely (compaction v2: a
``compaction_trigger`` request answered with one ``compaction`` item), as it does for OpenAI's own
models (``real-codex.md`` §3). That provider's retries cannot be turned off.
"""

from __future__ import annotations

import json
from pathlib import Path

PROVIDER_ID = "boss_demo"
PROVIDER_NAME = "Boss demo model (not a real model)"
ENV_KEY = "BOSS_DEMO_MODEL_API_KEY"
"""The environment variable Codex reads the (unchecked) API key from."""
API_KEY_VALUE = "demo-model-checks-no-key"
OPENAI_KEY_ENV = "CODEX_API_KEY"
"""The variable ``codex exec`` reads the built-in OpenAI provider's key from."""
PROVIDERS = ("demo", "openai")
"""``demo``: a custom provider (local compaction); ``openai``: the built-in one (remote compaction)."""
CODEX_MODEL = "gpt-5.5"
DEFAULT_CONTEXT_WINDOW = 32_000
"""Tokens; with the default usage model a thread compacts within about ten turns (see demo_model.usage)."""


def demo_model_environment(env_key: str = ENV_KEY) -> dict[str, str]:
    """The environment variables Codex needs to use a home written by :func:`write_codex_home`."""
    return {env_key: API_KEY_VALUE}


def openai_provider_environment() -> dict[str, str]:
    """The environment ``codex exec`` needs for a home written with ``provider="openai"``."""
    return {OPENAI_KEY_ENV: API_KEY_VALUE}


def codex_config_toml(
    base_url: str,
    *,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    auto_compact_token_limit: int | None = None,
    env_key: str = ENV_KEY,
    stream_idle_timeout_ms: int | None = None,
    provider: str = "demo",
) -> str:
    """The text of ``config.toml`` for a Codex home using the demo model.

    Args:
        base_url: the demo model's base URL, e.g. ``http://127.0.0.1:8123/v1``.
        context_window: ``model_context_window`` in tokens (Codex reports 95 % of it).
        auto_compact_token_limit: ``model_auto_compact_token_limit`` in tokens; None leaves Codex's
            default (90 % of the window).
        env_key: the variable holding the API key.
        stream_idle_timeout_ms: Codex's own SSE idle timeout (milliseconds); None keeps Codex's default.
        provider: ``"demo"`` (a custom provider: local compaction) or ``"openai"`` (Codex's built-in
            provider pointed at ``base_url``: remote compaction; ``env_key`` and the idle timeout
            are then not used).

    Raises:
        ValueError: the window or a limit is not positive, or the provider is unknown.
    """
    if context_window <= 0:
        raise ValueError(f"context_window must be positive, got {context_window}")
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    lines = [
        "# Codex home of Boss's built-in demo model (not a real model): every reply is canned.",
        f"model = {_toml(CODEX_MODEL)}",
    ]
    if provider == "openai":
        lines.append(f"openai_base_url = {_toml(base_url)}")
    else:
        lines.append(f"model_provider = {_toml(PROVIDER_ID)}")
    lines.append(f"model_context_window = {context_window}")
    if auto_compact_token_limit is not None:
        if auto_compact_token_limit <= 0:
            raise ValueError(f"auto_compact_token_limit must be positive, got {auto_compact_token_limit}")
        lines.append(f"model_auto_compact_token_limit = {auto_compact_token_limit}")
    lines += [
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
    ]
    if provider == "openai":
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"[model_providers.{PROVIDER_ID}]",
        f"name = {_toml(PROVIDER_NAME)}",
        f"base_url = {_toml(base_url)}",
        'wire_api = "responses"',
        f"env_key = {_toml(env_key)}",
        "request_max_retries = 0",
        "stream_max_retries = 0",
    ]
    if stream_idle_timeout_ms is not None:
        if stream_idle_timeout_ms <= 0:
            raise ValueError(f"stream_idle_timeout_ms must be positive, got {stream_idle_timeout_ms}")
        lines.append(f"stream_idle_timeout_ms = {stream_idle_timeout_ms}")
    return "\n".join(lines) + "\n"


def write_codex_home(
    codex_home: Path,
    base_url: str,
    *,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    auto_compact_token_limit: int | None = None,
    env_key: str = ENV_KEY,
    stream_idle_timeout_ms: int | None = None,
    provider: str = "demo",
) -> Path:
    """Creates ``codex_home`` if needed and (over)writes its ``config.toml`` for the demo model.

    Arguments as in :func:`codex_config_toml`. Sessions already in the home are kept.

    Returns:
        The path of the written ``config.toml``.

    Raises:
        ValueError: as :func:`codex_config_toml`.
        OSError: the folder or file cannot be written.
    """
    text = codex_config_toml(
        base_url,
        context_window=context_window,
        auto_compact_token_limit=auto_compact_token_limit,
        env_key=env_key,
        stream_idle_timeout_ms=stream_idle_timeout_ms,
        provider=provider,
    )
    codex_home.mkdir(parents=True, exist_ok=True)
    path = codex_home / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _toml(value: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML escapes)."""
    return json.dumps(value, ensure_ascii=False)
