"""Codex context-budget arithmetic: Codex's own "% context left" and Boss's budget before compaction.

Pure functions and constants, no I/O. Every formula cites the Codex source it mirrors (upstream
``openai/codex`` main at 2026-04-25, as recorded in ``research/codex-context.md`` §1-§2) or the SPEC
decision it implements (D-1, D-3). Units: tokens are plain ints, percents are 0-100.
"""

import math
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from worker.codex_sessions.rollout import TokenUsage

BASELINE_TOKENS = 12_000
"""Tokens Codex reserves for prompts, tools and room to call compact.

``BASELINE_TOKENS`` in codex-rs/protocol/src/protocol.rs (protocol.rs:2242-2288); hard-coded since
Codex PR #3190 (2025-09-04).
"""

DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT = 95
"""Share (percent) of the full window Codex reports as ``model_context_window``.

``default_effective_context_window_percent() -> 95`` in codex-rs/protocol/src/openai_models.rs:242-244
and :288-291; applied in codex-rs/core/src/session/turn_context.rs:106-113.
"""

DEFAULT_CONTEXT_WINDOW = 272_000
"""Full context window (tokens) of every bundled model and of Codex's fallback for unknown slugs.

codex-rs/models-manager/models.json and codex-rs/models-manager/src/model_info.rs:66-102.
"""

AUTO_COMPACT_NUMERATOR = 9
AUTO_COMPACT_DENOMINATOR = 10
"""Default auto-compact limit is 9/10 of the full window (codex-rs/protocol/src/openai_models.rs:281-323)."""


def _round_half_away_from_zero(value: float) -> int:
    """Round a non-negative float the way Rust's ``f64::round`` does: halves go up (away from zero).

    Python's ``round()`` rounds halves to even (banker's rounding) and would give 12 for 12.5 where
    Codex shows 13. ``value - floor(value)`` is exact for doubles, so the comparison with 0.5 is exact.
    """
    whole = math.floor(value)
    return whole + 1 if value - whole >= 0.5 else whole


def codex_context_left_percent(total_tokens: int, model_context_window: int) -> int:
    """Codex's displayed "N% context left", computed exactly as Codex computes it.

    Mirrors ``TokenUsage::percent_of_context_window_remaining`` in codex-rs/protocol/src/protocol.rs
    (protocol.rs:2242-2288)::

        if W <= BASELINE: 0
        else round(clamp(100 * max(0, (W - B) - max(0, T - B)) / (W - B), 0, 100))

    with the division and multiplication done in IEEE-754 doubles (``remaining / effective * 100``)
    and ``f64::round`` (half away from zero), so results match Codex bit for bit. A share that is
    exactly x.5 in exact arithmetic can come out of the doubles just below it (W = 258,400,
    T = 116,720 gives 57.49999999999999), and Codex then shows x, not x + 1; so does this function.

    Args:
        total_tokens: T, ``last_token_usage.total_tokens`` of the latest model response (tokens).
        model_context_window: W, Codex's ``model_context_window`` (tokens, already 95 % of the window).

    Returns:
        Percent left, an int in 0..100.
    """
    if model_context_window <= BASELINE_TOKENS:
        return 0
    effective_window = model_context_window - BASELINE_TOKENS
    used = max(0, total_tokens - BASELINE_TOKENS)
    remaining = max(0, effective_window - used)
    share = (remaining / effective_window) * 100.0
    return _round_half_away_from_zero(min(100.0, max(0.0, share)))


def full_context_window(
    model_context_window: int, effective_percent: int = DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT
) -> int:
    """Full context window CW (tokens) from Codex's reduced ``model_context_window`` W.

    Codex reports ``W = CW * effective_percent / 100`` with integer division
    (codex-rs/core/src/session/turn_context.rs:106-113). This returns the smallest CW that yields W:
    ``ceil(W * 100 / effective_percent)``; for W = 258,400 at 95 % that is exactly 272,000.

    Raises:
        ValueError: if ``effective_percent`` is not in 1..100.
    """
    if not 1 <= effective_percent <= 100:
        raise ValueError(f"effective_percent must be in 1..100, got {effective_percent}")
    return -(-model_context_window * 100 // effective_percent)


def auto_compact_token_limit(context_window: int, configured_limit: int | None = None) -> int:
    """Auto-compact token limit L (tokens) for a full context window CW.

    Mirrors ``ModelInfo::auto_compact_token_limit`` in codex-rs/protocol/src/openai_models.rs:281-323:
    the default is ``floor(CW * 9 / 10)`` (244,800 for 272,000) and a configured
    ``model_auto_compact_token_limit`` can only lower it: ``min(configured, floor(CW * 9 / 10))``.
    """
    default_limit = context_window * AUTO_COMPACT_NUMERATOR // AUTO_COMPACT_DENOMINATOR
    if configured_limit is None:
        return default_limit
    return min(configured_limit, default_limit)


def context_budget_remaining_percent(total_tokens: int, auto_compact_limit: int) -> float:
    """Boss's ``context_budget_remaining_pct``: usable room left before Codex auto-compacts (SPEC D-1).

    ``100 * max(0, L - T) / (L - B)`` with B = ``BASELINE_TOKENS``, clamped to 0..100 and rounded to
    one decimal (half away from zero, computed exactly with fractions). 0.0 when ``L <= B``.

    Args:
        total_tokens: T, the last model response's ``total_tokens`` (tokens).
        auto_compact_limit: L, the thread's auto-compact token limit (tokens).

    Returns:
        Percent 0.0..100.0 with one decimal.
    """
    usable = auto_compact_limit - BASELINE_TOKENS
    if usable <= 0:
        return 0.0
    share = Fraction(100 * max(0, auto_compact_limit - total_tokens), usable)
    clamped = min(Fraction(100), max(Fraction(0), share))
    exact = Decimal(clamped.numerator) / Decimal(clamped.denominator)
    return float(exact.quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def is_compaction_estimate(last_usage: TokenUsage) -> bool:
    """True when a ``last_token_usage`` is Codex's own estimate, not a model response (SPEC D-3).

    Around a compaction (and on resume) Codex's ``recompute_token_usage``
    (codex-rs/core/src/session/mod.rs:2762-2794) writes a usage whose input, cached input, output and
    reasoning tokens are all zero and only ``total_tokens`` is set (an estimate of the new history,
    940,499 tokens in a real session). Such a usage must never be reported as a reading.
    """
    components = (
        last_usage.input_tokens,
        last_usage.cached_input_tokens,
        last_usage.output_tokens,
        last_usage.reasoning_output_tokens,
    )
    return all(value == 0 for value in components) and last_usage.total_tokens != 0


def is_empty_usage(usage: TokenUsage) -> bool:
    """True when a usage has every count zero, ``total_tokens`` included: nothing was measured.

    Codex writes such a ``last_token_usage`` when a response reported no usage at all; taken as a
    reading it would claim an empty context ("100 % left"), so it is never one.
    """
    return (
        usage.total_tokens == 0
        and usage.input_tokens == 0
        and usage.cached_input_tokens == 0
        and usage.output_tokens == 0
        and usage.reasoning_output_tokens == 0
    )
