"""The master model's part in a dispatch plan: drafting each target's instruction.

`draft_request` is the chat sent to the model (a JSON answer is asked for); `read_drafts` validates
the answer and keeps it only when it is exactly right: one JSON object
`{"instructions": [{"target_id": "t1", "instruction": "..."}, ...]}` with one non-empty instruction
(at most 100,000 characters, no NUL) per target of the plan and no other. Anything else (not JSON,
another shape, a target missing or unknown, an empty or over-long text) falls back to the user's
text for every target, and the plan says why (`Drafts.note`). A JSON object wrapped in a Markdown
code fence is accepted (models often add one).

Pure: no model call here (the handlers make it, outside any transaction).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from services.conversations.chat.domain import NUL
from services.conversations.domain.model import MAX_MESSAGE_LENGTH
from services.conversations.groups.plans import DRAFTED_BY_MODEL, DRAFTED_BY_USER_TEXT, Drafts
from services.conversations.master.model import ChatMessage

DRAFTS_TAG = "[boss:dispatch_drafts]"
"""First line of the drafting request's system message: tells a model server (the demo model) what
the request is for."""

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n\s*```\s*$", re.DOTALL)

DRAFTS_SYSTEM = (
    f"{DRAFTS_TAG}\n"
    "You are Boss's master agent. A person sent one message to a group of Codex threads; Boss chose "
    "which threads get it, by their context budgets. Write, for each target thread, the instruction "
    "that thread receives: the person's request as it applies to that thread, self-contained, in "
    "the person's language. Do not invent work the person did not ask for.\n"
    'Answer with exactly one JSON object: {"instructions": [{"target_id": "<id>", '
    '"instruction": "<text>"}]}, one entry per target, every target once, nothing else.'
)


def draft_request(user_text: str, targets: Sequence[dict[str, Any]]) -> list[ChatMessage]:
    """The chat asking the model for the instructions of `targets` (each a dict with target_id,
    thread_title, codex_folder_ref, level, remaining_pct, reason)."""
    facts = {"message": user_text, "targets": list(targets)}
    return [
        ChatMessage("system", DRAFTS_SYSTEM),
        ChatMessage("user", json.dumps(facts, ensure_ascii=False, indent=1)),
    ]


def user_text_drafts(note: str = "") -> Drafts:
    """Every target gets the user's text (no model configured when `note` is "")."""
    return Drafts({}, DRAFTED_BY_USER_TEXT, note)


def fallback_note(problem: str) -> str:
    """The plan's note when the model's draft is not used: `problem` and what happens instead."""
    return f"the master model's draft was not used ({problem}); each thread gets your message as you wrote it"


def read_drafts(answer_text: str, target_ids: Sequence[str]) -> Drafts:
    """The model's instructions for `target_ids` when its answer is valid (module docstring), else
    the user's text for every target with the problem named in the note."""
    problem, instructions = _parse(answer_text, target_ids)
    if problem:
        return user_text_drafts(fallback_note(problem))
    return Drafts(instructions, DRAFTED_BY_MODEL)


def _parse(answer_text: str, target_ids: Sequence[str]) -> tuple[str, dict[str, str]]:
    """(problem in words, {}) or ("", instructions by target id)."""
    text = answer_text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body")
    if not text:
        return "it answered nothing", {}
    try:
        value = json.loads(text)
    except ValueError:
        return "its answer is not JSON", {}
    if not isinstance(value, dict) or not isinstance(value.get("instructions"), list):
        return 'its answer is not an object with an "instructions" list', {}
    wanted = set(target_ids)
    instructions: dict[str, str] = {}
    for entry in value["instructions"]:
        if not isinstance(entry, dict):
            return "an entry of its instructions is not an object", {}
        target_id, instruction = entry.get("target_id"), entry.get("instruction")
        if not isinstance(target_id, str) or target_id not in wanted:
            return f"it names a target the plan does not have ({str(target_id)[:40]!r})", {}
        if target_id in instructions:
            return f"it gives target {target_id} two instructions", {}
        if not isinstance(instruction, str) or not instruction.strip():
            return f"its instruction for {target_id} is empty", {}
        if len(instruction) > MAX_MESSAGE_LENGTH:
            return f"its instruction for {target_id} is over {MAX_MESSAGE_LENGTH:,} characters", {}
        if NUL in instruction:
            return f"its instruction for {target_id} holds a NUL character", {}
        instructions[target_id] = instruction
    missing = [target_id for target_id in target_ids if target_id not in instructions]
    if missing:
        return f"it gives no instruction for {', '.join(missing)}", {}
    return "", instructions
