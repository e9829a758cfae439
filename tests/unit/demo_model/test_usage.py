"""The demo model's usage rule, and that its defaults walk a 32,000-token thread into a compaction."""

from __future__ import annotations

import pytest

from demo_model.codex_home import DEFAULT_CONTEXT_WINDOW
from demo_model.usage import Usage, UsageModel
from services.context_budget.domain.policy import DEFAULT_POLICY, classify
from worker.codex_sessions.budget import auto_compact_token_limit, context_budget_remaining_percent


def test_input_grows_by_turn_tokens_per_user_turn() -> None:
    model = UsageModel(base_tokens=1_000, turn_tokens=300, output_tokens=7)
    assert model.usage(0) == Usage(1_000, 7)
    assert model.usage(4) == Usage(2_200, 7)
    assert model.usage(4).total_tokens == 2_207


def test_usage_has_the_responses_api_shape() -> None:
    assert UsageModel().usage(1).as_response_usage() == {
        "input_tokens": 14_000,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 100,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 14_100,
    }


@pytest.mark.parametrize("field", ["base_tokens", "turn_tokens", "output_tokens"])
def test_negative_counts_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        UsageModel(**{field: -1})


def test_negative_turns_are_refused() -> None:
    with pytest.raises(ValueError, match="user_turns"):
        UsageModel().usage(-1)


def test_defaults_pass_watch_urgent_and_critical_then_compact_before_turn_ten() -> None:
    model = UsageModel()
    limit = auto_compact_token_limit(DEFAULT_CONTEXT_WINDOW)
    totals = [model.usage(turn).total_tokens for turn in range(1, 10)]
    rings = [context_budget_remaining_percent(total, limit) for total in totals]
    levels = [classify(ring, DEFAULT_POLICY).value for ring in rings]
    assert levels == ["safe", "safe", "safe", "watch", "urgent", "urgent", "critical", "critical", "critical"]
    assert max(totals[:8]) < limit <= totals[8]
    assert totals[8] < DEFAULT_CONTEXT_WINDOW * 95 // 100
