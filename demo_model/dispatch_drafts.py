"""The demo model's answers for a group's dispatch plan (tasks ``[boss:dispatch_drafts]`` and
``[boss:dispatch_summary]``, services/conversations/groups): deterministic, and still not a real
model (every text says so).

- ``dispatch_drafts``: the request's user message is Boss's JSON ``{"message": ..., "targets":
  [{"target_id", "thread_title", "codex_folder_ref", ...}]}``; the answer is the JSON object Boss
  asks for, one instruction per target: the person's message, followed by a line saying the demo
  model drafted it for that thread. With :data:`MALFORMED_PLAN_MARKER` in the person's message the
  answer is a well-formed JSON object that is a wrong plan (an instruction for a target the plan
  does not have, none for the real ones), so Boss's validation and its fallback to the person's
  text can be seen. ``[[demo:nonsense]]`` (not JSON at all) and the failure markers work as for
  every chat request (:mod:`demo_model.chat_completions`).
- ``dispatch_summary``: the user message is ``{"message": ..., "results": [{"thread_title",
  "status", "failure_kind", "answer"}]}``; the answer names how many threads answered, the first
  line of each answer, and every thread that failed.

A request whose user message is not that JSON gets a text saying so. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from demo_model.chat_tasks import ChatRequest, chat_task
from demo_model.responses import REPLY_PREFIX

DRAFTS_TAG = "dispatch_drafts"
SUMMARY_TAG = "dispatch_summary"
MALFORMED_PLAN_MARKER = "[[demo:malformed_plan]]"
DEMO_NAME = REPLY_PREFIX.rstrip(": ")
"""``Demo model (not a real model)``."""
EXCERPT_CHARACTERS = 160


def _facts(request: ChatRequest) -> dict[str, Any] | None:
    try:
        facts = json.loads(request.user_text)
    except ValueError:
        return None
    return facts if isinstance(facts, dict) else None


@chat_task(DRAFTS_TAG)
def drafts(request: ChatRequest) -> str:
    """The instructions of a dispatch plan's targets as Boss's JSON (see the module docstring)."""
    facts = _facts(request)
    if facts is None or not isinstance(facts.get("targets"), list):
        return f"{DEMO_NAME}: a dispatch draft request must carry Boss's JSON facts."
    message = str(facts.get("message") or "")
    targets = [target for target in facts["targets"] if isinstance(target, dict)]
    if MALFORMED_PLAN_MARKER in message:
        return json.dumps(
            {
                "instructions": [
                    {"target_id": "t999", "instruction": f"{DEMO_NAME}: a plan for a thread nobody has"}
                ]
            }
        )
    instructions = [
        {
            "target_id": str(target.get("target_id") or ""),
            "instruction": (
                f"{message}\n\n({DEMO_NAME} drafted this for {target.get('thread_title') or 'this thread'}.)"
            ),
        }
        for target in targets
    ]
    return json.dumps({"instructions": instructions}, ensure_ascii=False)


@chat_task(SUMMARY_TAG)
def summary(request: ChatRequest) -> str:
    """The summary of a plan's results (see the module docstring)."""
    facts = _facts(request)
    if facts is None or not isinstance(facts.get("results"), list):
        return f"{DEMO_NAME}: a dispatch summary request must carry Boss's JSON results."
    results = [result for result in facts["results"] if isinstance(result, dict)]
    answered = [
        result for result in results if result.get("status") == "completed" and not result.get("failure_kind")
    ]
    failed = [result for result in results if result not in answered]
    lines = [f"{DEMO_NAME}, summarising: {len(answered)} of {len(results)} threads answered."]
    lines += [
        f"{result.get('thread_title')}: {_first_line(str(result.get('answer') or ''))}" for result in answered
    ]
    if failed:
        named = ", ".join(
            f"{result.get('thread_title')} ({result.get('failure_kind') or result.get('status')})"
            for result in failed
        )
        lines.append(f"Failed: {named}.")
    return "\n".join(lines)


def _first_line(text: str) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "(no answer)")
    return line if len(line) <= EXCERPT_CHARACTERS else line[: EXCERPT_CHARACTERS - 1] + "…"
