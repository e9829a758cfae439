"""Reading `codex exec --json` output and classifying how a run ended, with the shapes Codex 0.169
prints (real-codex.md §6, and runs against the demo model)."""

from __future__ import annotations

import json
from functools import reduce

import pytest
from boss.scheduler.v1 import scheduler_pb2

from worker.local_agent.codex_outcome import (
    CodexEvents,
    FailureKind,
    RunEnding,
    RunFacts,
    Verdict,
    classify_run,
    fold_event,
    plain_model_message,
    stderr_summary,
)

THREAD = "01a23357-c8b7-7e23-8886-07fd278f6424"

SUCCESS = [
    '{"type":"thread.started","thread_id":"01a23357-c8b7-7e23-8886-07fd278f6424"}',
    '{"type":"turn.started"}',
    '{"type":"item.started","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc '
    '\'echo hi\'","aggregated_output":"","exit_code":null,"status":"in_progress"}}',
    '{"type":"item.completed","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc '
    '\'echo hi\'","aggregated_output":"hi\\n","exit_code":0,"status":"completed"}}',
    '{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"first thought"}}',
    '{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"…final answer…"}}',
    '{"type":"turn.completed","usage":{"input_tokens":18184,"cached_input_tokens":9064,'
    '"cache_write_input_tokens":0,"output_tokens":6000,"reasoning_output_tokens":0}}',
]
HIGH_DEMAND = "We\u2019re currently experiencing high demand, which may cause temporary errors."
"""Codex's words for an HTTP 500 (with a typographic apostrophe)."""
HTTP_500 = [
    SUCCESS[0],
    '{"type":"turn.started"}',
    json.dumps({"type": "error", "message": HIGH_DEMAND}),
    json.dumps({"type": "turn.failed", "error": {"message": HIGH_DEMAND}}),
]
HTTP_400 = [
    SUCCESS[0],
    '{"type":"turn.started"}',
    '{"type":"turn.failed","error":{"message":"{\\"error\\":{\\"message\\":\\"Invalid \'input[3]\'\\",'
    '\\"type\\":\\"invalid_request_error\\"}}"}}',
]
MISSING_KEY = [
    SUCCESS[0],
    '{"type":"turn.started"}',
    '{"type":"error","message":"Missing environment variable: `FAKE_MODEL_API_KEY`."}',
    '{"type":"turn.failed","error":{"message":"Missing environment variable: `FAKE_MODEL_API_KEY`."}}',
]
UNAUTHORIZED = [
    SUCCESS[0],
    '{"type":"turn.started"}',
    '{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized: Incorrect API key '
    'provided, url: http://127.0.0.1:8123/v1/responses"}}',
]
NO_REPLY = [
    SUCCESS[0],
    '{"type":"turn.started"}',
    '{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for '
    '`fake-model` not found. Defaulting to fallback metadata; this can degrade performance."}}',
    '{"type":"turn.completed","usage":{"input_tokens":9000,"cached_input_tokens":0,'
    '"cache_write_input_tokens":0,"output_tokens":0,"reasoning_output_tokens":0}}',
]
NO_ROLLOUT_STDERR = (
    "Error: thread/resume: thread/resume failed: no rollout found for thread id "
    "01a2337c-0000-7000-8000-000000000000 (code -32600)\n\nStack backtrace:\n"
    "   0: <unknown>\n   1: <unknown>\n"
)
REJECTED_FLAG_STDERR = (
    "error: unexpected argument '-s' found\n\n  tip: to pass '-s' as a value, use '-- -s'\n\n"
    "Usage: codex exec resume [OPTIONS] [SESSION_ID] [PROMPT]\n\nFor more information, try '--help'.\n"
)


def _events(lines: list[str]) -> CodexEvents:
    return reduce(fold_event, lines, CodexEvents())


def _facts(
    lines: list[str],
    exit_code: int | None,
    *,
    ending: RunEnding = RunEnding.EXITED,
    thread_ref: str = THREAD,
    stderr: str = "",
    stall_timeout_s: float = 0.0,
    turn_timeout_s: float = 0.0,
    start_error: str = "",
    start_failure: FailureKind = FailureKind.COULD_NOT_START,
) -> RunFacts:
    return RunFacts(
        thread_ref=thread_ref,
        ending=ending,
        exit_code=exit_code,
        events=_events(lines),
        stderr=stderr,
        stall_timeout_s=stall_timeout_s,
        turn_timeout_s=turn_timeout_s,
        start_error=start_error,
        start_failure=start_failure,
    )


def test_a_successful_run_reads_the_session_and_the_last_agent_message() -> None:
    events = _events(SUCCESS)
    assert events.session_id == THREAD
    assert events.reply == "…final answer…"
    assert events.turn_completed and events.turn_failed is None
    assert (events.lines, events.unparsed) == (7, 0)
    assert classify_run(_facts(SUCCESS, 0)) == Verdict("…final answer…", None, "")


def test_lines_that_are_not_json_objects_are_counted_and_skipped() -> None:
    events = _events(["Reading prompt from stdin...", "[1, 2]", "", *SUCCESS])
    assert (events.lines, events.unparsed, events.reply) == (9, 2, "…final answer…")


def test_a_clean_exit_without_an_agent_message_is_no_reply() -> None:
    verdict = classify_run(_facts(NO_REPLY, 0))
    assert verdict.failure_kind is FailureKind.NO_REPLY
    assert verdict.failure_detail == "Codex finished the turn without a reply"


def test_a_blank_agent_message_is_no_reply() -> None:
    blank = [SUCCESS[0], '{"type":"item.completed","item":{"id":"i","type":"agent_message","text":"  "}}']
    assert classify_run(_facts(blank, 0)).failure_kind is FailureKind.NO_REPLY


def test_http_500_without_retries_is_a_model_error_in_codexs_words() -> None:
    verdict = classify_run(_facts(HTTP_500, 1))
    assert verdict == Verdict.failed(
        FailureKind.MODEL_ERROR,
        f"the model failed: {HIGH_DEMAND}",
    )


def test_a_raw_json_error_body_is_said_in_plain_words() -> None:
    verdict = classify_run(_facts(HTTP_400, 1))
    assert verdict.failure_detail == "the model failed: Invalid 'input[3]'"
    assert plain_model_message("not json at all ") == "not json at all"


def test_retry_notices_alone_are_a_model_error_with_the_last_notice() -> None:
    lines = [
        SUCCESS[0],
        '{"type":"error","message":"Reconnecting... 1/5 (stream disconnected before completion)"}',
        '{"type":"error","message":"Reconnecting... 2/5 (stream disconnected before completion)"}',
    ]
    verdict = classify_run(_facts(lines, 1))
    assert verdict.failure_kind is FailureKind.MODEL_ERROR
    assert "2/5" in verdict.failure_detail


def test_an_unset_key_variable_is_not_logged_in_naming_the_variable() -> None:
    verdict = classify_run(_facts(MISSING_KEY, 1))
    assert verdict.failure_kind is FailureKind.NOT_LOGGED_IN
    assert "FAKE_MODEL_API_KEY" in verdict.failure_detail


def test_a_refused_key_is_not_logged_in() -> None:
    verdict = classify_run(_facts(UNAUTHORIZED, 1))
    assert verdict.failure_kind is FailureKind.NOT_LOGGED_IN
    assert "Incorrect API key provided" in verdict.failure_detail


def test_not_logged_in_on_stderr_is_not_logged_in() -> None:
    facts = _facts([], 1, stderr="Error: Not logged in. Run `codex login` first.\n")
    assert classify_run(facts).failure_kind is FailureKind.NOT_LOGGED_IN


def test_no_rollout_on_stderr_is_session_not_found() -> None:
    verdict = classify_run(_facts([], 1, stderr=NO_ROLLOUT_STDERR))
    assert verdict.failure_kind is FailureKind.SESSION_NOT_FOUND
    assert "01a2337c-0000-7000-8000-000000000000" in verdict.failure_detail


def test_codex_opening_another_session_than_asked_is_session_not_found() -> None:
    other = SUCCESS.copy()
    other[0] = '{"type":"thread.started","thread_id":"01a2337c-db75-70b3-a5d2-3163078e9a50"}'
    verdict = classify_run(_facts(other, 0))
    assert verdict.failure_kind is FailureKind.SESSION_NOT_FOUND
    assert "01a2337c-db75-70b3-a5d2-3163078e9a50" in verdict.failure_detail


def test_a_new_thread_may_get_any_session_id() -> None:
    assert classify_run(_facts(SUCCESS, 0, thread_ref="")).reply_text == "…final answer…"


def test_a_rejected_flag_is_could_not_start() -> None:
    verdict = classify_run(_facts([], 2, stderr=REJECTED_FLAG_STDERR))
    assert verdict == Verdict.failed(
        FailureKind.COULD_NOT_START, "Codex refused its command line (error: unexpected argument '-s' found)"
    )


def test_a_stall_says_how_long_and_what_codex_said_last() -> None:
    lines = [SUCCESS[0], '{"type":"error","message":"Reconnecting... 1/5 (idle timeout waiting for SSE)"}']
    verdict = classify_run(_facts(lines, -15, ending=RunEnding.STALLED, stall_timeout_s=1.5))
    assert verdict.failure_kind is FailureKind.STALLED
    assert verdict.failure_detail == (
        "Codex showed no progress for 1.5 s, so the run was stopped "
        "(last message from Codex: Reconnecting... 1/5 (idle timeout waiting for SSE))"
    )


def test_the_turn_cap_is_timed_out_even_after_a_failure_line() -> None:
    verdict = classify_run(_facts(HTTP_500, -9, ending=RunEnding.TIMED_OUT, turn_timeout_s=600))
    assert verdict.failure_kind is FailureKind.TIMED_OUT
    assert verdict.failure_detail.startswith("the turn was still running after 600 s (the turn cap)")


def test_a_stopped_run_is_interrupted_even_with_a_reply_so_far() -> None:
    verdict = classify_run(_facts(SUCCESS[:5], -15, ending=RunEnding.INTERRUPTED))
    assert verdict.failure_kind is FailureKind.INTERRUPTED


def test_a_run_that_did_not_start_reports_its_reason_and_kind() -> None:
    facts = _facts(
        [], None, ending=RunEnding.NOT_STARTED, start_error="busy", start_failure=FailureKind.THREAD_BUSY
    )
    assert classify_run(facts) == Verdict.failed(FailureKind.THREAD_BUSY, "busy")
    facts = _facts([], None, ending=RunEnding.NOT_STARTED, start_error="no such file")
    assert classify_run(facts).failure_kind is FailureKind.COULD_NOT_START


def test_a_signal_is_named() -> None:
    verdict = classify_run(_facts(SUCCESS[:2], -9))
    assert verdict == Verdict.failed(FailureKind.OTHER, "Codex was killed by SIGKILL")


def test_anything_else_is_other_with_codexs_error_line() -> None:
    stderr = "Error: failed to load config: invalid type\n\nStack backtrace:\n   0: <unknown>\n"
    verdict = classify_run(_facts([], 1, stderr=stderr))
    assert verdict == Verdict.failed(
        FailureKind.OTHER, "Codex exited with code 1: Error: failed to load config: invalid type"
    )


@pytest.mark.parametrize(
    ("stderr", "summary"),
    [
        ("", ""),
        ("Reading prompt from stdin...\nsomething broke\n   0: <unknown>\n", "something broke"),
        ("warning: a\nError: the real one\nError: later\n", "Error: the real one"),
    ],
)
def test_stderr_summary_picks_the_line_that_matters(stderr: str, summary: str) -> None:
    assert stderr_summary(stderr) == summary


def test_failure_kinds_are_the_schedulers_names() -> None:
    for kind in FailureKind:
        assert scheduler_pb2.FailureKind.Value(f"FAILURE_KIND_{kind.value.upper()}") > 0
