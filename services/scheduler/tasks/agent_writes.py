"""The local agents' calls as write groups of `TaskWrites`: a batch's claims, starts, heartbeats and
finishes each take one statement for all of them on PostgreSQL (services/scheduler/tasks/writes.py
has the batching, the repository's `*_many` methods the statements).

A batch applies heartbeats, then starts, then finishes, then claims: the claims come last so that
they see the threads the batch's finishes freed. A claim asking to start is started right after the
batch's claims, in the same transaction. (No call of a batch depends on another call of it
otherwise: a start needs its claim's lease, a finish its start's answer, both committed.)

A fenced call whose statement matched nothing is looked at alone: a repeat of a start or finish
that already succeeded with the same lease (and, for a finish, the same outcome) answers the task
as it is, writing and publishing nothing; anything else is refused (`rules.refusal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.tasks.model import Task, TaskStatus
from services.scheduler.tasks.repository import ClaimCall, LeaseCall, SqlAlchemyTaskRepository
from services.scheduler.tasks.rules import FinishOutcome, is_same_outcome, refusal
from services.scheduler.tasks.writes import WriteGroup, Written
from services.shared.errors import BossError


@dataclass(frozen=True)
class ClaimRequest:
    """A claim, whether this process should record the node's presence with it, and whether the
    claimed task starts at once (claimed -> running in the same transaction)."""

    call: ClaimCall
    record_presence: bool
    start: bool = False


@dataclass(frozen=True)
class HeartbeatRequest:
    """A heartbeat, and whether this process should record the node's presence with it."""

    call: LeaseCall
    record_presence: bool


@dataclass(frozen=True)
class FinishRequest:
    """A finish with its (validated) outcome."""

    call: LeaseCall
    outcome: FinishOutcome


def _holds(task: Task | None, call: LeaseCall) -> bool:
    """Whether `task` is still held under `call`'s lease by `call`'s worker on its node, for the
    call's owner."""
    return (
        task is not None
        and task.owner_id == call.owner_id
        and task.lease_id == call.lease_id
        and task.device_id == call.node_id
        and task.worker_id == call.worker_id
    )


class Claims(WriteGroup[ClaimRequest, Task | None]):
    """A batch's claims: each claimed task (published: claimed), or None when nothing was
    claimable for it; a claim that asks to start has its task started right after, in the same
    statement batch (published: claimed, then running; answered running). Records the presence of
    the nodes whose requests ask for it."""

    order = 4

    def __init__(self, repository: SqlAlchemyTaskRepository, lease: timedelta, run_lease: timedelta) -> None:
        self._repository = repository
        self._lease = lease
        self._run_lease = run_lease

    async def apply(
        self, connection: AsyncConnection, requests: Sequence[ClaimRequest]
    ) -> list[Written[Task | None] | BossError]:
        seen = [(r.call.owner_id, r.call.node_id, r.call.worker_id) for r in requests if r.record_presence]
        if seen:
            await self._repository.record_presence_many(connection, seen)
        tasks = await self._repository.claim_many(connection, [r.call for r in requests], self._lease)
        to_start = [
            LeaseCall(task.task_id, r.call.node_id, r.call.worker_id, r.call.lease_id, r.call.owner_id)
            for r, task in zip(requests, tasks, strict=True)
            if r.start and task is not None
        ]
        started = iter(await self._repository.start_many(connection, to_start, self._run_lease))
        results: list[Written[Task | None] | BossError] = []
        for request, task in zip(requests, tasks, strict=True):
            if task is None:
                results.append(Written(None))
            elif not request.start:
                results.append(Written(task, [task]))
            else:
                # The claim holds the task under this very lease in this transaction: it starts.
                running = next(started)
                assert running is not None, f"task {task.task_id} claimed but not started"
                results.append(Written(running, [task, running]))
        return results


class Starts(WriteGroup[LeaseCall, Task]):
    """A batch's starts (claimed -> running, the lease renewed to the run lease; published)."""

    order = 2

    def __init__(self, repository: SqlAlchemyTaskRepository, lease: timedelta) -> None:
        self._repository = repository
        self._lease = lease

    async def apply(
        self, connection: AsyncConnection, requests: Sequence[LeaseCall]
    ) -> list[Written[Task] | BossError]:
        started = await self._repository.start_many(connection, requests, self._lease)
        results: list[Written[Task] | BossError] = []
        for call, task in zip(requests, started, strict=True):
            if task is not None:
                results.append(Written(task, [task]))
                continue
            current = await self._repository.task(connection, call.task_id)
            if current is not None and current.status is TaskStatus.RUNNING and _holds(current, call):
                results.append(Written(current))
            else:
                results.append(
                    refusal(
                        current, call.task_id, call.node_id, call.worker_id, TaskStatus.CLAIMED, call.owner_id
                    )
                )
        return results


class Heartbeats(WriteGroup[HeartbeatRequest, Task]):
    """A batch's heartbeats (the run lease renewed; nothing published). Records the presence of
    the nodes whose accepted heartbeats ask for it."""

    order = 1

    def __init__(self, repository: SqlAlchemyTaskRepository, lease: timedelta) -> None:
        self._repository = repository
        self._lease = lease

    async def apply(
        self, connection: AsyncConnection, requests: Sequence[HeartbeatRequest]
    ) -> list[Written[Task] | BossError]:
        renewed = await self._repository.heartbeat_many(connection, [r.call for r in requests], self._lease)
        results: list[Written[Task] | BossError] = []
        seen = []
        for request, task in zip(requests, renewed, strict=True):
            call = request.call
            if task is None:
                current = await self._repository.task(connection, call.task_id)
                results.append(
                    refusal(
                        current, call.task_id, call.node_id, call.worker_id, TaskStatus.RUNNING, call.owner_id
                    )
                )
                continue
            if request.record_presence:
                seen.append((call.owner_id, call.node_id, call.worker_id))
            results.append(Written(task))
        if seen:
            await self._repository.record_presence_many(connection, seen)
        return results


class Finishes(WriteGroup[FinishRequest, Task]):
    """A batch's finishes (running -> the outcome's status; published, and the node woken: its
    thread's next task may be claimable now)."""

    order = 3

    def __init__(self, repository: SqlAlchemyTaskRepository) -> None:
        self._repository = repository

    async def apply(
        self, connection: AsyncConnection, requests: Sequence[FinishRequest]
    ) -> list[Written[Task] | BossError]:
        finished = await self._repository.finish_many(connection, [(r.call, r.outcome) for r in requests])
        results: list[Written[Task] | BossError] = []
        for request, task in zip(requests, finished, strict=True):
            call = request.call
            if task is not None:
                results.append(Written(task, [task], [task.device_id]))
                continue
            current = await self._repository.task(connection, call.task_id)
            if (
                current is not None
                and current.terminal
                and _holds(current, call)
                and is_same_outcome(current, request.outcome)
            ):
                results.append(Written(current))
            else:
                results.append(
                    refusal(
                        current, call.task_id, call.node_id, call.worker_id, TaskStatus.RUNNING, call.owner_id
                    )
                )
        return results
