"""A group's relay thread taken in as a real thread (CHAT-4): once the dispatch task of a relay
target ends and reports the Codex session it started, that session becomes a thread of the system.

The relay target was proposed without a thread (thread id "relay-...", no Codex reference). Its
task runs `codex exec` for a new Codex session in the host member's folder, and its final report
carries the session id (`StatusReport.codex_session_id`). That id is the thread's id, as the
device's worker registers every Codex session it follows (worker/agent.py: thread id = Codex
session id = `codex exec resume` reference). Taking it in (`RelayIntake`, the conversations
handlers' `take_in_relay_thread`) registers the thread for the group's owner on the target's
device, with its own single-device conversation (so it is in the home list) and as a member of
the group; its own conversation then shows the instruction it was given and its answer.

The worker's registration of the same session can come first or second, or commit while the
intake runs: both write the thread row with one unique key, so whichever commits second finds the
row and keeps it (the intake inserts in a savepoint and reads the row on a conflict; RegisterThread
registers again on its conflict, and a thread the intake wrote knows the worker that ran the task,
or no worker: its node's worker is its device).

Pure: the values and messages; the intake itself is I/O (a callable the composition root gives).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from services.conversations.chat.domain import StatusReport
from services.conversations.domain.validation import check_thread_id
from services.conversations.groups.choice import RELAY
from services.conversations.groups.plans import DispatchPlan, DispatchTarget
from services.shared.errors import FieldViolation
from services.shared.outbox import NewEvent


@dataclass(frozen=True)
class RelayThread:
    """A relay thread to take in.

    Attributes:
        thread_id: the Codex session id its task reported (also its Codex thread reference).
        owner_id: the group's owner.
        node_id / worker_id: the device that ran it (worker_id "" when the report named none).
        codex_folder: the folder it was started in (the host member's).
        title: "<host title> (relay)" (`choice.relay_title`).
        group_project_id: the group it joins.
    """

    thread_id: str
    owner_id: str
    node_id: str
    worker_id: str
    codex_folder: str
    title: str
    group_project_id: str


@dataclass(frozen=True)
class TakenIn:
    """A relay thread as the intake left it: its thread id, its own conversation's project id, and
    the events the intake's writes publish (for the caller to append in its transaction)."""

    thread_id: str
    project_id: str
    events: list[NewEvent]


RelayIntake = Callable[[AsyncConnection, RelayThread, datetime], Awaitable[TakenIn | None]]
"""`(connection, relay, now) -> TakenIn`, in the caller's transaction; None when the session is
a thread of another owner or device (nothing is changed then)."""


def relay_thread_of(plan: DispatchPlan, target: DispatchTarget, report: StatusReport) -> RelayThread | None:
    """The relay thread `report` makes of `target`: None unless the target is a relay not taken
    in yet (no Codex reference) and the report names a Codex session id that is a valid thread id."""
    if target.kind != RELAY or target.codex_thread_ref or not report.codex_session_id:
        return None
    violations: list[FieldViolation] = []
    check_thread_id("codex_session_id", report.codex_session_id, violations)
    if violations:
        return None
    return RelayThread(
        thread_id=report.codex_session_id,
        owner_id=plan.owner_id,
        node_id=target.device_id,
        worker_id=report.worker_id,
        codex_folder=target.codex_folder_ref,
        title=target.thread_title,
        group_project_id=plan.project_id,
    )


def with_relay_taken_in(plan: DispatchPlan, target_id: str, thread_id: str) -> DispatchPlan:
    """The plan whose relay target `target_id` is now the thread `thread_id` (its id and Codex
    reference)."""
    return replace(
        plan,
        targets=tuple(
            replace(target, thread_id=thread_id, codex_thread_ref=thread_id)
            if target.target_id == target_id
            else target
            for target in plan.targets
        ),
    )
