"""The demo threads' pure rules: which plans, which prompt, which thread is due on a tick, when the
grower leaves a thread alone, and that the demo window takes a thread through every level into a
compaction."""

from __future__ import annotations

from dataclasses import replace

import pytest

from demo_model.threads import (
    CHAT_QUIET_S,
    DEMO_CONTEXT_WINDOW,
    DEMO_PLANS,
    DemoThreadPlan,
    demo_plans,
    describe_failure,
    due_on_tick,
    model_health_url,
    quiet_until,
)
from demo_model.usage import UsageModel
from services.context_budget.domain.model import ContextBudgetLevel
from services.context_budget.domain.policy import DEFAULT_POLICY, classify
from worker.codex_sessions.budget import auto_compact_token_limit, context_budget_remaining_percent
from worker.local_agent.codex_exec import CodexTurnResult
from worker.local_agent.codex_outcome import FailureKind

PLAN = DemoThreadPlan(name="p", module="m", prompts=("one", "two", "three"), initial_turns=1, turn_every=2)


def test_three_threads_are_the_built_in_plans_and_more_are_numbered_copies() -> None:
    assert demo_plans(3) == list(DEMO_PLANS)
    names = [plan.name for plan in demo_plans(7)]
    assert names == [
        "billing-api",
        "ios-sync-client",
        "firmware-flasher",
        "billing-api-2",
        "ios-sync-client-2",
        "firmware-flasher-2",
        "billing-api-3",
    ]
    assert demo_plans(4)[3] == replace(DEMO_PLANS[0], name="billing-api-2")


def test_no_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="--threads must be 1 or more, got 0"):
        demo_plans(0)


def test_one_thread_keeps_an_uncommitted_change_and_the_levels_start_apart() -> None:
    assert [plan.name for plan in DEMO_PLANS if plan.uncommitted_change] == ["ios-sync-client"]
    assert [plan.initial_turns for plan in DEMO_PLANS] == [1, 8, 13]  # safe, watch, critical


def test_prompts_are_used_in_turn_from_the_creating_one() -> None:
    assert [PLAN.prompt(index) for index in range(5)] == ["one", "two", "three", "one", "two"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prompts": ()}, "needs at least one prompt"),
        ({"initial_turns": 0}, "initial_turns of p must be 1 or more, got 0"),
        ({"turn_every": 0}, "turn_every of p must be 1 or more, got 0"),
    ],
)
def test_a_plan_that_cannot_run_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(PLAN, **changes)  # type: ignore[arg-type]


def test_a_thread_is_due_on_every_tick_its_turn_every_divides() -> None:
    every = {plan.name: plan.turn_every for plan in DEMO_PLANS}
    assert every == {"billing-api": 150, "ios-sync-client": 3, "firmware-flasher": 1}
    due = {
        tick: [plan.name for plan in due_on_tick(DEMO_PLANS, tick)] for tick in (1, 2, 3, 6, 149, 150, 300)
    }
    assert due == {
        1: ["firmware-flasher"],
        2: ["firmware-flasher"],
        3: ["ios-sync-client", "firmware-flasher"],
        6: ["ios-sync-client", "firmware-flasher"],
        149: ["firmware-flasher"],
        150: ["billing-api", "ios-sync-client", "firmware-flasher"],
        300: ["billing-api", "ios-sync-client", "firmware-flasher"],
    }


def test_a_write_by_somebody_else_keeps_the_grower_away_for_the_quiet_time() -> None:
    assert quiet_until(100.0, written_by_others=False, previous=0.0) == 0.0
    assert quiet_until(100.0, written_by_others=True, previous=0.0) == 100.0 + CHAT_QUIET_S
    assert quiet_until(100.0, written_by_others=True, previous=90.0, quiet_s=5.0) == 105.0
    # A later quiet time already set is kept; no new write keeps the old one.
    assert quiet_until(100.0, written_by_others=True, previous=500.0, quiet_s=5.0) == 500.0
    assert quiet_until(100.0, written_by_others=False, previous=130.0) == 130.0


@pytest.mark.parametrize(
    ("model_url", "health"),
    [
        ("http://127.0.0.1:8123/v1", "http://127.0.0.1:8123/healthz"),
        ("http://127.0.0.1:8123/v1/", "http://127.0.0.1:8123/healthz"),
        ("http://demo.local:9000", "http://demo.local:9000/healthz"),
    ],
)
def test_the_model_is_checked_at_its_health_url(model_url: str, health: str) -> None:
    assert model_health_url(model_url) == health


def test_a_failed_run_is_said_in_words() -> None:
    failed = CodexTurnResult("", FailureKind.MODEL_ERROR, "the model answered HTTP 500", "", 1, 0.3)
    assert describe_failure(failed) == "model error: the model answered HTTP 500"
    bare = CodexTurnResult("", FailureKind.NO_REPLY, "", "", 0, 0.3)
    assert describe_failure(bare) == "no reply"


def levels_by_turn(window: int, usage: UsageModel, turns: int) -> list[ContextBudgetLevel | str]:
    """The level of each user turn since the last compaction, "compacts" once a response reaches L
    (Codex then compacts before the next turn)."""
    limit = auto_compact_token_limit(window)
    levels: list[ContextBudgetLevel | str] = []
    for turn in range(1, turns + 1):
        total = usage.usage(turn).total_tokens
        if total >= limit:
            levels.append("compacts")
            break
        levels.append(classify(context_budget_remaining_percent(total, limit), DEFAULT_POLICY))
    return levels


def test_the_demo_window_takes_a_thread_through_every_level_into_a_compaction() -> None:
    levels = levels_by_turn(DEMO_CONTEXT_WINDOW, UsageModel(), 40)
    safe, watch, urgent, critical = (
        ContextBudgetLevel.SAFE,
        ContextBudgetLevel.WATCH,
        ContextBudgetLevel.URGENT,
        ContextBudgetLevel.CRITICAL,
    )
    assert levels == [safe] * 6 + [watch] * 3 + [urgent] * 2 + [critical] * 4 + ["compacts"]
    # Where the built-in threads start: safe, watch and critical.
    assert [levels[plan.initial_turns - 1] for plan in DEMO_PLANS] == [safe, watch, critical]
