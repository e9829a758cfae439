"""Codex's configuration as the worker reads it: config.toml (with profiles), the catalogue cache,
and L = min(configured limit, 90 % of the window) with where it came from."""

import json
import os
from pathlib import Path

import pytest

from worker.codex_sessions.codex_config import (
    UNCONFIGURED,
    CatalogueModel,
    CodexConfigError,
    CodexConfiguration,
    CodexConfigurationReader,
    LimitSource,
    ModelSettings,
    parse_config_toml,
    parse_models_cache,
    resolve_compaction_limit,
)


def test_top_level_settings_are_read() -> None:
    text = 'model = "gpt-5.5"\nmodel_context_window = 32000\nmodel_auto_compact_token_limit = 20000\n'
    assert parse_config_toml(text) == ModelSettings("gpt-5.5", 32_000, 20_000, None)


def test_the_active_profile_overrides_the_top_level() -> None:
    text = (
        'profile = "small"\nmodel = "gpt-5.5"\nmodel_auto_compact_token_limit = 200000\n'
        '[profiles.small]\nmodel = "gpt-5.4-mini"\nmodel_context_window = 64000\n'
        "model_auto_compact_token_limit = 40000\n"
        "[profiles.other]\nmodel_auto_compact_token_limit = 1000\n"
    )
    assert parse_config_toml(text) == ModelSettings("gpt-5.4-mini", 64_000, 40_000, "small")


def test_a_profile_without_a_limit_keeps_the_top_level_one() -> None:
    text = 'profile = "p"\nmodel_auto_compact_token_limit = 30000\n[profiles.p]\nmodel = "gpt-5.5"\n'
    assert parse_config_toml(text).auto_compact_token_limit == 30_000


def test_a_limit_of_zero_or_less_is_not_a_limit() -> None:
    assert parse_config_toml("model_auto_compact_token_limit = 0\n").auto_compact_token_limit is None
    assert parse_config_toml("model_context_window = -5\n").context_window is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("model = [", "not valid TOML"),
        ('model_auto_compact_token_limit = "20000"\n', "'model_auto_compact_token_limit' must be an integer"),
        ('profile = "missing"\n', "profile 'missing' is selected but [profiles.missing] is missing"),
        ("model = 5\n", "'model' must be a string"),
    ],
)
def test_a_config_codex_would_refuse_is_an_error_naming_the_problem(text: str, names: str) -> None:
    with pytest.raises(CodexConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_config_toml(text)


def test_the_catalogue_cache_is_read_by_slug() -> None:
    text = json.dumps(
        {
            "fetched_at": "2026-11-30T10:00:00Z",
            "models": [
                {"slug": "gpt-5.5", "context_window": 272000, "max_context_window": 272000},
                {
                    "slug": "big",
                    "context_window": 400000,
                    "max_context_window": 1000000,
                    "auto_compact_token_limit": 300000,
                    "effective_context_window_percent": 90,
                },
                {"display_name": "no slug"},
            ],
        }
    )
    catalogue = parse_models_cache(text)
    assert sorted(catalogue) == ["big", "gpt-5.5"]
    assert catalogue["big"] == CatalogueModel("big", 400_000, 1_000_000, 300_000, 90)
    assert catalogue["gpt-5.5"].effective_context_window_percent == 95


def test_a_cache_without_models_is_an_error() -> None:
    with pytest.raises(CodexConfigError, match="no 'models' list"):
        parse_models_cache("{}")


def configured(**settings: int | str | None) -> CodexConfiguration:
    return CodexConfiguration(ModelSettings(**settings))  # type: ignore[arg-type]


def test_a_configured_limit_below_90_percent_is_l() -> None:
    # The case of the issue: limit 20,000 and window 32,000 (W = 30,400 in the rollout).
    limit = resolve_compaction_limit(
        configured(context_window=32_000, auto_compact_token_limit=20_000), None, 30_400
    )
    assert (limit.limit, limit.context_window, limit.model_context_window) == (20_000, 32_000, 30_400)
    assert limit.source is LimitSource.CONFIGURED
    assert limit.reason == "model_auto_compact_token_limit = 20000 in config.toml"


def test_a_configured_limit_above_90_percent_is_clamped_to_the_configured_window() -> None:
    limit = resolve_compaction_limit(
        configured(context_window=32_000, auto_compact_token_limit=30_000), None, 30_400
    )
    assert (limit.limit, limit.source) == (28_800, LimitSource.CONFIGURED)
    assert limit.reason == "90 % of model_context_window = 32000 in config.toml"


def test_a_configured_window_alone_gives_90_percent_of_it() -> None:
    limit = resolve_compaction_limit(configured(context_window=48_000), "gpt-5.5", 45_600)
    assert (limit.limit, limit.source) == (43_200, LimitSource.CONFIGURED)


def test_without_configuration_l_is_codexs_default_for_the_reported_window() -> None:
    limit = resolve_compaction_limit(UNCONFIGURED, "gpt-5.3-codex", 258_400)
    assert (limit.limit, limit.context_window, limit.source) == (244_800, 272_000, LimitSource.MODEL_DEFAULT)


def test_the_catalogue_limit_of_the_threads_model_applies() -> None:
    catalogue = {"big": CatalogueModel("big", 400_000, 1_000_000, 300_000, 90)}
    configuration = CodexConfiguration(ModelSettings(), catalogue)
    limit = resolve_compaction_limit(configuration, "big", 360_000)
    assert (limit.limit, limit.context_window, limit.source) == (300_000, 400_000, LimitSource.MODEL_DEFAULT)
    assert "models_cache.json" in limit.reason
    # Another model of the same home has no such limit.
    other = resolve_compaction_limit(configuration, "gpt-5.5", 258_400)
    assert (other.limit, other.source) == (244_800, LimitSource.MODEL_DEFAULT)


def test_a_configured_limit_wins_over_the_catalogues() -> None:
    catalogue = {"big": CatalogueModel("big", 400_000, 1_000_000, 300_000, 90)}
    configuration = CodexConfiguration(ModelSettings(auto_compact_token_limit=250_000), catalogue)
    limit = resolve_compaction_limit(configuration, "big", 360_000)
    assert (limit.limit, limit.source) == (250_000, LimitSource.CONFIGURED)


def test_a_configured_window_is_capped_at_the_models_maximum() -> None:
    catalogue = {"m": CatalogueModel("m", 128_000, 128_000)}
    configuration = CodexConfiguration(ModelSettings(context_window=200_000), catalogue)
    limit = resolve_compaction_limit(configuration, "m", 121_600)
    assert (limit.limit, limit.source) == (115_200, LimitSource.CONFIGURED)


def test_a_reported_window_that_contradicts_the_configuration_is_assumed_and_keeps_the_lower_limit() -> None:
    # config.toml says 32,000, but the thread ran with a 48,000 window (codex -c ...): W = 45,600.
    configuration = configured(context_window=32_000, auto_compact_token_limit=20_000)
    limit = resolve_compaction_limit(configuration, None, 45_600)
    assert (limit.limit, limit.context_window, limit.source) == (20_000, 48_000, LimitSource.ASSUMED)
    assert "W = 45600" in limit.reason


def test_an_unreadable_configuration_is_assumed() -> None:
    configuration = CodexConfiguration(settings=None, problem="/h/config.toml cannot be used (bad)")
    limit = resolve_compaction_limit(configuration, None, 30_400)
    assert (limit.limit, limit.source) == (28_800, LimitSource.ASSUMED)
    assert limit.reason.startswith("/h/config.toml cannot be used (bad)")


def test_without_a_reported_window_the_configured_one_is_assumed() -> None:
    limit = resolve_compaction_limit(
        configured(context_window=32_000, auto_compact_token_limit=20_000), None, None
    )
    assert (limit.limit, limit.model_context_window, limit.source) == (20_000, 30_400, LimitSource.ASSUMED)


def test_the_reader_follows_edits_and_survives_a_broken_file(tmp_path: Path) -> None:
    reader = CodexConfigurationReader(tmp_path)
    assert reader.current() == UNCONFIGURED
    config = tmp_path / "config.toml"
    config.write_text("model_auto_compact_token_limit = 20000\n")
    assert reader.current().settings == ModelSettings(auto_compact_token_limit=20_000)
    same = reader.current()
    assert reader.current() is same  # unchanged files are not read again
    config.write_text("model_auto_compact_token_limit = = oops\n")
    broken = reader.current()
    assert broken.settings is None and "not valid TOML" in broken.problem
    (tmp_path / "models_cache.json").write_text(json.dumps({"models": [{"slug": "m", "context_window": 9}]}))
    assert set(reader.current().catalogue) == {"m"}
    config.unlink()
    assert reader.current().settings == ModelSettings()


def test_an_unreadable_config_file_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"\xff\xfe not utf-8")
    configuration = CodexConfigurationReader(tmp_path).current()
    assert configuration.settings is None
    assert str(config) in configuration.problem
    assert os.path.exists(config)
