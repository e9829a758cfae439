"""The master agent's prompt: the system's real state in words and as a machine-readable JSON block,
the conversation so far, and the person's question. Pure: the state and the clock come in.

Two shapes:

- `chat_messages` (openai_api): a system message (the role, the rules, the state), the last
  messages of the master conversation (user -> user, master -> assistant), the question.
- `codex_instruction` (master_codex_node): one text for the master's own Codex thread, which keeps
  its history itself: the same system text, then the question between `<boss-question>` tags.

Both begin with MASTER_CHAT_TAG on a line of its own and carry the state between STATE_OPEN and
STATE_CLOSE, so a stand-in model (demo_model) can find the task and the state; a real model reads
them as any other text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from services.conversations.chat.wording import when
from services.conversations.master.model import ChatMessage, Role
from services.conversations.master.state import (
    LEVEL_THRESHOLDS,
    SystemState,
    ThreadState,
    preview,
    state_payload,
)

MASTER_CHAT_TAG = "[boss:master_chat]"
"""First line of the prompt: names its task for a model server (demo_model's registry of chat tasks;
the dispatch plans' requests carry "[boss:dispatch_drafts]" and "[boss:dispatch_summary]")."""
STATE_OPEN = "<boss-state-json>"
STATE_CLOSE = "</boss-state-json>"
QUESTION_OPEN = "<boss-question>"
QUESTION_CLOSE = "</boss-question>"
MAX_HISTORY_MESSAGES = 20
"""How many earlier messages of the master conversation the openai_api prompt carries."""
MAX_HISTORY_CHARS = 4_000
"""Each earlier message is cut at this many characters."""

_ROLE_OF_AUTHOR: dict[str, Role] = {"user": "user", "master": "assistant"}


@dataclass(frozen=True)
class HistoryMessage:
    """An earlier message of the master conversation: author_kind user | master | system | thread."""

    author_kind: str
    text: str


def thread_line(thread: ThreadState) -> str:
    """One thread in words, e.g. `"parser" (th-1) on node-a: 18 % left, critical; must finish
    before compaction (uncommitted patch); handoff required; 2 compactions, the last at 10:04:05
    UTC; open tasks: running "fix the flaky test"`."""
    view = thread.view
    budget = view.budget
    head = f'"{view.title or view.thread_id}" ({view.thread_id}) on {view.node_id or "an unknown node"}'
    if budget is None:
        parts = ["no context budget reported yet"]
    else:
        parts = [f"{budget.percent} % left, {budget.level}"]
        if budget.must_finish_before_compaction:
            reason = f" ({budget.must_finish_reason})" if budget.must_finish_reason else ""
            parts.append(f"must finish before compaction{reason}")
        if budget.compaction_expected_at is not None:
            parts.append(f"compaction expected at {when(budget.compaction_expected_at, None)}")
        if budget.estimated_remaining_turns is not None:
            parts.append(f"about {budget.estimated_remaining_turns} turns left")
        if budget.compaction_count:
            last = (
                f", the last at {when(budget.last_compaction_at, None)}" if budget.last_compaction_at else ""
            )
            parts.append(f"{budget.compaction_count} compaction(s) so far{last}")
    if view.handoff_status != "none":
        reason = f" ({thread.handoff_reason})" if thread.handoff_reason else ""
        parts.append(f"handoff {view.handoff_status}{reason}")
    if thread.open_tasks:
        tasks = ", ".join(f'{task.status} "{preview(task.request_text, 80)}"' for task in thread.open_tasks)
        parts.append(f"open tasks: {tasks}")
    else:
        parts.append("no open task")
    if thread.is_master_main_thread:
        parts.append("this is the master agent's own thread")
    return f"- {head}: " + "; ".join(parts)


def state_in_words(state: SystemState) -> str:
    """The state as lines a person (or model) reads: one line per thread, most at risk first, then
    the projects."""
    threads = state.threads_in_risk_order()
    if not threads:
        lines = ["No thread is registered yet."]
    else:
        lines = [f"Threads ({len(threads)}), most at risk of compaction first:"]
        lines += [thread_line(thread) for thread in threads]
    if state.projects:
        lines.append("Conversations:")
        for project in state.projects:
            members = f", threads {', '.join(project.thread_ids)}" if project.thread_ids else ""
            lines.append(f'- "{project.title}" ({project.conversation_type}{members})')
    return "\n".join(lines)


def system_prompt(state: SystemState) -> str:
    """The system text: the master agent's role and rules, the state in words and as JSON."""
    thresholds = ", ".join(f"{level} {share} %" for level, share in LEVEL_THRESHOLDS.items())
    block = json.dumps(state_payload(state), ensure_ascii=False, separators=(",", ":"))
    return (
        f"{MASTER_CHAT_TAG}\n"
        "You are Boss's master agent: you watch every Codex thread of this person and answer their "
        "questions about them. Answer from the state below, which is Boss's real state captured at "
        f"{when(state.captured_at, None)}; never invent a thread, a number or a task. Name threads by "
        "their title and id. A thread's percent is its context budget: the share of its usable "
        "context left before Codex compacts it (lower means closer to compaction). Levels: "
        f"{thresholds}. At watch add no large context, at urgent finish the current subtask and "
        "prepare the relay, at critical wrap up now. Answer briefly, in the person's language.\n\n"
        f"{state_in_words(state)}\n\n"
        f"The same state, machine-readable (schema boss.master_state.v1):\n{STATE_OPEN}{block}{STATE_CLOSE}"
    )


def chat_messages(state: SystemState, history: Sequence[HistoryMessage], question: str) -> list[ChatMessage]:
    """The openai_api prompt: system text, up to MAX_HISTORY_MESSAGES earlier user and master
    messages (oldest first, each cut at MAX_HISTORY_CHARS; system and thread messages left out),
    then `question` as the last user message."""
    earlier = [message for message in history if message.author_kind in _ROLE_OF_AUTHOR]
    messages = [ChatMessage("system", system_prompt(state))]
    for message in earlier[-MAX_HISTORY_MESSAGES:]:
        messages.append(ChatMessage(_ROLE_OF_AUTHOR[message.author_kind], message.text[:MAX_HISTORY_CHARS]))
    messages.append(ChatMessage("user", question))
    return messages


def codex_instruction(state: SystemState, question: str) -> str:
    """The master_codex_node instruction: the system text, then the question between
    QUESTION_OPEN and QUESTION_CLOSE (Codex keeps the conversation's history in its thread)."""
    return f"{system_prompt(state)}\n\nThe person asks:\n{QUESTION_OPEN}\n{question}\n{QUESTION_CLOSE}"
