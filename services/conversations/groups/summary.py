"""The master agent's summary of a confirmed plan, once every dispatched task is terminal, and the
messages a group gets from its plans.

The summary names every failure: `plain_summary` lists each thread's outcome; a model's summary
(`summary_request` -> `read_summary`) is kept when it is a usable text, with a line naming the
failed threads appended when it does not name each of them by title. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from services.conversations.chat.domain import COMPLETED, NUL, ChatTask, StatusReport
from services.conversations.chat.wording import (
    SYSTEM_AUTHOR,
    THREAD_AUTHOR,
    ResultMessage,
    system_message_text,
)
from services.conversations.domain.model import MAX_MESSAGE_LENGTH
from services.conversations.groups.plans import DispatchPlan, DispatchTarget
from services.conversations.master.model import ChatMessage

SUMMARY_TAG = "[boss:dispatch_summary]"
"""First line of the summary request's system message (see drafting.DRAFTS_TAG)."""

EXCERPT_CHARACTERS = 300
"""How much of each thread's answer the plain summary quotes (characters)."""

SUMMARY_SYSTEM = (
    f"{SUMMARY_TAG}\n"
    "You are Boss's master agent. Threads of a group ran a person's message; summarise their results "
    "for the person in a few sentences: what was done, what is left, and name every thread that "
    "failed and why. Plain text, no JSON."
)


@dataclass(frozen=True)
class TargetResult:
    """How a dispatched target ended: its task's status and failure kind, and the text of the message
    that ended it (the thread's reply or the system message)."""

    target: DispatchTarget
    task_status: str
    failure_kind: str
    text: str

    @property
    def succeeded(self) -> bool:
        """Completed with a reply."""
        return self.task_status == COMPLETED and not self.failure_kind


def dispatch_result_message(task: ChatTask, report: StatusReport, thread_title: str) -> ResultMessage:
    """The message a terminal dispatch_execution task writes into its group, named by its thread:
    completed -> the thread's raw reply (author "thread", its thread id); otherwise a system message
    carrying the thread's id and starting with its title."""
    if report.status == COMPLETED and report.reply_text:
        return ResultMessage(THREAD_AUTHOR, task.target_thread_id, report.reply_text)
    return ResultMessage(
        SYSTEM_AUTHOR, task.target_thread_id, f"{thread_title}: {system_message_text(task, report)}"
    )


def plain_summary(plan: DispatchPlan, results: Sequence[TargetResult]) -> str:
    """The summary without a model: how many threads answered, one line per thread (an excerpt of
    its answer, or why it failed), and the failed threads named."""
    answered = sum(1 for result in results if result.succeeded)
    lines = [f"Summary of the dispatch plan {plan.plan_id}: {answered} of {len(results)} threads answered."]
    for result in results:
        title = result.target.thread_title
        if result.succeeded:
            lines.append(f"- {title}: {_excerpt(result.text)}")
        else:
            lines.append(f"- {title}: {result.task_status} ({result.failure_kind or 'no reply'})")
    return "\n".join([*lines, *_failures_line(results)])


def summary_request(plan: DispatchPlan, results: Sequence[TargetResult]) -> list[ChatMessage]:
    """The chat asking the model for the summary."""
    facts = {
        "message": plan.request_text,
        "results": [
            {
                "thread_title": result.target.thread_title,
                "instruction": result.target.instruction,
                "status": result.task_status,
                "failure_kind": result.failure_kind,
                "answer": result.text,
            }
            for result in results
        ],
    }
    return [
        ChatMessage("system", SUMMARY_SYSTEM),
        ChatMessage("user", json.dumps(facts, ensure_ascii=False, indent=1)),
    ]


def read_summary(answer_text: str, results: Sequence[TargetResult]) -> str | None:
    """The model's summary when usable (not empty, no NUL, fits a message with room for the
    failures line), with the failed threads named when it misses one; None otherwise (the plain
    summary is used)."""
    text = answer_text.strip()
    if not text or NUL in text or len(text) > MAX_MESSAGE_LENGTH - 10_000:
        return None
    missed = [result for result in results if not result.succeeded and result.target.thread_title not in text]
    if missed:
        text = "\n".join([text, *_failures_line(results)])
    return text


def _failures_line(results: Sequence[TargetResult]) -> list[str]:
    failed = [result for result in results if not result.succeeded]
    if not failed:
        return []
    named = "; ".join(f"{result.target.thread_title} ({_excerpt(result.text, 160)})" for result in failed)
    return [f"Failed: {named}."]


def _excerpt(text: str, limit: int = EXCERPT_CHARACTERS) -> str:
    """The text on one line, cut at `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def confirmation_text(plan: DispatchPlan) -> str:
    """The master agent's message when a plan is confirmed: who got the message and who was
    skipped or dropped."""
    sent = [target.thread_title for target in plan.dispatched]
    lines = [f"Sent to {len(sent)} thread{'s' if len(sent) != 1 else ''}: {', '.join(sent)}."]
    skipped = [target for target in plan.targets if target.status == "skipped"]
    if skipped:
        lines.append(
            "Not sent to: "
            + "; ".join(f"{target.thread_title} ({target.status_detail})" for target in skipped)
            + "."
        )
    return " ".join(lines)


def no_target_text(reason: str) -> str:
    """The master agent's message when no thread can take a group message."""
    return f"Nothing was sent: {reason}."


def expiry_text(plan: DispatchPlan) -> str:
    """The system message when a plan expires unconfirmed."""
    return (
        f"The dispatch plan {plan.plan_id} was not confirmed in time and expired; nothing was sent. "
        "Send the message again for a new plan."
    )


REJECTED_TEXT = "You rejected the dispatch plan; nothing was sent."
