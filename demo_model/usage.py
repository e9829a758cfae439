"""The demo model's token usage: deterministic, growing by turn, reset by a compaction.

Pure arithmetic, no I/O. Every response reports

    input_tokens  = base_tokens + turn_tokens x (user messages since the last compaction summary)
    output_tokens = output_tokens (a constant)
    total_tokens  = input_tokens + output_tokens

so the thread's context (what Codex reads as ``last_token_usage.total_tokens``) grows by
``turn_tokens`` per user turn and falls back after each compaction, as a real model's would.

The defaults are chosen for a 32,000-token ``model_context_window`` (Codex reports 95 %, W = 30,400,
and compacts when a response's total reaches L = 90 %, 28,800 tokens; Boss's budget ring is
``(L - T) / (L - 12,000)`` with Codex's 12,000-token baseline). Turn n has T = 12,100 + 2,000·n:

| turn | T      | ring | level    |
|------|--------|------|----------|
| 1    | 14,100 | 87 % | safe     |
| 2    | 16,100 | 75 % | safe     |
| 3    | 18,100 | 63 % | safe     |
| 4    | 20,100 | 51 % | watch    |
| 5    | 22,100 | 39 % | urgent   |
| 6    | 24,100 | 27 % | urgent   |
| 7    | 26,100 | 16 % | critical |
| 8    | 28,100 | 4 %  | critical |
| 9    | 30,100 | 0 %  | past L: Codex compacts before turn 10, which is back at 14,100 |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_BASE_TOKENS = 12_000
DEFAULT_TURN_TOKENS = 2_000
DEFAULT_OUTPUT_TOKENS = 100


@dataclass(frozen=True)
class Usage:
    """Token counts of one response (plain token counts)."""

    input_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        """input + output tokens."""
        return self.input_tokens + self.output_tokens

    def as_response_usage(self) -> dict[str, Any]:
        """The ``usage`` object of a ``response.completed`` event, in the Responses API's shape."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True)
class UsageModel:
    """How many tokens the demo model says each response used.

    Attributes:
        base_tokens: input tokens of a request with no user turn since the last summary (the fixed
            instructions and tools).
        turn_tokens: input tokens each user turn since the last summary adds.
        output_tokens: output tokens of every response.

    Raises:
        ValueError: a count is negative.
    """

    base_tokens: int = DEFAULT_BASE_TOKENS
    turn_tokens: int = DEFAULT_TURN_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS

    def __post_init__(self) -> None:
        for name in ("base_tokens", "turn_tokens", "output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")

    def usage(self, user_turns: int) -> Usage:
        """The usage of a response to a request with ``user_turns`` user messages since the last summary.

        Raises:
            ValueError: ``user_turns`` is negative.
        """
        if user_turns < 0:
            raise ValueError(f"user_turns must be 0 or more, got {user_turns}")
        return Usage(self.base_tokens + self.turn_tokens * user_turns, self.output_tokens)
