"""Budget arithmetic: Codex's "% context left", the compaction limit and Boss's D-1 percent."""

from decimal import ROUND_HALF_UP, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.codex_sessions.budget import (
    BASELINE_TOKENS,
    auto_compact_token_limit,
    codex_context_left_percent,
    context_budget_remaining_percent,
    full_context_window,
    is_compaction_estimate,
)
from worker.codex_sessions.rollout import TokenUsage

W_272K = 258_400
L_272K = 244_800


@pytest.mark.parametrize(
    ("total_tokens", "expected"),
    [(34_900, 91), (212_134, 19), (940_499, 0), (48_687, 85), (191_970, 27), (18_994, 97)],
)
def test_codex_percent_matches_known_values(total_tokens: int, expected: int) -> None:
    assert codex_context_left_percent(total_tokens, W_272K) == expected


def test_codex_percent_rounds_exact_half_away_from_zero() -> None:
    # W - B = 1,024 and 128 tokens remaining: 128 / 1024 * 100 = 12.5 exactly, also in doubles.
    window = BASELINE_TOKENS + 1_024
    total = BASELINE_TOKENS + 1_024 - 128
    assert codex_context_left_percent(total, window) == 13
    assert round(12.5) == 12  # what banker's rounding would have shown


def test_codex_percent_follows_float_arithmetic_like_codex() -> None:
    # Exactly 57.5 in rationals, 57.49999999999999 in f64: Codex (Rust f64) shows 57.
    assert codex_context_left_percent(116_720, W_272K) == 57


def test_codex_percent_is_100_below_baseline_and_0_for_tiny_windows() -> None:
    assert codex_context_left_percent(0, W_272K) == 100
    assert codex_context_left_percent(BASELINE_TOKENS, W_272K) == 100
    assert codex_context_left_percent(5_000, BASELINE_TOKENS) == 0
    assert codex_context_left_percent(5_000, 0) == 0


def test_full_window_inverts_the_95_percent_reduction() -> None:
    assert full_context_window(W_272K) == 272_000
    assert full_context_window(950_000) == 1_000_000
    assert full_context_window(100, effective_percent=100) == 100
    assert full_context_window(1_000) * 95 // 100 == 1_000
    with pytest.raises(ValueError, match="effective_percent"):
        full_context_window(W_272K, effective_percent=0)


def test_auto_compact_limit_is_90_percent_and_config_only_lowers_it() -> None:
    assert auto_compact_token_limit(272_000) == L_272K
    assert auto_compact_token_limit(400_000) == 360_000
    assert auto_compact_token_limit(272_000, configured_limit=200_000) == 200_000
    assert auto_compact_token_limit(272_000, configured_limit=300_000) == L_272K


def test_context_budget_percent_follows_d1() -> None:
    # 100 * (244,800 - 212,134) / (244,800 - 12,000) = 14.0318...
    assert context_budget_remaining_percent(212_134, L_272K) == 14.0
    # 100 * (244,800 - 48,687) / 232,800 = 84.2410...
    assert context_budget_remaining_percent(48_687, L_272K) == 84.2
    assert context_budget_remaining_percent(L_272K, L_272K) == 0.0
    assert context_budget_remaining_percent(940_499, L_272K) == 0.0
    assert context_budget_remaining_percent(1_000, L_272K) == 100.0
    assert context_budget_remaining_percent(5_000, BASELINE_TOKENS) == 0.0


def test_context_budget_percent_rounds_half_up_to_one_decimal() -> None:
    # L - B = 1,000: 100 * 5 / 1000 = 0.5 exactly, so 0.05 steps are exact too: 0.25 -> 0.3.
    limit = BASELINE_TOKENS + 1_000
    assert context_budget_remaining_percent(limit - 5, limit) == 0.5
    limit = BASELINE_TOKENS + 2_000
    assert context_budget_remaining_percent(limit - 5, limit) == 0.3


def test_compaction_estimate_has_only_a_total() -> None:
    assert is_compaction_estimate(TokenUsage(0, 0, 0, 0, 940_499))
    assert not is_compaction_estimate(TokenUsage(48_297, 22_912, 390, 95, 48_687))
    assert not is_compaction_estimate(TokenUsage(0, 0, 0, 0, 0))
    assert not is_compaction_estimate(TokenUsage(0, 0, 10, 0, 10))


def _reference_codex_percent(total: int, window: int) -> int:
    """Exact-arithmetic reference of Codex's formula (differs from f64 only at rare x.5 edges)."""
    if window <= BASELINE_TOKENS:
        return 0
    effective = window - BASELINE_TOKENS
    remaining = max(0, effective - max(0, total - BASELINE_TOKENS))
    share = (Decimal(remaining) * 100 / Decimal(effective)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return int(min(Decimal(100), max(Decimal(0), share)))


tokens = st.integers(min_value=0, max_value=3_000_000)
windows = st.integers(min_value=0, max_value=2_000_000)


@given(total=tokens, window=windows)
def test_codex_percent_is_within_0_and_100(total: int, window: int) -> None:
    assert 0 <= codex_context_left_percent(total, window) <= 100


@given(first=tokens, second=tokens, window=windows)
def test_codex_percent_never_rises_with_more_tokens(first: int, second: int, window: int) -> None:
    low, high = sorted((first, second))
    assert codex_context_left_percent(low, window) >= codex_context_left_percent(high, window)


@given(total=tokens, window=windows)
def test_codex_percent_is_within_one_of_exact_arithmetic(total: int, window: int) -> None:
    assert abs(codex_context_left_percent(total, window) - _reference_codex_percent(total, window)) <= 1


@given(total=tokens, limit=windows)
def test_budget_percent_is_within_0_and_100(total: int, limit: int) -> None:
    assert 0.0 <= context_budget_remaining_percent(total, limit) <= 100.0


@given(first=tokens, second=tokens, limit=windows)
def test_budget_percent_never_rises_with_more_tokens(first: int, second: int, limit: int) -> None:
    low, high = sorted((first, second))
    assert context_budget_remaining_percent(low, limit) >= context_budget_remaining_percent(high, limit)
