"""The ingest rules for a batch of validated snapshots, as a pure plan (ARCHITECTURE flow 1).

For each snapshot, in arrival order:

0. **Another device's thread**: a thread belongs to the device (owner, node, worker) that first
   reported it, or the one its owner moved it to. A snapshot of it from any other device is refused
   (PERMISSION_DENIED, reason THREAD_BOUND_TO_OTHER_DEVICE, naming `thread_id`); nothing is stored.
1. **Duplicate** (its snapshot_id is stored already, or came earlier in the batch): an exact repeat
   of the stored reading is answered with `duplicate=true` and the thread's current level; a
   different reading under that snapshot_id is refused (ALREADY_EXISTS, reason
   SNAPSHOT_ID_REUSED, naming `snapshot_id`). Nothing is stored either way.
2. **Classify** with the project's threshold policy (the default policy when it has none): the
   server's level is the truth; the worker's own level is only recorded.
3. **Older reading** ((captured_at, snapshot_version) <= the thread's current one): stored in the
   history with `superseded=true`; the current state, alerts and events are left alone.
4. **Applied**: becomes the thread's current state; events and alert changes follow
   (`events.py`, `alerts.py`). Several snapshots of one thread in a batch apply in order, each
   seeing the state the previous one left.

The caller loads the current states, the already stored snapshots of the batch's snapshot ids and
the policies, then writes the plan in one transaction (a handful of bulk statements).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from services.context_budget.domain import events as ev
from services.context_budget.domain.alerts import (
    DEFAULT_COMPACTION_RISK_HORIZON,
    compaction_risk_reason,
    level_alert_reason,
    level_alert_type,
    open_alert,
    resolve,
)
from services.context_budget.domain.model import (
    Alert,
    AlertType,
    ContextBudgetLevel,
    MasterAction,
    Snapshot,
    ThreadHead,
    ThreadState,
    ThresholdPolicy,
)
from services.context_budget.domain.policy import (
    DEFAULT_POLICY,
    classify,
    compaction_is_near,
    master_actions_of,
    report_interval_seconds,
)
from services.shared.errors import (
    AlreadyExists,
    BossError,
    FieldViolation,
    thread_bound_to_other_device,
)

SNAPSHOT_ID_REUSED = "SNAPSHOT_ID_REUSED"


def reused_snapshot_id_error(snapshot_id: str) -> AlreadyExists:
    """The refusal of a different reading under a stored (or earlier in the batch) snapshot_id."""
    return AlreadyExists(
        f"snapshot {snapshot_id!r} is stored with a different reading: give a new reading a new "
        "snapshot_id (or send none: the server derives one)",
        reason=SNAPSHOT_ID_REUSED,
        violations=[FieldViolation("snapshot_id", "is taken by a different reading")],
    )


@dataclass(slots=True)
class StoredSnapshot:
    """A history row: the snapshot, the server's level for it, and whether a newer reading of the
    thread was already current (so it changed nothing)."""

    snapshot: Snapshot
    level: ContextBudgetLevel
    superseded: bool


@dataclass(slots=True)
class IngestOutcome:
    """What one snapshot's ack says (CB-10).

    Attributes:
        level: the thread's current server level after this snapshot.
        duplicate: the snapshot was stored before; nothing changed.
        superseded: the thread already had a newer reading; stored in history only.
        error: set when the snapshot was refused (another device's thread, a reused snapshot_id);
            nothing of it was stored, and `level` means nothing.
    """

    snapshot_id: str
    thread_id: str
    level: ContextBudgetLevel
    duplicate: bool = False
    superseded: bool = False
    compaction_near: bool = False
    error: BossError | None = None

    @property
    def master_actions(self) -> tuple[MasterAction, ...]:
        """CB-7 actions at the current level, with `prepare_handoff` when the snapshot expects its
        compaction within the risk horizon (`master_actions_of`)."""
        return master_actions_of(self.level, self.compaction_near)

    @property
    def next_required_report_in_seconds(self) -> int:
        """CB-9 cadence at the current level."""
        return report_interval_seconds(self.level)


@dataclass(frozen=True, slots=True)
class ExistingAlertResolved:
    """Placeholder for the `alert_changed` event of an alert stored before this batch: the writer
    resolves it and publishes the event only if the alert was not resolved already."""

    alert_id: str
    node_id: str


PlannedEvent = ev.EventDraft | ExistingAlertResolved


@dataclass
class IngestPlan:
    """Everything one batch changes, to be written in one transaction.

    Attributes:
        snapshots: history rows to insert (not duplicates).
        states: the final current state of every thread the batch changed, one per thread.
        new_alerts: alerts opened in this batch, in their final status (possibly resolved already).
        resolve_alert_ids: alerts stored before this batch that must be resolved now.
        events: events in order; ExistingAlertResolved entries are filled in by the writer.
        event_sources: the snapshot each of `events` follows from, at the same positions (the
            writer gives an event its snapshot's trace context).
        outcomes: one per input snapshot, in input order.
    """

    snapshots: list[StoredSnapshot] = field(default_factory=list)
    states: list[ThreadState] = field(default_factory=list)
    new_alerts: list[Alert] = field(default_factory=list)
    resolve_alert_ids: list[str] = field(default_factory=list)
    events: list[PlannedEvent] = field(default_factory=list)
    event_sources: list[Snapshot] = field(default_factory=list)
    outcomes: list[IngestOutcome] = field(default_factory=list)


class _Planner:
    """Working memory of one plan_ingest call."""

    def __init__(self, now: datetime, horizon: timedelta, new_alert_id: Callable[[], str]) -> None:
        self.now = now
        self.horizon = horizon
        self.new_alert_id = new_alert_id
        self.new_alerts: dict[str, Alert] = {}
        self.plan = IngestPlan()

    def open(self, snapshot: Snapshot, alert_type: AlertType, reason: str) -> tuple[str, ev.EventDraft]:
        alert = open_alert(
            self.new_alert_id(), snapshot.thread_id, snapshot.project_id, alert_type, reason, self.now
        )
        self.new_alerts[alert.alert_id] = alert
        return alert.alert_id, ev.alert_changed_event(alert, snapshot.node_id)

    def resolve(self, alert_id: str, node_id: str) -> PlannedEvent:
        alert = self.new_alerts.get(alert_id)
        if alert is None:
            self.plan.resolve_alert_ids.append(alert_id)
            return ExistingAlertResolved(alert_id, node_id)
        resolved = resolve(alert, self.now)
        self.new_alerts[alert_id] = resolved
        return ev.alert_changed_event(resolved, node_id)

    def apply(
        self,
        snapshot: Snapshot,
        level: ContextBudgetLevel,
        previous: ThreadHead | None,
        compaction_near: bool,
    ) -> ThreadState:
        """Makes `snapshot` the thread's current state; plans its alerts and events (`compaction_near`:
        `compaction_is_near(snapshot, horizon)`)."""
        previous_level = previous.level if previous is not None else None
        level_alert_id = previous.level_alert_id if previous is not None else None
        risk_alert_id = previous.compaction_risk_alert_id if previous is not None else None
        follow_ups: list[PlannedEvent] = []
        level_changed = level is not previous_level
        if level_changed:
            if level_alert_id is not None:
                follow_ups.append(self.resolve(level_alert_id, snapshot.node_id))
                level_alert_id = None
            alert_type = level_alert_type(level)
            if alert_type is not None:
                level_alert_id, opened = self.open(snapshot, alert_type, level_alert_reason(snapshot, level))
                follow_ups.append(opened)
        risk_reason = compaction_risk_reason(snapshot, level, self.horizon)
        if risk_reason is not None and risk_alert_id is None:
            risk_alert_id, opened = self.open(snapshot, AlertType.COMPACTION_RISK, risk_reason)
            follow_ups.append(
                ev.compaction_risk_event(
                    ev.THREAD_CONTEXT_COMPACTION_RISK_OPENED, risk_alert_id, risk_reason, snapshot
                )
            )
            follow_ups.append(opened)
        elif risk_reason is None and risk_alert_id is not None:
            follow_ups.append(
                ev.compaction_risk_event(
                    ev.THREAD_CONTEXT_COMPACTION_RISK_RESOLVED,
                    risk_alert_id,
                    f"risk cleared at level {level.value}",
                    snapshot,
                )
            )
            follow_ups.append(self.resolve(risk_alert_id, snapshot.node_id))
            risk_alert_id = None
        if previous is not None and snapshot.compaction_count > previous.compaction_count:
            follow_ups.append(ev.compaction_observed_event(snapshot, previous.compaction_count))

        state = ThreadState(snapshot, level, level_alert_id, risk_alert_id, self.now)
        events = self.plan.events
        events.append(ev.updated_event(state, previous_level, compaction_near=compaction_near))
        if level_changed:
            events.append(ev.level_changed_event(state, previous_level))
        events.extend(follow_ups)
        sources = self.plan.event_sources
        sources.extend([snapshot] * (len(events) - len(sources)))
        return state


def plan_ingest(
    snapshots: Sequence[Snapshot],
    *,
    current: Mapping[str, ThreadHead],
    existing_snapshots: Mapping[str, Snapshot],
    policies: Mapping[str, ThresholdPolicy],
    now: datetime,
    new_alert_id: Callable[[], str],
    horizon: timedelta = DEFAULT_COMPACTION_RISK_HORIZON,
) -> IngestPlan:
    """Plans one batch (module docstring has the rules).

    Args:
        snapshots: validated snapshots in arrival order, each with its reporter's owner_id.
        current: the stored current state (its head) of every thread in the batch that has one.
        existing_snapshots: the stored readings of the batch's snapshot ids that are stored already.
        policies: threshold policies by project_id; "" is the default policy (CB-7 built-in when absent).
        now: the server's instant for updated_at and alert times (UTC).
        new_alert_id: makes a fresh alert id.
        horizon: how close compaction_expected_at must be to captured_at to open compaction_risk.
    """
    planner = _Planner(now, horizon, new_alert_id)
    plan = planner.plan
    default_policy = policies.get("", DEFAULT_POLICY)
    heads: dict[str, ThreadHead] = dict(current)
    changed: dict[str, ThreadState] = {}
    batch_readings: dict[str, Snapshot] = {}
    for snapshot in snapshots:
        snapshot_id = snapshot.snapshot_id
        thread_id = snapshot.thread_id
        previous = heads.get(thread_id)
        if previous is not None and previous.device != snapshot.device:
            plan.outcomes.append(
                IngestOutcome(
                    snapshot_id, thread_id, previous.level, error=thread_bound_to_other_device(thread_id)
                )
            )
            continue
        stored = batch_readings.get(snapshot_id) or existing_snapshots.get(snapshot_id)
        if stored is not None and not stored.same_reading_as(snapshot):
            level = previous.level if previous is not None else ContextBudgetLevel.SAFE
            plan.outcomes.append(
                IngestOutcome(snapshot_id, thread_id, level, error=reused_snapshot_id_error(snapshot_id))
            )
            continue
        if stored is not None:
            level = (
                previous.level
                if previous is not None
                else classify(
                    snapshot.context_budget_remaining_pct, policies.get(snapshot.project_id, default_policy)
                )
            )
            plan.outcomes.append(IngestOutcome(snapshot_id, thread_id, level, duplicate=True))
            continue
        batch_readings[snapshot_id] = snapshot
        level = classify(
            snapshot.context_budget_remaining_pct, policies.get(snapshot.project_id, default_policy)
        )
        if previous is not None and snapshot.order_key <= previous.order_key:
            plan.snapshots.append(StoredSnapshot(snapshot, level, superseded=True))
            plan.outcomes.append(IngestOutcome(snapshot_id, thread_id, previous.level, superseded=True))
            continue
        plan.snapshots.append(StoredSnapshot(snapshot, level, superseded=False))
        near = compaction_is_near(snapshot, horizon)
        state = planner.apply(snapshot, level, previous, near)
        heads[thread_id] = state.head
        changed[thread_id] = state
        plan.outcomes.append(IngestOutcome(snapshot_id, thread_id, level, compaction_near=near))
    plan.states = list(changed.values())
    plan.new_alerts = list(planner.new_alerts.values())
    return plan
