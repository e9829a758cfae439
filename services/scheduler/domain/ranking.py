"""Ranking threads for the master agent (CB-4, CB-17) and choosing a thread for new work.

Ranking order (most urgent first), each step a tie-break of the one before:

1. context_budget_level: critical, urgent, watch, safe, then threads with no known level;
2. must_finish_before_compaction set (CB-8);
3. unsolidified patch, then unsolidified test results, then a hardware test in progress (CB-17's
   tie-break among critical threads, applied at every level for one consistent order);
4. compaction_expected_at, soonest first (unknown last);
5. task importance, highest first;
6. context_budget_remaining_pct, lowest first;
7. thread_id (a stable, deterministic order).

New work (CB-17 "new subtasks go to threads with healthier budgets, new threads, or idle threads"):
only safe or watch threads that are not must_finish, not frozen and not wrapping up (a report of
their current epoch was at risk, e.g. a safe thread whose compaction is near was asked to hand off);
safe before watch, idle before busy, then the most budget left. None fit: a new thread is needed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

from services.scheduler.domain.model import Level, PackageStatus, ThreadState
from services.shared.time import isoformat_utc


@dataclass(frozen=True)
class RankedThread:
    """A thread's position (1-based `rank`) and the reasons for it, most important first (worded on
    first use, so ranking many threads does not pay for text nobody reads)."""

    rank: int
    state: ThreadState

    @cached_property
    def reasons(self) -> tuple[str, ...]:
        """See `reasons_for`."""
        return reasons_for(self.state)


@dataclass(frozen=True)
class WorkChoice:
    """The thread chosen for new work, or `new_thread_needed` with the reason."""

    thread_id: str
    new_thread_needed: bool
    reason: str


def ranking_key(state: ThreadState) -> tuple[int, int, int, int, int, float, int, float, str]:
    """The sort key of one thread (ascending = most urgent first); see the module docstring.

    Inlines ThreadState's must-finish and unsolidified rules (same results as its methods) because
    it runs once per thread per ranking (10,000 threads in <= 50 ms, bench/scheduler_bench.py)."""
    level = state.level
    severity = _SEVERITY[level] if level is not None else 0
    expected = state.compaction_expected_at
    reported = state.reported_must_finish
    reason = state.reported_must_finish_reason.lower() if reported else ""
    return (
        -severity,
        -(reported or state.master_must_finish),
        -(state.unsolidified_patch or "uncommitted" in reason or "patch" in reason or "diff" in reason),
        -(state.unsolidified_test_results or "test" in reason),
        -(state.hardware_test_in_progress or "hardware" in reason),
        expected.timestamp() if expected is not None else math.inf,
        -state.task_importance,
        state.remaining_pct,
        state.thread_id,
    )


_SEVERITY = {level: level.severity for level in Level}


def reasons_for(state: ThreadState) -> tuple[str, ...]:
    """Why a thread ranks where it does, in ranking-key order."""
    level = state.level.value if state.level is not None else "unknown"
    reasons = [f"level {level} ({state.remaining_pct:.1f} % left)"]
    if state.level is Level.CRITICAL:
        reasons.append("wrap-up and handoff first")
    if state.must_finish:
        reasons.append(f"must finish before compaction: {state.must_finish_reason or 'set'}")
    if state.has_unsolidified_patch():
        reasons.append("unsolidified patch")
    if state.has_unsolidified_test_results():
        reasons.append("unsolidified test results")
    if state.has_hardware_test_in_progress():
        reasons.append("hardware test in progress")
    if state.compaction_expected_at is not None:
        reasons.append(f"compaction expected at {isoformat_utc(state.compaction_expected_at)}")
    if state.task_importance:
        reasons.append(f"task importance {state.task_importance}")
    return tuple(reasons)


def rank_threads(states: Sequence[ThreadState], limit: int = 0) -> list[RankedThread]:
    """Threads in ranking order with reasons; at most `limit` when > 0. O(n log n)."""
    ordered = sorted(states, key=ranking_key)
    if limit > 0:
        ordered = ordered[:limit]
    return [RankedThread(rank, state) for rank, state in enumerate(ordered, start=1)]


def strategy_summary(ranked: Sequence[RankedThread], choice: WorkChoice | None = None) -> str:
    """The ranking in words for `master_context_strategy_summary` (CB-13): counts per level, what
    comes first and why, and where new work goes. Empty input gives "No threads report a context
    budget yet."."""
    if not ranked:
        return "No threads report a context budget yet."
    counts = Counter(item.state.level.value if item.state.level else "unknown" for item in ranked)
    order = ("critical", "urgent", "watch", "safe", "unknown")
    parts = [f"{counts[name]} {name}" for name in order if counts[name]]
    sentences = [f"{len(ranked)} thread{'s' if len(ranked) != 1 else ''}: {', '.join(parts)}."]
    first = ranked[0].state
    if first.level is Level.CRITICAL:
        why = "; ".join(ranked[0].reasons[1:]) or "critical"
        sentences.append(f"Wrap up and hand off {first.thread_id} first ({why}).")
    elif first.level is Level.URGENT:
        sentences.append(f"{first.thread_id} finishes its current subtask; relay thread pre-created.")
    elif first.level is Level.WATCH:
        handoff = (
            "its handoff package is ready"
            if first.current_package_status is PackageStatus.READY
            else "its handoff is being prepared"
        )
        sentences.append(f"Send {first.thread_id} less long context; {handoff}.")
    else:
        wrapping = [item.state.thread_id for item in ranked if item.state.wrapping_up]
        sentences.append(
            f"Compaction is near for {', '.join(wrapping)}: wrap up and hand off before it; "
            "keep stage summaries fresh."
            if wrapping
            else "Every thread has room; keep stage summaries fresh."
        )
    if choice is not None:
        sentences.append(
            "New work needs a new thread."
            if choice.new_thread_needed
            else f"New work goes to {choice.thread_id}."
        )
    return " ".join(sentences)


def choose_thread_for_work(
    states: Sequence[ThreadState],
    now: datetime,
    idle_after: timedelta,
    exclude: frozenset[str] = frozenset(),
) -> WorkChoice:
    """The best thread for new work among `states` (one project's threads); see the module docstring.

    Args:
        states: the project's threads.
        now: the current time (UTC), for idle-vs-busy.
        idle_after: a thread whose context has not grown for this long is idle.
        exclude: thread ids never to choose.
    """
    candidates = [
        state
        for state in states
        if state.thread_id not in exclude
        and state.level in (Level.SAFE, Level.WATCH)
        and not state.must_finish
        and not state.context_growth_frozen
        and not state.wrapping_up
    ]
    if not candidates:
        unfit = len([s for s in states if s.thread_id not in exclude])
        reason = (
            "the project has no thread yet"
            if unfit == 0
            else f"none of {unfit} thread(s) is safe or watch without must-finish work or a handoff under way"
        )
        return WorkChoice("", True, f"new thread needed: {reason}")

    def key(state: ThreadState) -> tuple[int, int, float, str]:
        severity = state.level.severity if state.level is not None else 0
        return (severity, int(state.is_busy(now, idle_after)), -state.remaining_pct, state.thread_id)

    best = min(candidates, key=key)
    level = best.level.value if best.level is not None else "unknown"
    activity = "busy" if best.is_busy(now, idle_after) else "idle"
    return WorkChoice(best.thread_id, False, f"{level}, {activity}, {best.remaining_pct:.1f} % left")
