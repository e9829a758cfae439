"""The device's local agent: claims this node's tasks from the scheduler, runs each turn, finishes it.

:class:`LocalAgent` keeps `max_concurrent_tasks` claim slots (2 by default). Each slot, in a loop:

1. long-polls `ClaimTask(wait_seconds=30, start=True)` for this worker and node (the scheduler
   hands out only this node's tasks, one at a time per Codex thread, in order), which answers the
   task already running (claimed -> running in the claim's transaction, the run lease), since a
   slot runs what it claims at once;
2. a scheduler that answers the task only claimed (one that predates `start`) gets a `StartTask`
   under the claim's lease (claimed -> running). `prepare_turn`, when given, is called with the
   task before the turn (as that StartTask goes out, so the runner gets ready meanwhile: the Codex
   runner looks for other Codex processes on the thread); the turn starts only once the task runs;
3. runs the turn through the :data:`~worker.local_agent.outcomes.RunTurn` callable (the Codex
   runner) while heartbeating every lease/3 seconds (`HeartbeatTask`);
4. `FinishTask` with the outcome (:func:`~worker.local_agent.outcomes.finish_request`).

Fencing: a StartTask, HeartbeatTask or FinishTask the scheduler refuses (FAILED_PRECONDITION
LEASE_LOST, or NOT_FOUND / PERMISSION_DENIED) means this agent no longer holds the task: a refused
heartbeat cancels the run and the task is not finished; a refused finish is logged and dropped.
Calls failing with UNAVAILABLE / DEADLINE_EXCEEDED are retried with backoff (0.2 s doubling to 5 s)
while the lease may still be valid; once it has surely run out the run is cancelled and left to the
scheduler, which fails a running task whose lease ran out as device_lost.

While the scheduler is unreachable the slots retry their claims with backoff (0.2 s doubling to
10 s, boss_common/reconnection.py); the outage is logged once when it starts and once when it ends.

Stopping (`stop` set, on SIGTERM/SIGINT of the worker): no more claims (pending long polls are
cancelled; a task the scheduler claimed and started for a cancelled poll goes back to its queue
at once, since the agent never held it); running turns are cancelled and finished as failed,
failure_kind interrupted, "the worker on <node> was stopped while running this message" (a turn
that still replied is finished with its reply). A turn that ignores its cancel for
`cancel_grace_s` is abandoned. Once every slot has ended, `on_stopped` is awaited (the Codex
runner completes or kills the cleanups of its finished runs there). A worker killed outright
leaves its running tasks to the scheduler's lease expiry.

Every task state change is logged on one line: claimed, started, finished (outcome and seconds),
lease lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from google.protobuf.message import Message

from boss_common.bearer import bearer_metadata
from boss_common.channels import open_channel
from boss_common.reconnection import Reconnection
from boss_common.time import utc_now
from boss_common.waiting import wait_until_set
from worker.local_agent.leases import (
    CallVerdict,
    LeaseClock,
    Reachability,
    lease_seconds,
    retry_delay,
    verdict_of,
)
from worker.local_agent.outcomes import (
    RunTurn,
    TurnOutcome,
    finish_fields,
    finish_request,
    outcome_after_stop,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_TASKS = 2
DEFAULT_CLAIM_WAIT_S = 30.0
MAX_CLAIM_WAIT_S = 60.0
"""ClaimTask's longest wait (seconds)."""
DEFAULT_CANCEL_GRACE_S = 15.0
CALL_TIMEOUT_S = 10.0
"""Deadline of StartTask, HeartbeatTask and FinishTask (seconds; shorter when the lease ends sooner)."""
CLAIM_CALL_MARGIN_S = 10.0
"""A ClaimTask call's deadline is its wait plus this (seconds)."""
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)
"""gRPC's own reconnect backoff grows to 120 s by default, and until it elapses every call fails at
once: capped at 5 s, a restarted scheduler is reached within seconds (a finish still in its lease)."""

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Claim:
    """A task this agent claimed: the task (status claimed), its fencing token, and the monotonic
    second the ClaimTask call was sent (the lease started no earlier)."""

    task: scheduler_pb2.Task
    lease_id: str
    sent_at: float


@dataclass
class HeldLease:
    """The lease of one running task, renewed in place by its heartbeats."""

    clock: LeaseClock


@dataclass(frozen=True)
class CallResult:
    """The end of a fenced task call: the response, or None with the verdict of its last failure."""

    response: Message | None
    sent_at: float
    verdict: CallVerdict | None = None
    error: grpc.aio.AioRpcError | None = None


class LocalAgent:
    """Claims, runs and finishes this node's tasks (see the module docstring).

    Raises ValueError for fewer than one slot or a claim wait outside 0-60 seconds.

    Args:
        scheduler_address: gRPC target of the scheduler (e.g. 127.0.0.1:50052).
        token: returns the worker bearer token (scope tasks:claim, bound to worker_id and node_id);
            called once per claim.
        worker_id, node_id: who this agent is (must equal the token's).
        run_turn: runs one turn (the Codex runner; a stub in tests).
        max_concurrent_tasks: claim slots, i.e. turns run at the same time (>= 1).
        claim_wait_s: how long one ClaimTask long poll waits for a task (seconds, 0-60).
        cancel_grace_s: how long a cancelled turn may take to return before it is abandoned (seconds).
        channel: an existing channel to use (not closed by the agent); one is opened otherwise.
        clock: monotonic seconds (lease deadlines, durations).
        on_stopped: awaited once every slot has ended, before `run` returns (e.g. the Codex
            runner's `close`); None for nothing.
        prepare_turn: called (synchronously, on the event loop) with each claimed task before its
            turn (and before a StartTask, when one is needed): e.g. the Codex runner's `prepare`,
            which starts its checks in the background; it must not start the turn. None for nothing.
    """

    def __init__(
        self,
        *,
        scheduler_address: str,
        token: Callable[[], str],
        worker_id: str,
        node_id: str,
        run_turn: RunTurn,
        max_concurrent_tasks: int = DEFAULT_MAX_CONCURRENT_TASKS,
        claim_wait_s: float = DEFAULT_CLAIM_WAIT_S,
        cancel_grace_s: float = DEFAULT_CANCEL_GRACE_S,
        channel: grpc.aio.Channel | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_stopped: Callable[[], Awaitable[None]] | None = None,
        prepare_turn: Callable[[scheduler_pb2.Task], None] | None = None,
    ) -> None:
        if max_concurrent_tasks < 1:
            raise ValueError(f"max_concurrent_tasks must be >= 1, got {max_concurrent_tasks}")
        if not 0 <= claim_wait_s <= MAX_CLAIM_WAIT_S:
            raise ValueError(
                f"claim_wait_s must be from 0 to {MAX_CLAIM_WAIT_S:.0f} seconds, got {claim_wait_s}"
            )
        self._address = scheduler_address
        self._token = token
        self.worker_id = worker_id
        self.node_id = node_id
        self._run_turn = run_turn
        self._slots = max_concurrent_tasks
        self._claim_wait_s = claim_wait_s
        self._cancel_grace_s = cancel_grace_s
        self._channel = channel
        self._clock = clock
        self._on_stopped = on_stopped
        self._prepare_turn = prepare_turn
        self._reachability = Reachability(clock)
        self.running: set[str] = set()
        """Ids of the tasks whose turn is running now."""

    async def run(self, stop: asyncio.Event) -> None:
        """Claims and runs tasks until `stop` is set; then interrupts and finishes the running turns
        (see the module docstring), awaits `on_stopped` and returns. Never raises for scheduler
        failures."""
        channel = self._channel or open_channel(self._address, CHANNEL_OPTIONS, for_worker=True)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        log.info(
            "local agent of %s on node %s: claiming tasks from %s with %d slot(s)",
            self.worker_id,
            self.node_id,
            self._address,
            self._slots,
        )
        try:
            async with asyncio.TaskGroup() as group:
                for slot in range(self._slots):
                    group.create_task(self._slot(stub, stop), name=f"local-agent-slot-{slot}")
        finally:
            try:
                if self._on_stopped is not None:
                    await self._on_stopped()
            finally:
                if self._channel is None:
                    await channel.close()
        log.info("local agent of %s stopped", self.worker_id)

    async def _slot(self, stub: scheduler_pb2_grpc.SchedulerServiceStub, stop: asyncio.Event) -> None:
        """One claim slot: claim, run, finish, again, until `stop`."""
        reconnection = Reconnection(self._clock)
        while not stop.is_set():
            try:
                claim = await self._claim(stub, stop, reconnection)
            except grpc.aio.AioRpcError as error:
                await wait_until_set(stop, self._claim_failed(error, reconnection))
                continue
            except Exception:
                log.exception("claiming a task failed; trying again")
                await wait_until_set(stop, reconnection.next_delay())
                continue
            if claim is None:
                continue
            try:
                await self._run_claimed(stub, claim, stop)
            except Exception:
                log.exception("task %s: the local agent failed while handling it", claim.task.task_id)

    async def _claim(
        self, stub: scheduler_pb2_grpc.SchedulerServiceStub, stop: asyncio.Event, reconnection: Reconnection
    ) -> Claim | None:
        """One ClaimTask long poll, given up when `stop` is set. None when no task came (or stop)."""
        request = scheduler_pb2.ClaimTaskRequest(
            worker_id=self.worker_id, node_id=self.node_id, wait_seconds=self._claim_wait_s, start=True
        )
        reconnection.attempt_started()
        sent_at = self._clock()
        call = asyncio.ensure_future(
            stub.ClaimTask(
                request,
                metadata=bearer_metadata(self._token()),
                timeout=self._claim_wait_s + CLAIM_CALL_MARGIN_S,
            )
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await call
            return None
        response = call.result()
        reconnection.delivered()
        self._answered()
        if not response.HasField("task"):
            return None
        claim = Claim(response.task, response.lease_id, sent_at)
        log.info(
            "task %s claimed: thread %s, attempt %d",
            claim.task.task_id,
            claim.task.target_thread_id,
            claim.task.attempt,
        )
        return claim

    def _claim_failed(self, error: grpc.aio.AioRpcError, reconnection: Reconnection) -> float:
        """Logs a failed claim (once per outage) and returns the delay before the next one."""
        delay = reconnection.next_delay()
        if self._reachability.failed():
            if verdict_of(error.code()) is CallVerdict.TRANSIENT:
                log.warning(
                    "scheduler at %s unreachable (%s); the local agent keeps retrying with backoff",
                    self._address,
                    error.code().name,
                )
            else:
                log.error(
                    "scheduler at %s refused to hand out tasks (%s: %s); the local agent keeps retrying",
                    self._address,
                    error.code().name,
                    error.details(),
                )
        return delay

    def _answered(self) -> None:
        """The scheduler answered a call: logs the end of an outage."""
        lasted = self._reachability.answered()
        if lasted is not None:
            log.info(
                "scheduler at %s answers again (after %.1f s); the local agent resumes", self._address, lasted
            )

    async def _run_claimed(
        self, stub: scheduler_pb2_grpc.SchedulerServiceStub, claim: Claim, stop: asyncio.Event
    ) -> None:
        """Starts, runs (heartbeating) and finishes one claimed task."""
        task_id = claim.task.task_id
        if stop.is_set():
            log.info(
                "task %s: claimed as the worker stops; not started (the scheduler re-queues it)", task_id
            )
            return
        metadata = bearer_metadata(self._token())
        lease = HeldLease(LeaseClock.granted(claim.sent_at, lease_seconds(claim.task, now=utc_now())))
        if self._prepare_turn is not None:
            try:
                self._prepare_turn(claim.task)
            except Exception:
                log.exception("task %s: preparing its turn failed; the turn gets ready by itself", task_id)
        task = claim.task
        if task.status != scheduler_pb2.TASK_STATUS_RUNNING:
            start_request = scheduler_pb2.StartTaskRequest(
                worker_id=self.worker_id, node_id=self.node_id, task_id=task_id, lease_id=claim.lease_id
            )
            started = await self._fenced_call(
                stub.StartTask, start_request, metadata, lease, task_id, "start"
            )
            if not isinstance(started.response, scheduler_pb2.StartTaskResponse):
                return
            task = started.response.task
            lease.clock = LeaseClock.granted(started.sent_at, lease_seconds(task, now=utc_now()))
        log.info(
            "task %s started: thread %s in %s (lease %.1f s)",
            task_id,
            task.codex_thread_ref or task.target_thread_id,
            task.codex_folder_ref or "?",
            lease.clock.lease_s,
        )
        began = self._clock()
        outcome = await self._run_with_lease(stub, task, claim.lease_id, metadata, lease, stop)
        if outcome is None:
            return
        await self._finish(stub, task, claim.lease_id, metadata, lease, outcome, self._clock() - began)

    async def _run_with_lease(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        task: scheduler_pb2.Task,
        lease_id: str,
        metadata: Metadata,
        lease: HeldLease,
        stop: asyncio.Event,
    ) -> TurnOutcome | None:
        """Runs the turn while heartbeating. Returns its outcome (rewritten as interrupted when the
        worker's stop cancelled it), or None when the lease was lost (the run was cancelled)."""
        cancel = asyncio.Event()
        stopped_by_worker = asyncio.Event()
        self.running.add(task.task_id)
        turn = asyncio.create_task(self._turn(task, cancel), name=f"turn-{task.task_id}")
        keeper = asyncio.create_task(self._keep_lease(stub, task, lease_id, metadata, lease))
        enforcer = asyncio.create_task(self._enforce_cancel(task, turn, cancel, stop, stopped_by_worker))
        try:
            await asyncio.wait({turn, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if not turn.done():
                cancel.set()
                await asyncio.wait({turn})
                log.warning("task %s: run stopped, this agent lost its lease; not finished", task.task_id)
                return None
        finally:
            if not turn.done():
                turn.cancel()
            keeper.cancel()
            enforcer.cancel()
            for helper in (keeper, enforcer):
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            self.running.discard(task.task_id)
        if turn.cancelled():
            outcome = TurnOutcome.failed(
                "interrupted", f"the run did not stop within {self._cancel_grace_s:.0f} s of being cancelled"
            )
        else:
            outcome = turn.result()
        if stopped_by_worker.is_set():
            outcome = outcome_after_stop(outcome, self.node_id)
        return outcome

    async def _turn(self, task: scheduler_pb2.Task, cancel: asyncio.Event) -> TurnOutcome:
        """`run_turn`, with an exception reported as failure `other`."""
        try:
            return await self._run_turn(task, cancel)
        except Exception as error:
            log.exception("task %s: the run raised", task.task_id)
            return TurnOutcome.failed("other", f"the local agent failed while running this message: {error}")

    async def _enforce_cancel(
        self,
        task: scheduler_pb2.Task,
        turn: asyncio.Task[TurnOutcome],
        cancel: asyncio.Event,
        stop: asyncio.Event,
        stopped_by_worker: asyncio.Event,
    ) -> None:
        """Sets `cancel` when the worker stops; abandons a turn still running `cancel_grace_s` after
        its cancel."""
        waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(cancel.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if stop.is_set() and not cancel.is_set():
            stopped_by_worker.set()
            log.info("task %s: the worker stops; interrupting the run", task.task_id)
        cancel.set()
        await asyncio.sleep(self._cancel_grace_s)
        if not turn.done():
            log.error(
                "task %s: the run did not stop within %.0f s of being cancelled; abandoning it",
                task.task_id,
                self._cancel_grace_s,
            )
            turn.cancel()

    async def _keep_lease(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        task: scheduler_pb2.Task,
        lease_id: str,
        metadata: Metadata,
        lease: HeldLease,
    ) -> None:
        """Heartbeats every lease/3 seconds, renewing `lease`; returns once the lease is lost
        (refused, or surely run out while the scheduler was unreachable)."""
        request = scheduler_pb2.HeartbeatTaskRequest(
            worker_id=self.worker_id, node_id=self.node_id, task_id=task.task_id, lease_id=lease_id
        )
        next_at = lease.clock.deadline - lease.clock.lease_s + lease.clock.heartbeat_interval
        while True:
            await asyncio.sleep(max(0.0, next_at - self._clock()))
            result = await self._fenced_call(
                stub.HeartbeatTask, request, metadata, lease, task.task_id, "heartbeat"
            )
            if not isinstance(result.response, scheduler_pb2.HeartbeatTaskResponse):
                return
            lease.clock = LeaseClock.granted(
                result.sent_at, lease_seconds(result.response.task, now=utc_now())
            )
            next_at = result.sent_at + lease.clock.heartbeat_interval

    async def _finish(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        task: scheduler_pb2.Task,
        lease_id: str,
        metadata: Metadata,
        lease: HeldLease,
        outcome: TurnOutcome,
        seconds: float,
    ) -> None:
        """FinishTask with `outcome`. A finish refused as invalid (say, a reply the scheduler will
        not store) is finished once more as failure `other` saying so, so the task still ends."""
        request = finish_request(task, lease_id, outcome, worker_id=self.worker_id, node_id=self.node_id)
        result = await self._fenced_call(stub.FinishTask, request, metadata, lease, task.task_id, "finish")
        if result.verdict is CallVerdict.REJECTED and result.error is not None:
            outcome = TurnOutcome.failed(
                "other",
                f"the local agent could not report this run's result: {result.error.details()}",
                outcome.codex_session_id,
            )
            request = finish_request(task, lease_id, outcome, worker_id=self.worker_id, node_id=self.node_id)
            result = await self._fenced_call(
                stub.FinishTask, request, metadata, lease, task.task_id, "finish"
            )
        if result.response is None:
            return
        fields = finish_fields(outcome)
        if fields.completed:
            log.info("task %s finished: completed in %.1f s", task.task_id, seconds)
        else:
            log.info(
                "task %s finished: %s (%s) in %.1f s",
                task.task_id,
                scheduler_pb2.TaskStatus.Name(request.status).removeprefix("TASK_STATUS_").lower(),
                fields.failure_kind,
                seconds,
            )

    async def _fenced_call(
        self,
        method: Callable[..., Awaitable[Message]],
        request: Message,
        metadata: Metadata,
        lease: HeldLease,
        task_id: str,
        action: str,
    ) -> CallResult:
        """Calls a lease-fenced task RPC, retrying transient failures while the lease may still be
        valid. Logs why it gave up; never raises AioRpcError."""
        failures = 0
        while True:
            sent_at = self._clock()
            timeout = max(0.05, min(CALL_TIMEOUT_S, lease.clock.deadline - sent_at))
            try:
                response = await method(request, metadata=metadata, timeout=timeout)
            except grpc.aio.AioRpcError as error:
                verdict = verdict_of(error.code())
                if verdict is CallVerdict.TRANSIENT:
                    if self._reachability.failed():
                        log.warning(
                            "scheduler at %s unreachable (%s); retrying with backoff",
                            self._address,
                            error.code().name,
                        )
                    failures += 1
                    delay = retry_delay(failures)
                    if lease.clock.worth_retrying(self._clock(), delay):
                        await asyncio.sleep(delay)
                        continue
                    log.warning(
                        "task %s: gave up on %s: its lease ran out while the scheduler was unreachable",
                        task_id,
                        action,
                    )
                elif verdict is CallVerdict.LEASE_LOST:
                    log.warning(
                        "task %s: %s refused, this agent no longer holds the task (%s: %s)",
                        task_id,
                        action,
                        error.code().name,
                        error.details(),
                    )
                else:
                    log.error(
                        "task %s: %s rejected (%s: %s)", task_id, action, error.code().name, error.details()
                    )
                return CallResult(None, sent_at, verdict, error)
            self._answered()
            return CallResult(response, sent_at)
