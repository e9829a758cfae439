"""What a ``codex exec --json`` run said and how it ended, read into a reply or a classified failure.

Pure functions and dataclasses, no I/O: :func:`fold_event` reads one stdout line into
:class:`CodexEvents`; :func:`classify_run` turns the facts of a finished run (:class:`RunFacts`)
into a :class:`Verdict`. Shapes are those observed on Codex 0.169 (``real-codex.md`` §6):

- stdout, one JSON object a line: ``{"type": "thread.started", "thread_id": …}`` (always first
  when a session was opened), ``item.completed`` items (``agent_message`` with ``text``;
  ``error`` items are non-fatal notices), ``turn.completed``, and on failure ``error`` events
  (``"Reconnecting... 1/5 (…)"`` while retrying) then ``turn.failed`` with ``error.message``;
- stderr: ``Error: thread/resume: thread/resume failed: no rollout found for thread id … (code
  -32600)`` plus a backtrace when the session does not exist (no JSON at all on stdout), clap's
  ``error: unexpected argument '-s' found`` (exit 2) for a flag ``exec resume`` rejects.

Failure kinds are the scheduler's ``FailureKind`` names in lower case (``boss.scheduler.v1``),
without ``device_lost``, which only the scheduler decides.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any


class FailureKind(StrEnum):
    """Why a turn produced no reply; values equal ``FAILURE_KIND_<NAME>`` lower-cased."""

    SESSION_NOT_FOUND = "session_not_found"
    THREAD_BUSY = "thread_busy"
    NOT_LOGGED_IN = "not_logged_in"
    MODEL_ERROR = "model_error"
    STALLED = "stalled"
    TIMED_OUT = "timed_out"
    COULD_NOT_START = "could_not_start"
    NO_REPLY = "no_reply"
    INTERRUPTED = "interrupted"
    OTHER = "other"


class RunEnding(StrEnum):
    """How the Codex process came to an end."""

    EXITED = "exited"
    """It exited by itself."""
    STALLED = "stalled"
    """The runner stopped it: no stdout line for the stall timeout."""
    TIMED_OUT = "timed_out"
    """The runner stopped it: the turn cap was reached."""
    INTERRUPTED = "interrupted"
    """The runner stopped it because it was asked to (cancellation, shutdown)."""
    NOT_STARTED = "not_started"
    """It never started (or was never tried: bad folder, thread busy)."""


@dataclass(frozen=True)
class CodexEvents:
    """What the ``--json`` stdout said so far.

    Attributes:
        session_id: ``thread.started.thread_id`` ("" until seen).
        reply: the text of the last ``item.completed`` ``agent_message`` (None when there is none).
        turn_completed: a ``turn.completed`` was seen.
        turn_failed: ``turn.failed.error.message`` (None when not failed).
        last_error: the message of the last top-level ``error`` event (None when none).
        lines: stdout lines read; ``unparsed`` of them were not JSON objects.
    """

    session_id: str = ""
    reply: str | None = None
    turn_completed: bool = False
    turn_failed: str | None = None
    last_error: str | None = None
    lines: int = 0
    unparsed: int = 0


def fold_event(events: CodexEvents, line: str) -> CodexEvents:
    """``events`` updated with one stdout line (blank lines and non-JSON lines are only counted)."""
    if not line.strip():
        return events
    counted = replace(events, lines=events.lines + 1)
    try:
        event = json.loads(line)
    except ValueError:
        return replace(counted, unparsed=counted.unparsed + 1)
    if not isinstance(event, dict):
        return replace(counted, unparsed=counted.unparsed + 1)
    event_type = event.get("type")
    if event_type == "thread.started" and isinstance(event.get("thread_id"), str):
        return replace(counted, session_id=event["thread_id"])
    if event_type == "item.completed":
        item = event.get("item")
        if (
            isinstance(item, dict)
            and item.get("type") == "agent_message"
            and isinstance(item.get("text"), str)
        ):
            return replace(counted, reply=item["text"])
        return counted
    if event_type == "turn.completed":
        return replace(counted, turn_completed=True)
    if event_type == "turn.failed":
        return replace(counted, turn_failed=_error_message(event.get("error")) or "the turn failed")
    if event_type == "error":
        return replace(counted, last_error=_error_message(event) or "error")
    return counted


@dataclass(frozen=True)
class RunFacts:
    """Everything known about one finished run, the input of :func:`classify_run`.

    Attributes:
        thread_ref: the session id asked to resume ("" when a new thread was started).
        ending: how the process ended.
        exit_code: the process's exit code (negative: killed by that signal), None when it never ran.
        events: what stdout said.
        stderr: the head and tail of stderr (the runner keeps a bounded excerpt).
        stall_timeout_s: the stall timeout in force (seconds).
        turn_timeout_s: the turn cap in force (seconds).
        start_error: why it did not start (with ``ending`` NOT_STARTED).
        start_failure: the kind to report when it did not start (default could_not_start).
    """

    thread_ref: str
    ending: RunEnding
    exit_code: int | None
    events: CodexEvents
    stderr: str = ""
    stall_timeout_s: float = 0.0
    turn_timeout_s: float = 0.0
    start_error: str = ""
    start_failure: FailureKind = FailureKind.COULD_NOT_START


@dataclass(frozen=True)
class Verdict:
    """A run's result: the reply, or a failure kind with its detail in plain words."""

    reply_text: str
    failure_kind: FailureKind | None
    failure_detail: str

    @classmethod
    def failed(cls, kind: FailureKind, detail: str) -> Verdict:
        """A failure of ``kind`` said as ``detail``."""
        return cls("", kind, detail)


NO_ROLLOUT = re.compile(r"no rollout found for thread id (\S+)", re.IGNORECASE)
_AUTH_PATTERNS = (
    re.compile(r"Missing environment variable: `?([A-Za-z_][A-Za-z0-9_]*)`?", re.IGNORECASE),
    re.compile(r"\b401 Unauthorized\b", re.IGNORECASE),
    re.compile(r"\bnot logged in\b", re.IGNORECASE),
    re.compile(r"\bnot signed in\b", re.IGNORECASE),
    re.compile(r"\bre-?run `?codex login`?", re.IGNORECASE),
)
_USAGE_ERROR = re.compile(r"^error: (unexpected argument|invalid value|the argument)", re.MULTILINE)
_STDERR_NOISE = re.compile(
    r"^(Stack backtrace:|\s*\d+: |\s*at |Reading (prompt|additional input) from stdin|"
    r"WARNING: proceeding, even though we could not update PATH|For more information, try)"
)


def classify_run(facts: RunFacts) -> Verdict:
    """The reply or the failure of a finished run, from its facts alone.

    Precedence: how the runner ended it (stalled, timed out, interrupted, not started), then the
    missing session (stderr), then a clean exit (the reply, or no_reply; a different session id
    than the one asked for is session_not_found), then missing credentials, then a model failure
    (``turn.failed`` / ``error``), a rejected command line, a signal, and finally ``other`` with
    Codex's own words.
    """
    events = facts.events
    if facts.ending is RunEnding.NOT_STARTED:
        return Verdict.failed(facts.start_failure, facts.start_error or "Codex could not be started")
    if facts.ending is RunEnding.STALLED:
        return Verdict.failed(
            FailureKind.STALLED,
            f"Codex showed no progress for {_seconds(facts.stall_timeout_s)}, so the run was stopped"
            + _model_said(events),
        )
    if facts.ending is RunEnding.TIMED_OUT:
        return Verdict.failed(
            FailureKind.TIMED_OUT,
            f"the turn was still running after {_seconds(facts.turn_timeout_s)} (the turn cap), "
            "so the run was stopped" + _model_said(events),
        )
    if facts.ending is RunEnding.INTERRUPTED:
        return Verdict.failed(FailureKind.INTERRUPTED, "the run was stopped before Codex finished the turn")
    missing = NO_ROLLOUT.search(facts.stderr)
    if missing:
        return Verdict.failed(
            FailureKind.SESSION_NOT_FOUND,
            f"this machine's Codex has no session {missing.group(1)} (no rollout file for it in its "
            "Codex home)",
        )
    if facts.exit_code == 0 and events.turn_failed is None:
        if facts.thread_ref and events.session_id and events.session_id != facts.thread_ref:
            return Verdict.failed(
                FailureKind.SESSION_NOT_FOUND,
                f"Codex opened session {events.session_id} instead of resuming {facts.thread_ref}",
            )
        if events.reply is not None and events.reply.strip():
            return Verdict(events.reply, None, "")
        return Verdict.failed(FailureKind.NO_REPLY, "Codex finished the turn without a reply")
    failure_text = "\n".join(
        text for text in (events.turn_failed, events.last_error, facts.stderr) if text is not None
    )
    auth = _auth_problem(failure_text)
    if auth is not None:
        return Verdict.failed(FailureKind.NOT_LOGGED_IN, auth)
    model_message = events.turn_failed or events.last_error
    if model_message is not None:
        return Verdict.failed(
            FailureKind.MODEL_ERROR, f"the model failed: {plain_model_message(model_message)}"
        )
    usage = _USAGE_ERROR.search(facts.stderr)
    if usage is not None:
        line = facts.stderr[usage.start() :].splitlines()[0]
        return Verdict.failed(FailureKind.COULD_NOT_START, f"Codex refused its command line ({line})")
    if facts.exit_code is not None and facts.exit_code < 0:
        return Verdict.failed(FailureKind.OTHER, f"Codex was killed by {_signal_name(-facts.exit_code)}")
    said = stderr_summary(facts.stderr)
    return Verdict.failed(
        FailureKind.OTHER, f"Codex exited with code {facts.exit_code}" + (f": {said}" if said else "")
    )


def plain_model_message(message: str) -> str:
    """A model error in plain words: the ``error.message`` of a raw JSON error body, else as given."""
    try:
        body = json.loads(message)
    except ValueError:
        return message.strip()
    inner = _error_message(body.get("error")) if isinstance(body, dict) else None
    return inner or message.strip()


def stderr_summary(stderr: str) -> str:
    """The line of Codex's stderr that says what went wrong: its first ``Error:`` line, else its last
    line that is not a backtrace frame or a routine notice ("" when there is none)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Error:"):
            return line
    meaningful = [line for line in lines if not _STDERR_NOISE.match(line)]
    return meaningful[-1] if meaningful else ""


def _auth_problem(text: str) -> str | None:
    for pattern in _AUTH_PATTERNS:
        match = pattern.search(text)
        if match is None:
            continue
        if match.groups():
            return (
                f"Codex has no API key: the environment variable {match.group(1)} its model provider "
                "reads is not set for the local agent"
            )
        line = next((line for line in text.splitlines() if pattern.search(line)), match.group(0))
        return f"Codex is not logged in or its credentials were refused: {plain_model_message(line)}"
    return None


def _model_said(events: CodexEvents) -> str:
    message = events.turn_failed or events.last_error
    return f" (last message from Codex: {plain_model_message(message)})" if message else ""


def _error_message(error: Any) -> str | None:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return None


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
