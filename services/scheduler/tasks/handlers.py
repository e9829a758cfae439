"""Task handlers: each one unit of work writing the task change and its `task.status_changed`
event in one transaction, then waking the claims it may concern after the commit. The local
agents' calls (claim, start, heartbeat, finish) are grouped writes of `TaskWrites`, which commits
those that arrive together in one transaction, each kind applied by one statement on PostgreSQL
(services/scheduler/tasks/writes.py, agent_writes.py).

Commands: ApplyTaskRequests (the batch handler of the consumer of conversations' stream; it hands
a new task straight to a claim-and-start waiting on its node: services/scheduler/tasks/waiting_claims.py),
ClaimTask (a long poll), StartTask, HeartbeatTask, FinishTask, and the sweep. Events published:
`task.status_changed` (services/scheduler/README.md has its payload), one per status change, and
one when a queued task's device is found offline or back (same status, new status_detail).
Heartbeats change no status and publish nothing.

Logs: the routine path (a task queued for a device that is online, a task completed) at DEBUG,
one line each; what needs a look (a request stored failed, a device offline, a run that failed or
timed out, a sweep) at INFO. At hundreds of tasks a second the routine lines were a few percent of
the process's CPU, and the task's events and row keep the same record.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.waiting import wait_until_set
from services.scheduler.tasks.agent_writes import (
    ClaimRequest,
    Claims,
    Finishes,
    FinishRequest,
    HeartbeatRequest,
    Heartbeats,
    Starts,
)
from services.scheduler.tasks.model import Task, TaskRequest, TaskSettings, TaskStatus
from services.scheduler.tasks.repository import (
    ClaimCall,
    LeaseCall,
    RequestLookup,
    SqlAlchemyTaskRepository,
)
from services.scheduler.tasks.rules import (
    CANCEL_TOO_LATE_DETAIL,
    CANCELLED_DETAIL,
    FinishOutcome,
    RejectedRequest,
    cancelled_at_once,
    check_finish,
    check_lease_call,
    check_wait,
    claimed_by,
    handed_to_waiting_claims,
    new_task,
    parse_cancel_request,
    parse_task_request,
    released_detail,
    started,
)
from services.scheduler.tasks.sweep import decide
from services.scheduler.tasks.waiting_claims import WaitingClaim, WaitingClaims
from services.scheduler.tasks.wakeups import TaskWakeups
from services.scheduler.tasks.writes import Grouped, TaskWrites, Written, status_changed_event
from services.shared.auth import DEFAULT_OWNER_ID
from services.shared.db import Database
from services.shared.event_stream import Publication
from services.shared.outbox import EventLog, NewEvent, StoredEvent

log = logging.getLogger(__name__)

TASK_REQUESTED = "task.requested"
TASK_CANCEL_REQUESTED = "task.cancel_requested"
CONVERSATIONS_EVENT_TYPES = (TASK_REQUESTED, TASK_CANCEL_REQUESTED)
"""The conversations events the scheduler consumes: task requests and their owners' cancels."""
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
        self._presence_written: dict[tuple[str, str], float] = {}
        self._nodes_to_wake: set[str] = set()
        self._releases: set[asyncio.Future[None]] = set()
        self.waiting_claims = WaitingClaims()
        self._offers: list[tuple[WaitingClaim, Task]] = []
        self.writes = TaskWrites(database, event_log, self.repository, wakeups, channel)
        self._claims = Claims(self.repository, settings.claim_lease, settings.run_lease)
        self._starts = Starts(self.repository, settings.run_lease)
        self._heartbeats = Heartbeats(self.repository, settings.run_lease)
        self._finishes = Finishes(self.repository)

    # ---- creation from conversations' stream ---------------------------------------------------

    async def apply_task_requests(
        self, connection: AsyncConnection, events: list[StoredEvent]
    ) -> list[NewEvent] | Publication:
        """EventConsumer batch handler of conversations' `task.requested` and
        `task.cancel_requested` events (other types are skipped); returns the `task.status_changed`
        events of what it wrote. Notifies the nodes of queued or freed tasks (PostgreSQL) in the
        transaction; `requests_committed` wakes this process's claims after the commit. Events
        without a usable task_id (or, for a cancel, owner_id) are logged and skipped.

        A request creates its task if it is not stored yet: queued (its status_detail saying so
        when its device is offline already), or failed when the request cannot run. A cancel by the
        task's owner makes a queued or claimed task cancelled (one requested in the same batch is
        created cancelled); a running task keeps running, its status_detail saying the cancel came
        too late; anything else is left alone.

        On PostgreSQL one read (database time, stored ids, presence) and the insert and the
        notification carried by the consumer's outbox append (`Publication`): an enqueue is
        BEGIN, read, append, COMMIT. A task id stored meanwhile by another scheduler process is
        left alone by the insert (ON CONFLICT DO NOTHING) and that process's cursor move makes
        this batch roll back and skip it (EventConsumer), so nothing is published twice."""
        self._nodes_to_wake = set()
        self._decline_offers()
        requests: dict[str, TaskRequest | RejectedRequest] = {}
        cancels: dict[str, str] = {}
        for event in events:
            if event.type == TASK_CANCEL_REQUESTED:
                cancel = parse_cancel_request(event.payload)
                if cancel is None:
                    log.warning(
                        "event %s: task.cancel_requested without a usable task_id; skipped", event.sequence
                    )
                else:
                    cancels.setdefault(*cancel)
            elif event.type == TASK_REQUESTED:
                request = parse_task_request(event.payload)
                if request is None:
                    log.warning("event %s: task.requested without a usable task_id; skipped", event.sequence)
                else:
                    requests.setdefault(request.task_id, request)
        created, found = await self._new_tasks(connection, requests, cancels) if requests else ([], None)
        created_ids = {task.task_id for task in created}
        changed = await self._apply_cancels(
            connection, {task_id: owner for task_id, owner in cancels.items() if task_id not in created_ids}
        )
        if not created:
            return [status_changed_event(task) for task in changed]
        assert found is not None
        steps = self._hand_to_waiting_claims(created, found)
        created = [steps[task.task_id][-1] if task.task_id in steps else task for task in created]
        queued = sorted({task.device_id for task in created if task.status is TaskStatus.QUEUED})
        self._nodes_to_wake = set(queued) | {task.device_id for task in changed if task.terminal}
        published = [
            status_changed_event(step)
            for task in (*changed, *created)
            for step in steps.get(task.task_id, (task,))
        ]
        if self.repository.postgres:
            return Publication(published, self.repository.insertion(created, self.channel, queued))
        await self.repository.insert(connection, created)
        return published

    async def _new_tasks(
        self,
        connection: AsyncConnection,
        requests: dict[str, TaskRequest | RejectedRequest],
        cancels: dict[str, str],
    ) -> tuple[list[Task], RequestLookup]:
        """The tasks of `requests` not stored yet, at database time (`new_task`; cancelled at
        once when their owner's cancel is in `cancels`), each logged, and what the lookup found
        (the open threads asked for are those of the nodes with a waiting claim)."""
        waited_on = [
            r.target_thread_id
            for r in requests.values()
            if self.waiting_claims.count(r.owner_id, r.device_id)
        ]
        found = await self.repository.lookup(
            connection,
            list(requests),
            sorted({(r.owner_id, r.device_id) for r in requests.values()}),
            sorted(set(waited_on)),
        )
        window = self.settings.presence_window
        created = [
            cancelled_at_once(
                new_task(
                    request, found.now, found.last_seen.get((request.owner_id, request.device_id)), window
                ),
                cancels,
            )
            for task_id, request in requests.items()
            if task_id not in found.existing
        ]
        for task in created:
            routine = task.status is TaskStatus.QUEUED and not task.device_offline
            log.log(
                logging.DEBUG if routine else logging.INFO,
                "task %s %s for thread %s on %s%s",
                task.task_id,
                task.status,
                task.target_thread_id,
                task.device_id,
                f": {task.status_detail}" if task.status_detail else "",
            )
        return created, found

    def _hand_to_waiting_claims(self, created: list[Task], found: RequestLookup) -> dict[str, list[Task]]:
        """Gives the new tasks that a claim waiting on their node may take
        (`rules.handed_to_waiting_claims`) to those claims: each is stored claimed and started
        under its claim's lease at the enqueue's database time. Returns, by task id, the task's
        steps to publish (queued, claimed, running); the claims are answered after the commit
        (`requests_committed`)."""
        waiting = {
            (task.owner_id, task.device_id): self.waiting_claims.count(task.owner_id, task.device_id)
            for task in created
        }
        steps: dict[str, list[Task]] = {}
        for task in handed_to_waiting_claims(created, found.open_threads, waiting):
            claim = self.waiting_claims.take(task.owner_id, task.device_id)
            assert claim is not None, "a waiting claim counted a moment ago is gone"
            claimed = claimed_by(
                task, claim.call.worker_id, claim.call.lease_id, found.now, self.settings.claim_lease
            )
            running = started(claimed, found.now, self.settings.run_lease)
            steps[task.task_id] = [task, claimed, running]
            self._offers.append((claim, running))
            log.debug("task %s handed to the waiting claim of %s", task.task_id, claim.call.worker_id)
        return steps

    def _decline_offers(self) -> None:
        """Declines the waiting claims an enqueue took without committing (it failed, or another
        process applied its batch first): their long polls claim again."""
        offers, self._offers = self._offers, []
        for claim, _task in offers:
            claim.decline()

    async def _apply_cancels(self, connection: AsyncConnection, cancels: dict[str, str]) -> list[Task]:
        """The owners' cancels of stored tasks (`cancels`: task id -> owner id): a queued or claimed
        task becomes cancelled; a running one keeps running, its status_detail saying the cancel came
        too late. Returns the tasks written; notifies the nodes of those cancelled (PostgreSQL: a
        cancelled task may free its thread's next one)."""
        written: list[Task] = []
        for task_id, owner_id in cancels.items():
            task = await self.repository.cancel(connection, task_id, owner_id, CANCELLED_DETAIL)
            if task is not None:
                log.info("task %s cancelled by its owner (it had not started)", task_id)
                written.append(task)
                continue
            task = await self.repository.note_cancel_too_late(
                connection, task_id, owner_id, CANCEL_TOO_LATE_DETAIL
            )
            if task is not None:
                log.info("cancel of task %s came after Codex had started it; it runs on", task_id)
                written.append(task)
            else:
                log.info("cancel of task %s: not an open task of that owner; nothing to do", task_id)
        await self.repository.notify(
            connection, self.channel, sorted({task.device_id for task in written if task.terminal})
        )
        return written

    def requests_committed(self) -> None:
        """After a batch of requests committed: answers the waiting claims it handed tasks to (a
        claim withdrawn meanwhile has its task put back in the queue), then wakes the claims
        waiting for its nodes."""
        offers, self._offers = self._offers, []
        for claim, task in offers:
            if not claim.offer(task):
                self._release_later(task)
        nodes, self._nodes_to_wake = self._nodes_to_wake, set()
        self.wakeups.wake_nodes(nodes)

    # ---- the local agent's calls ----------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        node_id: str,
        wait_seconds: float,
        owner_id: str = DEFAULT_OWNER_ID,
        start: bool = False,
    ) -> Task | None:
        """Claims the oldest claimable task of `owner_id` on `node_id` for `worker_id` (a device of
        another owner with the same node id claims none of them; status claimed, a fresh
        `lease_id`, attempt + 1, lease running out the claim lease after database now), waiting up
        to `wait_seconds` (0-60) for one; None when none came. With `start`, the claimed task is
        started in the same transaction (status running, the run lease; both changes published).
        Each call records the node's presence (at most one write per node per
        presence_write_interval). Raises InvalidArgument for a bad wait."""
        deadline = self._monotonic() + check_wait(wait_seconds)
        while True:
            marker = self.wakeups.marker(node_id)
            task = await self._claim_once(worker_id, node_id, owner_id, start)
            remaining = deadline - self._monotonic()
            if task is not None or remaining <= 0:
                return task
            if not start:
                await wait_until_set(marker, remaining)
                continue
            task = await self._wait_for_enqueue(
                ClaimCall(node_id, worker_id, self._new_lease_id(), owner_id), marker, remaining
            )
            if task is not None:
                log.debug("task %s claimed by %s on %s at its enqueue", task.task_id, worker_id, node_id)
                return task

    async def _wait_for_enqueue(self, call: ClaimCall, marker: asyncio.Event, seconds: float) -> Task | None:
        """Waits as a `WaitingClaim` up to `seconds`: the task an enqueue handed to it (stored
        running under `call.lease_id`), or None when `marker` woke it or time ran out. A caller
        going away after the task was handed over puts it back in the queue."""
        claim = self.waiting_claims.add(call)
        try:
            task = await claim.wait(marker, seconds)
        except asyncio.CancelledError:
            unanswered = self.waiting_claims.withdraw(claim)
            if unanswered is not None:
                self._release_later(unanswered)
            raise
        self.waiting_claims.withdraw(claim)
        return task

    async def _claim_once(
        self, worker_id: str, node_id: str, owner_id: str = DEFAULT_OWNER_ID, start: bool = False
    ) -> Task | None:
        """One claim attempt in the next write batch (tried again when the thread's unique index
        refused it: another process claimed the thread first)."""
        for _ in range(CLAIM_ATTEMPTS):
            request = ClaimRequest(
                ClaimCall(node_id, worker_id, self._new_lease_id(), owner_id),
                self._presence_due(owner_id, node_id),
                start,
            )
            write = asyncio.ensure_future(self.writes.run(Grouped(self._claims, request)))
            try:
                task = await asyncio.shield(write)
            except asyncio.CancelledError:
                if start:
                    write.add_done_callback(self._release_unanswered)
                raise
            except IntegrityError:
                log.info("claim on node %s lost its thread to another claim; trying again", node_id)
                continue
            if task is not None:
                log.debug(
                    "task %s claimed by %s on %s (attempt %d)", task.task_id, worker_id, node_id, task.attempt
                )
            return task
        return None

    def _release_unanswered(self, write: asyncio.Future[Task | None]) -> None:
        """Done callback of a claim-and-start whose caller went away meanwhile: the task it started
        (if any) goes back to the queue, since its answer (the lease) never reached the agent."""
        if write.cancelled() or write.exception() is not None:
            return
        task = write.result()
        if task is not None:
            self._release_later(task)

    def _release_later(self, task: Task) -> None:
        """Puts `task` (started under a claim whose answer never reached its agent) back in the
        queue in the background (`_release`)."""
        released = asyncio.ensure_future(self._release(task))
        self._releases.add(released)
        released.add_done_callback(self._releases.discard)

    async def _release(self, task: Task) -> None:
        """Queues `task` again (`repository.release`), publishing its status and waking its node."""

        async def release(connection: AsyncConnection) -> Written[Task | None]:
            queued = await self.repository.release(
                connection, task.task_id, task.lease_id, released_detail(task.worker_id)
            )
            if queued is None:
                return Written(None)
            return Written(queued, [queued], [queued.device_id])

        try:
            queued = await self.writes.run(release)
        except Exception:
            log.exception("task %s: could not queue it again after its claim went unanswered", task.task_id)
            return
        if queued is not None:
            log.info("task %s: its claim never reached %s; queued again", task.task_id, task.worker_id)

    async def start(
        self, worker_id: str, node_id: str, task_id: str, lease_id: str, owner_id: str = DEFAULT_OWNER_ID
    ) -> Task:
        """claimed -> running under the presented lease (renewed to the run lease). A repeat of a
        start that succeeded answers the running task unchanged. Raises InvalidArgument (empty
        task_id / lease_id), NotFound (TASK_NOT_FOUND: unknown, or another owner's), PermissionDenied
        (another node's task),
        FailedPrecondition (LEASE_LOST: not the current lease, or no longer claimed)."""
        check_lease_call(task_id, lease_id)
        call = LeaseCall(task_id, node_id, worker_id, lease_id, owner_id)
        task = await self.writes.run(Grouped(self._starts, call))
        log.debug("task %s started by %s on %s", task_id, worker_id, node_id)
        return task

    async def heartbeat(
        self, worker_id: str, node_id: str, task_id: str, lease_id: str, owner_id: str = DEFAULT_OWNER_ID
    ) -> Task:
        """Renews a running task's lease (the run lease from database now) and records the
        heartbeat and the node's presence; publishes nothing. Errors as `start` (the task must be
        running)."""
        check_lease_call(task_id, lease_id)
        request = HeartbeatRequest(
            LeaseCall(task_id, node_id, worker_id, lease_id, owner_id), self._presence_due(owner_id, node_id)
        )
        return await self.writes.run(Grouped(self._heartbeats, request))

    async def finish(
        self,
        worker_id: str,
        node_id: str,
        task_id: str,
        lease_id: str,
        outcome: FinishOutcome,
        owner_id: str = DEFAULT_OWNER_ID,
    ) -> Task:
        """running -> completed | failed | timed_out under the presented lease. A repeat with the
        same lease and outcome answers the stored task. Raises InvalidArgument (`check_finish`,
        empty ids), NotFound, PermissionDenied or FailedPrecondition (LEASE_LOST) as `start`."""
        check_lease_call(task_id, lease_id)
        check_finish(outcome)
        request = FinishRequest(LeaseCall(task_id, node_id, worker_id, lease_id, owner_id), outcome)
        task = await self.writes.run(Grouped(self._finishes, request))
        log.log(
            logging.DEBUG if task.status is TaskStatus.COMPLETED else logging.INFO,
            "task %s %s (%s) by %s on %s",
            task_id,
            task.status,
            task.failure_kind or "-",
            worker_id,
            node_id,
        )
        return task

    async def get(self, task_id: str) -> Task | None:
        """One task with its device's last seen instant, or None."""
        async with self.database.read() as connection:
            return await self.repository.task(connection, task_id)

    async def device_presence(
        self, owner_id: str, node_ids: Sequence[str]
    ) -> tuple[datetime, dict[str, datetime]]:
        """(The database's current time, when each of `owner_id`'s `node_ids` ever seen was last
        seen), read on the reader; a node never seen is absent, and so is another owner's device
        with the same node id. Online means seen within `settings.presence_window` of that time
        (`rules.is_offline`)."""
        async with self.database.read() as connection:
            lookup = await self.repository.lookup(connection, (), [(owner_id, node) for node in node_ids])
        return lookup.now, {node: seen for (_owner, node), seen in lookup.last_seen.items()}

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

    def _presence_due(self, owner_id: str, node_id: str) -> bool:
        """Whether this call should write the device's presence (at most one per owner's node per
        presence_write_interval in this process); True counts as written now."""
        now = self._monotonic()
        written = self._presence_written.get((owner_id, node_id))
        if written is not None and now - written < self.settings.presence_write_interval.total_seconds():
            return False
        self._presence_written[(owner_id, node_id)] = now
        return True

    async def _publish(self, connection: AsyncConnection, changed: Iterable[Task]) -> list[StoredEvent]:
        """Appends the `task.status_changed` events of `changed` in the caller's transaction."""
        events = [status_changed_event(task) for task in changed]
        return await self.event_log.append(connection, events) if events else []
