"""The config.toml the demo model's Codex home gets."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from demo_model.codex_home import (
    ENV_KEY,
    PROVIDER_ID,
    codex_config_toml,
    demo_model_environment,
    openai_provider_environment,
)


def test_the_config_names_a_custom_responses_provider_without_retries() -> None:
    config = tomllib.loads(codex_config_toml("http://127.0.0.1:8123/v1"))
    assert config["model"] == "gpt-5.5"
    assert config["model_provider"] == PROVIDER_ID
    assert config["model_context_window"] == 32_000
    assert "model_auto_compact_token_limit" not in config
    assert config["analytics"] == {"enabled": False}
    assert config["check_for_update_on_startup"] is False
    provider = config["model_providers"][PROVIDER_ID]
    assert provider == {
        "name": "Boss demo model (not a real model)",
        "base_url": "http://127.0.0.1:8123/v1",
        "wire_api": "responses",
        "env_key": ENV_KEY,
        "request_max_retries": 0,
        "stream_max_retries": 0,
    }


def test_optional_limits_and_key_variable() -> None:
    text = codex_config_toml(
        'http://h:1/v1?x="y"',
        context_window=64_000,
        auto_compact_token_limit=50_000,
        env_key="OTHER_KEY",
        stream_idle_timeout_ms=2_000,
    )
    config = tomllib.loads(text)
    assert config["model_context_window"] == 64_000
    assert config["model_auto_compact_token_limit"] == 50_000
    provider = config["model_providers"][PROVIDER_ID]
    assert provider["base_url"] == 'http://h:1/v1?x="y"'
    assert provider["env_key"] == "OTHER_KEY"
    assert provider["stream_idle_timeout_ms"] == 2_000


@pytest.mark.parametrize(
    "options",
    [{"context_window": 0}, {"auto_compact_token_limit": -1}, {"stream_idle_timeout_ms": 0}],
)
def test_non_positive_limits_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(options))):
        codex_config_toml("http://127.0.0.1:1/v1", **options)


def test_the_environment_sets_the_key_variable() -> None:
    assert set(demo_model_environment()) == {ENV_KEY}
    assert demo_model_environment("X_KEY").keys() == {"X_KEY"}


def test_the_built_in_provider_is_pointed_at_the_demo_model_for_remote_compaction() -> None:
    config = tomllib.loads(
        codex_config_toml(
            "http://127.0.0.1:9/v1", context_window=32_000, auto_compact_token_limit=20_000, provider="openai"
        )
    )
    assert config["openai_base_url"] == "http://127.0.0.1:9/v1"
    assert "model_provider" not in config and "model_providers" not in config
    assert (config["model_context_window"], config["model_auto_compact_token_limit"]) == (32_000, 20_000)
    assert openai_provider_environment() == {"CODEX_API_KEY": "demo-model-checks-no-key"}


def test_an_unknown_provider_is_refused() -> None:
    with pytest.raises(ValueError, match="provider must be one of demo, openai"):
        codex_config_toml("http://127.0.0.1:9/v1", provider="azure")
