"""Service layer of the context budget: one handler per command or query, each one transaction.

Commands: `ingest` (ReportThreadContext, from the batcher), `acknowledge_alert`, `resolve_alert`,
`set_threshold_policy`. Queries: `get_thread_context`, `list_thread_contexts`, `get_threshold_policy`,
`list_alerts`; each takes the owner whose threads the caller may see (None: every owner). Events are
appended to the outbox inside the command's transaction and the sequencer is kicked after the commit
(domain/events.py documents the payloads). `apply_conversations_events` follows the conversations
service's thread moves and device revocations (services/shared/devices.py).

Traces (when tracing is on): `ingest` gives every snapshot of a batch an "ingest snapshot" span, a
child of the report's span when the snapshot carries its context (else a trace of its own), ended
after the commit; the events a snapshot causes carry that span's context, so what follows them
(the consumers' batch spans, the gateway's SSE deliveries) links to the report's trace although
one transaction holds many reports.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from boss_common.tracing import context_of, parent_of, tracing_enabled
from services.context_budget.adapters.repository import SqlAlchemyContextRepository
from services.context_budget.domain import alerts as alert_rules
from services.context_budget.domain import events as ev
from services.context_budget.domain.alerts import DEFAULT_COMPACTION_RISK_HORIZON
from services.context_budget.domain.ingest import ExistingAlertResolved, IngestOutcome, plan_ingest
from services.context_budget.domain.model import Alert, AlertStatus, Snapshot, ThreadState, ThresholdPolicy
from services.context_budget.domain.policy import DEFAULT_POLICY, validate_policy
from services.shared.db import Database
from services.shared.devices import THREAD_MOVED_EVENT, RevocationStore
from services.shared.errors import ALERT_NOT_FOUND, THREAD_NOT_FOUND, NotFound
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.telemetry import meter
from services.shared.time import utc_now

log = logging.getLogger(__name__)

SNAPSHOTS_RECEIVED = meter.create_counter(
    "boss.context_budget.snapshots",
    unit="{snapshot}",
    description="Valid snapshots answered: applied, superseded, duplicate or refused",
)
BATCH_SIZE = meter.create_histogram(
    "boss.context_budget.batch_size", unit="{snapshot}", description="Snapshots per ingest transaction"
)


@dataclass(frozen=True)
class ThreadContextView:
    """A thread's current state with its open (opened or acked) alerts."""

    state: ThreadState
    open_alerts: list[Alert]


def _new_event(
    draft: ev.EventDraft, occurred_at: datetime, trace_context: dict[str, str] | None = None
) -> NewEvent:
    return NewEvent(
        draft.type,
        draft.payload,
        thread_id=draft.thread_id,
        project_id=draft.project_id,
        node_id=draft.node_id,
        occurred_at=occurred_at,
        trace_context=trace_context,
    )


class _IngestSpans:
    """The "ingest snapshot" span of every snapshot of a batch (module docstring, "Traces")."""

    def __init__(self, snapshots: Sequence[Snapshot]) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context

        tracer = trace.get_tracer(__name__)
        # Never the batcher task's own context: that is the call that happened to start it.
        self._spans = {
            id(snapshot): tracer.start_span(
                "ingest snapshot",
                context=parent_of(snapshot.trace_context) if snapshot.trace_context else Context(),
                attributes={"thread_id": snapshot.thread_id, "snapshot_id": snapshot.snapshot_id},
            )
            for snapshot in snapshots
        }
        self._contexts: dict[int, dict[str, str]] = {}

    def context_of(self, snapshot: Snapshot) -> dict[str, str]:
        """The trace context the events of `snapshot` carry."""
        key = id(snapshot)
        if key not in self._contexts:
            self._contexts[key] = dict(context_of(self._spans[key]))
        return self._contexts[key]

    def end(self, error: BaseException | None) -> None:
        """Ends every span, marked failed with `error` when the batch was not stored."""
        from opentelemetry.trace import Status, StatusCode

        for span in self._spans.values():
            if error is not None:
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            span.end()


@contextlib.contextmanager
def _ingest_spans(snapshots: Sequence[Snapshot]) -> Iterator[_IngestSpans | None]:
    """The batch's ingest spans when tracing is on (None when off), ended when the block ends."""
    if not tracing_enabled():
        yield None
        return
    spans = _IngestSpans(snapshots)
    try:
        yield spans
    except BaseException as error:
        spans.end(error)
        raise
    spans.end(None)


class ContextBudgetHandlers:
    """The handlers, wired to one database, repository and event log.

    Args:
        clock: the server clock (aware UTC); tests may pass a fixed one.
        compaction_risk_horizon: how close compaction_expected_at must be to captured_at to open a
            compaction_risk alert (default 10 minutes).
        revocation_store: where revocations from the conversations service are kept (None: this
            process follows none).
    """

    def __init__(
        self,
        database: Database,
        repository: SqlAlchemyContextRepository,
        event_log: EventLog,
        *,
        clock: Callable[[], datetime] = utc_now,
        compaction_risk_horizon: timedelta = DEFAULT_COMPACTION_RISK_HORIZON,
        revocation_store: RevocationStore | None = None,
    ) -> None:
        self._database = database
        self._repository = repository
        self._events = event_log
        self.clock = clock
        self.compaction_risk_horizon = compaction_risk_horizon
        self.revocation_store = revocation_store

    # --- commands -------------------------------------------------------------------------------

    async def ingest(self, snapshots: Sequence[Snapshot]) -> list[IngestOutcome]:
        """Stores a batch of validated snapshots (each with its reporter's owner_id) in one
        transaction; one outcome per snapshot, in order (rules in domain/ingest.py: another
        device's thread and a reused snapshot_id come back as outcomes with `error` set, and store
        nothing). Returns only after the commit.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the transaction failed; nothing was stored.
        """
        with _ingest_spans(snapshots) as spans:
            return await self._ingest(snapshots, spans)

    async def _ingest(self, snapshots: Sequence[Snapshot], spans: _IngestSpans | None) -> list[IngestOutcome]:
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
                existing_snapshots=existing,
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
            for planned, source in zip(plan.events, plan.event_sources, strict=True):
                trace_context = spans.context_of(source) if spans is not None else None
                if isinstance(planned, ExistingAlertResolved):
                    alert = resolved.get(planned.alert_id)
                    if alert is not None:
                        draft = ev.alert_changed_event(alert, planned.node_id)
                        events.append(_new_event(draft, now, trace_context))
                else:
                    events.append(_new_event(planned, now, trace_context))
            appended = await self._events.append(connection, events, carrying=readings)
        if appended:
            self._events.kick(appended)
        BATCH_SIZE.record(len(snapshots))
        duplicates = sum(1 for outcome in plan.outcomes if outcome.duplicate)
        superseded = sum(1 for outcome in plan.outcomes if outcome.superseded)
        refused = sum(1 for outcome in plan.outcomes if outcome.error is not None)
        SNAPSHOTS_RECEIVED.add(len(snapshots) - duplicates - superseded - refused, {"outcome": "applied"})
        if duplicates:
            SNAPSHOTS_RECEIVED.add(duplicates, {"outcome": "duplicate"})
        if superseded:
            SNAPSHOTS_RECEIVED.add(superseded, {"outcome": "superseded"})
        if refused:
            SNAPSHOTS_RECEIVED.add(refused, {"outcome": "refused"})
        return plan.outcomes

    async def apply_conversations_events(
        self, connection: AsyncConnection, batch: list[StoredEvent]
    ) -> list[NewEvent]:
        """Applies the conversations service's events (an EventConsumer handler, in its
        transaction): `thread.moved` {owner_id, thread_id, node_id, worker_id} hands the owner's
        thread to that device (a thread with no reading here yet is bound by its first report);
        `device.revoked` is stored (`revocation_store`, effective after the commit:
        `conversations_batch_committed`). Publishes nothing."""
        for event in batch:
            if event.type != THREAD_MOVED_EVENT:
                continue
            payload = event.payload
            thread_id = str(payload.get("thread_id") or "")
            owner_id = str(payload.get("owner_id") or "")
            node_id = str(payload.get("node_id") or "")
            worker_id = str(payload.get("worker_id") or "")
            if not (thread_id and owner_id and node_id and worker_id):
                log.warning("thread.moved %s lacks a thread, owner or device; skipped", event.sequence)
                continue
            moved = await self._repository.move_thread(connection, thread_id, owner_id, node_id, worker_id)
            if not moved:
                log.info(
                    "thread.moved %s: thread %s has no reading of that owner here", event.sequence, thread_id
                )
        if self.revocation_store is not None:
            await self.revocation_store.apply(connection, batch)
        return []

    def conversations_batch_committed(self) -> None:
        """After a batch of conversations' events committed: its revocations take effect."""
        if self.revocation_store is not None:
            self.revocation_store.committed()

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

    async def get_thread_context(self, thread_id: str, owner_id: str | None = None) -> ThreadContextView:
        """The current state of a thread. Raises NotFound when it never reported, or (with
        `owner_id`) belongs to another owner: the same answer, so its existence is not revealed."""
        async with self._database.read() as connection:
            state = await self._repository.get_state(connection, thread_id)
            if state is None or (owner_id is not None and state.snapshot.owner_id != owner_id):
                raise NotFound(f"thread {thread_id!r} has no context budget", reason=THREAD_NOT_FOUND)
            alerts = await self._repository.open_alerts_of(connection, [thread_id])
        return ThreadContextView(state, alerts.get(thread_id, []))

    async def list_thread_contexts(
        self,
        *,
        project_id: str,
        thread_ids: Sequence[str],
        after_thread_id: str | None,
        limit: int,
        owner_id: str | None = None,
    ) -> list[ThreadContextView]:
        """Current states by thread_id after `after_thread_id`, at most `limit`, with open alerts;
        with `owner_id`, only that owner's threads."""
        async with self._database.read() as connection:
            states = await self._repository.list_states(
                connection,
                project_id=project_id,
                thread_ids=thread_ids,
                after_thread_id=after_thread_id,
                limit=limit,
                owner_id=owner_id,
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
        owner_id: str | None = None,
    ) -> list[Alert]:
        """Alerts newest first, filtered, after the keyset cursor (opened_at, alert_id); with
        `owner_id`, only alerts of that owner's threads."""
        async with self._database.read() as connection:
            return await self._repository.list_alerts(
                connection,
                thread_id=thread_id,
                project_id=project_id,
                statuses=statuses,
                after=after,
                limit=limit,
                owner_id=owner_id,
            )
