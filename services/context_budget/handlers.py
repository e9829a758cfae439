"""Service layer of the context budget: one handler per command or query, each one transaction.

Commands: `ingest` (ReportThreadContext, from the batcher), `acknowledge_alert`, `resolve_alert`,
`set_threshold_policy`. Queries: `get_thread_context`, `list_thread_contexts`, `get_threshold_policy`,
`list_alerts`. Events are appended to the outbox inside the command's transaction and the sequencer
is kicked after the commit (domain/events.py documents the payloads).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from services.context_budget.adapters.repository import SqlAlchemyContextRepository
from services.context_budget.domain import alerts as alert_rules
from services.context_budget.domain import events as ev
from services.context_budget.domain.alerts import DEFAULT_COMPACTION_RISK_HORIZON
from services.context_budget.domain.ingest import ExistingAlertResolved, IngestOutcome, plan_ingest
from services.context_budget.domain.model import Alert, AlertStatus, Snapshot, ThreadState, ThresholdPolicy
from services.context_budget.domain.policy import DEFAULT_POLICY, validate_policy
from services.shared.db import Database
from services.shared.errors import ALERT_NOT_FOUND, THREAD_NOT_FOUND, NotFound
from services.shared.outbox import EventLog, NewEvent
from services.shared.telemetry import meter
from services.shared.time import utc_now

SNAPSHOTS_RECEIVED = meter.create_counter(
    "boss.context_budget.snapshots",
    unit="{snapshot}",
    description="Valid snapshots acknowledged: applied, superseded or duplicate",
)
BATCH_SIZE = meter.create_histogram(
    "boss.context_budget.batch_size", unit="{snapshot}", description="Snapshots per ingest transaction"
)


@dataclass(frozen=True)
class ThreadContextView:
    """A thread's current state with its open (opened or acked) alerts."""

    state: ThreadState
    open_alerts: list[Alert]


def _new_event(draft: ev.EventDraft, occurred_at: datetime) -> NewEvent:
    return NewEvent(
        draft.type,
        draft.payload,
        thread_id=draft.thread_id,
        project_id=draft.project_id,
        node_id=draft.node_id,
        occurred_at=occurred_at,
    )


class ContextBudgetHandlers:
    """The handlers, wired to one database, repository and event log.

    Args:
        clock: the server clock (aware UTC); tests may pass a fixed one.
        compaction_risk_horizon: how close compaction_expected_at must be to captured_at to open a
            compaction_risk alert (default 10 minutes).
    """

    def __init__(
        self,
        database: Database,
        repository: SqlAlchemyContextRepository,
        event_log: EventLog,
        *,
        clock: Callable[[], datetime] = utc_now,
        compaction_risk_horizon: timedelta = DEFAULT_COMPACTION_RISK_HORIZON,
    ) -> None:
        self._database = database
        self._repository = repository
        self._events = event_log
        self.clock = clock
        self.compaction_risk_horizon = compaction_risk_horizon

    # --- commands -------------------------------------------------------------------------------

    async def ingest(self, snapshots: Sequence[Snapshot]) -> list[IngestOutcome]:
        """Stores a batch of validated snapshots in one transaction; one outcome per snapshot, in
        order (rules in domain/ingest.py). Returns only after the commit.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the transaction failed; nothing was stored.
        """
        repository = self._repository
        thread_ids = {snapshot.thread_id for snapshot in snapshots}
        async with self._database.transaction() as connection:
            now = self.clock()
            current, existing, policies = await repository.load_batch_context(
                connection, thread_ids, {s.snapshot_id for s in snapshots}, {s.project_id for s in snapshots}
            )
            plan = plan_ingest(
                snapshots,
                current=current,
                existing_snapshot_ids=existing,
                policies=policies,
                now=now,
                new_alert_id=lambda: str(uuid.uuid4()),
                horizon=self.compaction_risk_horizon,
            )
            # On PostgreSQL the outbox append below makes these writes in its own statement.
            readings = await repository.write_readings(
                connection, plan.snapshots, plan.states, now, carried=True
            )
            await repository.insert_alerts(connection, plan.new_alerts)
            resolved = {
                alert.alert_id: alert
                for alert in await repository.resolve_alerts(connection, plan.resolve_alert_ids, now)
            }
            events: list[NewEvent] = []
            for planned in plan.events:
                if isinstance(planned, ExistingAlertResolved):
                    alert = resolved.get(planned.alert_id)
                    if alert is not None:
                        events.append(_new_event(ev.alert_changed_event(alert, planned.node_id), now))
                else:
                    events.append(_new_event(planned, now))
            appended = await self._events.append(connection, events, carrying=readings)
        if appended:
            self._events.kick(appended)
        BATCH_SIZE.record(len(snapshots))
        duplicates = sum(1 for outcome in plan.outcomes if outcome.duplicate)
        superseded = sum(1 for outcome in plan.outcomes if outcome.superseded)
        SNAPSHOTS_RECEIVED.add(len(snapshots) - duplicates - superseded, {"outcome": "applied"})
        if duplicates:
            SNAPSHOTS_RECEIVED.add(duplicates, {"outcome": "duplicate"})
        if superseded:
            SNAPSHOTS_RECEIVED.add(superseded, {"outcome": "superseded"})
        return plan.outcomes

    async def acknowledge_alert(self, alert_id: str) -> Alert:
        """opened -> acked. Raises NotFound (unknown id) or FailedPrecondition (other status)."""
        return await self._change_alert(alert_id, alert_rules.acknowledge)

    async def resolve_alert(self, alert_id: str) -> Alert:
        """opened|acked -> resolved. Raises NotFound or FailedPrecondition (already resolved)."""
        return await self._change_alert(alert_id, alert_rules.resolve)

    async def _change_alert(self, alert_id: str, transition: Callable[[Alert, datetime], Alert]) -> Alert:
        async with self._database.transaction() as connection:
            alert = await self._repository.get_alert(connection, alert_id, for_update=True)
            if alert is None:
                raise NotFound(f"alert {alert_id!r} not found", reason=ALERT_NOT_FOUND)
            now = self.clock()
            changed = transition(alert, now)
            await self._repository.save_alert(connection, changed)
            event = _new_event(ev.alert_changed_event(changed), now)
            appended = await self._events.append(connection, [event])
        self._events.kick(appended)
        return changed

    async def set_threshold_policy(self, policy: ThresholdPolicy) -> ThresholdPolicy:
        """Stores a project's override (or, for project_id "", the default). It classifies every
        snapshot received afterwards; current states keep their level until their next snapshot.

        Raises:
            InvalidArgument: thresholds not 0 < urgent < watch < safe <= 100.
        """
        validate_policy(policy)
        async with self._database.transaction() as connection:
            stored = replace(policy, updated_at=self.clock())
            await self._repository.save_policy(connection, stored)
        return stored

    # --- queries --------------------------------------------------------------------------------

    async def get_thread_context(self, thread_id: str) -> ThreadContextView:
        """The current state of a thread. Raises NotFound when it never reported."""
        async with self._database.read() as connection:
            state = await self._repository.get_state(connection, thread_id)
            if state is None:
                raise NotFound(f"thread {thread_id!r} has no context budget", reason=THREAD_NOT_FOUND)
            alerts = await self._repository.open_alerts_of(connection, [thread_id])
        return ThreadContextView(state, alerts.get(thread_id, []))

    async def list_thread_contexts(
        self, *, project_id: str, thread_ids: Sequence[str], after_thread_id: str | None, limit: int
    ) -> list[ThreadContextView]:
        """Current states by thread_id after `after_thread_id`, at most `limit`, with open alerts."""
        async with self._database.read() as connection:
            states = await self._repository.list_states(
                connection,
                project_id=project_id,
                thread_ids=thread_ids,
                after_thread_id=after_thread_id,
                limit=limit,
            )
            alerts = await self._repository.open_alerts_of(connection, [s.snapshot.thread_id for s in states])
        return [ThreadContextView(state, alerts.get(state.snapshot.thread_id, [])) for state in states]

    async def get_threshold_policy(self, project_id: str) -> tuple[ThresholdPolicy, bool]:
        """The policy in force for `project_id` and whether it is the project's own override.

        A project without an override gets the stored default, else the CB-7 built-in default.
        """
        async with self._database.read() as connection:
            if project_id:
                own = await self._repository.get_policy(connection, project_id)
                if own is not None:
                    return own, True
            default = await self._repository.get_policy(connection, "")
        return (default or DEFAULT_POLICY), False

    async def list_alerts(
        self,
        *,
        thread_id: str,
        project_id: str,
        statuses: Sequence[AlertStatus],
        after: tuple[datetime, str] | None,
        limit: int,
    ) -> list[Alert]:
        """Alerts newest first, filtered, after the keyset cursor (opened_at, alert_id)."""
        async with self._database.read() as connection:
            return await self._repository.list_alerts(
                connection,
                thread_id=thread_id,
                project_id=project_id,
                statuses=statuses,
                after=after,
                limit=limit,
            )
