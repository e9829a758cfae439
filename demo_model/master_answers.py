"""The demo model's answers to the master agent's chat (task ``[boss:master_chat]``): true ones, read
from the machine-readable state Boss puts in the prompt, in fixed templates. Still not a real model:
every answer starts with :data:`MASTER_PREFIX`.

Boss's master prompt (services/conversations/master/prompt.py) carries the state as JSON (schema
``boss.master_state.v1``) between :data:`STATE_OPEN` and :data:`STATE_CLOSE`; through Codex
(master_codex_node) the question itself sits between :data:`QUESTION_OPEN` and
:data:`QUESTION_CLOSE`. What the question asks decides the template, in this order:

1. it names a thread (its title or id): what that thread is doing (budget, level, must-finish,
   handoff, compactions, open tasks, the last message of its conversation);
2. it speaks of compaction, budget, context or risk: the thread closest to compaction with its
   percent and level, then the others at watch or worse;
3. anything else: an overview (threads per level, the closest to compaction, what to ask).

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from demo_model.chat_tasks import ChatRequest, chat_task
from demo_model.responses import REPLY_PREFIX

MASTER_CHAT_TAG = "master_chat"
STATE_OPEN = "<boss-state-json>"
STATE_CLOSE = "</boss-state-json>"
QUESTION_OPEN = "<boss-question>"
QUESTION_CLOSE = "</boss-question>"
MASTER_PREFIX = REPLY_PREFIX.rstrip(": ") + ", answering from Boss's state"
"""``Demo model (not a real model), answering from Boss's state``."""

_RISK_WORDS = ("compact", "budget", "context", "risk", "percent", "%", "close", "full")
_LEVEL_ORDER = ("critical", "urgent", "watch", "safe")


def state_of(text: str) -> dict[str, Any] | None:
    """The state JSON object between STATE_OPEN and STATE_CLOSE in `text`, None when absent or
    not a JSON object."""
    start = text.find(STATE_OPEN)
    end = text.find(STATE_CLOSE, start + len(STATE_OPEN))
    if start < 0 or end < 0:
        return None
    try:
        state = json.loads(text[start + len(STATE_OPEN) : end])
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def question_of(text: str) -> str:
    """The question between QUESTION_OPEN and QUESTION_CLOSE, or the whole text when not tagged."""
    match = re.search(re.escape(QUESTION_OPEN) + r"\s*(.*?)\s*" + re.escape(QUESTION_CLOSE), text, re.DOTALL)
    return match.group(1) if match else text


def _clock(value: Any) -> str:
    """An RFC 3339 instant as "10:04:05 UTC" (the text as given when it does not parse)."""
    if not isinstance(value, str) or not value:
        return "an unknown time"
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%H:%M:%S UTC")
    except ValueError:
        return value


def _name(thread: dict[str, Any]) -> str:
    title = str(thread.get("title") or thread.get("thread_id") or "?")
    return f'"{title}" ({thread.get("thread_id")})'


def _budget_words(thread: dict[str, Any]) -> str:
    budget = thread.get("budget") or {}
    if not budget.get("reported"):
        return "has not reported its context budget yet"
    return f"has {budget.get('percent')} % of its context budget left ({budget.get('level')})"


def describe_thread(thread: dict[str, Any]) -> str:
    """What a thread is doing, in sentences."""
    budget = thread.get("budget") or {}
    parts = [f"{_name(thread)} on {thread.get('node_id') or 'an unknown node'} {_budget_words(thread)}"]
    if budget.get("must_finish_before_compaction"):
        reason = budget.get("must_finish_reason")
        parts.append("it must finish before compaction" + (f" ({reason})" if reason else ""))
    if budget.get("compaction_expected_at"):
        parts.append(f"compaction is expected at {_clock(budget['compaction_expected_at'])}")
    if budget.get("compaction_count"):
        parts.append(f"it was compacted {budget['compaction_count']} time(s)")
    handoff = thread.get("handoff") or {}
    if handoff.get("status") and handoff.get("status") != "none":
        reason = handoff.get("reason")
        parts.append(f"its handoff is {handoff['status']}" + (f" ({reason})" if reason else ""))
    sentence = "; ".join(parts) + "."
    tasks = thread.get("open_tasks") or []
    if tasks:
        listed = ", ".join(f'{task.get("status")} "{task.get("request")}"' for task in tasks)
        sentence += f" It has {len(tasks)} open task(s): {listed}."
    else:
        sentence += " It has no open task."
    last = thread.get("last_message")
    if isinstance(last, dict) and last.get("text"):
        said = f"{last.get('author_kind')}, {_clock(last.get('at'))}"
        sentence += f' Its conversation last said ({said}): "{last["text"]}"'
    return sentence


def closest_to_compaction(state: dict[str, Any]) -> str:
    """The thread nearest compaction with its percent and level, then the others at risk."""
    threads = {thread.get("thread_id"): thread for thread in state.get("threads") or []}
    reported = [thread for thread in threads.values() if (thread.get("budget") or {}).get("reported")]
    if not reported:
        return "No thread has reported its context budget yet, so none is known to be close to compaction."
    at_risk = [
        threads[thread_id] for thread_id in state.get("closest_to_compaction") or [] if thread_id in threads
    ]
    if not at_risk:
        lowest = min(reported, key=lambda thread: thread["budget"].get("remaining_pct", 100))
        return (
            "No thread is close to compaction: every reporting thread is safe; the lowest is "
            f"{_name(lowest)} with {lowest['budget'].get('percent')} % left."
        )
    first = at_risk[0]
    budget = first["budget"]
    answer = (
        f"The thread closest to compaction is {_name(first)} with {budget.get('percent')} % of its "
        f"context budget left ({budget.get('level')})"
    )
    if budget.get("compaction_expected_at"):
        answer += f", compaction expected at {_clock(budget['compaction_expected_at'])}"
    answer += "."
    others = [
        f"{_name(thread)} at {thread['budget'].get('percent')} % ({thread['budget'].get('level')})"
        for thread in at_risk[1:]
    ]
    if others:
        answer += " Also at risk: " + ", ".join(others) + "."
    return answer


def overview(state: dict[str, Any]) -> str:
    """How many threads at each level, the closest to compaction, and what to ask."""
    threads = state.get("threads") or []
    if not threads:
        return "No thread is registered yet; once a device's worker reports one, ask me about it."
    counts: dict[str, int] = {}
    for thread in threads:
        budget = thread.get("budget") or {}
        level = str(budget.get("level")) if budget.get("reported") else "not reported"
        counts[level] = counts.get(level, 0) + 1
    levels = ", ".join(
        f"{counts[level]} {level}" for level in (*_LEVEL_ORDER, "not reported") if level in counts
    )
    example = threads[0].get("title") or threads[0].get("thread_id")
    return (
        f"You have {len(threads)} thread(s): {levels}. {closest_to_compaction(state)} Ask me "
        f'"which thread is close to compaction?" or "what is {example} doing?".'
    )


def _named_thread(question: str, state: dict[str, Any]) -> dict[str, Any] | None:
    """The thread the question names (its id, or its title of 3+ characters; the longest match)."""
    lowered = question.lower()
    best: tuple[int, dict[str, Any]] | None = None
    for thread in state.get("threads") or []:
        for name in (str(thread.get("thread_id") or ""), str(thread.get("title") or "")):
            if len(name) >= 3 and name.lower() in lowered and (best is None or len(name) > best[0]):
                best = (len(name), thread)
    return best[1] if best else None


def master_reply(question: str, state: dict[str, Any] | None) -> str:
    """The demo master agent's answer to `question` from `state` (see the module docstring)."""
    if state is None:
        return f"{REPLY_PREFIX}the master prompt carried no state I can read, so I cannot answer from it."
    named = _named_thread(question, state)
    if named is not None:
        body = describe_thread(named)
    elif any(word in question.lower() for word in _RISK_WORDS):
        body = closest_to_compaction(state)
    else:
        body = overview(state)
    return f"{MASTER_PREFIX} at {_clock(state.get('captured_at'))}: {body}"


@chat_task(MASTER_CHAT_TAG)
def answer_master_chat(request: ChatRequest) -> str:
    """``[boss:master_chat]``: the answer to the last user message from the system message's state."""
    return master_reply(request.user_text, state_of(request.system_text))


def codex_master_reply(user_text: str) -> str | None:
    """Through Codex (master_codex_node) the whole prompt is one user message: its answer when it
    is a master prompt (it starts with ``[boss:master_chat]``), else None."""
    if not user_text.lstrip().startswith(f"[boss:{MASTER_CHAT_TAG}]"):
        return None
    return master_reply(question_of(user_text), state_of(user_text))
