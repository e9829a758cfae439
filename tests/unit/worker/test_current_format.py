"""Codex 0.169's rollout vocabulary (real-codex.md §4): every record kind parsed, and the tracker's
readings, compactions and handoff facts from them. Lines are shaped as real Codex 0.169 writes them
(field names and order of a real session, values of its own)."""

import json
from typing import Any

import pytest

from worker.codex_sessions.rollout import (
    AgentMessageRecord,
    CommandExecutionRecord,
    CompactedRecord,
    CompactionSummaryRecord,
    ContextCompactionItemRecord,
    ResponseUsageRecord,
    RolloutParseError,
    TokenUsage,
    UnknownRecord,
    UserMessageRecord,
    WorldStateRecord,
    parse_rollout_line,
)
from worker.codex_sessions.tracker import ThreadBudgetReading, ThreadBudgetTracker

THREAD = "01a23357-c8b7-7e23-8886-07fd278f6424"
W = 30_400


class Writer:
    """Lines of one 0.169 rollout, each with its ordinal, a second apart."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.thread_total = 0
        self.cumulative = 0

    def add(self, record_type: str, payload: dict[str, Any], metadata: dict[str, Any] | None = None) -> str:
        ordinal = len(self.lines)
        line: dict[str, Any] = {
            "timestamp": f"2026-12-01T20:{ordinal // 60:02d}:{ordinal % 60:02d}.000Z",
            "ordinal": ordinal,
            "type": record_type,
            "payload": payload,
        }
        if metadata is not None:
            line["metadata"] = metadata
        text = json.dumps(line)
        self.lines.append(text)
        return text

    def event(self, payload: dict[str, Any]) -> str:
        return self.add("event_msg", payload)

    def item(self, item: dict[str, Any]) -> str:
        return self.event({"type": "item_completed", "thread_id": THREAD, "turn_id": "t", "item": item})

    def response(self, total: int, *, count: bool = True) -> None:
        """A model response: its token_usage_record and token_count (input + 100 output)."""
        usage = usage_of(total - 100, 100)
        self.thread_total += total
        self.cumulative += total
        self.add(
            "token_usage_record",
            {
                "thread_id": THREAD,
                "turn_id": "t",
                "response_id": f"resp_{len(self.lines)}",
                "usage": usage,
                "thread_token_usage": usage_of(self.thread_total - 100, 100),
            },
        )
        if count:
            self.token_count(usage, usage_of(self.cumulative - 100, 100))

    def token_count(self, last: dict[str, int], total: dict[str, int]) -> None:
        info = {"total_token_usage": total, "last_token_usage": last, "model_context_window": W}
        self.event({"type": "token_count", "info": info, "rate_limits": {"limit_id": "codex"}})


def usage_of(input_tokens: int, output_tokens: int, *, total: int | None = None) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cached_input_tokens": 0,
        "cache_write_input_tokens": 0,
        "output_tokens": output_tokens,
        "reasoning_output_tokens": 0,
        "total_tokens": input_tokens + output_tokens if total is None else total,
    }


def test_item_completed_user_and_agent_messages() -> None:
    writer = Writer()
    user = writer.item(
        {
            "type": "UserMessage",
            "id": "u1",
            "content": [{"type": "text", "text": "fix it", "text_elements": []}],
        }
    )
    agent = writer.item({"type": "AgentMessage", "id": "m1", "content": [{"type": "Text", "text": "Fixed."}]})
    assert isinstance(parse_rollout_line(user), UserMessageRecord)
    assert parse_rollout_line(user).message == "fix it"  # type: ignore[union-attr]
    parsed = parse_rollout_line(agent)
    assert isinstance(parsed, AgentMessageRecord) and parsed.text == "Fixed."


def test_item_completed_command_execution() -> None:
    line = Writer().item(
        {
            "type": "CommandExecution",
            "id": "call_1",
            "process_id": "33908",
            "command": ["/bin/bash", "-lc", "pytest -q"],
            "cwd": "file:///w",
            "source": "unified_exec_startup",
            "status": "failed",
            "aggregated_output": "1 failed, 2 passed\n",
            "exit_code": 1,
            "duration": {"secs": 0, "nanos": 40963532},
        }
    )
    record = parse_rollout_line(line)
    assert isinstance(record, CommandExecutionRecord)
    assert (record.call_id, record.command, record.exit_code, record.status) == (
        "call_1",
        "pytest -q",
        1,
        "failed",
    )
    assert record.output == "1 failed, 2 passed\n"


def test_a_command_execution_with_a_bad_command_is_malformed() -> None:
    with pytest.raises(RolloutParseError, match="'command' is not a list of strings"):
        parse_rollout_line(Writer().item({"type": "CommandExecution", "id": "c", "command": [1, 2]}))


def test_item_completed_context_compaction_and_unknown_items() -> None:
    writer = Writer()
    compaction = parse_rollout_line(writer.item({"type": "ContextCompaction", "id": "01a2-ce40"}))
    assert isinstance(compaction, ContextCompactionItemRecord) and compaction.item_id == "01a2-ce40"
    plan = parse_rollout_line(writer.item({"type": "Plan", "id": "p"}))
    assert isinstance(plan, UnknownRecord) and plan.payload_type == "item_completed:Plan"


def test_token_usage_record_world_state_and_the_compaction_summary() -> None:
    writer = Writer()
    writer.response(12_064)
    record = parse_rollout_line(writer.lines[0])
    assert isinstance(record, ResponseUsageRecord)
    assert record.usage == TokenUsage(11_964, 0, 100, 0, 12_064)
    assert record.thread_token_usage is not None and record.thread_token_usage.total_tokens == 12_064
    world = writer.add("world_state", {"full": True, "state": {"model": "gpt-5.5", "model_catalog": "ea1a"}})
    assert parse_rollout_line(world) == WorldStateRecord(parse_rollout_line(world).timestamp, "gpt-5.5")
    summary = writer.add(
        "response_item",
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "SUMMARY"}]},
        {"history_sequence": 13, "compaction_output": True},
    )
    assert isinstance(parse_rollout_line(summary), CompactionSummaryRecord)
    ordinary = writer.add(
        "response_item",
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"history_sequence": 14},
    )
    assert isinstance(parse_rollout_line(ordinary), UnknownRecord)


def test_compacted_carries_its_compaction_response_id() -> None:
    line = Writer().add(
        "compacted",
        {
            "message": "summary",
            "replacement_history": [{}, {}],
            "window_number": 1,
            "compaction_response_id": "r9",
        },
    )
    record = parse_rollout_line(line)
    assert isinstance(record, CompactedRecord)
    assert (record.compaction_response_id, record.replacement_history_items) == ("r9", 2)


def test_unknown_kinds_of_the_current_format_are_ignored_quietly() -> None:
    writer = Writer()
    for payload in ({"type": "thread_settings_applied", "thread_settings": {}}, {"type": "turn_aborted"}):
        assert isinstance(parse_rollout_line(writer.event(payload)), UnknownRecord)
    assert isinstance(parse_rollout_line(writer.add("security_risk_score", {"x": 1})), UnknownRecord)


def feed(writer: Writer) -> tuple[ThreadBudgetTracker, list[ThreadBudgetReading]]:
    tracker = ThreadBudgetTracker(THREAD)
    readings = tracker.feed_many(parse_rollout_line(line) for line in writer.lines)
    return tracker, readings


def local_pre_turn_compaction(writer: Writer) -> None:
    """real-codex.md §5, lines 48-65: repeat, summary, the request's own usage, compacted, estimate."""
    writer.token_count(usage_of(21_026, 100), usage_of(writer.cumulative - 100, 100))  # repeated
    writer.add(
        "response_item",
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "S"}]},
        {"compaction_output": True},
    )
    writer.response(21_923)
    writer.add("compacted", {"message": "summary", "replacement_history": [{}] * 7})
    writer.add("world_state", {"full": True, "state": {"model": "gpt-5.5"}})
    writer.add("turn_context", {"turn_id": "t5", "cwd": "/w", "model": "gpt-5.5"})
    writer.token_count(usage_of(0, 0, total=6_928), usage_of(writer.cumulative - 100, 100))
    writer.item({"type": "ContextCompaction", "id": "c1"})


def test_a_local_compaction_is_reported_at_once_and_its_requests_usage_is_no_reading() -> None:
    writer = Writer()
    writer.response(18_000)
    writer.response(21_126)
    local_pre_turn_compaction(writer)
    tracker, readings = feed(writer)
    assert [(r.last_total_tokens, r.compaction_count) for r in readings] == [(18_000, 0), (21_126, 0), (0, 1)]
    assert readings[-1].awaiting_reading_after_compaction
    assert tracker.compaction_count == 1
    writer.response(12_197)
    _, readings = feed(writer)
    assert [r.last_total_tokens for r in readings] == [18_000, 21_126, 0, 12_197]
    assert not readings[-1].awaiting_reading_after_compaction


def test_a_remote_compaction_without_a_request_token_count_is_reported_once() -> None:
    writer = Writer()
    writer.response(24_068, count=False)
    writer.add("compacted", {"message": "", "replacement_history": [{"type": "compaction"}]})
    writer.add("world_state", {"full": True, "state": {"model": "gpt-5.5"}})
    writer.token_count(usage_of(0, 0, total=6_811), usage_of(66_148, 100))
    writer.item({"type": "ContextCompaction", "id": "c1"})
    writer.response(12_100)
    tracker, readings = feed(writer)
    assert [(r.last_total_tokens, r.compaction_count) for r in readings] == [(0, 1), (12_100, 1)]
    assert tracker.compaction_count == 1


def test_two_compactions_in_a_row_are_two() -> None:
    writer = Writer()
    writer.response(21_000)
    for _ in range(2):
        writer.add("compacted", {"message": ""})
        writer.item({"type": "ContextCompaction", "id": "c"})
    tracker, readings = feed(writer)
    assert tracker.compaction_count == 2
    assert [r.compaction_count for r in readings] == [0, 1, 2]


def test_the_model_of_world_state_is_the_threads() -> None:
    writer = Writer()
    writer.add("world_state", {"full": True, "state": {"model": "gpt-5.4-mini"}})
    writer.response(14_000)
    _, readings = feed(writer)
    assert readings[0].model == "gpt-5.4-mini"


def test_the_thread_token_usage_is_codexs_running_total() -> None:
    writer = Writer()
    for total in (12_054, 12_106, 15_109):
        writer.response(total)
    tracker, _ = feed(writer)
    assert tracker.thread_token_usage is not None
    assert tracker.thread_token_usage.total_tokens == 12_054 + 12_106 + 15_109
    assert tracker.total_token_usage is not None
    assert tracker.total_token_usage.total_tokens == 12_054 + 12_106 + 15_109


def test_handoff_facts_come_from_the_current_records() -> None:
    writer = Writer()
    call = {
        "type": "function_call",
        "name": "exec_command",
        "arguments": '{"cmd": "pytest -q"}',
        "call_id": "c7",
    }
    writer.add("response_item", call, {"history_sequence": 4})
    writer.response(14_000, count=False)
    writer.item(
        {
            "type": "CommandExecution",
            "id": "c7",
            "command": ["/bin/bash", "-lc", "pytest -q"],
            "status": "failed",
            "aggregated_output": "F..\n1 failed, 2 passed in 0.1s\n",
            "exit_code": 1,
        }
    )
    output = "Chunk ID: ba75\nWall time: 0.1 seconds\nProcess exited with code 1\n"
    output += "Output:\nF..\n1 failed, 2 passed\n"
    writer.add("response_item", {"type": "function_call_output", "call_id": "c7", "output": output})
    writer.item(
        {"type": "AgentMessage", "id": "m", "content": [{"type": "Text", "text": "Should I fix it?"}]}
    )
    tracker, _ = feed(writer)
    activity = tracker.last_activity
    assert activity.last_shell_command is not None
    assert (activity.last_shell_command.command, activity.last_shell_command.exit_code) == ("pytest -q", 1)
    assert activity.last_shell_command.output == "F..\n1 failed, 2 passed in 0.1s\n"
    assert activity.last_test_run is not None
    assert (activity.last_test_run.outcome, activity.last_test_run.summary) == (
        "failed",
        "1 failed, 2 passed in 0.1s",
    )
    assert activity.last_agent_message == "Should I fix it?"


def test_a_command_the_user_ran_directly_is_the_last_command() -> None:
    writer = Writer()
    writer.item(
        {
            "type": "CommandExecution",
            "id": "u-1",
            "command": ["/bin/bash", "-lc", "git status"],
            "status": "completed",
            "aggregated_output": "clean\n",
            "exit_code": 0,
        }
    )
    tracker, _ = feed(writer)
    shell = tracker.last_activity.last_shell_command
    assert shell is not None and (shell.command, shell.exit_code, shell.output) == (
        "git status",
        0,
        "clean\n",
    )


def test_an_all_zero_usage_is_not_100_percent_left() -> None:
    writer = Writer()
    writer.response(20_000)
    writer.token_count(usage_of(0, 0), usage_of(0, 0))
    _, readings = feed(writer)
    assert [r.last_total_tokens for r in readings] == [20_000]
