"""The group chat's background work in a conversations process: the master agent's summaries and
the expiry of plans nobody confirmed.

Summaries follow the service's own outbox: a committed `dispatch_plan.updated` whose plan has its
summary pending (the last dispatched task ended) starts `DispatchProgress.summarise` at once, outside
the consumer transaction that made it pending (the model may take seconds). Every
`expiry_check` (BOSS_DISPATCH_EXPIRY_CHECK_SECONDS) plans past their expiry are written expired, and
pending summaries are looked for again, so a summary whose process stopped or failed is posted
after a restart. Two processes may both summarise one plan; the first to commit posts it (a
conditional update), the other writes nothing.
"""

from __future__ import annotations

import asyncio
import logging

from services.conversations.groups.handlers import GroupHandlers
from services.conversations.groups.plans import SUMMARY_PENDING
from services.conversations.groups.support import PLAN_UPDATED
from services.shared.outbox import EventLog

log = logging.getLogger(__name__)


class DispatchBackground:
    """Runs summaries and expiry for `handlers` (see the module docstring)."""

    def __init__(self, handlers: GroupHandlers, event_log: EventLog) -> None:
        self.handlers = handlers
        self.event_log = event_log

    async def run(self) -> None:
        """Until cancelled: follows the outbox for pending summaries and checks expiry. Cancelled,
        it returns only once both loops have ended (a task group), so none of them is still
        reading when the process closes its database."""
        await self.event_log.refresh()
        head = self.event_log.last_sequence
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow(head))
            group.create_task(self._every_check())

    async def _follow(self, after: int) -> None:
        async for batch in self.event_log.follow_batches(after, types=[PLAN_UPDATED]):
            for event in batch:
                plan = event.payload.get("dispatch_plan") or {}
                if plan.get("summary_status") == SUMMARY_PENDING:
                    await self._summarise(str(plan.get("plan_id") or ""))

    async def _every_check(self) -> None:
        while True:
            try:
                await self.handlers.progress.expire_due()
                for plan_id in await self.handlers.progress.pending_summaries():
                    await self._summarise(plan_id)
            except Exception:
                log.exception("dispatch plans: the expiry and summary check failed; trying again")
            await asyncio.sleep(self.handlers.settings.expiry_check.total_seconds())

    async def _summarise(self, plan_id: str) -> None:
        try:
            await self.handlers.progress.summarise(plan_id)
        except Exception:
            log.exception("dispatch plan %s: the summary failed; tried again at the next check", plan_id)
