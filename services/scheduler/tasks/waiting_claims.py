"""Claims waiting for their node's next task, so that the enqueue creating it can hand it over.

A `ClaimTask` long poll that asks to start its task and found nothing waits on its node's marker
(services/scheduler/tasks/wakeups.py) and, in this process, as a `WaitingClaim` here. An enqueue
(`TaskHandlers.apply_task_requests`) takes the waiting claims of the nodes its new tasks are for,
stores those tasks already claimed and started under each claim's lease in its own transaction,
and after the commit answers each claim with its task: the claim returns without a transaction of
its own, one write and one wake-up fewer between a message and its Codex run.

A claim stops waiting when its long poll's time is up, when its node's marker wakes it, or when its
caller goes away; it is then withdrawn, and an answer offered after that is refused: the enqueue
puts the task back in the queue (nothing ran: the agent never heard of it). An enqueue that took
claims and did not commit declines them at its next batch; a declined claim tries again.
Claims waiting on another scheduler process are woken by its LISTEN/NOTIFY as before.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from services.scheduler.tasks.model import Task
from services.scheduler.tasks.repository import ClaimCall


@dataclass(eq=False)
class WaitingClaim:
    """One waiting claim-and-start: who asks (`call`: node, worker, the lease it will hold, owner)
    and the answer an enqueue gives it (a Task, None when declined)."""

    call: ClaimCall
    answer: asyncio.Future[Task | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def offer(self, task: Task) -> bool:
        """Answers the claim with `task` (stored running under `call.lease_id`); False when the
        claim was withdrawn first: the caller must put the task back in the queue."""
        if self.answer.done():
            return False
        self.answer.set_result(task)
        return True

    def decline(self) -> None:
        """Answers the claim with no task (the enqueue that took it did not commit): its long poll
        claims again."""
        if not self.answer.done():
            self.answer.set_result(None)

    async def wait(self, marker: asyncio.Event, seconds: float) -> Task | None:
        """Waits up to `seconds` for an answer or for `marker` (its node's next wake-up); the task
        offered, or None (declined, woken, or time up: the caller claims again or gives up)."""
        woken = asyncio.ensure_future(marker.wait())
        either: set[asyncio.Future[Any]] = {self.answer, woken}
        try:
            await asyncio.wait(either, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        if self.answer.done() and not self.answer.cancelled():
            return self.answer.result()
        return None


class WaitingClaims:
    """This process's waiting claims, by (owner_id, node_id), oldest first."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[str, str], deque[WaitingClaim]] = {}

    def add(self, call: ClaimCall) -> WaitingClaim:
        """Registers a claim that waits from now on."""
        claim = WaitingClaim(call)
        self._waiting.setdefault((call.owner_id, call.node_id), deque()).append(claim)
        return claim

    def count(self, owner_id: str, node_id: str) -> int:
        """How many claims of `owner_id`'s node `node_id` wait now."""
        return len(self._waiting.get((owner_id, node_id), ()))

    def take(self, owner_id: str, node_id: str) -> WaitingClaim | None:
        """Takes the oldest waiting claim of `owner_id`'s node `node_id` (no longer waiting for
        other enqueues), or None."""
        queue = self._waiting.get((owner_id, node_id))
        if not queue:
            return None
        claim = queue.popleft()
        if not queue:
            del self._waiting[(owner_id, node_id)]
        return claim

    def withdraw(self, claim: WaitingClaim) -> Task | None:
        """The claim stops waiting: unregistered, and an answer not given yet is refused from now
        on. Returns the task it was answered with, if any (a caller going away must put it back in
        the queue)."""
        queue = self._waiting.get((claim.call.owner_id, claim.call.node_id))
        if queue is not None and claim in queue:
            queue.remove(claim)
            if not queue:
                del self._waiting[(claim.call.owner_id, claim.call.node_id)]
        if not claim.answer.done():
            claim.answer.cancel()
            return None
        return None if claim.answer.cancelled() else claim.answer.result()
