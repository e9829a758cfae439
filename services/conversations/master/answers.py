"""What the master agent's model answered, as the conversation stores it: the reply, or a system
message saying what failed; and the master conversation's ring under openai_api (CB-16 §7.3).
Pure: the answer, the reason and the clock come in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from services.conversations.chat.domain import NUL, NUL_REPLACEMENT
from services.conversations.chat.wording import when
from services.conversations.domain.model import MAX_MESSAGE_LENGTH, Indicator, display_percent
from services.conversations.master.model import ModelAnswer

MASTER_AUTHOR = "master"
SYSTEM_AUTHOR = "system"
TRUNCATED_NOTE = "\n\n[The master agent's answer was longer than a message holds and was cut here.]"

# Failure kinds of a master-model task (the ChatTask's failure_kind; the scheduler's words where
# they fit: model_error, no_reply, interrupted).
MODEL_ERROR = "model_error"
NO_REPLY = "no_reply"
INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class MasterOutcome:
    """How a master-model task ends: the message to store (author master or system), the task's
    final status (completed | failed), its failure kind ("" when completed) and detail in words."""

    author_kind: str
    text: str
    status: str
    failure_kind: str = ""
    status_detail: str = ""


def storable(text: str) -> str:
    """A model's text as a message can hold it: NUL -> U+FFFD, cut at MAX_MESSAGE_LENGTH characters
    with a note saying so."""
    clean = text.replace(NUL, NUL_REPLACEMENT)
    if len(clean) <= MAX_MESSAGE_LENGTH:
        return clean
    return clean[: MAX_MESSAGE_LENGTH - len(TRUNCATED_NOTE)] + TRUNCATED_NOTE


def outcome_of_answer(answer: ModelAnswer) -> MasterOutcome:
    """The reply (author master, task completed) of an answer with text; an answer that is empty
    or whitespace only ends the task failed (no_reply) with a system message."""
    if not answer.text.strip():
        model = answer.model or "the model"
        return MasterOutcome(
            SYSTEM_AUTHOR,
            f"The master agent's model ({model}) answered with no text. Your message is kept; you can "
            "retry it.",
            "failed",
            NO_REPLY,
            "the model answered with no text",
        )
    return MasterOutcome(MASTER_AUTHOR, storable(answer.text.strip()), "completed")


def outcome_of_failure(reason: str) -> MasterOutcome:
    """A model that could not answer (`reason`: MasterModelUnavailable's sentence): failed
    (model_error) with a system message naming the reason."""
    reason = reason.strip().rstrip(".") or "the model did not answer"
    return MasterOutcome(
        SYSTEM_AUTHOR,
        f"The master agent could not answer: {reason}. Your message is kept; retry it when the model "
        "answers again.",
        "failed",
        MODEL_ERROR,
        reason,
    )


def outcome_of_loss(started_at: datetime, now: datetime) -> MasterOutcome:
    """A call lost with its process (conversations restarted or stopped while the model answered):
    failed (interrupted) with a system message."""
    return MasterOutcome(
        SYSTEM_AUTHOR,
        "The master agent's answer was lost: the conversations service stopped while the model was "
        f"answering (it had started at {when(started_at, now)}). Your message is kept; you can retry it.",
        "failed",
        INTERRUPTED,
        "the conversations service stopped while the model was answering",
    )


def outcome_of_cancel() -> MasterOutcome:
    """A queued message its owner cancelled before the model was asked."""
    return MasterOutcome(
        SYSTEM_AUTHOR,
        "This message was cancelled before the master agent answered it; the model was not asked. You "
        "can retry it.",
        "cancelled",
        "",
        "cancelled by its owner before the model was asked",
    )


def outcome_of_error() -> MasterOutcome:
    """An unexpected error of Boss's own while running the call (logged with its traceback)."""
    return MasterOutcome(
        SYSTEM_AUTHOR,
        "The master agent could not answer because of an internal error in Boss (it is logged). Your "
        "message is kept; you can retry it.",
        "failed",
        "other",
        "internal error while asking the model",
    )


def level_of(remaining_pct: float) -> str:
    """The level of a percent left with the default thresholds (SPEC CB-7): safe >= 60, watch
    40-59, urgent 25-39, critical < 25."""
    if remaining_pct >= 60:
        return "safe"
    if remaining_pct >= 40:
        return "watch"
    if remaining_pct >= 25:
        return "urgent"
    return "critical"


def conversation_ring(total_tokens: int, context_window_tokens: int | None, at: datetime) -> Indicator | None:
    """The master conversation's ring under openai_api: the share of the model's context window
    that the last answer left unused, `100 * max(0, window - total_tokens) / window` (total_tokens:
    the endpoint's reported prompt + completion tokens of that answer, which carries the state and
    the history), with its CB-7 level. None (no ring, or the ring as it was) when the window is
    not known or the endpoint reported no usage."""
    if not context_window_tokens or total_tokens <= 0:
        return None
    remaining_pct = 100.0 * max(0, context_window_tokens - total_tokens) / context_window_tokens
    return Indicator(
        visible=True,
        percent=display_percent(remaining_pct),
        level=level_of(remaining_pct),
        thread_id="",
        source_node_id="",
        updated_at=at,
    )


def ring_follows_main_thread(backend: str) -> bool:
    """Whether the master conversation's ring shows its main Codex thread's budget (CB-16 §7.3):
    yes with master_codex_node (the master runs in that thread) and with no backend (the thread
    registered as the master's is all there is); no with openai_api (the conversation's own
    context use, `conversation_ring`)."""
    return backend != "openai_api"
