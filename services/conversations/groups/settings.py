"""The group chat's settings, from the environment of the conversations service.

| variable | default | meaning |
|---|---|---|
| BOSS_DISPATCH_PLAN_TTL_SECONDS | 1800 | an unconfirmed plan expires after this (nothing is sent) |
| BOSS_DISPATCH_MAX_TARGETS | 10 | most threads one plan sends a message to (healthier and idle first) |
| BOSS_DISPATCH_IDLE_AFTER_SECONDS | 300 | a thread whose context grew within this counts as busy |
| BOSS_DISPATCH_MODEL_TIMEOUT_SECONDS | 20 | how long the master model may take to draft or summarise |
| BOSS_DISPATCH_EXPIRY_CHECK_SECONDS | 10 | how often expired plans are looked for (and said so) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from services.conversations.groups.choice import DEFAULT_IDLE_AFTER, DEFAULT_MAX_TARGETS, ChoiceSettings


@dataclass(frozen=True)
class DispatchSettings:
    """Spans are timedeltas, the model timeout seconds (see the module docstring)."""

    plan_ttl: timedelta = timedelta(minutes=30)
    choice: ChoiceSettings = field(default_factory=ChoiceSettings)
    model_timeout_s: float = 20.0
    expiry_check: timedelta = timedelta(seconds=10)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DispatchSettings:
        """The settings from BOSS_DISPATCH_* variables (defaults for unset ones). Raises ValueError
        naming the variable for a value that is not a positive number (an integer for the target
        limit)."""
        env = os.environ if environ is None else environ

        def number(name: str, default: float) -> float:
            text = env.get(f"BOSS_DISPATCH_{name}", "").strip()
            if not text:
                return default
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"BOSS_DISPATCH_{name} must be a number, not {text!r}") from None
            if not value > 0:
                raise ValueError(f"BOSS_DISPATCH_{name} must be positive, not {text!r}")
            return value

        max_targets = number("MAX_TARGETS", DEFAULT_MAX_TARGETS)
        if max_targets != int(max_targets):
            raise ValueError(f"BOSS_DISPATCH_MAX_TARGETS must be a whole number, not {max_targets}")
        return cls(
            plan_ttl=timedelta(seconds=number("PLAN_TTL_SECONDS", 1800)),
            choice=ChoiceSettings(
                max_targets=int(max_targets),
                idle_after=timedelta(
                    seconds=number("IDLE_AFTER_SECONDS", DEFAULT_IDLE_AFTER.total_seconds())
                ),
            ),
            model_timeout_s=number("MODEL_TIMEOUT_SECONDS", 20.0),
            expiry_check=timedelta(seconds=number("EXPIRY_CHECK_SECONDS", 10)),
        )
