"""Reading Codex's requests and planning the demo model's answers, with request bodies shaped as
Codex 0.169 sends them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from demo_model.conversation import COMPACTION_PROMPT_PREFIX, SUMMARY_TAG, RequestKind, read_request
from demo_model.responses import MAX_QUOTE_CHARS, plan_response, reply_text, tool_reply_text
from demo_model.usage import UsageModel

MODEL = UsageModel(base_tokens=10_000, turn_tokens=1_000, output_tokens=50)


def _message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def _preamble() -> list[dict[str, Any]]:
    """What Codex puts before the person's first message."""
    return [
        _message("developer", "You are Codex, a coding agent based on GPT-5."),
        _message("developer", "<permissions instructions>\nsandboxing…</permissions instructions>"),
        _message("user", "<environment_context>\n  <cwd>/srv/app</cwd>\n</environment_context>"),
        _message("user", "# AGENTS.md instructions for /srv/app\n\n<INSTRUCTIONS>be brief</INSTRUCTIONS>"),
    ]


def _body(*items: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-5.5", "stream": True, "input": [*_preamble(), *items], "tools": []}


def _types(events: tuple[dict[str, Any], ...]) -> list[str]:
    return [event["type"] for event in events]


def _streamed_text(events: tuple[dict[str, Any], ...]) -> str:
    return "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")


def test_codex_context_messages_are_not_user_turns() -> None:
    history = [_message("user", "first"), _message("assistant", "ok"), _message("user", "second")]
    view = read_request(_body(*history))
    assert (view.kind, view.user_text, view.user_turns) == (RequestKind.TURN, "second", 2)
    assert view.tool_output is None


def test_a_reply_quotes_the_latest_message_and_streams_it() -> None:
    plan = plan_response(_body(_message("user", "first"), _message("user", "  fix the flaky test\n")), MODEL)
    assert _types(plan.events)[:2] == ["response.created", "response.output_item.added"]
    assert _types(plan.events)[-2:] == ["response.output_item.done", "response.completed"]
    expected = "Demo model (not a real model): you said: fix the flaky test"
    assert reply_text("  fix the flaky test\n") == expected
    assert _streamed_text(plan.events) == expected
    done = plan.events[-2]["item"]
    assert done["content"][0]["text"] == expected and done["role"] == "assistant"
    completed = plan.events[-1]["response"]
    assert completed["output"] == [done]
    assert completed["usage"]["input_tokens"] == 12_000 and completed["usage"]["total_tokens"] == 12_050


def test_a_long_message_is_quoted_up_to_the_limit() -> None:
    text = "x" * (MAX_QUOTE_CHARS + 10)
    assert reply_text(text).endswith("x" * MAX_QUOTE_CHARS + "…")


def test_turns_are_counted_from_the_last_local_compaction_summary() -> None:
    summary = f"Another language model started to solve this problem…\n{SUMMARY_TAG}: 3 user turns so far"
    view = read_request(
        _body(
            _message("user", "one"),
            _message("user", "two"),
            _message("user", "three"),
            _message("user", summary),
            _message("user", "four"),
        )
    )
    assert (view.user_text, view.user_turns) == ("four", 1)
    assert plan_response(_body(_message("user", summary)), MODEL).usage.input_tokens == 10_000


def test_turns_are_counted_from_the_last_remote_compaction_item() -> None:
    view = read_request(
        _body(
            _message("user", "one"),
            {"type": "compaction", "encrypted_content": "c3VtbWFyeQ=="},
            _message("user", "two"),
            _message("user", "three"),
        )
    )
    assert view.user_turns == 2


def test_a_local_compaction_request_gets_the_summary() -> None:
    prompt = _message("user", f"{COMPACTION_PROMPT_PREFIX}. Create a handoff summary for another LLM…")
    plan = plan_response(_body(_message("user", "one"), _message("user", "two"), prompt), MODEL)
    assert plan.view.kind is RequestKind.LOCAL_COMPACTION
    assert plan.view.user_turns == 2
    text = _streamed_text(plan.events)
    assert text == f"{SUMMARY_TAG}: 2 user turns so far; the latest said: two"
    assert plan.usage.input_tokens == 12_000


def test_a_remote_compaction_request_gets_exactly_one_compaction_item() -> None:
    plan = plan_response(_body(_message("user", "one"), {"type": "compaction_trigger"}), MODEL)
    assert plan.view.kind is RequestKind.REMOTE_COMPACTION
    items = plan.events[-1]["response"]["output"]
    assert [item["type"] for item in items] == ["compaction"]
    assert base64.b64decode(items[0]["encrypted_content"]).decode().startswith(SUMMARY_TAG)


def test_a_compaction_ignores_failure_markers() -> None:
    prompt = _message("user", f"{COMPACTION_PROMPT_PREFIX}.")
    plan = plan_response(_body(_message("user", "[[demo:http500]]"), prompt), MODEL)
    assert plan.http_error is None and _types(plan.events)[-1] == "response.completed"


@pytest.mark.parametrize(
    ("marker", "status", "error_type"),
    [
        ("[[demo:http500]]", 500, "server_error"),
        ("[[demo:http400]]", 400, "invalid_request_error"),
        ("[[demo:http429]]", 429, "rate_limit_exceeded"),
        ("[[demo:http401]]", 401, "invalid_api_key"),
    ],
)
def test_http_failures_answer_with_an_error_body(marker: str, status: int, error_type: str) -> None:
    plan = plan_response(_body(_message("user", f"please {marker}")), MODEL)
    assert plan.http_error is not None and plan.events == ()
    assert plan.http_error.status == status
    error = plan.http_error.body["error"]
    assert error["type"] == error_type and error["message"].startswith("Demo model (not a real model): ")


def test_response_failed_sends_created_then_failed() -> None:
    plan = plan_response(_body(_message("user", "[[demo:response_failed]]")), MODEL)
    assert _types(plan.events) == ["response.created", "response.failed"]
    assert "on purpose" in plan.events[1]["response"]["error"]["message"]


def test_stall_sends_created_then_holds() -> None:
    plan = plan_response(_body(_message("user", "[[demo:stall]]")), MODEL)
    assert _types(plan.events) == ["response.created"] and plan.stall


def test_no_reply_completes_with_no_output_but_with_usage() -> None:
    plan = plan_response(_body(_message("user", "[[demo:no_reply]]")), MODEL)
    assert _types(plan.events) == ["response.created", "response.completed"]
    assert plan.events[-1]["response"]["output"] == []
    assert plan.events[-1]["response"]["usage"]["total_tokens"] == 11_050


def test_slow_waits_then_answers_normally() -> None:
    plan = plan_response(_body(_message("user", "[[demo:slow=1.5]] hi")), MODEL)
    assert plan.delay_seconds == 1.5 and plan.directives.failure is None
    assert _streamed_text(plan.events) == reply_text("[[demo:slow=1.5]] hi")


def test_an_earlier_messages_marker_does_not_apply_to_the_next_turn() -> None:
    plan = plan_response(_body(_message("user", "[[demo:http500]]"), _message("user", "hello again")), MODEL)
    assert plan.http_error is None
    assert _streamed_text(plan.events) == reply_text("hello again")


def test_shell_first_calls_the_tool_then_replies_after_its_output() -> None:
    message = _message("user", "[[demo:shell=echo hi]] check")
    first = plan_response(_body(message), MODEL)
    call = first.events[-2]["item"]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert json.loads(call["arguments"]) == {"cmd": "echo hi"}
    assert first.events[-1]["response"]["output"] == [call]
    output = {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": "Chunk ID: ba754d\nWall time: 0.0412 seconds\nProcess exited with code 0\nOutput:\nhi\n",
    }
    follow_up = plan_response(_body(message, {**call, "status": "completed"}, output), MODEL)
    assert follow_up.view.tool_output == output["output"]
    text = _streamed_text(follow_up.events)
    assert text == (
        "Demo model (not a real model): ran `echo hi` (exit code 0); you said: [[demo:shell=echo hi]] check"
    )
    assert follow_up.usage == first.usage


def test_a_tool_reply_says_when_there_was_no_exit_code() -> None:
    assert tool_reply_text("go", "touch x", "Read-only file system") == (
        "Demo model (not a real model): ran `touch x` (no exit code); you said: go"
    )


def test_a_failure_marker_beats_the_tool_call() -> None:
    plan = plan_response(_body(_message("user", "[[demo:shell=ls]] [[demo:http500]]")), MODEL)
    assert plan.http_error is not None and plan.http_error.status == 500


def test_a_body_without_input_is_answered_with_base_usage() -> None:
    plan = plan_response({"model": "gpt-5.5"}, MODEL)
    assert plan.view.user_turns == 0 and plan.usage.input_tokens == 10_000
    assert _types(plan.events)[-1] == "response.completed"
