"""Where Codex auto-compacts a thread: L from Codex's own configuration, as Codex computes it.

The auto-compact limit L is not written in the rollout file (only W, ``model_context_window``, is;
``research/real-codex.md`` §5), so the worker reads what Codex reads:

- ``$CODEX_HOME/config.toml``: ``model``, ``model_context_window`` and
  ``model_auto_compact_token_limit`` at the top level, overridden by the active profile
  (``profile = "name"`` selects ``[profiles.name]``);
- ``$CODEX_HOME/models_cache.json``, Codex's cache of its model catalogue
  (codex-rs/models-manager/src/manager.rs ``MODEL_CACHE_FILE``; ``{"models": [ModelInfo, ...]}``,
  each with ``slug``, ``context_window``, ``max_context_window``, ``auto_compact_token_limit`` and
  ``effective_context_window_percent``), when present.

Codex's rules (codex-rs/protocol/src/openai_models.rs ``auto_compact_token_limit``, model_info.rs;
``research/codex-context.md`` §1.3, §2.1):

- the full window CW is the model's ``context_window`` (else ``max_context_window``, else 272,000);
  a configured ``model_context_window`` replaces it, capped at ``max_context_window``;
- Codex reports ``W = CW * effective_context_window_percent / 100`` (95 % by default);
- ``L = min(limit, floor(CW * 9 / 10))`` where ``limit`` is the configured
  ``model_auto_compact_token_limit``, else the model's ``auto_compact_token_limit``; a limit that is
  absent or not positive leaves ``floor(CW * 9 / 10)``.

Whenever the thread's rollout reports W, CW is taken from it (``ceil(W * 100 / percent)``): W is what
the thread really ran with, while the configuration may have changed since or been overridden on the
command line.

Each limit says where it came from (:class:`LimitSource`): ``configured`` (config.toml decided it: its
limit, or 90 % of its window), ``model_default`` (Codex's default for the thread's model: the
catalogue's limit, or 90 % of the model's window), ``assumed`` (Boss could not see what decides it:
config.toml unreadable or invalid, no window reported yet, or a reported W that disagrees with the
configuration, so a limit set where Boss cannot see it, e.g. ``codex -c`` or ``--profile``, may apply).

Not read (documented limits): ``-c`` / ``--profile`` given on Codex's command line, the catalogue
compiled into the Codex binary (its values are only known through the W it reports), the
``model_catalog_json`` file option, and 0.169's ``model_auto_compact_token_limit_scope`` and
``model_post_turn_compact_threshold_percent``.

Parsing and resolution are pure; :class:`CodexConfigurationReader` is the I/O edge (it re-reads the two
files when they change).
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from worker.codex_sessions.budget import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT,
    auto_compact_token_limit,
    full_context_window,
)

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.toml"
"""Codex's configuration, relative to ``$CODEX_HOME``."""

MODELS_CACHE_FILE = "models_cache.json"
"""Codex's model catalogue cache, relative to ``$CODEX_HOME`` (codex-rs/models-manager/src/manager.rs)."""


class CodexConfigError(ValueError):
    """A configuration file Codex would not accept; the message names the file and the problem."""


class LimitSource(StrEnum):
    """Where a thread's auto-compact limit L came from (see the module docstring)."""

    CONFIGURED = "configured"
    MODEL_DEFAULT = "model_default"
    ASSUMED = "assumed"


@dataclass(frozen=True)
class ModelSettings:
    """The settings of config.toml that decide L: the top level with the active profile applied.

    Attributes:
        model: the default model slug (``model``), None when not set.
        context_window: ``model_context_window`` in tokens (the full window CW), None when not set.
        auto_compact_token_limit: ``model_auto_compact_token_limit`` in tokens, None when not set.
        profile: the active profile's name, None when none is selected.
    """

    model: str | None = None
    context_window: int | None = None
    auto_compact_token_limit: int | None = None
    profile: str | None = None


@dataclass(frozen=True)
class CatalogueModel:
    """One model of Codex's catalogue cache (tokens; percent 1-100).

    Attributes:
        slug: the model's name as ``turn_context.model`` carries it.
        context_window / max_context_window: the model's full window and its cap, when given.
        auto_compact_token_limit: the model's own limit, when given.
        effective_context_window_percent: the share of CW Codex reports as W (95 when absent).
    """

    slug: str
    context_window: int | None = None
    max_context_window: int | None = None
    auto_compact_token_limit: int | None = None
    effective_context_window_percent: int = DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT

    @property
    def resolved_context_window(self) -> int | None:
        """``context_window``, else ``max_context_window`` (openai_models.rs ``resolved_context_window``)."""
        return self.context_window or self.max_context_window


@dataclass(frozen=True)
class CodexConfiguration:
    """What the worker knows of one Codex home's configuration.

    Attributes:
        settings: config.toml's settings, None when config.toml could not be read or parsed.
        catalogue: the catalogue cache's models by slug (empty without a cache).
        problem: why config.toml could not be used, in words ("" when it could, or is absent).
    """

    settings: ModelSettings | None = field(default_factory=ModelSettings)
    catalogue: Mapping[str, CatalogueModel] = field(default_factory=dict)
    problem: str = ""


UNCONFIGURED = CodexConfiguration()
"""A Codex home without config.toml or catalogue cache: Codex's defaults apply."""


@dataclass(frozen=True)
class CompactionLimit:
    """A thread's auto-compact limit and what it rests on.

    Attributes:
        limit: L in tokens.
        context_window: CW, the full window in tokens.
        model_context_window: W in tokens (reported by the rollout, else computed as Codex would).
        source: where L came from.
        reason: one sentence saying why, e.g. "model_auto_compact_token_limit = 20000 in config.toml".
    """

    limit: int
    context_window: int
    model_context_window: int
    source: LimitSource
    reason: str


def _positive_int(table: Mapping[str, Any], key: str, where: str) -> int | None:
    """``table[key]`` as a positive int; None when absent or not positive (Codex ignores those).

    Raises:
        CodexConfigError: the value is present but not an integer.
    """
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise CodexConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value if value > 0 else None


def _optional_text(table: Mapping[str, Any], key: str, where: str) -> str | None:
    """``table[key]`` as a string, None when absent.

    Raises:
        CodexConfigError: the value is present but not a string.
    """
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise CodexConfigError(f"{where}: '{key}' must be a string, got {value!r}")
    return value


def parse_config_toml(text: str) -> ModelSettings:
    """The L-deciding settings of a config.toml text, with the active profile applied.

    ``profile = "name"`` selects ``[profiles.name]``, whose ``model``, ``model_context_window`` and
    ``model_auto_compact_token_limit`` replace the top-level ones (a profile that does not exist
    makes Codex refuse to start, so it is an error here too). A limit or window that is 0 or
    negative is treated as not set, as Codex does (``filter(|limit| *limit > 0)``).

    Raises:
        CodexConfigError: not valid TOML, a setting of the wrong type, or an unknown profile.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CodexConfigError(f"{CONFIG_FILE} is not valid TOML: {error}") from error
    profile = _optional_text(document, "profile", CONFIG_FILE)
    tables: list[tuple[Mapping[str, Any], str]] = [(document, CONFIG_FILE)]
    if profile is not None:
        profiles = document.get("profiles")
        chosen = profiles.get(profile) if isinstance(profiles, dict) else None
        if not isinstance(chosen, dict):
            raise CodexConfigError(
                f"{CONFIG_FILE}: profile {profile!r} is selected but [profiles.{profile}] is missing"
            )
        tables.append((chosen, f"{CONFIG_FILE} [profiles.{profile}]"))
    model: str | None = None
    window: int | None = None
    limit: int | None = None
    for table, where in tables:
        model = _optional_text(table, "model", where) or model
        if "model_context_window" in table:
            window = _positive_int(table, "model_context_window", where)
        if "model_auto_compact_token_limit" in table:
            limit = _positive_int(table, "model_auto_compact_token_limit", where)
    return ModelSettings(model=model, context_window=window, auto_compact_token_limit=limit, profile=profile)


def parse_models_cache(text: str) -> dict[str, CatalogueModel]:
    """The models of a ``models_cache.json`` text by slug; entries without a slug are skipped.

    Shape: ``{"fetched_at": ..., "models": [{"slug": "gpt-5.5", "context_window": 272000,
    "max_context_window": 272000, "auto_compact_token_limit": null,
    "effective_context_window_percent": 95, ...}, ...]}`` (codex-rs/models-manager/src/cache.rs).

    Raises:
        CodexConfigError: not JSON, no ``models`` list, or a figure of the wrong type.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CodexConfigError(f"{MODELS_CACHE_FILE} is not valid JSON: {error.msg}") from error
    models = document.get("models") if isinstance(document, dict) else None
    if not isinstance(models, list):
        raise CodexConfigError(f"{MODELS_CACHE_FILE} has no 'models' list")
    catalogue: dict[str, CatalogueModel] = {}
    for entry in models:
        if not isinstance(entry, dict) or not isinstance(entry.get("slug"), str):
            continue
        slug = entry["slug"]
        where = f"{MODELS_CACHE_FILE} model {slug!r}"
        percent = _positive_int(entry, "effective_context_window_percent", where)
        catalogue[slug] = CatalogueModel(
            slug=slug,
            context_window=_positive_int(entry, "context_window", where),
            max_context_window=_positive_int(entry, "max_context_window", where),
            auto_compact_token_limit=_positive_int(entry, "auto_compact_token_limit", where),
            effective_context_window_percent=min(100, percent or DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT),
        )
    return catalogue


def resolve_compaction_limit(
    configuration: CodexConfiguration, model: str | None, reported_window: int | None
) -> CompactionLimit:
    """L for a thread running ``model`` that reported W = ``reported_window``, as Codex computes it.

    Args:
        configuration: the Codex home's configuration (:data:`UNCONFIGURED` for none).
        model: the thread's model (its latest ``turn_context`` / ``world_state``), else config.toml's.
        reported_window: W from the rollout (tokens), None before any line carried it.

    Returns:
        L, CW, W and the source (module docstring). With an unreadable config.toml the configured
        limit is unknown: L is Codex's default for the reported window and the source ``assumed``.
        When the reported W disagrees with the configuration, a configured limit is still applied
        (the lower, safer L) and the source is ``assumed``.
    """
    settings = configuration.settings
    slug = model or (settings.model if settings else None)
    entry = configuration.catalogue.get(slug) if slug else None
    percent = entry.effective_context_window_percent if entry else DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT
    model_window = (entry.resolved_context_window if entry else None) or DEFAULT_CONTEXT_WINDOW
    configured_window = settings.context_window if settings else None
    if configured_window is not None:
        cap = (entry.max_context_window or entry.context_window) if entry else None
        expected_window = min(configured_window, cap) if cap else configured_window
    else:
        expected_window = model_window
    expected_reported = expected_window * percent // 100
    if reported_window is not None:
        context_window = full_context_window(reported_window, percent)
        window = reported_window
    else:
        context_window, window = expected_window, expected_reported
    configured_limit = settings.auto_compact_token_limit if settings else None
    model_limit = entry.auto_compact_token_limit if entry else None
    limit = auto_compact_token_limit(context_window, configured_limit or model_limit)
    default_limit = auto_compact_token_limit(context_window)
    if settings is None:
        reason = f"{configuration.problem or CONFIG_FILE + ' could not be read'}: Codex's default assumed"
        return CompactionLimit(limit, context_window, window, LimitSource.ASSUMED, reason)
    if reported_window is None:
        reason = "no window reported yet: the configured or default window assumed"
        return CompactionLimit(limit, context_window, window, LimitSource.ASSUMED, reason)
    if reported_window != expected_reported and (configured_window is not None or entry is not None):
        reason = (
            f"Codex reported W = {reported_window}, the configuration gives {expected_reported}: the thread "
            "runs with settings Boss cannot see (command line?)"
        )
        return CompactionLimit(limit, context_window, window, LimitSource.ASSUMED, reason)
    if configured_limit is not None and limit == configured_limit:
        where = f"[profiles.{settings.profile}]" if settings.profile else CONFIG_FILE
        reason = f"model_auto_compact_token_limit = {configured_limit} in {where}"
        return CompactionLimit(limit, context_window, window, LimitSource.CONFIGURED, reason)
    if configured_window is not None and limit == default_limit:
        reason = f"90 % of model_context_window = {configured_window} in {CONFIG_FILE}"
        return CompactionLimit(limit, context_window, window, LimitSource.CONFIGURED, reason)
    if model_limit is not None and limit == model_limit:
        reason = f"auto_compact_token_limit = {model_limit} of {slug} in {MODELS_CACHE_FILE}"
        return CompactionLimit(limit, context_window, window, LimitSource.MODEL_DEFAULT, reason)
    reason = f"Codex's default: 90 % of the {context_window}-token window of {slug or 'the model'}"
    return CompactionLimit(limit, context_window, window, LimitSource.MODEL_DEFAULT, reason)


_Stamp = tuple[int, int] | None
"""(modification time in nanoseconds, size) of a file, None when it does not exist."""


class CodexConfigurationReader:
    """Reads ``config.toml`` and ``models_cache.json`` of one Codex home, again whenever they change.

    :meth:`current` stats both files (cheap) and re-parses only a file whose modification time or
    size changed; a problem is logged once per change, never raised.
    """

    def __init__(self, codex_home: Path) -> None:
        """Prepare to read ``codex_home``; nothing is read until :meth:`current`."""
        self._codex_home = codex_home
        self._stamps: tuple[_Stamp, _Stamp] = (None, None)
        self._settings: ModelSettings | None = ModelSettings()
        self._problem = ""
        self._catalogue: dict[str, CatalogueModel] = {}
        self._current: CodexConfiguration | None = None

    def current(self) -> CodexConfiguration:
        """The configuration as the files are now (re-read when changed since the last call)."""
        stamps = (_stamp(self._codex_home / CONFIG_FILE), _stamp(self._codex_home / MODELS_CACHE_FILE))
        if self._current is not None and stamps == self._stamps:
            return self._current
        if self._current is None or stamps[0] != self._stamps[0]:
            self._settings, self._problem = self._read_settings(stamps[0] is not None)
        if self._current is None or stamps[1] != self._stamps[1]:
            self._catalogue = self._read_catalogue(stamps[1] is not None)
        self._stamps = stamps
        self._current = CodexConfiguration(self._settings, dict(self._catalogue), self._problem)
        return self._current

    def _read_settings(self, exists: bool) -> tuple[ModelSettings | None, str]:
        path = self._codex_home / CONFIG_FILE
        if not exists:
            return ModelSettings(), ""
        try:
            settings = parse_config_toml(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, CodexConfigError) as error:
            logger.warning("cannot use %s (compaction limits are assumed until it is fixed): %s", path, error)
            return None, f"{path} cannot be used ({error})"
        logger.info(
            "Codex configuration %s: model %s, window %s, auto-compact limit %s%s",
            path,
            settings.model or "default",
            settings.context_window or "default",
            settings.auto_compact_token_limit or "default",
            f" (profile {settings.profile})" if settings.profile else "",
        )
        return settings, ""

    def _read_catalogue(self, exists: bool) -> dict[str, CatalogueModel]:
        path = self._codex_home / MODELS_CACHE_FILE
        if not exists:
            return {}
        try:
            return parse_models_cache(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, CodexConfigError) as error:
            logger.warning("ignoring Codex's model catalogue cache %s: %s", path, error)
            return {}


def _stamp(path: Path) -> _Stamp:
    try:
        status = path.stat()
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size)
