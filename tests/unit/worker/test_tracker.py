"""ThreadBudgetTracker: which token_counts become readings, compaction counting, D-2 estimates, activity."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from worker.codex_sessions.codex_config import CodexConfiguration, LimitSource, ModelSettings
from worker.codex_sessions.rollout import (
    AgentMessageRecord,
    CompactedRecord,
    ContextCompactedRecord,
    CustomToolCallOutputRecord,
    CustomToolCallRecord,
    FunctionCallOutputRecord,
    FunctionCallRecord,
    LocalShellCallRecord,
    SessionMetaRecord,
    TaskStartedRecord,
    TokenCountRecord,
    TokenUsage,
    TurnContextRecord,
    UnknownRecord,
)
from worker.codex_sessions.tracker import (
    ThreadBudgetTracker,
    ToolRun,
    TrackerSettings,
    classify_test_run,
    estimate_growth,
    is_test_command,
    mean_positive_growth,
)

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
W = 258_400
L = 244_800


def at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


class Session:
    """Builds token_count records whose cumulative totals grow like Codex's."""

    def __init__(self) -> None:
        self.cumulative = 0

    def response(self, minutes: float, total: int, window: int | None = W) -> TokenCountRecord:
        self.cumulative += total
        last = TokenUsage(total - 300, total // 2, 300, 100, total)
        return TokenCountRecord(
            at(minutes), last, TokenUsage(self.cumulative, 0, 0, 0, self.cumulative), window
        )

    def reemit(self, minutes: float, previous: TokenCountRecord) -> TokenCountRecord:
        return TokenCountRecord(at(minutes), previous.last_token_usage, previous.total_token_usage, W)

    def estimate(self, minutes: float, total: int) -> TokenCountRecord:
        return TokenCountRecord(
            at(minutes),
            TokenUsage(0, 0, 0, 0, total),
            TokenUsage(self.cumulative, 0, 0, 0, self.cumulative),
            W,
        )


def totals(readings: list) -> list[int]:
    return [reading.last_total_tokens for reading in readings]


def test_first_reading_has_budget_figures_and_no_estimates() -> None:
    session = Session()
    tracker = ThreadBudgetTracker("fallback-id")
    tracker.feed(TurnContextRecord(at(0), "t1", "/w", "gpt-5.5"))
    reading = tracker.feed(session.response(1, 34_900))
    assert reading is not None
    assert reading.codex_thread_id == "fallback-id"
    assert (reading.cwd, reading.model) == ("/w", "gpt-5.5")
    assert reading.last_total_tokens == 34_900
    assert (reading.model_context_window, reading.context_window, reading.auto_compact_token_limit) == (
        W,
        272_000,
        L,
    )
    assert reading.codex_context_left_pct == 91
    assert reading.context_budget_remaining_pct == 90.2
    assert (reading.compaction_count, reading.last_compaction_at) == (0, None)
    assert reading.estimated_remaining_turns is None
    assert reading.estimated_remaining_large_messages is None
    assert reading.compaction_expected_at is None
    assert reading.captured_at == at(1)
    assert reading.reading_sequence == 1
    assert tracker.latest_reading == reading


def test_session_meta_id_wins_over_file_name_and_first_meta_wins() -> None:
    tracker = ThreadBudgetTracker("from-file-name")
    tracker.feed(SessionMetaRecord(at(0), "thread-a", "/a", "0.128.0", "codex_cli_rs", "openai", None, None))
    tracker.feed(
        SessionMetaRecord(at(0), "parent-thread", "/p", "0.128.0", "codex_cli_rs", "openai", None, None)
    )
    reading = tracker.feed(Session().response(1, 20_000))
    assert reading is not None
    assert (reading.codex_thread_id, reading.cwd) == ("thread-a", "/a")


def test_null_info_and_reemits_are_not_readings() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    assert tracker.feed(TokenCountRecord(at(0), None, None, None)) is None
    first = session.response(1, 30_000)
    readings = tracker.feed_many([first, session.reemit(1.1, first), session.reemit(2, first)])
    second = session.response(3, 36_000)
    readings += tracker.feed_many([second, session.reemit(3.2, second)])
    assert totals(readings) == [30_000, 36_000]
    assert [reading.reading_sequence for reading in readings] == [1, 2]


def test_window_falls_back_to_task_started_then_to_codex_default() -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed(TaskStartedRecord(at(0), "t1", 950_000))
    reading = tracker.feed(Session().response(1, 100_000, window=None))
    assert reading is not None
    assert (reading.model_context_window, reading.context_window, reading.auto_compact_token_limit) == (
        950_000,
        1_000_000,
        900_000,
    )
    bare = ThreadBudgetTracker().feed(Session().response(1, 100_000, window=None))
    assert bare is not None
    assert (bare.model_context_window, bare.context_window) == (W, 272_000)


def test_configured_limit_lowers_l() -> None:
    configuration = CodexConfiguration(ModelSettings(auto_compact_token_limit=200_000))
    tracker = ThreadBudgetTracker(configuration=configuration)
    reading = tracker.feed(Session().response(1, 106_000))
    assert reading is not None
    assert reading.auto_compact_token_limit == 200_000
    assert reading.compaction_limit_source is LimitSource.CONFIGURED
    assert reading.context_budget_remaining_pct == 50.0


def test_a_configuration_change_applies_to_the_next_reading() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    first = tracker.feed(session.response(1, 106_000))
    tracker.use_configuration(CodexConfiguration(ModelSettings(auto_compact_token_limit=150_000)))
    second = tracker.feed(session.response(2, 107_000))
    assert first is not None and second is not None
    assert (first.auto_compact_token_limit, first.compaction_limit_source) == (L, LimitSource.MODEL_DEFAULT)
    assert (second.auto_compact_token_limit, second.compaction_limit_source) == (
        150_000,
        LimitSource.CONFIGURED,
    )


def test_an_unreadable_configuration_is_reported_as_assumed() -> None:
    configuration = CodexConfiguration(settings=None, problem="config.toml is not valid TOML")
    reading = ThreadBudgetTracker(configuration=configuration).feed(Session().response(1, 106_000))
    assert reading is not None
    assert (reading.auto_compact_token_limit, reading.compaction_limit_source) == (L, LimitSource.ASSUMED)
    assert "not valid TOML" in reading.compaction_limit_reason


def test_all_zero_usage_is_no_reading() -> None:
    empty = TokenUsage(0, 0, 0, 0, 0)
    assert ThreadBudgetTracker().feed(TokenCountRecord(at(1), empty, empty, W)) is None


def test_compaction_sequence_counts_once_and_skips_estimates() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    before = session.response(1, 212_134)
    readings = tracker.feed_many(
        [
            before,
            session.estimate(2, 940_499),
            CompactedRecord(at(2.01), "", 40),
            ContextCompactedRecord(at(2.02)),
            TurnContextRecord(at(2.03), "t1", "/w", "gpt-5.5"),
            session.estimate(2.05, 940_499),
            session.response(2.2, 48_687),
        ]
    )
    assert totals(readings) == [212_134, 0, 48_687]
    awaiting = readings[1]
    assert awaiting.awaiting_reading_after_compaction
    assert (awaiting.compaction_count, awaiting.last_compaction_at) == (1, at(2.01))
    assert (awaiting.context_budget_remaining_pct, awaiting.codex_context_left_pct) == (100.0, None)
    assert awaiting.reading_sequence == 2
    after = readings[-1]
    assert not after.awaiting_reading_after_compaction
    assert after.compaction_count == 1
    assert after.last_compaction_at == at(2.01)
    assert after.codex_context_left_pct == 85
    assert after.estimated_remaining_turns is None


def test_newer_order_compacted_then_estimate_then_context_compacted_counts_once() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    tracker.feed_many(
        [
            session.response(1, 230_000),
            CompactedRecord(at(2), "summary", 3),
            TurnContextRecord(at(2.01), "t1", "/w", "gpt-5.5"),
            session.estimate(2.02, 61_000),
            ContextCompactedRecord(at(2.03)),
            session.response(3, 52_000),
        ]
    )
    assert tracker.compaction_count == 1
    assert tracker.last_compaction_at == at(2)


@pytest.mark.parametrize(
    "records",
    [
        [CompactedRecord(at(2), "", 0)],
        [ContextCompactedRecord(at(2))],
    ],
)
def test_a_lone_compaction_record_counts(records: list) -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed_many(records)
    assert tracker.compaction_count == 1
    assert tracker.last_compaction_at == at(2)


def test_context_compacted_first_then_compacted_counts_once_at_compacted_time() -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed_many([ContextCompactedRecord(at(2)), CompactedRecord(at(2.01), "", 0)])
    assert tracker.compaction_count == 1
    assert tracker.last_compaction_at == at(2.01)


def test_two_compactions_are_two() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    tracker.feed_many(
        [
            CompactedRecord(at(1), "", 0),
            ContextCompactedRecord(at(1.01)),
            session.response(2, 40_000),
            CompactedRecord(at(3), "", 0),
            ContextCompactedRecord(at(3.01)),
            CompactedRecord(at(4), "", 0),
        ]
    )
    assert tracker.compaction_count == 3
    assert tracker.last_compaction_at == at(4)


def test_growth_estimates_from_recent_turns() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    readings = tracker.feed_many(
        [session.response(0, 100_000), session.response(1, 110_000), session.response(2, 118_000)]
    )
    last = readings[-1]
    # Mean growth 9,000 tokens per turn; L - T = 126,800 tokens.
    assert last.estimated_remaining_turns == 14
    assert last.estimated_remaining_large_messages == 15
    # 18,000 tokens in 2 minutes = 9,000 tokens/minute: 126,800 / 9,000 minutes after the reading.
    assert last.compaction_expected_at == at(2) + timedelta(minutes=126_800 / 9_000)


def test_growth_window_uses_only_the_last_turns() -> None:
    session = Session()
    tracker = ThreadBudgetTracker(settings=TrackerSettings(growth_window_turns=2))
    readings = tracker.feed_many(
        [session.response(minute, total) for minute, total in enumerate([20_000, 100_000, 101_000, 102_000])]
    )
    assert readings[-1].estimated_remaining_turns == (L - 102_000) // 1_000


def test_estimates_reset_at_compaction() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    tracker.feed_many([session.response(0, 200_000), session.response(1, 220_000)])
    tracker.feed(CompactedRecord(at(2), "", 0))
    first = tracker.feed(session.response(3, 40_000))
    second = tracker.feed(session.response(4, 45_000))
    assert first is not None and second is not None
    assert first.estimated_remaining_turns is None
    assert second.estimated_remaining_turns == (L - 45_000) // 5_000


def test_no_growth_gives_no_estimates() -> None:
    session = Session()
    tracker = ThreadBudgetTracker()
    readings = tracker.feed_many([session.response(0, 90_000), session.response(1, 85_000)])
    assert readings[-1].estimated_remaining_turns is None
    assert readings[-1].estimated_remaining_large_messages is None
    assert readings[-1].compaction_expected_at is None


def test_estimate_growth_caps_far_projections() -> None:
    samples = [(at(0), 100_000), (at(60 * 24 * 10), 100_010)]
    estimate = estimate_growth(samples, L, 8_000, timedelta(days=30))
    assert estimate.remaining_turns == (L - 100_010) // 10
    assert estimate.compaction_expected_at is None


def test_mean_positive_growth_ignores_shrinking_steps() -> None:
    assert mean_positive_growth([10, 20, 15, 45]) == 20
    assert mean_positive_growth([10]) is None


def test_unknown_records_are_ignored() -> None:
    tracker = ThreadBudgetTracker()
    assert tracker.feed(UnknownRecord(at(0), "world_state", None)) is None
    assert tracker.latest_reading is None


def call(call_id: str, command: str, minutes: float = 0) -> FunctionCallRecord:
    return FunctionCallRecord(at(minutes), "exec_command", json.dumps({"cmd": command}), call_id)


def test_last_activity_tracks_calls_outputs_and_tests() -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed(AgentMessageRecord(at(0), "Running the tests."))
    tracker.feed(call("c1", "pytest -q tests/unit"))
    running = tracker.last_activity.last_test_run
    assert running is not None and running.outcome == "running"
    output = "Exit code: 0\nWall time: 1.2 seconds\nOutput:\n....\n3 passed in 0.41s\n"
    tracker.feed(FunctionCallOutputRecord(at(1), "c1", output))
    tracker.feed(call("c2", "git status --short", 2))
    tracker.feed(FunctionCallOutputRecord(at(2.1), "c2", "Exit code: 0\nOutput:\n M a.py\n"))
    tracker.feed(CustomToolCallRecord(at(3), "apply_patch", "*** Begin Patch", "c3", "completed"))
    tracker.feed(CustomToolCallOutputRecord(at(3.1), "c3", "Success."))

    activity = tracker.last_activity
    assert activity.last_agent_message == "Running the tests."
    assert activity.last_agent_message_at == at(0)
    assert activity.last_tool_call is not None
    assert (activity.last_tool_call.tool_name, activity.last_tool_call.output) == ("apply_patch", "Success.")
    assert activity.last_shell_command is not None
    assert activity.last_shell_command.command == "git status --short"
    assert activity.last_shell_command.exit_code == 0
    test = activity.last_test_run
    assert test is not None
    assert (test.run.command, test.outcome, test.summary) == (
        "pytest -q tests/unit",
        "passed",
        "3 passed in 0.41s",
    )
    assert test.run.finished_at == at(1)


def test_late_output_of_an_older_call_does_not_replace_the_newer_call() -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed(call("c1", "cargo build"))
    tracker.feed(call("c2", "cargo test", 1))
    tracker.feed(FunctionCallOutputRecord(at(2), "c1", "Exit code: 0\n"))
    activity = tracker.last_activity
    assert activity.last_tool_call is not None and activity.last_tool_call.call_id == "c2"
    assert activity.last_shell_command is not None and activity.last_shell_command.output is None
    tracker.feed(
        FunctionCallOutputRecord(at(3), "c2", "Exit code: 101\ntest result: FAILED. 1 passed; 1 failed")
    )
    test = tracker.last_activity.last_test_run
    assert test is not None
    assert (test.outcome, test.summary) == ("failed", "test result: FAILED. 1 passed; 1 failed")


def test_local_shell_call_output_arrives_as_function_call_output() -> None:
    tracker = ThreadBudgetTracker()
    tracker.feed(LocalShellCallRecord(at(0), "c9", ("bash", "-lc", "go test ./..."), "completed", "/w"))
    tracker.feed(
        FunctionCallOutputRecord(
            at(1), "c9", json.dumps({"output": "ok  pkg 0.2s", "metadata": {"exit_code": 0}})
        )
    )
    test = tracker.last_activity.last_test_run
    assert test is not None and test.outcome == "passed"
    assert test.run.command == "go test ./..."


@pytest.mark.parametrize(
    ("command", "is_test"),
    [
        ("pytest -q", True),
        ("python -m pytest tests/unit -x", True),
        ("cd app && npm test", True),
        ("npm run test -- --watch=false", True),
        ("cargo test --workspace", True),
        ("go test ./...", True),
        ("make test", True),
        (".venv/bin/pytest", True),
        ("git log --oneline", False),
        ("cat pytest.ini", False),
        ("make build", False),
    ],
)
def test_test_command_detection(command: str, is_test: bool) -> None:
    assert is_test_command(command) is is_test


@pytest.mark.parametrize(
    ("output", "outcome", "summary"),
    [
        ("=== 2 failed, 10 passed in 3.1s ===", "failed", "=== 2 failed, 10 passed in 3.1s ==="),
        ("....\n12 passed in 0.9s", "passed", "12 passed in 0.9s"),
        ("collecting ...", "unknown", None),
    ],
)
def test_test_outcome_without_exit_code(output: str, outcome: str, summary: str | None) -> None:
    run = ToolRun("c", "exec_command", "pytest", "{}", at(0), output=output, finished_at=at(1))
    result = classify_test_run(run)
    assert (result.outcome, result.summary) == (outcome, summary)
