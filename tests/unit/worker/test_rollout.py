"""Parsing single rollout lines into typed records."""

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from worker.codex_sessions.rollout import (
    AgentMessageRecord,
    CompactedRecord,
    ContextCompactedRecord,
    CustomToolCallOutputRecord,
    CustomToolCallRecord,
    FunctionCallOutputRecord,
    FunctionCallRecord,
    GitInfo,
    LocalShellCallRecord,
    RolloutParseError,
    SessionMetaRecord,
    TaskCompleteRecord,
    TaskStartedRecord,
    TokenCountRecord,
    TokenUsage,
    TurnContextRecord,
    UnknownRecord,
    UserMessageRecord,
    command_from_arguments,
    exit_code_from_output,
    parse_rollout_line,
    thread_id_from_rollout_name,
)

STAMP = "2026-03-02T09:15:04.210Z"
AT = datetime(2026, 3, 2, 9, 15, 4, 210_000, tzinfo=UTC)


def line(record_type: str, payload: Any, timestamp: str = STAMP) -> str:
    return json.dumps({"timestamp": timestamp, "type": record_type, "payload": payload})


def usage(total: int, input_tokens: int = 0, output: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "cached_input_tokens": 0,
        "output_tokens": output,
        "reasoning_output_tokens": 0,
        "total_tokens": total,
    }


def test_session_meta() -> None:
    payload = {
        "id": "0195f0aa-1111-7222-8333-444455556666",
        "timestamp": STAMP,
        "cwd": "/home/dev/shop",
        "originator": "codex_cli_rs",
        "cli_version": "0.128.0",
        "source": "cli",
        "model_provider": "openai",
        "git": {"commit_hash": "abc123", "branch": "main", "repository_url": "git@example.com:shop.git"},
        "some_future_field": {"x": 1},
    }
    record = parse_rollout_line(line("session_meta", payload))
    assert record == SessionMetaRecord(
        timestamp=AT,
        thread_id="0195f0aa-1111-7222-8333-444455556666",
        cwd="/home/dev/shop",
        cli_version="0.128.0",
        originator="codex_cli_rs",
        model_provider="openai",
        forked_from_id=None,
        git=GitInfo("abc123", "main", "git@example.com:shop.git"),
    )


def test_turn_context_and_task_events() -> None:
    context = parse_rollout_line(line("turn_context", {"turn_id": "t1", "cwd": "/w", "model": "gpt-5.5"}))
    assert context == TurnContextRecord(AT, "t1", "/w", "gpt-5.5")
    started = {"type": "task_started", "turn_id": "t1", "model_context_window": 258_400}
    assert parse_rollout_line(line("event_msg", started)) == TaskStartedRecord(AT, "t1", 258_400)
    complete = {"type": "task_complete", "turn_id": "t1", "last_agent_message": "done"}
    assert parse_rollout_line(line("event_msg", complete)) == TaskCompleteRecord(AT, "t1", "done")
    user = {"type": "user_message", "message": "fix it", "images": []}
    assert parse_rollout_line(line("event_msg", user)) == UserMessageRecord(AT, "fix it")
    agent = {"type": "agent_message", "message": "On it."}
    assert parse_rollout_line(line("event_msg", agent)) == AgentMessageRecord(AT, "On it.")


def test_token_count_with_info() -> None:
    info = {
        "total_token_usage": usage(90_000, 89_000, 1_000),
        "last_token_usage": {**usage(34_900, 34_469, 431), "cache_write_input_tokens": 12},
        "model_context_window": 258_400,
    }
    record = parse_rollout_line(line("event_msg", {"type": "token_count", "info": info, "rate_limits": None}))
    assert record == TokenCountRecord(
        timestamp=AT,
        last_token_usage=TokenUsage(34_469, 0, 431, 0, 34_900),
        total_token_usage=TokenUsage(89_000, 0, 1_000, 0, 90_000),
        model_context_window=258_400,
    )
    assert isinstance(record, TokenCountRecord) and record.has_info


def test_token_count_with_null_info_has_no_usage() -> None:
    record = parse_rollout_line(line("event_msg", {"type": "token_count", "info": None, "rate_limits": {}}))
    assert record == TokenCountRecord(AT, None, None, None)
    assert isinstance(record, TokenCountRecord) and not record.has_info


def test_compaction_records() -> None:
    compacted = {"message": "", "replacement_history": [{"type": "message"}, {"type": "compaction"}]}
    assert parse_rollout_line(line("compacted", compacted)) == CompactedRecord(AT, "", 2)
    windowed = {"window_number": 2, "previous_window_id": "window-a", "window_id": "window-b"}
    assert parse_rollout_line(line("compacted", windowed)) == CompactedRecord(AT, "", 0)
    event = {"type": "context_compacted"}
    assert parse_rollout_line(line("event_msg", event)) == ContextCompactedRecord(AT)


def test_function_call_and_output() -> None:
    arguments = json.dumps({"cmd": "pytest -q", "workdir": "/w"})
    call = parse_rollout_line(
        line(
            "response_item",
            {"type": "function_call", "name": "exec_command", "arguments": arguments, "call_id": "c1"},
        )
    )
    assert call == FunctionCallRecord(AT, "exec_command", arguments, "c1")
    assert isinstance(call, FunctionCallRecord) and call.command == "pytest -q"
    output = "Exit code: 1\nWall time: 2.1 seconds\nOutput:\n1 failed, 2 passed in 1.9s\n"
    result = parse_rollout_line(
        line("response_item", {"type": "function_call_output", "call_id": "c1", "output": output})
    )
    assert result == FunctionCallOutputRecord(AT, "c1", output)
    assert isinstance(result, FunctionCallOutputRecord) and result.exit_code == 1


def test_function_call_output_as_content_items() -> None:
    items = [
        {"type": "input_text", "text": "first"},
        {"type": "input_image", "image_url": "x"},
        {"type": "input_text", "text": "second"},
    ]
    record = parse_rollout_line(
        line("response_item", {"type": "function_call_output", "call_id": "c2", "output": items})
    )
    assert record == FunctionCallOutputRecord(AT, "c2", "first\nsecond")


def test_custom_tool_call_and_output() -> None:
    payload = {
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "c3",
        "name": "apply_patch",
        "input": "*** Begin Patch",
    }
    assert parse_rollout_line(line("response_item", payload)) == CustomToolCallRecord(
        AT, "apply_patch", "*** Begin Patch", "c3", "completed"
    )
    output = {"type": "custom_tool_call_output", "call_id": "c3", "output": "Success."}
    assert parse_rollout_line(line("response_item", output)) == CustomToolCallOutputRecord(
        AT, "c3", "Success."
    )


def test_local_shell_call() -> None:
    payload = {
        "type": "local_shell_call",
        "call_id": "c4",
        "status": "completed",
        "action": {"type": "exec", "command": ["bash", "-lc", "cargo test"], "working_directory": "/w"},
    }
    record = parse_rollout_line(line("response_item", payload))
    assert record == LocalShellCallRecord(AT, "c4", ("bash", "-lc", "cargo test"), "completed", "/w")
    assert isinstance(record, LocalShellCallRecord) and record.command == "cargo test"


@pytest.mark.parametrize(
    ("record_type", "payload", "expected"),
    [
        (
            "response_item",
            {"type": "reasoning", "summary": []},
            UnknownRecord(AT, "response_item", "reasoning"),
        ),
        (
            "event_msg",
            {"type": "agent_reasoning", "text": "hm"},
            UnknownRecord(AT, "event_msg", "agent_reasoning"),
        ),
        ("token_usage_record", {"thread_id": "t"}, UnknownRecord(AT, "token_usage_record", None)),
        ("world_state", ["not", "an", "object"], UnknownRecord(AT, "world_state", None)),
    ],
)
def test_unknown_records_do_not_fail(record_type: str, payload: Any, expected: UnknownRecord) -> None:
    assert parse_rollout_line(line(record_type, payload)) == expected


def test_timestamps_become_aware_utc() -> None:
    record = parse_rollout_line(
        line("event_msg", {"type": "context_compacted"}, "2026-03-02T11:15:04.210+02:00")
    )
    assert record.timestamp == AT and record.timestamp.tzinfo is UTC
    naive = parse_rollout_line(line("event_msg", {"type": "context_compacted"}, "2026-03-02T09:15:04.210"))
    assert naive.timestamp == AT


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"timestamp": "2026-03-02T09:15:04.210Z", "type": "event_msg", "payl', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"type": "event_msg", "payload": {}}), "timestamp"),
        (json.dumps({"timestamp": "yesterday", "type": "event_msg", "payload": {}}), "invalid timestamp"),
        (json.dumps({"timestamp": STAMP, "payload": {}}), "'type'"),
        (json.dumps({"timestamp": STAMP, "type": "turn_context"}), "no payload"),
        (line("session_meta", {"cwd": "/w"}), "'id'"),
        (
            line("event_msg", {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 1}}}),
            "total_tokens",
        ),
        (
            line(
                "event_msg",
                {"type": "token_count", "info": {"last_token_usage": usage(10) | {"output_tokens": "9"}}},
            ),
            "output_tokens",
        ),
        (line("event_msg", {"type": "token_count", "info": "full"}), "'info'"),
        (line("response_item", {"type": "function_call", "name": "shell", "arguments": "{}"}), "call_id"),
    ],
)
def test_malformed_lines_raise_a_named_problem(text: str, problem: str) -> None:
    with pytest.raises(RolloutParseError, match=problem):
        parse_rollout_line(text)


def test_thread_id_from_file_name() -> None:
    name = "rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl"
    assert thread_id_from_rollout_name(name) == "019c8a4d-8f45-7010-8b5d-7fad920aa6f9"
    assert thread_id_from_rollout_name(name + ".zst") == "019c8a4d-8f45-7010-8b5d-7fad920aa6f9"
    assert thread_id_from_rollout_name("notes.jsonl") is None


@pytest.mark.parametrize(
    ("arguments", "command"),
    [
        ({"cmd": "go test ./...", "workdir": "/w"}, "go test ./..."),
        ({"command": "npm test"}, "npm test"),
        ({"command": ["bash", "-lc", "make test"]}, "make test"),
        ({"command": ["ls", "-la", "my dir"]}, "ls -la 'my dir'"),
        ({"path": "README.md"}, None),
    ],
)
def test_command_from_arguments(arguments: dict[str, Any], command: str | None) -> None:
    assert command_from_arguments(json.dumps(arguments)) == command


def test_command_from_non_json_arguments_is_none() -> None:
    assert command_from_arguments("[REDACTED]") is None


@pytest.mark.parametrize(
    ("output", "exit_code"),
    [
        (json.dumps({"output": "ok", "metadata": {"exit_code": 2, "duration_seconds": 0.4}}), 2),
        ("Exit code: 0\nWall time: 0.5 seconds\nOutput:\nok\n", 0),
        ("Chunk ID: 7f\nWall time: 1.0 seconds\nProcess exited with code 137\nOutput:\nKilled\n", 137),
        ("Success. Updated the following files:\nM a.py\n", None),
    ],
)
def test_exit_code_from_output(output: str, exit_code: int | None) -> None:
    assert exit_code_from_output(output) == exit_code
