"""Task handlers: each one unit of work writing the task change and its `task.status_changed`
event in one transaction, then waking the claims it may concern after the commit. The local
agents' calls (claim, start, heartbeat, finish) are writes of `TaskWrites`, which commits those
that arrive together in one transaction (services/scheduler/tasks/writes.py).

Commands: ApplyTaskRequests (the batch handler of the consumer of conversations' stream),
ClaimTask (a long poll), StartTask, HeartbeatTask, FinishTask, and the sweep. Events published:
`task.status_changed` (services/scheduler/README.md has its payload), one per status change, and
one when a queued task's device is found offline or back (same status, new status_detail).
Heartbeats change no status and publish nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.tasks.model import Task, TaskSettings, TaskStatus
from services.scheduler.tasks.repository import SqlAlchemyTaskRepository
from services.scheduler.tasks.rules import (
    FinishOutcome,
    check_finish,
    check_lease_call,
    check_wait,
    is_same_outcome,
    new_task,
    parse_task_request,
    refusal,
)
from services.scheduler.tasks.sweep import decide
from services.scheduler.tasks.wakeups import TaskWakeups
from services.scheduler.tasks.writes import TaskWrites, Written, status_changed_event
from services.shared.db import Database
from services.shared.event_stream import Publication
from services.shared.outbox import EventLog, NewEvent, StoredEvent

log = logging.getLogger(__name__)

TASK_REQUESTED = "task.requested"
CLAIM_ATTEMPTS = 5
"""Claim attempts per wake when the thread's unique index refuses a claim (another took it)."""


class TaskHandlers:
    """The task handlers over the scheduler's database and outbox.

    Args:
        database: the scheduler's database.
        event_log: its outbox.
        settings: leases, presence window, queue expiry, sweep interval.
        wakeups: this process's claim wake-ups (shared with its LISTEN connection on PostgreSQL).
        channel: the LISTEN/NOTIFY channel the enqueue, finish and sweep transactions notify.
        new_lease_id: fresh fencing tokens (uuid4 hex by default).
        monotonic: seconds on a monotonic clock (long-poll deadlines, presence throttling).
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        settings: TaskSettings,
        wakeups: TaskWakeups,
        channel: str,
        new_lease_id: Callable[[], str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.settings = settings
        self.wakeups = wakeups
        self.channel = channel
        self.repository = SqlAlchemyTaskRepository(database.dialect)
        self._new_lease_id = new_lease_id or (lambda: uuid.uuid4().hex)
        self._monotonic = monotonic
        self._presence_written: dict[str, float] = {}
        self._nodes_to_wake: set[str] = set()
        self.writes = TaskWrites(database, event_log, self.repository, wakeups, channel)

    # ---- creation from conversations' stream ---------------------------------------------------

    async def apply_task_requests(
        self, connection: AsyncConnection, events: list[StoredEvent]
    ) -> list[NewEvent] | Publication:
        """EventConsumer batch handler: creates the task of every `task.requested` event (other
        types are skipped) that is not stored yet, queued (its status_detail saying so when its
        device is offline already), or failed when the request cannot run; returns their
        `task.status_changed` events. Notifies the queued tasks' nodes (PostgreSQL) in the
        transaction; `requests_committed` wakes this process's claims after the commit. Events
        without a usable task_id are logged and skipped.

        On PostgreSQL one read (database time, stored ids, presence) and the insert and the
        notification carried by the consumer's outbox append (`Publication`): an enqueue is
        BEGIN, read, append, COMMIT. A task id stored meanwhile by another scheduler process is
        left alone by the insert (ON CONFLICT DO NOTHING) and that process's cursor move makes
        this batch roll back and skip it (EventConsumer), so nothing is published twice."""
        self._nodes_to_wake = set()
        requests = {}
        for event in events:
            if event.type != TASK_REQUESTED:
                continue
            request = parse_task_request(event.payload)
            if request is None:
                log.warning("event %s: task.requested without a usable task_id; skipped", event.sequence)
            elif request.task_id not in requests:
                requests[request.task_id] = request
        if not requests:
            return []
        found = await self.repository.lookup(
            connection, list(requests), sorted({r.device_id for r in requests.values()})
        )
        window = self.settings.presence_window
        created = [
            new_task(request, found.now, found.last_seen.get(request.device_id), window)
            for task_id, request in requests.items()
            if task_id not in found.existing
        ]
        if not created:
            return []
        queued = sorted({task.device_id for task in created if task.status is TaskStatus.QUEUED})
        for task in created:
            log.info(
                "task %s %s for thread %s on %s",
                task.task_id,
                task.status,
                task.target_thread_id,
                task.device_id,
            )
        self._nodes_to_wake = set(queued)
        published = [status_changed_event(task) for task in created]
        if self.repository.postgres:
            return Publication(published, self.repository.insertion(created, self.channel, queued))
        await self.repository.insert(connection, created)
        return published

    def requests_committed(self) -> None:
        """After a batch of requests committed: wakes the claims waiting for its nodes."""
        nodes, self._nodes_to_wake = self._nodes_to_wake, set()
        self.wakeups.wake_nodes(nodes)

    # ---- the local agent's calls ----------------------------------------------------------------

    async def claim(self, worker_id: str, node_id: str, wait_seconds: float) -> Task | None:
        """Claims the oldest claimable task of `node_id` for `worker_id` (status claimed, a fresh
        `lease_id`, attempt + 1, lease running out the claim lease after database now), waiting up
        to `wait_seconds` (0-60) for one; None when none came. Each call records the node's
        presence (at most one write per node per presence_write_interval). Raises
        InvalidArgument for a bad wait."""
        deadline = self._monotonic() + check_wait(wait_seconds)
        while True:
            marker = self.wakeups.marker(node_id)
            task = await self._claim_once(worker_id, node_id)
            remaining = deadline - self._monotonic()
            if task is not None or remaining <= 0:
                return task
            await self.wakeups.wait(marker, remaining)

    async def _claim_once(self, worker_id: str, node_id: str) -> Task | None:
        """One claim attempt in the next write batch (tried again when the thread's unique index
        refused it: another process claimed the thread first)."""
        lease = self.settings.claim_lease

        async def write(connection: AsyncConnection) -> Written[Task | None]:
            if self._presence_due(node_id):
                await self.repository.record_presence(connection, node_id, worker_id)
                self._presence_written[node_id] = self._monotonic()
            task = await self.repository.claim(connection, node_id, worker_id, self._new_lease_id(), lease)
            return Written(task, [task] if task is not None else [])

        for _ in range(CLAIM_ATTEMPTS):
            try:
                task = await self.writes.run(write)
            except IntegrityError:
                log.info("claim on node %s lost its thread to another claim; trying again", node_id)
                continue
            if task is not None:
                log.debug(
                    "task %s claimed by %s on %s (attempt %d)", task.task_id, worker_id, node_id, task.attempt
                )
            return task
        return None

    async def start(self, worker_id: str, node_id: str, task_id: str, lease_id: str) -> Task:
        """claimed -> running under the presented lease (renewed to the run lease). A repeat of a
        start that succeeded answers the running task unchanged. Raises InvalidArgument (empty
        task_id / lease_id), NotFound (TASK_NOT_FOUND), PermissionDenied (another node's task),
        FailedPrecondition (LEASE_LOST: not the current lease, or no longer claimed)."""
        check_lease_call(task_id, lease_id)
        lease = self.settings.run_lease

        async def write(connection: AsyncConnection) -> Written[Task]:
            task = await self.repository.start(connection, task_id, node_id, worker_id, lease_id, lease)
            if task is not None:
                return Written(task, [task])
            current = await self.repository.task(connection, task_id)
            if (
                current is not None
                and current.status is TaskStatus.RUNNING
                and current.lease_id == lease_id
                and current.device_id == node_id
                and current.worker_id == worker_id
            ):
                return Written(current)
            raise refusal(current, task_id, node_id, worker_id, TaskStatus.CLAIMED)

        task = await self.writes.run(write)
        log.debug("task %s started by %s on %s", task_id, worker_id, node_id)
        return task

    async def heartbeat(self, worker_id: str, node_id: str, task_id: str, lease_id: str) -> Task:
        """Renews a running task's lease (the run lease from database now) and records the
        heartbeat and the node's presence; publishes nothing. Errors as `start` (the task must be
        running)."""
        check_lease_call(task_id, lease_id)
        lease = self.settings.run_lease

        async def write(connection: AsyncConnection) -> Written[Task]:
            task = await self.repository.heartbeat(connection, task_id, node_id, worker_id, lease_id, lease)
            if task is None:
                current = await self.repository.task(connection, task_id)
                raise refusal(current, task_id, node_id, worker_id, TaskStatus.RUNNING)
            if self._presence_due(node_id):
                await self.repository.record_presence(connection, node_id, worker_id)
                self._presence_written[node_id] = self._monotonic()
            return Written(task)

        return await self.writes.run(write)

    async def finish(
        self, worker_id: str, node_id: str, task_id: str, lease_id: str, outcome: FinishOutcome
    ) -> Task:
        """running -> completed | failed | timed_out under the presented lease. A repeat with the
        same lease and outcome answers the stored task. Raises InvalidArgument (`check_finish`,
        empty ids), NotFound, PermissionDenied or FailedPrecondition (LEASE_LOST) as `start`."""
        check_lease_call(task_id, lease_id)
        check_finish(outcome)

        async def write(connection: AsyncConnection) -> Written[Task]:
            task = await self.repository.finish(connection, task_id, node_id, worker_id, lease_id, outcome)
            if task is not None:
                return Written(task, [task], [task.device_id])
            current = await self.repository.task(connection, task_id)
            if (
                current is not None
                and current.terminal
                and current.lease_id == lease_id
                and current.device_id == node_id
                and current.worker_id == worker_id
                and is_same_outcome(current, outcome)
            ):
                return Written(current)
            raise refusal(current, task_id, node_id, worker_id, TaskStatus.RUNNING)

        task = await self.writes.run(write)
        log.info(
            "task %s %s (%s) by %s on %s", task_id, task.status, task.failure_kind or "-", worker_id, node_id
        )
        return task

    async def get(self, task_id: str) -> Task | None:
        """One task with its device's last seen instant, or None."""
        async with self.database.read() as connection:
            return await self.repository.task(connection, task_id)

    # ---- the sweeper ------------------------------------------------------------------------------

    async def sweep(self) -> list[Task]:
        """One sweep (`sweep.decide` for every candidate): claims whose lease ran out go back to
        queued, runs whose lease ran out fail `device_lost`, queued tasks of offline devices say so
        once, then expire. Returns the tasks written. The candidates' read is one indexed query on
        the reader; a write transaction opens only when something is due, and each write holds
        only if the task is still as the read saw it. After the commit it wakes the claims of
        every node it touched: a task sent back to the queue or a thread freed is claimable now,
        and a claim that ran while this transaction held a queued task's row lock skipped it."""
        async with self.database.read() as connection:
            candidates, now = await self.repository.sweep_candidates(connection, self.settings)
        if now is None:
            return []
        due = [
            (task, action) for task in candidates if (action := decide(task, now, self.settings)) is not None
        ]
        if not due:
            return []
        written: list[Task] = []
        async with self.database.transaction() as connection:
            for task, action in due:
                updated = await self.repository.apply_sweep(connection, action, task, self.settings)
                if updated is None:
                    continue
                written.append(updated)
                log.info("task %s swept (%s): %s", updated.task_id, action.kind, updated.status_detail)
            touched = sorted({task.device_id for task in written})
            await self.repository.notify(connection, self.channel, touched)
            stored = await self._publish(connection, written)
        if stored:
            self.event_log.kick(stored)
        self.wakeups.wake_nodes(touched)
        return written

    async def run_sweeper(self) -> None:
        """Background loop: a sweep every `sweep_interval` until cancelled (a failed sweep is
        logged and the loop goes on)."""
        interval = self.settings.sweep_interval.total_seconds()
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("task sweep failed; trying again in %.1f s", interval)
            await asyncio.sleep(interval)

    # ---- helpers ----------------------------------------------------------------------------------

    def _presence_due(self, node_id: str) -> bool:
        """Whether this process should write the node's presence now (throttled per node)."""
        written = self._presence_written.get(node_id)
        interval = self.settings.presence_write_interval.total_seconds()
        return written is None or self._monotonic() - written >= interval

    async def _publish(self, connection: AsyncConnection, changed: Iterable[Task]) -> list[StoredEvent]:
        """Appends the `task.status_changed` events of `changed` in the caller's transaction."""
        events = [status_changed_event(task) for task in changed]
        return await self.event_log.append(connection, events) if events else []
