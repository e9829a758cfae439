"""What one Codex turn ended with, and how that becomes the scheduler's FinishTask request.

The local agent runs a task's turn through a :data:`RunTurn` callable (the Codex runner in
production, a stub in tests) and maps the :class:`TurnOutcome` it returns onto
`boss.scheduler.v1.FinishTaskRequest` with :func:`finish_request`:

| outcome | FinishTask status | failure_kind |
|---|---|---|
| a non-blank reply, no failure | completed (reply_text) | unspecified |
| failure `stalled` or `timed_out` | timed_out | stalled / timed_out |
| any other failure | failed | that kind (unknown names: other) |
| no failure and no reply | failed | no_reply |

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from boss.scheduler.v1 import scheduler_pb2

MAX_REPLY_CHARS = 100_000
"""FinishTask's limit on reply_text (characters)."""

MAX_DETAIL_CHARS = 2_000
"""FinishTask's limit on status_detail (characters)."""

TIMED_OUT_KINDS = frozenset({"stalled", "timed_out"})
"""Failure kinds that end a task as timed_out (the agent's stall timeout or turn cap stopped the run)."""

NO_REPLY_DETAIL = "Codex finished without a reply"


@dataclass(frozen=True)
class TurnOutcome:
    """How one turn ended.

    Attributes:
        reply_text: the thread's reply (the final agent message), "" when there is none.
        failure_kind: "" when the turn replied, else a FailureKind name in lower case without its
            prefix ("model_error", "stalled", "interrupted", ...).
        detail: the failure in plain words, for the system message the user sees ("" on success).
        codex_session_id: Codex's session id from the run's `thread.started` event, "" when unseen.
    """

    reply_text: str = ""
    failure_kind: str = ""
    detail: str = ""
    codex_session_id: str = ""

    @classmethod
    def replied(cls, reply_text: str, codex_session_id: str = "") -> TurnOutcome:
        """A turn that ended with the thread's reply."""
        return cls(reply_text=reply_text, codex_session_id=codex_session_id)

    @classmethod
    def failed(cls, failure_kind: str, detail: str, codex_session_id: str = "") -> TurnOutcome:
        """A turn that failed with `failure_kind` (lower-case FailureKind name) and `detail`."""
        return cls(failure_kind=failure_kind, detail=detail, codex_session_id=codex_session_id)

    @property
    def completed(self) -> bool:
        """True when the turn replied: no failure and a reply that is not blank."""
        return not self.failure_kind and bool(self.reply_text.strip())

    @property
    def outcome_name(self) -> str:
        """ "completed", or the failure kind ("no_reply" for a turn with neither), for logs."""
        if self.completed:
            return "completed"
        return self.failure_kind or "no_reply"


RunTurn = Callable[[scheduler_pb2.Task, asyncio.Event], Awaitable[TurnOutcome]]
"""Runs one task's turn: `await run_turn(task, cancel)`.

`task` is the scheduler's Task (status running; `instruction_text`, `codex_thread_ref`,
`codex_folder_ref` say what to run where). When `cancel` is set the callable must stop the run
promptly (the Codex runner kills Codex's process group) and return an outcome, typically
`failure_kind="interrupted"`. It should not raise; an exception is reported as failure `other`.
"""


def stopped_detail(node_id: str) -> str:
    """The system message's words for a run the worker's stop interrupted."""
    return f"the worker on {node_id} was stopped while running this message"


def outcome_after_stop(outcome: TurnOutcome, node_id: str) -> TurnOutcome:
    """The outcome to report for a turn the worker's stop cancelled: a turn that still managed to
    reply keeps its reply; anything else is failure `interrupted` saying the worker on `node_id`
    was stopped (the run's session id is kept)."""
    if outcome.completed:
        return outcome
    return TurnOutcome.failed("interrupted", stopped_detail(node_id), outcome.codex_session_id)


def failure_kind_value(name: str) -> scheduler_pb2.FailureKind:
    """The FailureKind enum value of a lower-case kind name ("model_error" -> MODEL_ERROR); an
    unknown or empty name (or "unspecified") is FAILURE_KIND_OTHER."""
    try:
        value = scheduler_pb2.FailureKind.Value("FAILURE_KIND_" + name.upper())
    except ValueError:
        return scheduler_pb2.FAILURE_KIND_OTHER
    return value if value != scheduler_pb2.FAILURE_KIND_UNSPECIFIED else scheduler_pb2.FAILURE_KIND_OTHER


def bounded(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters; a cut text ends with a note saying how long it was."""
    if len(text) <= limit:
        return text
    note = f"\n[cut: {len(text):,} characters in all]"
    return text[: limit - len(note)] + note


def without_nul(text: str) -> str:
    """`text` with every NUL replaced by U+FFFD (the replacement character)."""
    return text.replace("\x00", "\ufffd")


def finish_fields(outcome: TurnOutcome) -> TurnOutcome:
    """`outcome` normalised for FinishTask: a turn with neither reply nor failure becomes
    `no_reply`; NUL characters (which no stored text may hold) become U+FFFD, so a reply that
    contains one is kept rather than refused; reply and detail are cut to the RPC's limits
    (100,000 and 2,000 characters)."""
    if outcome.completed:
        return replace(outcome, reply_text=bounded(without_nul(outcome.reply_text), MAX_REPLY_CHARS))
    kind = outcome.failure_kind or "no_reply"
    detail = outcome.detail.strip() or (NO_REPLY_DETAIL if kind == "no_reply" else f"the run failed ({kind})")
    return TurnOutcome(
        failure_kind=kind,
        detail=bounded(without_nul(detail), MAX_DETAIL_CHARS),
        codex_session_id=outcome.codex_session_id,
    )


def finish_request(
    task: scheduler_pb2.Task, lease_id: str, outcome: TurnOutcome, *, worker_id: str, node_id: str
) -> scheduler_pb2.FinishTaskRequest:
    """The FinishTask request reporting `outcome` for `task` under `lease_id` (see the module table)."""
    fields = finish_fields(outcome)
    request = scheduler_pb2.FinishTaskRequest(
        worker_id=worker_id,
        node_id=node_id,
        task_id=task.task_id,
        lease_id=lease_id,
        codex_session_id=fields.codex_session_id,
    )
    if fields.completed:
        request.status = scheduler_pb2.TASK_STATUS_COMPLETED
        request.reply_text = fields.reply_text
        return request
    timed_out = fields.failure_kind in TIMED_OUT_KINDS
    request.status = scheduler_pb2.TASK_STATUS_TIMED_OUT if timed_out else scheduler_pb2.TASK_STATUS_FAILED
    request.failure_kind = failure_kind_value(fields.failure_kind)
    request.status_detail = fields.detail
    return request
