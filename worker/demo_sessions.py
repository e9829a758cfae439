"""Generate realistic demo Codex sessions (rollout files plus small git workspaces) and play them live.

The demo data is Boss's own: every line is generated here in the rollout format Codex 0.169 writes
(``research/real-codex.md`` §4-5: ``ordinal`` on every line, ``item_completed`` items for messages,
commands and compactions, ``token_usage_record`` beside every ``token_count``, ``world_state`` after
a compaction). Nothing is copied from real sessions. (``make run`` itself drives real Codex threads,
:mod:`demo_model.threads`; these generated sessions serve tests and a Codex-less demo.)

- :func:`write_demo_codex_home` writes ``root/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl`` for a
  few threads, each working in a real git repository under ``root/workspaces/<name>`` (one with an
  uncommitted change), one of them going through a mid-turn local auto-compaction in 0.169's order:
  the summary message, the compaction request's own usage, ``compacted``, ``world_state`` and
  ``turn_context``, Codex's post-compaction estimate (SPEC D-3), the ``ContextCompaction`` item.
- :class:`DemoSessionPlayer` appends one user turn per thread on every :meth:`~DemoSessionPlayer.advance`;
  a thread whose next response would cross the auto-compact limit writes a compaction sequence.

CLI: ``python -m worker.demo_sessions --codex-home DIR [--threads 3] [--live --interval 2]``.
"""

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from worker.codex_sessions.budget import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT,
    auto_compact_token_limit,
)
from worker.codex_sessions.rollout import TokenUsage

logger = logging.getLogger(__name__)

DEMO_CLI_VERSION = "0.169.0"
DEMO_MODEL = "gpt-5.5"
DEMO_MODEL_CONTEXT_WINDOW = DEFAULT_CONTEXT_WINDOW * DEFAULT_EFFECTIVE_CONTEXT_WINDOW_PERCENT // 100
"""W = 258,400 tokens, what Codex reports for 272k-window models."""
DEMO_AUTO_COMPACT_LIMIT = auto_compact_token_limit(DEFAULT_CONTEXT_WINDOW)
"""L = 244,800 tokens: a demo thread compacts instead of letting a response cross it."""

_EMPTY_USAGE = TokenUsage(0, 0, 0, 0, 0)
_TURN_SPACING_MINUTES = 6
_MAX_TURN_DURATION = timedelta(seconds=100)
"""Upper bound of one written turn's span (sum of the largest clock steps, compaction included)."""
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Boss Demo",
    "GIT_AUTHOR_EMAIL": "demo@boss.invalid",
    "GIT_COMMITTER_NAME": "Boss Demo",
    "GIT_COMMITTER_EMAIL": "demo@boss.invalid",
}


@dataclass(frozen=True)
class DemoThreadPlan:
    """The script of one demo thread.

    Attributes:
        name: workspace folder name and project label.
        module: the Python module the workspace holds (``src/<module>.py``, ``tests/test_<module>.py``).
        prompts: user prompts, used in turn.
        explore_command: the command run before the tests in every turn.
        explore_output: what that command prints.
        growth_per_response: mean tokens the context grows per model response.
        initial_turns: turns written by :func:`write_demo_codex_home` (at least).
        uncommitted_change: leave a modified file in the workspace (CB-8's uncommitted patch).
        compacts_in_history: keep writing turns past ``initial_turns`` until one compaction is written.
    """

    name: str
    module: str
    prompts: tuple[str, ...]
    explore_command: str
    explore_output: str
    growth_per_response: int
    initial_turns: int
    uncommitted_change: bool = False
    compacts_in_history: bool = False


DEMO_PLANS: tuple[DemoThreadPlan, ...] = (
    DemoThreadPlan(
        name="billing-api",
        module="invoices",
        prompts=(
            "Add a rounding rule for invoice totals in EUR and cover it with tests.",
            "Make the late-fee calculation use the due date in the customer's time zone.",
            "Refactor the invoice total so discounts apply before tax.",
        ),
        explore_command="rg -n 'def invoices_total' src",
        explore_output="src/invoices.py:4:def invoices_total(items):\n",
        growth_per_response=5_000,
        initial_turns=3,
    ),
    DemoThreadPlan(
        name="ios-sync-client",
        module="sync_queue",
        prompts=(
            "The offline queue drops edits made while the app is backgrounded; find out why.",
            "Retry failed uploads with exponential backoff capped at five minutes.",
            "Persist the queue between launches and add a test for the restore path.",
        ),
        explore_command="git diff --stat",
        explore_output=" src/sync_queue.py | 4 ++++\n 1 file changed, 4 insertions(+)\n",
        growth_per_response=11_000,
        initial_turns=5,
        uncommitted_change=True,
    ),
    DemoThreadPlan(
        name="firmware-flasher",
        module="flasher",
        prompts=(
            "Verify the image checksum before flashing and refuse mismatched images.",
            "Read the bootloader version over serial and log it with each flash.",
            "Split flashing into erase, write and verify steps with progress reporting.",
        ),
        explore_command="sed -n '1,120p' src/flasher.py",
        explore_output='"""firmware-flasher: demo module."""\n\n\ndef flasher_total(items):\n    ...\n',
        growth_per_response=22_000,
        initial_turns=6,
        compacts_in_history=True,
    ),
)
"""The built-in demo threads; ``threads`` beyond three reuse them with numbered names."""


@dataclass(frozen=True)
class DemoThread:
    """A generated demo thread and its state after the last line written.

    Attributes:
        plan: the thread's script.
        path: its rollout file.
        codex_thread_id: the thread uuid (in ``session_meta`` and the file name).
        cwd: the git workspace the thread works in.
        last_total_tokens: current context size in tokens: T of the last response, or the
            post-compaction size right after a compaction.
        last_usage: ``last_token_usage`` of the last token_count written (re-emitted as is).
        cumulative_usage: ``total_token_usage`` so far (tokens).
        last_written_at: UTC timestamp of the last line.
        turns_written: user turns written so far.
        compactions: compactions written so far.
        lines_written: lines in the rollout so far (the next line's ``ordinal``).
        thread_usage: every request so far, compaction requests included (``thread_token_usage``).
    """

    plan: DemoThreadPlan
    path: Path
    codex_thread_id: str
    cwd: Path
    last_total_tokens: int
    last_usage: TokenUsage
    cumulative_usage: TokenUsage
    last_written_at: datetime
    turns_written: int
    compactions: int
    lines_written: int = 0
    thread_usage: TokenUsage = _EMPTY_USAGE


class _LineClock:
    """Hands out non-decreasing line timestamps, random steps apart (scaled to fit a time budget)."""

    def __init__(self, start: datetime, rng: random.Random, scale: float = 1.0) -> None:
        """Start at ``start`` (aware UTC); every step is multiplied by ``scale`` (0..1)."""
        self._now = start
        self._rng = rng
        self._scale = scale

    def tick(self, low_s: float = 0.05, high_s: float = 1.5) -> datetime:
        """Advance by a random step in ``[low_s, high_s]`` seconds (times the scale); return the new time."""
        step_s = self._rng.uniform(low_s, high_s) * self._scale
        self._now += timedelta(milliseconds=round(step_s * 1000))
        return self._now


def format_timestamp(at: datetime) -> str:
    """``at`` as Codex writes line timestamps: UTC with milliseconds, e.g. ``2026-03-02T09:15:04.210Z``."""
    utc = at.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def rollout_line(
    at: datetime,
    record_type: str,
    payload: dict[str, Any],
    ordinal: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """One rollout JSONL line (with newline): ``{"timestamp": "...Z", "ordinal": n, "type": ...,
    "payload": ..., "metadata": ...}``; ``ordinal`` and ``metadata`` only when given."""
    line: dict[str, Any] = {"timestamp": format_timestamp(at)}
    if ordinal is not None:
        line["ordinal"] = ordinal
    line["type"] = record_type
    line["payload"] = payload
    if metadata is not None:
        line["metadata"] = metadata
    return json.dumps(line, separators=(",", ":")) + "\n"


def demo_uuid7(at: datetime, rng: random.Random) -> str:
    """A UUIDv7-shaped id (48-bit Unix milliseconds, then random bits), as Codex thread ids are."""
    millis = int(at.timestamp() * 1000) & ((1 << 48) - 1)
    value = (millis << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64) | (0b10 << 62) | rng.getrandbits(62)
    return str(uuid.UUID(int=value))


def rollout_path(codex_home: Path, started_at: datetime, thread_id: str) -> Path:
    """``codex_home/sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<uuid>.jsonl`` for ``started_at``.

    Codex names files in local time (codex-rs/rollout/src/recorder.rs:1320-1349); the demo uses the
    time zone of ``started_at`` as given.
    """
    day = codex_home / "sessions" / f"{started_at:%Y}" / f"{started_at:%m}" / f"{started_at:%d}"
    return day / f"rollout-{started_at:%Y-%m-%dT%H-%M-%S}-{thread_id}.jsonl"


def _usage_payload(usage: TokenUsage) -> dict[str, int]:
    """A ``TokenUsage`` as its JSON object (0.169's fields)."""
    return {
        "input_tokens": usage.input_tokens,
        "cached_input_tokens": usage.cached_input_tokens,
        "cache_write_input_tokens": 0,
        "output_tokens": usage.output_tokens,
        "reasoning_output_tokens": usage.reasoning_output_tokens,
        "total_tokens": usage.total_tokens,
    }


def _add_usage(left: TokenUsage, right: TokenUsage) -> TokenUsage:
    """Component-wise sum of two usages (how Codex accumulates ``total_token_usage``)."""
    return TokenUsage(
        left.input_tokens + right.input_tokens,
        left.cached_input_tokens + right.cached_input_tokens,
        left.output_tokens + right.output_tokens,
        left.reasoning_output_tokens + right.reasoning_output_tokens,
        left.total_tokens + right.total_tokens,
    )


def _rate_limits(used_primary: float) -> dict[str, Any]:
    """A ``rate_limits`` object like the one Codex attaches to every token_count."""
    return {
        "limit_id": "codex",
        "limit_name": None,
        "primary": {"used_percent": round(used_primary, 1), "window_minutes": 300, "resets_at": 1900000000},
        "secondary": {
            "used_percent": round(used_primary / 4, 1),
            "window_minutes": 10080,
            "resets_at": 1900400000,
        },
        "credits": {"has_credits": False, "unlimited": False, "balance": None},
        "plan_type": None,
    }


class _ThreadWriter:
    """Mutable simulation of one demo thread; appends Codex-shaped lines to its rollout file."""

    def __init__(self, thread: DemoThread, rng: random.Random) -> None:
        """Continue ``thread`` from its recorded state."""
        self.thread = thread
        self._rng = rng
        self._lines: list[str] = []
        self._pytest_seconds = 0.5

    def start_session(self, clock: _LineClock, git_commit: str | None) -> None:
        """Write the session header: ``session_meta`` (with the git commit) and a developer message."""
        thread = self.thread
        git = {"commit_hash": git_commit, "branch": "main", "repository_url": None} if git_commit else None
        meta = {
            "account_scoped": True,
            "session_id": thread.codex_thread_id,
            "id": thread.codex_thread_id,
            "timestamp": format_timestamp(thread.last_written_at),
            "cwd": str(thread.cwd),
            "runtime_workspace_roots": [str(thread.cwd)],
            "originator": "codex_cli_rs",
            "cli_version": DEMO_CLI_VERSION,
            "source": "cli",
            "thread_source": "user",
            "model_provider": "openai",
            "base_instructions": {
                "text": "You are Codex, a coding agent working in the user's repository.",
                "provenance": {"type": "model", "model": DEMO_MODEL},
            },
            "history_mode": "paginated",
            "git": git,
        }
        self._emit(clock.tick(), "session_meta", meta)
        developer = {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Sandbox: workspace-write. Approvals: on-request."}],
        }
        self._emit(clock.tick(0.001, 0.01), "response_item", developer, self._metadata())
        self._world_state(clock.tick(0.001, 0.01))

    def write_turn(self, clock: _LineClock) -> None:
        """Append one user turn: prompt, an exploring call, (a patch,) a test run, the answer.

        The turn holds two model responses, each followed by a ``token_count``; Codex's re-emitted
        token_counts (same totals) appear at the start and end of the turn as they do in real files.
        """
        plan = self.thread.plan
        turn_index = self.thread.turns_written
        turn_id = demo_uuid7(clock.tick(0.0, 0.01), self._rng)
        prompt = plan.prompts[turn_index % len(plan.prompts)]
        self._event(
            clock.tick(), {"type": "thread_settings_applied", "thread_id": self.thread.codex_thread_id}
        )
        started = {
            "type": "task_started",
            "turn_id": turn_id,
            "root_turn_id": turn_id,
            "model_context_window": DEMO_MODEL_CONTEXT_WINDOW,
            "collaboration_mode_kind": "default",
        }
        self._event(clock.tick(0.01, 0.05), started)
        self._turn_context(clock.tick(0.01, 0.05), turn_id)
        user_item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}
        self._emit(clock.tick(0.01, 0.05), "response_item", user_item, self._metadata())
        self._item(
            clock.tick(0.001, 0.01),
            turn_id,
            {
                "type": "UserMessage",
                "id": demo_uuid7(clock.tick(0.0, 0.001), self._rng),
                "content": [{"type": "text", "text": prompt, "text_elements": []}],
            },
        )
        self._token_count(clock.tick(0.5, 2.5), None)
        looking = f"Looking at `src/{plan.module}.py` first."
        self._agent_message(clock.tick(2.0, 9.0), turn_id, looking)
        self._shell_call(
            clock, turn_id, plan.explore_command, plan.explore_output, self._explore_output(plan)
        )
        if plan.uncommitted_change:
            self._apply_patch(clock, plan)
        self._respond(clock, turn_id)
        self._shell_call(clock, turn_id, "pytest -q", self._pytest_summary(), self._pytest_output())
        self._respond(clock, turn_id)
        answer = f"Done: {prompt[0].lower()}{prompt[1:-1]}. `pytest -q` passes (3 tests)."
        self._agent_message(clock.tick(1.0, 4.0), turn_id, answer)
        self._token_count(clock.tick(0.05, 0.5), None)
        complete = {"type": "task_complete", "turn_id": turn_id, "last_agent_message": answer}
        self._event(clock.tick(0.01, 0.1), complete)
        self.thread = replace(self.thread, turns_written=turn_index + 1)

    def flush(self) -> None:
        """Append the buffered lines to the rollout file."""
        path = self.thread.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.writelines(self._lines)
        self._lines.clear()

    def _respond(self, clock: _LineClock, turn_id: str) -> None:
        """One model response; compacts first (mid-turn) when it would cross the auto-compact limit."""
        growth = round(self.thread.plan.growth_per_response * self._rng.uniform(0.7, 1.3))
        if self.thread.last_total_tokens + growth > DEMO_AUTO_COMPACT_LIMIT:
            self._compact(clock, turn_id)
        output = self._rng.randint(150, 1_800)
        total = self.thread.last_total_tokens + growth
        input_tokens = total - output
        last = TokenUsage(
            input_tokens=input_tokens,
            cached_input_tokens=max(0, input_tokens - input_tokens % 128 - 128 * self._rng.randint(1, 40)),
            output_tokens=output,
            reasoning_output_tokens=self._rng.randint(0, output // 2),
            total_tokens=total,
        )
        self.thread = replace(
            self.thread,
            last_total_tokens=total,
            cumulative_usage=_add_usage(self.thread.cumulative_usage, last),
        )
        at = clock.tick(1.0, 6.0)
        self._usage_record(at, turn_id, last)
        self._token_count(at, last)

    def _compact(self, clock: _LineClock, turn_id: str) -> None:
        """Codex 0.169's mid-turn local compaction (``research/real-codex.md`` §5).

        Lines: the last reading repeated, the summary message (``metadata.compaction_output``), the
        compaction request's own ``token_usage_record`` and ``token_count`` (not a reading),
        ``compacted``, ``world_state`` and ``turn_context``, Codex's estimate ``token_count`` (every
        component zero, only a total) and the ``ContextCompaction`` item; the next response then
        reports the real, much smaller context.
        """
        self._token_count(clock.tick(0.01, 0.05), None)
        summary = f"Demo summary: {self.thread.turns_written} turns on {self.thread.plan.name} so far."
        message = {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{self._rng.getrandbits(96):024x}",
            "status": "completed",
            "content": [{"type": "output_text", "text": summary}],
        }
        self._emit(clock.tick(20.0, 50.0), "response_item", message, self._metadata(compaction_output=True))
        request_total = self.thread.last_total_tokens + self._rng.randint(500, 1_500)
        request = TokenUsage(request_total - 600, 0, 600, 0, request_total)
        at = clock.tick(0.001, 0.01)
        response_id = self._usage_record(at, turn_id, request)
        self.thread = replace(self.thread, cumulative_usage=_add_usage(self.thread.cumulative_usage, request))
        self._token_count(at, request)
        first_prompt = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": self.thread.plan.prompts[0]}],
        }
        compacted = {
            "message": summary,
            "replacement_history": [first_prompt, {**message, "role": "user"}],
            "window_number": self.thread.compactions + 1,
            "compaction_response_id": response_id,
        }
        self._emit(clock.tick(0.001, 0.01), "compacted", compacted)
        self._world_state(clock.tick(0.0, 0.001))
        self._turn_context(clock.tick(0.0, 0.001), turn_id)
        estimate = TokenUsage(0, 0, 0, 0, self._rng.randint(6_000, 9_000))
        self._token_count(clock.tick(0.001, 0.01), estimate)
        compaction_item = {"type": "ContextCompaction", "id": demo_uuid7(clock.tick(0.0, 0.001), self._rng)}
        self._item(clock.tick(0.001, 0.01), turn_id, compaction_item)
        self.thread = replace(
            self.thread,
            last_total_tokens=self._rng.randint(30_000, 45_000),
            compactions=self.thread.compactions + 1,
        )

    def _shell_call(self, clock: _LineClock, turn_id: str, command: str, printed: str, output: str) -> None:
        """An ``exec_command`` function call, its ``CommandExecution`` item and its output."""
        call_id = f"call_{self._rng.getrandbits(96):024x}"
        arguments = json.dumps({"cmd": command, "workdir": str(self.thread.cwd)})
        call = {"type": "function_call", "name": "exec_command", "arguments": arguments, "call_id": call_id}
        self._emit(clock.tick(0.01, 0.1), "response_item", call, self._metadata())
        execution = {
            "type": "CommandExecution",
            "id": call_id,
            "command": ["/bin/bash", "-lc", command],
            "cwd": f"file://{self.thread.cwd}",
            "source": "unified_exec_startup",
            "status": "completed",
            "aggregated_output": printed,
            "exit_code": 0,
        }
        done_at = clock.tick(0.3, 2.0)
        self._item(done_at, turn_id, execution)
        result = {"type": "function_call_output", "call_id": call_id, "output": output}
        self._emit(clock.tick(0.001, 0.01), "response_item", result, self._metadata())

    def _apply_patch(self, clock: _LineClock, plan: DemoThreadPlan) -> None:
        """An ``apply_patch`` custom tool call adding a helper to the workspace module, and its output."""
        call_id = f"call_{self._rng.getrandbits(96):024x}"
        patch = (
            f"*** Begin Patch\n*** Update File: src/{plan.module}.py\n@@\n"
            f"+def {plan.module}_count(items):\n+    return len(items)\n*** End Patch\n"
        )
        call = {
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": "apply_patch",
            "input": patch,
        }
        self._emit(clock.tick(0.5, 3.0), "response_item", call, self._metadata())
        output = f"Success. Updated the following files:\nM src/{plan.module}.py\n"
        result = {"type": "custom_tool_call_output", "call_id": call_id, "output": output}
        self._emit(clock.tick(0.05, 0.3), "response_item", result, self._metadata())

    def _turn_context(self, at: datetime, turn_id: str) -> None:
        """A ``turn_context`` line."""
        cwd = str(self.thread.cwd)
        payload = {
            "turn_id": turn_id,
            "cwd": cwd,
            "approval_policy": "on-request",
            "sandbox_policy": {"type": "workspace-write", "writable_roots": [cwd], "network_access": False},
            "model": DEMO_MODEL,
            "effort": "medium",
            "summary": "auto",
        }
        self._emit(at, "turn_context", payload)

    def _token_count(self, at: datetime, last: TokenUsage | None) -> None:
        """A ``token_count``: ``last`` given, or a re-emit of the current info (``info: null`` before any)."""
        thread = self.thread
        cumulative = thread.cumulative_usage
        used = min(99.0, 2.0 + cumulative.total_tokens / 400_000)
        if last is None and cumulative == _EMPTY_USAGE:
            self._event(at, {"type": "token_count", "info": None, "rate_limits": _rate_limits(used)})
            return
        if last is None:
            last = thread.last_usage
        self.thread = replace(thread, last_usage=last)
        info = {
            "total_token_usage": _usage_payload(cumulative),
            "last_token_usage": _usage_payload(last),
            "last_usage_includes_reasoning": last.input_tokens == 0,
            "model_context_window": DEMO_MODEL_CONTEXT_WINDOW,
        }
        self._event(at, {"type": "token_count", "info": info, "rate_limits": _rate_limits(used)})

    def _usage_record(self, at: datetime, turn_id: str, usage: TokenUsage) -> str:
        """A ``token_usage_record`` of one response with ``usage``; returns the response id."""
        thread = self.thread
        thread_usage = _add_usage(thread.thread_usage, usage)
        self.thread = replace(thread, thread_usage=thread_usage)
        response_id = f"resp_{self._rng.getrandbits(96):024x}"
        payload = {
            "thread_id": thread.codex_thread_id,
            "turn_id": turn_id,
            "session_id": thread.codex_thread_id,
            "root_turn_id": turn_id,
            "response_id": response_id,
            "usage": _usage_payload(usage),
            "thread_token_usage": _usage_payload(thread_usage),
        }
        self._emit(at, "token_usage_record", payload)
        return response_id

    def _world_state(self, at: datetime) -> None:
        """A ``world_state`` line naming the model."""
        state = {"model": DEMO_MODEL, "collaboration_mode": {"mode": "default", "model": DEMO_MODEL}}
        self._emit(at, "world_state", {"full": True, "state": state})

    def _item(self, at: datetime, turn_id: str, item: dict[str, Any]) -> None:
        """An ``event_msg`` ``item_completed`` line."""
        millis = int(at.timestamp() * 1000)
        payload = {
            "type": "item_completed",
            "thread_id": self.thread.codex_thread_id,
            "turn_id": turn_id,
            "item": item,
            "started_at_ms": millis,
            "completed_at_ms": millis,
        }
        self._event(at, payload)

    def _agent_message(self, at: datetime, turn_id: str, text: str) -> None:
        """The agent's message: its ``AgentMessage`` item and its ``response_item``."""
        message_id = f"msg_{self._rng.getrandbits(96):024x}"
        self._item(
            at,
            turn_id,
            {"type": "AgentMessage", "id": message_id, "content": [{"type": "Text", "text": text}]},
        )
        message = {
            "type": "message",
            "status": "completed",
            "id": message_id,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }
        self._emit(at, "response_item", message, self._metadata())

    def _metadata(self, **extra: Any) -> dict[str, Any]:
        """The ``metadata`` of a ``response_item`` line."""
        return {"history_sequence": self.thread.lines_written, "client_authored": False, **extra}

    def _event(self, at: datetime, payload: dict[str, Any]) -> None:
        """An ``event_msg`` line."""
        self._emit(at, "event_msg", payload)

    def _emit(
        self, at: datetime, record_type: str, payload: dict[str, Any], metadata: dict[str, Any] | None = None
    ) -> None:
        """Buffer one line (with the next ordinal) and remember its time."""
        ordinal = self.thread.lines_written
        self._lines.append(rollout_line(at, record_type, payload, ordinal, metadata))
        self.thread = replace(self.thread, last_written_at=at, lines_written=ordinal + 1)

    def _explore_output(self, plan: DemoThreadPlan) -> str:
        """The plan's exploring command output, framed as Codex's ``exec_command`` returns it."""
        wall = self._rng.uniform(0.01, 0.2)
        header = f"Chunk ID: {self._rng.getrandbits(24):06x}\nWall time: {wall:.4f} seconds\n"
        return f"{header}Process exited with code 0\nOutput:\n{plan.explore_output}"

    def _pytest_summary(self) -> str:
        """What a passing ``pytest -q`` over the workspace's three tests prints."""
        self._pytest_seconds = self._rng.uniform(0.2, 0.9)
        progress = "..." + " " * 69 + "[100%]"
        return f"{progress}\n3 passed in {self._pytest_seconds:.2f}s\n"

    def _pytest_output(self) -> str:
        """That output framed as Codex's ``exec_command`` returns it to the model."""
        seconds = self._pytest_seconds
        header = f"Chunk ID: {self._rng.getrandbits(24):06x}\nWall time: {seconds + 0.3:.4f} seconds\n"
        header += "Process exited with code 0\nOutput:\n"
        progress = "..." + " " * 69 + "[100%]"
        return f"{header}{progress}\n3 passed in {seconds:.2f}s\n"


def _plan_for(index: int) -> DemoThreadPlan:
    """The ``index``-th demo plan; beyond the built-in ones, numbered variants of them."""
    base = DEMO_PLANS[index % len(DEMO_PLANS)]
    cycle = index // len(DEMO_PLANS)
    return base if cycle == 0 else replace(base, name=f"{base.name}-{cycle + 1}")


def _git(workspace: Path, *arguments: str) -> str:
    """Run git in ``workspace`` with the demo identity; stdout. Raises on failure."""
    completed = subprocess.run(
        ["git", "-C", str(workspace), *arguments],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        env={**os.environ, **_GIT_IDENTITY},
    )
    return completed.stdout


def create_demo_workspace(root: Path, plan: DemoThreadPlan) -> tuple[Path, str | None]:
    """Create ``root/workspaces/<plan.name>``: a small Python project committed to git on ``main``.

    With ``plan.uncommitted_change`` a source file is left modified. Returns the folder and the commit
    hash, or None for the hash when git is not installed (the folder then has no repository).
    """
    workspace = root / "workspaces" / plan.name
    (workspace / "src").mkdir(parents=True, exist_ok=True)
    (workspace / "tests").mkdir(exist_ok=True)
    module = plan.module
    (workspace / "README.md").write_text(f"# {plan.name}\n\nDemo workspace for Boss.\n", encoding="utf-8")
    (workspace / "src" / f"{module}.py").write_text(
        f'"""{plan.name}: demo module."""\n\n\ndef {module}_total(items):\n    return sum(items)\n',
        encoding="utf-8",
    )
    (workspace / "tests" / f"test_{module}.py").write_text(
        f"from src.{module} import {module}_total\n\n\n"
        f"def test_empty():\n    assert {module}_total([]) == 0\n\n\n"
        f"def test_one():\n    assert {module}_total([2]) == 2\n\n\n"
        f"def test_many():\n    assert {module}_total([1, 2, 3]) == 6\n",
        encoding="utf-8",
    )
    if shutil.which("git") is None:
        logger.warning("git is not installed; demo workspace %s has no repository", workspace)
        return workspace, None
    if not (workspace / ".git").exists():
        _git(workspace, "init", "--quiet", "--initial-branch=main")
        _git(workspace, "add", "--all")
        _git(workspace, "-c", "commit.gpgsign=false", "commit", "--quiet", "-m", f"Start {plan.name}")
    commit = _git(workspace, "rev-parse", "HEAD").strip()
    if plan.uncommitted_change:
        with (workspace / "src" / f"{module}.py").open("a", encoding="utf-8") as handle:
            handle.write(f"\n\ndef {module}_count(items):\n    return len(items)\n")
    return workspace, commit


def _wants_another_turn(thread: DemoThread) -> bool:
    """True until the plan's initial turns (and, if it asks for one, a compaction) are written."""
    plan = thread.plan
    if thread.turns_written < plan.initial_turns:
        return True
    return plan.compacts_in_history and thread.compactions == 0


def write_demo_codex_home(root: Path, now: datetime, threads: int = 3, seed: int = 7) -> list[DemoThread]:
    """Write demo Codex sessions under ``root`` (used as ``$CODEX_HOME``), ending at about ``now``.

    Args:
        root: folder to fill: ``root/sessions/...`` rollouts and ``root/workspaces/<name>`` repos.
        now: aware datetime; the sessions started earlier and their last lines are at most ``now``.
        threads: number of threads (>= 1); the third built-in thread goes through a compaction.
        seed: makes the generated content reproducible.

    Returns:
        The written threads, ready for :class:`DemoSessionPlayer`.

    Raises:
        ValueError: ``threads < 1`` or ``now`` is naive.
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    rng = random.Random(seed)
    written = []
    for index in range(threads):
        plan = _plan_for(index)
        cwd, commit = create_demo_workspace(root, plan)
        started_at = now - timedelta(minutes=_TURN_SPACING_MINUTES * (plan.initial_turns + 4) + 5 + index)
        thread_id = demo_uuid7(started_at, rng)
        thread = DemoThread(
            plan=plan,
            path=rollout_path(root, started_at, thread_id),
            codex_thread_id=thread_id,
            cwd=cwd,
            last_total_tokens=0,
            last_usage=_EMPTY_USAGE,
            cumulative_usage=_EMPTY_USAGE,
            last_written_at=started_at,
            turns_written=0,
            compactions=0,
        )
        writer = _ThreadWriter(thread, rng)
        writer.start_session(_LineClock(started_at, rng), commit)
        while _wants_another_turn(writer.thread):
            turn_start = started_at + timedelta(
                minutes=_TURN_SPACING_MINUTES * writer.thread.turns_written + 1
            )
            writer.write_turn(_LineClock(max(turn_start, writer.thread.last_written_at), rng))
        writer.flush()
        written.append(writer.thread)
    return written


class DemoSessionPlayer:
    """Appends turns to demo threads over time, so a follower sees their budgets move."""

    def __init__(self, threads: Sequence[DemoThread], seed: int = 11) -> None:
        """Continue the given threads (as returned by :func:`write_demo_codex_home`)."""
        self._rng = random.Random(seed)
        self._threads = list(threads)

    @property
    def threads(self) -> list[DemoThread]:
        """The threads' current state."""
        return list(self._threads)

    def advance(self, now: datetime) -> list[DemoThread]:
        """Append one user turn to every thread, its lines timestamped between its last line and ``now``.

        Lines never lie in the future of ``now``; with short intervals a turn's steps are compressed.

        A thread whose next response would cross the auto-compact limit (244,800 tokens) first writes
        a compaction sequence. Returns the threads' new state.
        """
        advanced = []
        for thread in self._threads:
            start = max(now - _MAX_TURN_DURATION, thread.last_written_at + timedelta(milliseconds=1))
            scale = min(1.0, max(0.0, (now - start) / _MAX_TURN_DURATION))
            writer = _ThreadWriter(thread, self._rng)
            writer.write_turn(_LineClock(start, self._rng, scale))
            writer.flush()
            advanced.append(writer.thread)
        self._threads = advanced
        return list(advanced)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: write a demo ``$CODEX_HOME`` and optionally keep appending turns."""
    parser = argparse.ArgumentParser(
        prog="python -m worker.demo_sessions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--codex-home", type=Path, required=True, help="folder to write (used as CODEX_HOME)")
    parser.add_argument("--threads", type=int, default=3, help="number of demo threads (default 3)")
    parser.add_argument("--seed", type=int, default=7, help="random seed for reproducible content")
    parser.add_argument("--live", action="store_true", help="keep appending one turn per thread")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between live turns (default 2)")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    threads = write_demo_codex_home(
        arguments.codex_home, datetime.now(UTC), arguments.threads, arguments.seed
    )
    for thread in threads:
        logger.info("wrote %s (%s, T=%d tokens)", thread.path, thread.plan.name, thread.last_total_tokens)
    if not arguments.live:
        return 0
    player = DemoSessionPlayer(threads, seed=arguments.seed + 1)
    try:
        while True:
            time.sleep(arguments.interval)
            for thread in player.advance(datetime.now(UTC)):
                logger.info(
                    "%s: T=%d tokens, %d compaction(s)",
                    thread.plan.name,
                    thread.last_total_tokens,
                    thread.compactions,
                )
    except KeyboardInterrupt:
        logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
