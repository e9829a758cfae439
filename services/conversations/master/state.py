"""The system's state as the master agent is told it: every live project and thread of one owner with
its context budget, level, handoff status, compactions and open tasks, as conversations projects them.

Pure values and their JSON form (`state_payload`, schema "boss.master_state.v1"); the repository
reads them (services/conversations/master/repository.py), the prompt builder puts them into words and
into a machine-readable block (services/conversations/master/prompt.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from services.conversations.domain.model import (
    ThreadView,
    at_risk,
    next_compaction_risk_thread,
    risk_order,
    threads_requiring_handoff,
)
from services.shared.time import isoformat_utc

STATE_SCHEMA = "boss.master_state.v1"
PREVIEW_CHARS = 200
"""Texts quoted in the state (a task's request, a thread's last message) are cut at this many
characters, with "…"."""
MAX_THREADS = 200
"""At most this many threads are described, most at risk first (the rest are counted)."""
LEVEL_THRESHOLDS = {"safe": ">= 60", "watch": "40-59", "urgent": "25-39", "critical": "< 25"}
"""The default thresholds of the levels, percent of the budget left (SPEC CB-7)."""


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """`text` on one line, cut at `limit` characters with "…"."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit].rstrip() + "…"


@dataclass(frozen=True)
class OpenTask:
    """A chat task of a thread that has not ended.

    Attributes:
        status: queued | claimed | running.
        request_text: the user message it answers (or the instruction it carries), cut for the prompt.
    """

    task_id: str
    task_type: str
    status: str
    request_text: str
    created_at: datetime


@dataclass(frozen=True)
class LastMessage:
    """The latest message of a thread's own conversation (what it last said or was asked)."""

    author_kind: str
    text: str
    created_at: datetime


@dataclass(frozen=True)
class ThreadState:
    """One live thread: its budget view (ThreadView: percent, level, must-finish, compactions,
    handoff status), where it runs and what it is doing."""

    view: ThreadView
    codex_folder: str = ""
    handoff_reason: str = ""
    is_master_main_thread: bool = False
    project_titles: tuple[str, ...] = ()
    open_tasks: tuple[OpenTask, ...] = ()
    last_message: LastMessage | None = None


@dataclass(frozen=True)
class ProjectState:
    """One live project (conversation) and its member threads' ids."""

    project_id: str
    title: str
    conversation_type: str
    thread_ids: tuple[str, ...] = ()
    strategy_summary: str = ""


@dataclass(frozen=True)
class SystemState:
    """Everything the master agent is told, captured at `captured_at` (UTC)."""

    captured_at: datetime
    threads: tuple[ThreadState, ...] = ()
    projects: tuple[ProjectState, ...] = ()

    def threads_in_risk_order(self) -> list[ThreadState]:
        """The threads most at risk first (domain.model.risk_order: level, must-finish, expected
        compaction, percent; never-reported last)."""
        by_id = {thread.view.thread_id: thread for thread in self.threads}
        return [by_id[view.thread_id] for view in risk_order(t.view for t in self.threads)]


def _budget_payload(thread: ThreadState) -> dict[str, Any]:
    budget = thread.view.budget
    if budget is None:
        return {"reported": False}
    return {
        "reported": True,
        "percent": budget.percent,
        "remaining_pct": round(budget.remaining_pct, 1),
        "level": budget.level,
        "must_finish_before_compaction": budget.must_finish_before_compaction,
        "must_finish_reason": budget.must_finish_reason,
        "compaction_expected_at": isoformat_utc(budget.compaction_expected_at),
        "estimated_remaining_turns": budget.estimated_remaining_turns,
        "compaction_count": budget.compaction_count,
        "last_compaction_at": isoformat_utc(budget.last_compaction_at),
        "updated_at": isoformat_utc(budget.updated_at),
    }


def thread_payload(thread: ThreadState) -> dict[str, Any]:
    """One thread of the state as JSON (see `state_payload`)."""
    view = thread.view
    last = thread.last_message
    return {
        "thread_id": view.thread_id,
        "title": view.title,
        "node_id": view.node_id,
        "codex_folder": thread.codex_folder,
        "is_master_main_thread": thread.is_master_main_thread,
        "projects": list(thread.project_titles),
        "budget": _budget_payload(thread),
        "handoff": {"status": view.handoff_status, "reason": thread.handoff_reason},
        "open_tasks": [
            {
                "task_id": task.task_id,
                "task_type": task.task_type,
                "status": task.status,
                "request": preview(task.request_text),
                "created_at": isoformat_utc(task.created_at),
            }
            for task in thread.open_tasks
        ],
        "last_message": (
            {
                "author_kind": last.author_kind,
                "text": preview(last.text),
                "at": isoformat_utc(last.created_at),
            }
            if last is not None
            else None
        ),
    }


def state_payload(state: SystemState) -> dict[str, Any]:
    """The state as JSON, schema "boss.master_state.v1":

    {schema, captured_at (RFC 3339 UTC), level_thresholds {level: percent range},
     threads_total, threads_described, closest_to_compaction [thread ids at risk, most at risk
     first], threads_requiring_handoff [ids], threads [thread, most at risk first: thread_id,
     title, node_id, codex_folder, is_master_main_thread, projects [titles], budget {reported,
     percent (0-100, rounded down), remaining_pct, level, must_finish_before_compaction,
     must_finish_reason, compaction_expected_at, estimated_remaining_turns, compaction_count,
     last_compaction_at, updated_at}, handoff {status none|required|ready, reason}, open_tasks
     [{task_id, task_type, status, request, created_at}], last_message {author_kind, text, at} |
     null], projects [{project_id, title, type, thread_ids}]}

    Percent is the budget left before Codex's auto-compaction (SPEC D-1). At most MAX_THREADS
    threads are described; `closest_to_compaction` holds the threads domain.model.at_risk names:
    at watch or worse, or expected to compact within COMPACTION_RISK_HORIZON (10 minutes).
    """
    ordered = state.threads_in_risk_order()
    described = ordered[:MAX_THREADS]
    views = [thread.view for thread in ordered]
    closest = [view.thread_id for view in risk_order(views) if at_risk(view, state.captured_at)]
    return {
        "schema": STATE_SCHEMA,
        "captured_at": isoformat_utc(state.captured_at),
        "level_thresholds": dict(LEVEL_THRESHOLDS),
        "threads_total": len(ordered),
        "threads_described": len(described),
        "next_compaction_risk_thread_id": next_compaction_risk_thread(views),
        "closest_to_compaction": closest,
        "threads_requiring_handoff": threads_requiring_handoff(views),
        "threads": [thread_payload(thread) for thread in described],
        "projects": [
            {
                "project_id": project.project_id,
                "title": project.title,
                "type": project.conversation_type,
                "thread_ids": list(project.thread_ids),
                "strategy_summary": project.strategy_summary,
            }
            for project in state.projects
        ],
    }
