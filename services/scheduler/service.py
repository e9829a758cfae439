"""The scheduler's service layer: small handlers, each one unit of work (one transaction) that writes
its state changes and outbox events together.

Commands (imperative): ApplyBudgetEvents (the consumer's batch handler), UploadHandoffPackage,
ConsumeHandoffPackage, AckWorkerCommand, SetMustFinishBeforeCompaction, SetThreadWorkFacts,
ExpireHandoffPackages. Events (past tense) published: thread.handoff.required, thread.handoff.ready,
thread.handoff.consumed, thread.handoff.expired, thread.handoff.closed (a compaction ended the
thread's handoff cycle: it no longer presents its draft or ready package, whose own status is
unchanged), thread.schedule.updated; and, from the
`StrategyPublisher` (services/scheduler/strategy_publisher.py) after handlers mark the projects they
changed, project.context_strategy.updated.

`handoff_missing` alerts are kept here (table `handoff_alerts`), not in context_budget: the scheduler
is the only context that knows whether a package was ready when the compaction showed, and contexts
never write each other's tables. The alert is announced with `thread.handoff.required`
(reason "handoff_missing").
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from services.scheduler.adapters.repository import AlertRow, CommandRow, SqlAlchemySchedulerRepository
from services.scheduler.domain.guarantee import AppliedReport, Decision, apply_reports
from services.scheduler.domain.handoff import (
    HandoffPackage,
    PackageContent,
    check_transition,
    draft_checklist,
    is_expired,
    normalise_checklist,
)
from services.scheduler.domain.model import (
    BudgetReport,
    PackageStatus,
    SchedulerSettings,
    ThreadState,
    parse_level,
)
from services.scheduler.domain.ranking import (
    RankedThread,
    WorkChoice,
    choose_thread_for_work,
    rank_threads,
    strategy_summary,
)
from services.scheduler.metrics import count_compactions
from services.scheduler.strategy_publisher import StrategyPublisher
from services.shared.auth import DEFAULT_OWNER_ID
from services.shared.db import Database
from services.shared.devices import THREAD_MOVED_EVENT, RevocationStore
from services.shared.errors import (
    COMMAND_NOT_FOUND,
    PACKAGE_NOT_FOUND,
    THREAD_NOT_FOUND,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from services.shared.identifiers import id_problem
from services.shared.outbox import EventLog, NewEvent, StoredEvent
from services.shared.time import isoformat_utc, utc_now

log = logging.getLogger(__name__)

BUDGET_EVENT = "thread.context.updated"


def _parse_time(value: Any) -> datetime | None:
    """An aware datetime from RFC 3339 text (None for empty / null)."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def report_from_event(event: StoredEvent) -> BudgetReport | None:
    """The BudgetReport in a `thread.context.updated` event; None (logged) when it names no thread or
    has no capture time."""
    payload = event.payload
    thread_id = str(payload.get("thread_id") or event.thread_id or "")
    captured_at = _parse_time(payload.get("captured_at"))
    if not thread_id or captured_at is None:
        log.warning("event %s: %s without thread_id or captured_at; skipped", event.sequence, event.type)
        return None
    return BudgetReport(
        thread_id=thread_id,
        project_id=str(payload.get("project_id") or event.project_id or ""),
        task_id=str(payload.get("task_id") or ""),
        node_id=str(payload.get("node_id") or event.node_id or ""),
        worker_id=str(payload.get("worker_id") or ""),
        codex_folder=str(payload.get("codex_folder") or ""),
        level=parse_level(payload.get("context_budget_level")),
        remaining_pct=float(payload.get("context_budget_remaining_pct") or 0.0),
        must_finish=bool(payload.get("must_finish_before_compaction")),
        must_finish_reason=str(payload.get("must_finish_reason") or ""),
        compaction_expected_at=_parse_time(payload.get("compaction_expected_at")),
        compaction_count=int(payload.get("compaction_count") or 0),
        last_compaction_at=_parse_time(payload.get("last_compaction_at")),
        snapshot_version=int(payload.get("snapshot_version") or 0),
        captured_at=captured_at,
        last_total_tokens=int(payload.get("last_total_tokens") or 0),
        # Events from before they named the owner were all the default owner's.
        owner_id=str(payload.get("owner_id") or DEFAULT_OWNER_ID),
    )


def package_payload(package: HandoffPackage, owner_id: str = "") -> dict[str, Any]:
    """The event payload describing a package's status: its ids, status and instants (RFC 3339
    UTC), `missing_items` (the CB-18 items the worker looked for and did not find) and
    `checklist_details` (item -> the checklist's detail in words, as GetHandoffPackage shows it),
    so that a projection shows the same checklist as the scheduler; `owner_id`: the owner of the
    package's thread ("" when the scheduler does not know the thread)."""
    missing = [entry.item for entry in package.content.checklist if entry.status == "missing"]
    return {
        "owner_id": owner_id,
        "handoff_package_id": package.handoff_package_id,
        "thread_id": package.from_thread_id,
        "from_thread_id": package.from_thread_id,
        "to_thread_id": package.to_thread_id,
        "project_id": package.project_id,
        "node_id": package.node_id,
        "package_status": package.package_status.value,
        "created_at": isoformat_utc(package.created_at),
        "ready_at": isoformat_utc(package.ready_at),
        "consumed_at": isoformat_utc(package.consumed_at),
        "missing_items": missing,
        "checklist_details": {entry.item: entry.detail for entry in package.content.checklist},
    }


def schedule_payload(state: ThreadState) -> dict[str, Any]:
    """The `thread.schedule.updated` payload: the thread's CB-7 flags and handoff state."""
    return {
        "owner_id": state.owner_id,
        "thread_id": state.thread_id,
        "project_id": state.project_id,
        "node_id": state.node_id,
        "context_budget_level": state.level.value if state.level else None,
        "no_large_context_appends": state.no_large_context_appends,
        "finish_current_subtask": state.finish_current_subtask,
        "context_growth_frozen": state.context_growth_frozen,
        "relay_thread_id": state.relay_thread_id,
        "handoff_package_id": state.current_package_id,
        "package_status": state.current_package_status.value if state.current_package_status else None,
        "must_finish_before_compaction": state.must_finish,
        "must_finish_reason": state.must_finish_reason,
    }


def check_request_id(field: str, value: str) -> None:
    """Raises InvalidArgument naming `field` for an empty id, one over MAX_ID_LENGTH (200)
    characters, or one holding a control or bidirectional formatting character (PostgreSQL cannot
    even hold NUL: bad input, not an internal error; and a NOT_FOUND echoing a huge id would not
    fit in gRPC's trailing metadata)."""
    problem = id_problem(value)
    if problem is not None:
        raise InvalidArgument([FieldViolation(field, problem)])


def _visible(state: ThreadState, owner_id: str | None) -> bool:
    """Whether a caller acting for `owner_id` (None: every owner) may see the thread."""
    return owner_id is None or state.owner_id == owner_id


def _reports_of(events: list[StoredEvent]) -> list[BudgetReport]:
    """The budget reports among `events`, in order (other event types and malformed reports left
    out, see `report_from_event`)."""
    return [report for event in events if event.type == BUDGET_EVENT if (report := report_from_event(event))]


@dataclass(frozen=True)
class _DecidedAhead:
    """Decisions made for upcoming events before their batch began (SchedulerHandlers, "Deciding
    ahead"): the events' sequences, their reports, the state each thread started from (None: not
    known, taken as new), the applied reports and the states after them."""

    sequences: tuple[int, ...]
    reports: list[BudgetReport]
    started_from: dict[str, ThreadState | None]
    applied: list[AppliedReport]
    states: dict[str, ThreadState]


class SchedulerHandlers:
    """The scheduler's handlers over one database, repository and outbox.

    Args:
        database: the scheduler's database.
        event_log: its outbox.
        settings: horizon, time to live, idle and redelivery rules.
        new_id: fresh unique ids (uuid4 hex by default; injectable for tests).
        clock: the current time (UTC).

    Attributes:
        strategies: the StrategyPublisher the handlers mark changed projects on; its `run()` is
            one of the service's background tasks.
        upcoming: returns the events the consumer has received after the batch in flight (its
            `EventConsumer.upcoming`; none by default). See "Deciding ahead" below.
        batches_decided_ahead / batches_redecided: how many batches reused decisions made ahead,
            and how many had to decide again because a state changed meanwhile.
        revocation_store: where revocations from the conversations service are kept (None: this
            process follows none; `server.build` sets it).

    Deciding ahead (PostgreSQL): once a batch's decisions are made, and while its writes run, the
    handler decides the next batch's reports (`upcoming`) from the states it just decided and
    the states it keeps of earlier writes. The next batch reuses those decisions only if its own
    read returns, for every thread involved, exactly the state object they started from (the
    repository returns its kept object only while the row still carries the version this process
    wrote, see `SqlAlchemySchedulerRepository.threads_by_id`); otherwise, e.g. after an RPC or
    another process changed a thread or the batch rolled back, it decides again. Decisions are a
    pure function of the prior state and the report (`apply_reports`), so both paths store the same
    outcome; deciding ahead only moves CPU into the time the database works.
    """

    def __init__(
        self,
        database: Database,
        event_log: EventLog,
        settings: SchedulerSettings | None = None,
        new_id: Callable[[], str] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.database = database
        self.event_log = event_log
        self.settings = settings or SchedulerSettings()
        self.repository = SqlAlchemySchedulerRepository(database.dialect)
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        self._clock = clock
        self.strategies = StrategyPublisher(database, event_log, self.repository, self.settings, clock)
        self._batch_projects: dict[str, bool] = {}
        self._batch_states: list[ThreadState] = []
        # Per compaction the batch in flight saw: whether its package was ready (metrics.py).
        self._batch_compactions: list[bool] = []
        self.upcoming: Callable[[], list[StoredEvent]] = list
        self._ahead: _DecidedAhead | None = None
        self.batches_decided_ahead = 0
        self.batches_redecided = 0
        self.revocation_store: RevocationStore | None = None

    # ---- consuming context_budget's stream -------------------------------------------------------

    async def apply_budget_events(
        self, connection: AsyncConnection, events: list[StoredEvent]
    ) -> list[NewEvent]:
        """EventConsumer batch handler: applies every `thread.context.updated` in order (other types
        are skipped), persisting states, packages, commands and alerts with one statement per kind;
        returns events to publish. The projects it changed are marked for the strategy publisher
        by `budget_batch_committed` once the consumer committed the batch. Decisions made ahead
        for these events are reused when they still hold (class docstring), and once this batch
        is decided the next one is decided ahead while the writes run."""
        self._batch_projects, self._batch_states, self._batch_compactions = {}, [], []
        ahead = self._ahead_of(events)
        # The reports of the events decided ahead were parsed then; only the rest are parsed here.
        covered = ahead.reports if ahead is not None else []
        reports = covered + _reports_of(events[len(ahead.sequences) :] if ahead is not None else events)
        if not reports:
            return []
        now = self._clock()
        states = await self.repository.threads_by_id(connection, (r.thread_id for r in reports))
        applied = self._decided_ahead(ahead, states) if ahead is not None else None
        if applied is None:
            applied = apply_reports(reports, states, self.settings, self._new_id)
        else:
            applied += apply_reports(reports[len(covered) :], states, self.settings, self._new_id)
        published: list[NewEvent] = []
        command_rows: list[dict[str, Any]] = []
        packages: list[HandoffPackage] = []
        relays: dict[str, str] = {}
        changed: dict[str, ThreadState] = {}
        projects: dict[str, bool] = {}
        for report, previous, decision in applied:
            state = decision.state
            changed[report.thread_id] = state
            urgent = (
                previous is None
                or decision.level_changed
                or previous.must_finish != state.must_finish
                or previous.project_id != state.project_id
            )
            if previous is not None and previous.project_id != state.project_id:
                projects[previous.project_id] = True
            projects[state.project_id] = projects.get(state.project_id, False) or urgent
            await self._persist_decision(
                connection, decision, report, now, command_rows, packages, relays, published
            )
        await self.repository.insert_packages(connection, packages)
        await self.repository.set_package_relays(connection, relays)
        if self.repository.keeps_written_states:
            # Runs as soon as the state upsert below (the batch's longest statement) is on its way.
            asyncio.get_running_loop().call_soon(self._decide_ahead, states)
        await self.repository.save_threads(connection, list(changed.values()), now)
        await self.repository.insert_commands(connection, command_rows)
        self._batch_projects, self._batch_states = projects, list(changed.values())
        self._batch_compactions = [
            not decision.handoff_missing for _report, _previous, decision in applied if decision.compaction
        ]
        return published

    def budget_batch_committed(self) -> None:
        """EventConsumer `after_commit` hook: hands the projects the committed batch changed, and its
        threads' final states, to the strategy publisher (urgent projects are recomputed at once),
        and counts the batch's compactions (`boss.scheduler.compactions`)."""
        projects, self._batch_projects = self._batch_projects, {}
        states, self._batch_states = self._batch_states, []
        compactions, self._batch_compactions = self._batch_compactions, []
        count_compactions(compactions)
        urgent = [project_id for project_id, is_urgent in projects.items() if is_urgent]
        self.strategies.mark(urgent, urgent=True, states=states)
        self.strategies.mark(
            (project_id for project_id, is_urgent in projects.items() if not is_urgent), states=()
        )

    def _decide_ahead(self, latest: dict[str, ThreadState]) -> None:
        """Decides the upcoming events' reports (class docstring, "Deciding ahead") from `latest`
        (the batch in flight's states after its decisions) and the repository's kept states, and
        keeps the result for the next batch. Runs from the event loop while the batch's writes are
        in flight; does nothing when nothing is waiting."""
        self._ahead = None
        events = self.upcoming()
        reports = _reports_of(events)
        if not reports:
            return
        started_from: dict[str, ThreadState | None] = {}
        for report in reports:
            if report.thread_id not in started_from:
                thread_id = report.thread_id
                started_from[thread_id] = latest.get(thread_id) or self.repository.kept_state(thread_id)
        states = {thread_id: state for thread_id, state in started_from.items() if state is not None}
        applied = apply_reports(reports, states, self.settings, self._new_id)
        self._ahead = _DecidedAhead(
            sequences=tuple(event.sequence for event in events),
            reports=reports,
            started_from=started_from,
            applied=applied,
            states=states,
        )

    def _ahead_of(self, events: list[StoredEvent]) -> _DecidedAhead | None:
        """Takes the decisions made ahead, if they are for the events this batch begins with."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if tuple(event.sequence for event in events[: len(ahead.sequences)]) != ahead.sequences:
            self.batches_redecided += 1
            return None
        return ahead

    def _decided_ahead(
        self, ahead: _DecidedAhead, states: dict[str, ThreadState]
    ) -> list[AppliedReport] | None:
        """The decisions made ahead for the start of a batch (whose events begin with the ones
        decided), when they still hold: `states` (just read) holds, for every thread involved, the
        very state they started from. `states` is then advanced past them. None otherwise (decide
        again)."""
        if not all(states.get(thread_id) is state for thread_id, state in ahead.started_from.items()):
            self.batches_redecided += 1
            return None
        self.batches_decided_ahead += 1
        states.update(ahead.states)
        return list(ahead.applied)

    async def _persist_decision(
        self,
        connection: AsyncConnection,
        decision: Decision,
        report: BudgetReport,
        now: datetime,
        command_rows: list[dict[str, Any]],
        packages: list[HandoffPackage],
        relays: dict[str, str],
        published: list[NewEvent],
    ) -> None:
        """Writes what one decision creates (alert) and collects its package, relay, commands and
        events for the batch's bulk writes."""
        state = decision.state
        subject = {
            "owner_id": state.owner_id,
            "thread_id": state.thread_id,
            "project_id": state.project_id,
            "node_id": state.node_id,
        }
        compaction = decision.compaction
        closed_status = compaction.closed_package_status if compaction is not None else None
        if compaction is not None and closed_status in (PackageStatus.DRAFT, PackageStatus.READY):
            # A compaction closed the thread's draft or ready package (an expired or consumed one
            # was over already): the thread no longer presents it.
            published.append(
                NewEvent(
                    "thread.handoff.closed",
                    {
                        **subject,
                        "reason": "compaction",
                        "handoff_package_id": compaction.closed_package_id,
                        "package_status": str(closed_status),
                        "compaction_count": compaction.count,
                    },
                    thread_id=state.thread_id,
                    project_id=state.project_id,
                    node_id=state.node_id,
                )
            )
        if decision.compaction is not None and decision.handoff_missing:
            alert = AlertRow(
                alert_id=self._new_id(),
                thread_id=state.thread_id,
                project_id=state.project_id,
                alert_type="handoff_missing",
                alert_status="opened",
                reason=(
                    f"compaction {decision.compaction.count} happened with no ready handoff package"
                    + (" (prepare_handoff was issued)" if decision.compaction.prepare_issued else "")
                ),
                compaction_count=decision.compaction.count,
                opened_at=now,
                resolved_at=None,
            )
            await self.repository.insert_alert(connection, alert)
            published.append(
                NewEvent(
                    "thread.handoff.required",
                    {
                        **subject,
                        "reason": "handoff_missing",
                        "alert_id": alert.alert_id,
                        "handoff_package_id": decision.compaction.handoff_package_id,
                        "compaction_count": decision.compaction.count,
                        "prepare_handoff_issued": decision.compaction.prepare_issued,
                    },
                    thread_id=state.thread_id,
                    project_id=state.project_id,
                    node_id=state.node_id,
                )
            )
        if decision.new_package is not None:
            packages.append(
                HandoffPackage(
                    handoff_package_id=decision.new_package.handoff_package_id,
                    project_id=state.project_id,
                    task_id=state.task_id,
                    from_thread_id=state.thread_id,
                    to_thread_id=decision.new_package.to_thread_id,
                    node_id=state.node_id,
                    package_status=PackageStatus.DRAFT,
                    content=PackageContent(checklist=draft_checklist()),
                    epoch=state.epoch,
                    created_at=now,
                    expires_at=now + self.settings.handoff_ttl,
                ),
            )
        elif decision.relay_thread_id and state.current_package_id:
            relays.setdefault(state.current_package_id, decision.relay_thread_id)
        for command in decision.commands:
            command_rows.append(
                {
                    "command_id": command.command_id,
                    "command_type": command.command_type.value,
                    "thread_id": state.thread_id,
                    "project_id": state.project_id,
                    "node_id": state.node_id,
                    "worker_id": state.worker_id,
                    "handoff_package_id": command.handoff_package_id,
                    "to_thread_id": command.to_thread_id,
                    "codex_folder": state.codex_folder,
                    "reason": command.reason,
                    "command_status": "pending",
                    "delivery_count": 0,
                    "issued_at": now,
                    "outcome": "",
                    "outcome_detail": "",
                    "owner_id": state.owner_id,
                }
            )
        if decision.handoff_required_reason:
            prepare = decision.commands[-1]
            published.append(
                NewEvent(
                    "thread.handoff.required",
                    {
                        **subject,
                        "reason": decision.handoff_required_reason,
                        "command_id": prepare.command_id,
                        "handoff_package_id": prepare.handoff_package_id,
                        "to_thread_id": prepare.to_thread_id,
                        "context_budget_level": state.level.value if state.level else None,
                        "context_budget_remaining_pct": state.remaining_pct,
                        "compaction_expected_at": isoformat_utc(report.compaction_expected_at),
                    },
                    thread_id=state.thread_id,
                    project_id=state.project_id,
                    node_id=state.node_id,
                )
            )
        if decision.commands or decision.level_changed or decision.new_package or decision.compaction:
            published.append(
                NewEvent(
                    "thread.schedule.updated",
                    schedule_payload(state),
                    thread_id=state.thread_id,
                    project_id=state.project_id,
                    node_id=state.node_id,
                )
            )

    # ---- the conversations service's device events -----------------------------------------------

    async def apply_device_events(
        self, connection: AsyncConnection, batch: list[StoredEvent]
    ) -> list[NewEvent]:
        """Applies conversations' device events (an EventConsumer handler, in its transaction):
        `thread.moved` {owner_id, thread_id, node_id, worker_id} routes the owner's thread (its
        future commands) to that device; `device.revoked` is stored (`revocation_store`, effective
        after the commit: `device_events_committed`). Publishes nothing."""
        for event in batch:
            if event.type != THREAD_MOVED_EVENT:
                continue
            payload = event.payload
            values = [
                str(payload.get(name) or "") for name in ("thread_id", "owner_id", "node_id", "worker_id")
            ]
            if not all(values):
                log.warning("thread.moved %s lacks a thread, owner or device; skipped", event.sequence)
                continue
            await self.repository.move_thread(connection, *values)
        if self.revocation_store is not None:
            await self.revocation_store.apply(connection, batch)
        return []

    def device_events_committed(self) -> None:
        """After a batch of device events committed: its revocations take effect."""
        if self.revocation_store is not None:
            self.revocation_store.committed()

    # ---- reads -----------------------------------------------------------------------------------

    async def rank(
        self, project_id: str = "", limit: int = 0, owner_id: str | None = None
    ) -> tuple[list[RankedThread], str]:
        """Ranked threads (all, or one project's; with `owner_id` only that owner's) and the
        strategy summary."""
        async with self.database.read() as connection:
            states = await self.repository.threads(connection, project_id, owner_id)
        ranked = rank_threads(states)
        choice = (
            choose_thread_for_work(states, self._clock(), self.settings.idle_after) if project_id else None
        )
        summary = strategy_summary(ranked, choice)
        return (ranked[:limit] if limit > 0 else ranked), summary

    async def choose_thread(
        self, project_id: str, exclude: frozenset[str], owner_id: str | None = None
    ) -> WorkChoice:
        """The best thread of a project for new work (with `owner_id`, among that owner's threads).
        Raises InvalidArgument for an empty project_id."""
        if not project_id:
            raise InvalidArgument([FieldViolation("project_id", "is required")])
        async with self.database.read() as connection:
            states = await self.repository.threads(connection, project_id, owner_id)
        return choose_thread_for_work(states, self._clock(), self.settings.idle_after, exclude)

    async def thread_schedule(
        self, thread_id: str, owner_id: str | None = None
    ) -> tuple[ThreadState, HandoffPackage | None]:
        """A thread's state and its current package. NotFound for an unknown thread, and (with
        `owner_id`) for another owner's: the same answer."""
        check_request_id("thread_id", thread_id)
        async with self.database.read() as connection:
            state = await self.repository.thread(connection, thread_id)
            if state is None or not _visible(state, owner_id):
                raise NotFound(f"thread {thread_id} is unknown to the scheduler", reason=THREAD_NOT_FOUND)
            package = (
                await self.repository.package(connection, state.current_package_id)
                if state.current_package_id
                else None
            )
        return state, package

    async def package(self, handoff_package_id: str, owner_id: str | None = None) -> HandoffPackage:
        """One package. NotFound for an unknown id, and (with `owner_id`) for a package of another
        owner's thread: the same answer."""
        check_request_id("handoff_package_id", handoff_package_id)
        async with self.database.read() as connection:
            package = await self.repository.package(connection, handoff_package_id)
            state = (
                await self.repository.thread(connection, package.from_thread_id)
                if package is not None and owner_id is not None
                else None
            )
        if package is None or (owner_id is not None and (state is None or not _visible(state, owner_id))):
            raise NotFound(f"handoff package {handoff_package_id} does not exist", reason=PACKAGE_NOT_FOUND)
        return package

    async def packages_of_thread(self, thread_id: str, owner_id: str | None = None) -> list[HandoffPackage]:
        """A thread's packages, newest first; none for another owner's thread (with `owner_id`),
        as for an unknown one."""
        check_request_id("thread_id", thread_id)
        async with self.database.read() as connection:
            if owner_id is not None:
                state = await self.repository.thread(connection, thread_id)
                if state is None or not _visible(state, owner_id):
                    return []
            return await self.repository.packages_of_thread(connection, thread_id)

    async def alerts(
        self, thread_id: str, project_id: str, open_only: bool, owner_id: str | None = None
    ) -> list[AlertRow]:
        """handoff_missing alerts, newest first (with `owner_id`, only of that owner's threads)."""
        async with self.database.read() as connection:
            return await self.repository.alerts(connection, thread_id, project_id, open_only, owner_id)

    # ---- master-agent changes --------------------------------------------------------------------

    async def set_must_finish(self, thread_id: str, must_finish: bool, reason: str) -> ThreadState:
        """Sets or clears the master's CB-8 flag. InvalidArgument without a reason when setting;
        NotFound for an unknown thread. The worker's own flag is unaffected."""
        violations = []
        if not thread_id:
            violations.append(FieldViolation("thread_id", "is required"))
        if must_finish and not reason.strip():
            violations.append(FieldViolation("reason", "required when setting must_finish_before_compaction"))
        if violations:
            raise InvalidArgument(violations)
        return await self._update_thread(
            thread_id,
            lambda s: replace(
                s,
                master_must_finish=must_finish,
                master_must_finish_reason=reason.strip() if must_finish else "",
            ),
        )

    async def set_work_facts(
        self, thread_id: str, importance: int, patch: bool, tests: bool, hardware: bool, busy: bool
    ) -> ThreadState:
        """Records the ranking's task facts. InvalidArgument for importance outside 0-100."""
        violations = []
        if not thread_id:
            violations.append(FieldViolation("thread_id", "is required"))
        if not 0 <= importance <= 100:
            violations.append(FieldViolation("task_importance", "must be between 0 and 100"))
        if violations:
            raise InvalidArgument(violations)
        return await self._update_thread(
            thread_id,
            lambda s: replace(
                s,
                task_importance=importance,
                unsolidified_patch=patch,
                unsolidified_test_results=tests,
                hardware_test_in_progress=hardware,
                busy=busy,
            ),
        )

    async def _update_thread(
        self, thread_id: str, change: Callable[[ThreadState], ThreadState]
    ) -> ThreadState:
        now = self._clock()
        async with self.database.transaction() as connection:
            state = await self.repository.thread(connection, thread_id)
            if state is None:
                raise NotFound(f"thread {thread_id} is unknown to the scheduler", reason=THREAD_NOT_FOUND)
            state = change(state)
            await self.repository.save_threads(connection, [state], now)
            events = [
                NewEvent(
                    "thread.schedule.updated",
                    schedule_payload(state),
                    thread_id=state.thread_id,
                    project_id=state.project_id,
                    node_id=state.node_id,
                )
            ]
            appended = await self.event_log.append(connection, events)
        self.event_log.kick(appended)
        self.strategies.mark([state.project_id], urgent=True)
        return state

    # ---- handoff packages ------------------------------------------------------------------------

    async def upload_package(
        self,
        worker_id: str,
        node_id: str,
        command_id: str,
        handoff_package_id: str,
        content: PackageContent,
        owner_id: str | None = None,
    ) -> HandoffPackage:
        """A worker's package: draft|ready -> ready. Idempotent for a repeated command_id.

        Publishes `thread.handoff.ready` (`package_payload` plus `current_for_thread`: false for a
        package a compaction closed, which becomes ready but is not the thread's current package
        again). Raises InvalidArgument (missing ids), NotFound (unknown package, or one of another
        owner's thread when `owner_id` is given), PermissionDenied (the thread belongs to another
        worker or node), FailedPrecondition (consumed or expired).
        """
        violations = [
            FieldViolation(name, "is required")
            for name, value in (
                ("worker_id", worker_id),
                ("node_id", node_id),
                ("handoff_package.handoff_package_id", handoff_package_id),
            )
            if not value
        ]
        if violations:
            raise InvalidArgument(violations)
        now = self._clock()
        async with self.database.transaction() as connection:
            package = await self.repository.package(connection, handoff_package_id, for_update=True)
            if package is None:
                raise NotFound(
                    f"handoff package {handoff_package_id} does not exist", reason=PACKAGE_NOT_FOUND
                )
            state = await self.repository.thread(connection, package.from_thread_id)
            if owner_id is not None and (state is None or state.owner_id != owner_id):
                raise NotFound(
                    f"handoff package {handoff_package_id} does not exist", reason=PACKAGE_NOT_FOUND
                )
            owner = (state.worker_id, state.node_id) if state else ("", package.node_id)
            if owner != (worker_id, node_id):
                raise PermissionDenied(
                    f"thread {package.from_thread_id} belongs to worker {owner[0]!r} on node {owner[1]!r}",
                    reason="NOT_THREAD_OWNER",
                )
            if (
                command_id
                and package.last_command_id == command_id
                and package.package_status is PackageStatus.READY
            ):
                return package
            if is_expired(package.package_status, package.expires_at, now):
                raise FailedPrecondition(
                    f"handoff package {handoff_package_id} expired", reason="PACKAGE_EXPIRED"
                )
            check_transition(handoff_package_id, package.package_status, PackageStatus.READY)
            content = replace(content, checklist=normalise_checklist(list(content.checklist)))
            package = replace(
                package,
                package_status=PackageStatus.READY,
                content=content,
                ready_at=now,
                expires_at=now + self.settings.handoff_ttl,
                last_command_id=command_id or package.last_command_id,
            )
            await self.repository.save_package(connection, package)
            # A package a compaction closed (guarantee.py) can still become ready; the thread does
            # not present it again, and says so to the projection.
            is_current = state is not None and state.current_package_id == package.handoff_package_id
            events = [
                NewEvent(
                    "thread.handoff.ready",
                    {
                        **package_payload(package, state.owner_id if state else ""),
                        "current_for_thread": is_current,
                    },
                    thread_id=package.from_thread_id,
                    project_id=package.project_id,
                    node_id=package.node_id,
                )
            ]
            saved = None
            if state is not None and is_current:
                saved = replace(state, current_package_status=PackageStatus.READY)
                await self.repository.save_threads(connection, [saved], now)
            await self.repository.resolve_alerts(connection, package.from_thread_id, now)
            appended = await self.event_log.append(connection, events)
        self.event_log.kick(appended)
        if saved is not None:  # the summary names the package's status: recompute it
            self.strategies.mark([saved.project_id], states=[saved])
        return package

    async def consume_package(
        self,
        handoff_package_id: str,
        consumed_by: str,
        owner_id: str | None = None,
        node_id: str | None = None,
    ) -> HandoffPackage:
        """ready -> consumed by the relay thread (default: the package's to_thread_id).
        NotFound for an unknown id, and for a package the caller may not see: with `owner_id`, of
        another owner's thread; with `node_id` too (a worker), of a thread on another node.
        FailedPrecondition from any other status. Nothing changes on any error."""
        check_request_id("handoff_package_id", handoff_package_id)
        now = self._clock()
        async with self.database.transaction() as connection:
            package = await self.repository.package(connection, handoff_package_id, for_update=True)
            if package is not None and owner_id is not None:
                state = await self.repository.thread(connection, package.from_thread_id)
                if (
                    state is None
                    or state.owner_id != owner_id
                    or (node_id is not None and state.node_id != node_id)
                ):
                    package = None
            if package is None:
                raise NotFound(
                    f"handoff package {handoff_package_id} does not exist", reason=PACKAGE_NOT_FOUND
                )
            check_transition(handoff_package_id, package.package_status, PackageStatus.CONSUMED)
            package = replace(
                package,
                package_status=PackageStatus.CONSUMED,
                consumed_at=now,
                consumed_by_thread_id=consumed_by or package.to_thread_id,
            )
            await self.repository.save_package(connection, package)
            synced = await self._sync_thread_package(connection, package, now)
            await self.event_log.append(
                connection,
                [
                    NewEvent(
                        "thread.handoff.consumed",
                        {**package_payload(package), "consumed_by_thread_id": package.consumed_by_thread_id},
                        thread_id=package.from_thread_id,
                        project_id=package.project_id,
                        node_id=package.node_id,
                    )
                ],
            )
        self.event_log.kick()
        self.strategies.update_states(synced)
        return package

    async def expire_packages(self) -> int:
        """Expires every draft or ready package past its time to live; returns how many."""
        now = self._clock()
        synced: list[ThreadState] = []
        async with self.database.transaction() as connection:
            expired = await self.repository.expirable_packages(connection, now)
            for package in expired:
                synced += await self._expire(connection, package)
        if expired:
            self.event_log.kick()
        self.strategies.update_states(synced)
        return len(expired)

    async def _expire(self, connection: AsyncConnection, package: HandoffPackage) -> list[ThreadState]:
        """Expires one package in the caller's transaction; returns the thread state it saved (at
        most one)."""
        package = replace(package, package_status=PackageStatus.EXPIRED)
        await self.repository.save_package(connection, package)
        synced = await self._sync_thread_package(connection, package, self._clock())
        await self.event_log.append(
            connection,
            [
                NewEvent(
                    "thread.handoff.expired",
                    package_payload(package),
                    thread_id=package.from_thread_id,
                    project_id=package.project_id,
                    node_id=package.node_id,
                )
            ],
        )
        return synced

    async def _sync_thread_package(
        self, connection: AsyncConnection, package: HandoffPackage, now: datetime
    ) -> list[ThreadState]:
        """Copies the package's status onto its thread when it is the thread's current package;
        returns the saved state (none or one), to hand to the strategy publisher after commit."""
        state = await self.repository.thread(connection, package.from_thread_id)
        if state is not None and state.current_package_id == package.handoff_package_id:
            state = replace(state, current_package_status=package.package_status)
            await self.repository.save_threads(connection, [state], now)
            return [state]
        return []

    # ---- worker commands -------------------------------------------------------------------------

    async def ack_command(
        self,
        worker_id: str,
        node_id: str,
        command_id: str,
        outcome: str,
        detail: str,
        owner_id: str | None = None,
    ) -> CommandRow:
        """Acknowledges a command. Idempotent; NotFound for an unknown id, and (with `owner_id`) for
        another owner's command; PermissionDenied when it is another worker's or node's;
        InvalidArgument for a missing id or outcome."""
        violations = [
            FieldViolation(name, "is required")
            for name, value in (("command_id", command_id), ("outcome", outcome))
            if not value
        ]
        if violations:
            raise InvalidArgument(violations)
        now = self._clock()
        async with self.database.transaction() as connection:
            command = await self.repository.command(connection, command_id)
            if command is None or (owner_id is not None and command.owner_id != owner_id):
                raise NotFound(f"command {command_id} does not exist", reason=COMMAND_NOT_FOUND)
            if (command.worker_id, command.node_id) != (worker_id, node_id):
                raise PermissionDenied(
                    f"command {command_id} is for worker {command.worker_id!r} on node {command.node_id!r}",
                    reason="NOT_COMMAND_RECIPIENT",
                )
            if command.command_status != "acked":
                await self.repository.ack_command(connection, command_id, outcome, detail, now)
                command = await self.repository.command(connection, command_id)
        assert command is not None
        return command

    async def follow_commands(
        self, worker_id: str, node_id: str, poll_seconds: float = 1.0, owner_id: str | None = None
    ) -> AsyncIterator[CommandRow]:
        """Commands for a worker on a node (with `owner_id`: of that owner's device, so a device of
        another owner with the same names gets none): every unacknowledged one first, then new ones as their
        transactions commit (woken by the outbox sequencer, else every `poll_seconds`), and again any
        left unacknowledged for `redeliver_after`. Each is counted as delivered before it is yielded.
        Runs until the caller stops iterating, or until the process begins to stop
        (`EventLog.end_followers`): the stream then ends normally, and the worker reconnects (to
        another replica) and gets every command it has not acknowledged again."""
        first = True
        while not self.event_log.followers_ended:
            seen = self.event_log.last_sequence
            marker = self.event_log.change_marker()
            now = self._clock()
            async with self.database.transaction() as connection:
                due = await self.repository.due_commands(
                    connection,
                    worker_id,
                    node_id,
                    now - self.settings.redeliver_after,
                    include_delivered=first,
                    owner_id=owner_id,
                )
                await self.repository.mark_delivered(connection, [c.command_id for c in due], now)
            first = False
            for command in due:
                yield replace(command, command_status="delivered", delivery_count=command.delivery_count + 1)
            await self.event_log.wait_beyond(seen, poll_seconds, marker)
