"""StrategyPublisher: publishes `project.context_strategy.updated` for projects whose threads changed,
off the budget consumer's path.

The strategy summary (`master_context_strategy_summary`, CB-13) is a per-project text for the master
agent and the console. Recomputing it needs every thread of the project, which costs far more than
applying the report that changed one of them, so handlers do not recompute it in their transaction:
after their transaction commits they *mark* the changed projects dirty, and this publisher's
background task recomputes the dirty projects in its own transaction (outbox in that transaction),
publishing an event only for a project whose summary text differs from the last one published
(`project_strategies`), exactly as before. A summary is of one owner's threads of a project
(`owners_of_projects`): the project id is the one the reporting worker names, which nothing checks,
so no summary mixes two owners' threads; each event names its owner.

Timing: a mark is published
- at once (when the previous publication ended at least `SchedulerSettings.strategy_urgent_interval`,
  default 0.1 s, ago) when it is *urgent*: a level changed, a thread appeared or moved project, or a
  thread's must-finish flag or work facts changed: what the console shows first;
- otherwise within `SchedulerSettings.strategy_interval` (default 1 s) of the previous publication.
Under load many batches therefore share one recomputation per project. The set of dirty projects is
in memory: at start every project is dirty, so a restart never leaves a summary stale. One
publication runs at a time (an asyncio lock), so summaries are compared and recorded in order.

Thread states: the publisher keeps the states of the projects it loaded (`threads_of_projects`, or
every thread at start) and does not reload them on every recomputation. The budget consumer hands
it each committed batch's final states with its marks (`mark(..., states=...)`), which replace the
kept ones; a mark without states (a handler that changed threads some other way) drops the project's
kept states, so it is reloaded from the database before its next recomputation, and so is any project
whose states were loaded more than `RELOAD_SECONDS` ago (changes committed by another process of the
scheduler, which never reach this one's marks, are seen within that time). A recomputation therefore
sees the same committed states a reload would: its summaries and events are those of a reload.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.waiting import wait_until_set
from services.scheduler.adapters.repository import SqlAlchemySchedulerRepository, utc_state
from services.scheduler.domain.model import SchedulerSettings, ThreadState
from services.scheduler.domain.ranking import choose_thread_for_work, rank_threads, strategy_summary
from services.shared.db import Database
from services.shared.outbox import EventLog, NewEvent

log = logging.getLogger(__name__)

STRATEGY_EVENT = "project.context_strategy.updated"

# Seconds to wait before retrying after a failed publication (database unavailable).
RETRY_SECONDS = 1.0

# Kept thread states of a project older than this (seconds) are reloaded before its recomputation.
RELOAD_SECONDS = 30.0


class StrategyPublisher:
    """Recomputes and publishes the strategy summaries of dirty projects.

    Args:
        database: the scheduler's database.
        event_log: its outbox.
        repository: the scheduler's repository.
        settings: `idle_after` (new-work choice), `strategy_interval`, `strategy_urgent_interval`.
        clock: the current time (UTC), for the new-work choice's idle-vs-busy rule.
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        repository: SqlAlchemySchedulerRepository,
        settings: SchedulerSettings,
        clock: Callable[[], datetime],
    ) -> None:
        self._database = database
        self._event_log = event_log
        self._repository = repository
        self._settings = settings
        self._clock = clock
        self._dirty: set[str] = set()
        self._everything = True
        self._urgent = True
        self._wake = asyncio.Event()
        self._wake.set()
        self._lock = asyncio.Lock()
        self._last_finished = -math.inf
        self.publications = 0
        # Kept committed states of fully loaded projects: project_id -> thread_id -> state, when
        # each project was loaded (loop time), and the project of every kept thread.
        self._kept: dict[str, dict[str, ThreadState]] = {}
        self._loaded_at: dict[str, float] = {}
        self._project_of: dict[str, str] = {}
        # While a load runs: the states handed in meanwhile (replayed over the loaded rows) and the
        # projects dropped meanwhile (their loaded rows may predate the change: not kept).
        self._loading = False
        self._handed_while_loading: list[ThreadState] = []
        self._dropped_while_loading: set[str] = set()

    @property
    def pending(self) -> bool:
        """True while some project is marked and not yet recomputed."""
        return self._everything or bool(self._dirty)

    @property
    def idle(self) -> bool:
        """True when nothing is marked and no recomputation is running."""
        return not self.pending and not self._lock.locked()

    def mark(
        self,
        project_ids: Iterable[str],
        urgent: bool = False,
        states: Iterable[ThreadState] | None = None,
    ) -> None:
        """Marks projects dirty (call only after the transaction that changed them committed).
        Threads with no project ("") have no strategy and are ignored.

        Args:
            project_ids: the projects the transaction changed (for a thread that moved, both).
            urgent: recompute at the urgent interval (module docstring).
            states: the final committed state of *every* thread the transaction changed, in
                commit order: they replace the kept ones. None: the projects' kept states are
                dropped and reloaded from the database before their next recomputation.
        """
        ids = {project_id for project_id in project_ids if project_id}
        if states is None:
            self._drop(ids)
        else:
            self.update_states(states)
        if not ids:
            return
        self._dirty |= ids
        self._urgent = self._urgent or urgent
        self._wake.set()

    def update_states(self, states: Iterable[ThreadState]) -> None:
        """Replaces kept thread states with committed ones without marking anything (call only after
        their transaction committed), for changes that no strategy depends on; see `mark`."""
        states = [utc_state(state) for state in states]
        if self._loading:
            self._handed_while_loading.extend(states)
        for state in states:
            self._keep(state)

    def _keep(self, state: ThreadState) -> None:
        """Puts one committed state among the kept ones (moving it out of its previous project's);
        a thread of a project that is not kept is not kept either (its project would be partial)."""
        thread_id, project_id = state.thread_id, state.project_id
        before = self._project_of.get(thread_id)
        if before is not None and before != project_id:
            kept_before = self._kept.get(before)
            if kept_before is not None:
                kept_before.pop(thread_id, None)
            del self._project_of[thread_id]
        kept = self._kept.get(project_id)
        if kept is not None:
            kept[thread_id] = state
            self._project_of[thread_id] = project_id

    def _drop(self, project_ids: Iterable[str]) -> None:
        """Forgets the kept states of projects (reloaded before their next recomputation)."""
        for project_id in project_ids:
            if self._loading:
                self._dropped_while_loading.add(project_id)
            self._loaded_at.pop(project_id, None)
            kept = self._kept.pop(project_id, None)
            for thread_id in kept or ():
                if self._project_of.get(thread_id) == project_id:
                    del self._project_of[thread_id]

    async def flush(self) -> int:
        """Recomputes every dirty project now (whatever the intervals); returns how many
        `project.context_strategy.updated` events were published. Database errors propagate and
        leave the projects dirty."""
        async with self._lock:
            everything, dirty = self._everything, self._dirty
            self._everything, self._dirty, self._urgent = False, set(), False
            try:
                published = await self._publish(dirty, everything)
            except BaseException:
                self._everything = self._everything or everything
                self._dirty |= dirty
                raise
            finally:
                self._last_finished = asyncio.get_running_loop().time()
            self.publications += 1
            return published

    async def run(self) -> None:
        """The background task: waits for marks, spaces publications by the intervals (module
        docstring), publishes. Cancel it to stop."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            while True:
                spacing = (
                    self._settings.strategy_urgent_interval
                    if self._urgent
                    else self._settings.strategy_interval
                ).total_seconds()
                delay = self._last_finished + spacing - loop.time()
                if delay <= 0:
                    break
                self._wake.clear()
                await wait_until_set(self._wake, delay)
            self._wake.clear()
            if not self.pending:
                continue
            try:
                await self.flush()
            except Exception:
                log.exception("strategy publication failed; retrying in %.1f s", RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
                self._wake.set()

    async def _publish(self, dirty: set[str], everything: bool) -> int:
        """One transaction: the projects' threads (kept ones, else loaded), a summary per owner of
        each project, the changed ones recorded and published."""
        now = self._clock()
        async with self._database.transaction() as connection:
            by_project = await self._states_of(connection, dirty, everything)
            by_project.pop("", None)
            if not by_project:
                return 0
            previous = await self._repository.strategies(connection, by_project)
            by_owner = owners_of_projects(by_project, previous)
            events = []
            summaries: dict[tuple[str, str], str] = {}
            for key in sorted(by_owner):
                owner_id, project_id = key
                states = by_owner[key]
                ranked = rank_threads(states)
                choice = choose_thread_for_work(states, now, self._settings.idle_after)
                summary = strategy_summary(ranked, choice)
                if previous.get(key) == summary:
                    continue
                summaries[key] = summary
                events.append(
                    NewEvent(
                        STRATEGY_EVENT,
                        {
                            "owner_id": owner_id,
                            "project_id": project_id,
                            "master_context_strategy_summary": summary,
                            "ranked_thread_ids": [item.state.thread_id for item in ranked],
                            "next_compaction_risk_thread_id": ranked[0].state.thread_id
                            if ranked and ranked[0].state.level and ranked[0].state.level.severity >= 2
                            else None,
                            "threads_requiring_handoff": [
                                s.thread_id for s in states if s.prepare_issued_at is not None
                            ],
                            "new_work_thread_id": choice.thread_id or None,
                        },
                        project_id=project_id,
                    )
                )
            await self._repository.save_strategies(connection, summaries, now)
            appended = await self._event_log.append(connection, events)
        if appended:
            self._event_log.kick(appended)
        return len(events)

    async def _states_of(
        self, connection: AsyncConnection, dirty: set[str], everything: bool
    ) -> dict[str, list[ThreadState]]:
        """The committed thread states of the dirty projects (of every project when `everything`),
        by project: the kept ones, after loading the projects not kept or kept too long."""
        started = asyncio.get_running_loop().time()
        oldest = started - RELOAD_SECONDS
        by_project: dict[str, list[ThreadState]] = {}
        missing: set[str] = set()
        for project_id in dirty:
            kept = self._kept.get(project_id)
            if everything or kept is None or self._loaded_at[project_id] < oldest:
                missing.add(project_id)
            else:
                by_project[project_id] = list(kept.values())
        if not everything and not missing:
            return by_project
        self._loading, self._handed_while_loading, self._dropped_while_loading = True, [], set()
        try:
            if everything:
                loaded: dict[str, list[ThreadState]] = {project_id: [] for project_id in missing}
                for state in await self._repository.threads(connection):
                    loaded.setdefault(state.project_id, []).append(state)
            else:
                loaded = await self._repository.threads_of_projects(connection, missing)
        finally:
            self._loading = False
        handed, dropped = self._handed_while_loading, self._dropped_while_loading
        self._handed_while_loading, self._dropped_while_loading = [], set()
        for project_id, states in loaded.items():
            by_project[project_id] = states
            if project_id and project_id not in dropped:
                self._drop([project_id])
                self._kept[project_id] = {}
                self._loaded_at[project_id] = started
                for state in states:
                    self._keep(state)
        for state in handed:
            self._keep(state)
        return by_project


def owners_of_projects(
    by_project: dict[str, list[ThreadState]], published: Iterable[tuple[str, str]] = ()
) -> dict[tuple[str, str], list[ThreadState]]:
    """The threads of each project split by their owner, keyed (owner_id, project_id); an owner with
    a `published` summary of one of these projects and no thread in it any more gets an empty list
    (its summary says so). A project id is what a worker reports, so two owners' devices may name the
    same one: each owner's threads get a summary of their own, and no summary ever mixes owners."""
    by_owner: dict[tuple[str, str], list[ThreadState]] = {
        (owner_id, project_id): [] for owner_id, project_id in published if project_id in by_project
    }
    for project_id, states in by_project.items():
        for state in states:
            by_owner.setdefault((state.owner_id, project_id), []).append(state)
    return by_owner
