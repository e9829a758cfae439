"""The per-thread state machine that applies one budget report: level actions (CB-7) and the
pre-compaction guarantee (CB-3, CB-19).

Guarantee. A thread is *at risk* on a report when its level is urgent or critical, or when its
`compaction_expected_at` is at most `SchedulerSettings.compaction_horizon` after the report's
`captured_at`. On the first at-risk report of a compaction epoch (the span between two compactions)
a `prepare_handoff` command is issued, in the same transaction that stores the report; at critical it
is issued once more unless the package is already ready ("run the wrap-up now"). Reports are applied
in order, and a compaction is only visible in a *later* report (its `compaction_count` grew), so for
every thread whose reports of an epoch passed through urgent/critical or the horizon, a
`prepare_handoff` exists before the report that shows the compaction. When that report arrives and
the epoch's package is not ready (or consumed), the decision carries `handoff_missing`: the service
records a handoff_missing alert and publishes `thread.handoff.required`.

A compaction also ends the handoff cycle of the epoch it closes (CB-6's lifecycle draft -> ready ->
consumed | expired is the package's; which package the thread presents is the thread's): from the
report that shows it, the thread has no current package (`current_package_id` "",
`current_package_status` None) until the new epoch opens its own draft, so a thread never presents
the package made for the context Codex has just compacted away. The package itself is untouched:
its status stays what it was (no rule of the spec turns a compaction into consumed or expired), it
stays readable by id and a relay thread may still consume it. `CompactionSeen.closed_package_id`
names it so that the service can tell the projection (`thread.handoff.closed`).

Pure: ids come from the caller's `new_id`, time from the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from services.scheduler.domain.level_actions import flags_for, level_commands
from services.scheduler.domain.model import (
    AT_RISK_MARKER,
    BudgetReport,
    CommandType,
    Level,
    PackageStatus,
    SchedulerSettings,
    ThreadState,
)


@dataclass(frozen=True)
class CommandIntent:
    """A command to persist for the thread's worker."""

    command_id: str
    command_type: CommandType
    reason: str
    handoff_package_id: str = ""
    to_thread_id: str = ""


@dataclass(frozen=True)
class PackageIntent:
    """A new draft handoff package to create for the thread."""

    handoff_package_id: str
    to_thread_id: str


@dataclass(frozen=True)
class CompactionSeen:
    """A compaction shown by this report.

    Attributes:
        previous_count / count: compaction_count before and after.
        prepare_issued: a prepare_handoff was issued in the epoch that ended.
        was_at_risk: the epoch had at least one at-risk report.
        package_ready: the epoch's package was ready or consumed when the compaction showed.
        handoff_package_id: that package, when any.
        closed_package_id: the package the thread presented as its current one until this report
            ("" when none); the thread no longer presents it (see the module docstring).
        closed_package_status: that package's status as the thread knew it (None when none).
    """

    previous_count: int
    count: int
    prepare_issued: bool
    was_at_risk: bool
    package_ready: bool
    handoff_package_id: str
    closed_package_id: str = ""
    closed_package_status: PackageStatus | None = None


@dataclass(frozen=True)
class Decision:
    """What applying a report changes.

    Attributes:
        state: the thread's new state (the old one when `ignored`).
        ignored: the report is older than (or the same as) the one already applied.
        commands: commands to persist, in order.
        new_package: a draft package to create (before `commands`, which may name it).
        relay_thread_id: set when a relay thread was pre-created by this report.
        compaction: set when this report shows a compaction.
        handoff_missing: the compaction found no ready package (open the alert, publish required).
        handoff_required_reason: set when a prepare_handoff is issued ("context_urgent",
            "context_critical", "compaction_near").
        level_changed: the level differs from the previous report's.
    """

    state: ThreadState
    ignored: bool = False
    commands: tuple[CommandIntent, ...] = ()
    new_package: PackageIntent | None = None
    relay_thread_id: str = ""
    compaction: CompactionSeen | None = None
    handoff_missing: bool = False
    handoff_required_reason: str = ""
    level_changed: bool = False
    was_at_risk_in_epoch: bool = field(default=False)


def _evolve(state: ThreadState, **changes: Any) -> ThreadState:
    """`dataclasses.replace(state, **changes)` for ThreadState, which has no `__post_init__` and no
    `init=False` fields, at a small fraction of its cost (it runs several times per applied report;
    bench/scheduler_bench.py). Raises TypeError for a name that is not a ThreadState field."""
    unknown = changes.keys() - _STATE_FIELDS
    if unknown:
        raise TypeError(f"ThreadState has no field(s) {sorted(unknown)}")
    evolved = object.__new__(ThreadState)
    evolved.__dict__.update(state.__dict__)
    evolved.__dict__.update(changes)
    return evolved


_STATE_FIELDS = frozenset(ThreadState.__dataclass_fields__)


def is_at_risk(report: BudgetReport, settings: SchedulerSettings) -> bool:
    """CB-19's trigger: urgent or critical, or the compaction expected within the horizon."""
    if report.level in (Level.URGENT, Level.CRITICAL):
        return True
    expected = report.compaction_expected_at
    return expected is not None and expected - report.captured_at <= settings.compaction_horizon


def risk_reason(report: BudgetReport) -> str:
    """Why a prepare_handoff is issued: context_critical, context_urgent or compaction_near."""
    if report.level is Level.CRITICAL:
        return "context_critical"
    if report.level is Level.URGENT:
        return "context_urgent"
    return "compaction_near"


def is_stale(state: ThreadState, report: BudgetReport) -> bool:
    """True when `report` is not newer than the applied one (older capture, or same capture and a
    version not above it): applying it again would repeat or undo work."""
    if state.captured_at is None:
        return False
    if report.captured_at != state.captured_at:
        return report.captured_at < state.captured_at
    return report.snapshot_version <= state.snapshot_version


def compaction_seen(previous: ThreadState, compaction_count: int) -> CompactionSeen:
    """What a report with `compaction_count` (above `previous.compaction_count`) shows about the
    epoch it ends: whether a prepare_handoff went out, whether the epoch was at risk, whether its
    package was ready (or consumed), and which package the thread presented until now."""
    package_ready = previous.package_epoch == previous.epoch and previous.current_package_status in (
        PackageStatus.READY,
        PackageStatus.CONSUMED,
    )
    return CompactionSeen(
        previous_count=previous.compaction_count,
        count=compaction_count,
        prepare_issued=previous.prepare_issued_at is not None,
        was_at_risk=previous.wrapping_up,
        package_ready=package_ready,
        handoff_package_id=previous.current_package_id if previous.package_epoch == previous.epoch else "",
        closed_package_id=previous.current_package_id,
        closed_package_status=previous.current_package_status if previous.current_package_id else None,
    )


def end_epoch(state: ThreadState, compaction_count: int) -> ThreadState:
    """The thread's state once a compaction (the new `compaction_count`) is seen: a new epoch with
    no prepare_handoff, commands or relay thread yet, and no current package (the previous one is
    not the thread's any more; its own status is left alone, see the module docstring)."""
    return _evolve(
        state,
        epoch=compaction_count,
        prepare_issued_at=None,
        prepare_issued_at_critical=False,
        commands_sent=frozenset(),
        relay_thread_id="",
        current_package_id="",
        current_package_status=None,
        package_epoch=-1,
    )


def apply_report(
    previous: ThreadState | None,
    report: BudgetReport,
    settings: SchedulerSettings,
    new_id: Callable[[], str],
) -> Decision:
    """Applies one report to a thread's state.

    Args:
        previous: the thread's state, None for a thread never seen.
        report: the report, in the order context_budget applied it.
        settings: the horizon and other rules.
        new_id: returns a fresh unique id (packages, relay threads, commands).

    Returns:
        The Decision; `ignored` for a stale or repeated report (nothing else set).
    """
    state = previous or ThreadState(thread_id=report.thread_id, epoch=report.compaction_count)
    if previous is not None and is_stale(previous, report):
        return Decision(state=previous, ignored=True)

    compaction = None
    handoff_missing = False
    if previous is not None and report.compaction_count > previous.compaction_count:
        compaction = compaction_seen(previous, report.compaction_count)
        handoff_missing = not compaction.package_ready
        state = end_epoch(state, report.compaction_count)

    active = previous is None or report.last_total_tokens != previous.last_total_tokens
    reported: dict[str, Any] = dict(
        project_id=report.project_id or state.project_id,
        task_id=report.task_id,
        node_id=report.node_id or state.node_id,
        worker_id=report.worker_id or state.worker_id,
        owner_id=report.owner_id or state.owner_id,
        codex_folder=report.codex_folder or state.codex_folder,
        level=report.level,
        remaining_pct=report.remaining_pct,
        reported_must_finish=report.must_finish,
        reported_must_finish_reason=report.must_finish_reason if report.must_finish else "",
        compaction_expected_at=report.compaction_expected_at,
        compaction_count=report.compaction_count,
        last_compaction_at=report.last_compaction_at,
        snapshot_version=report.snapshot_version,
        captured_at=report.captured_at,
        last_total_tokens=report.last_total_tokens,
        last_activity_at=report.captured_at if active else state.last_activity_at,
    )
    return _apply_level_actions(
        previous, state, reported, report, settings, new_id, compaction, handoff_missing
    )


class AppliedReport(NamedTuple):
    """One report that changed its thread: the state before it (None for a new thread) and the
    Decision (never `ignored`)."""

    report: BudgetReport
    previous: ThreadState | None
    decision: Decision


def apply_reports(
    reports: Iterable[BudgetReport],
    states: MutableMapping[str, ThreadState],
    settings: SchedulerSettings,
    new_id: Callable[[], str],
) -> list[AppliedReport]:
    """Applies reports in order with `apply_report`, each to its thread's latest state: `states`
    (thread_id -> state, threads not in it are new) is updated in place, so a thread's second report
    in the same call sees its first. Stale or repeated reports are left out of the result."""
    applied: list[AppliedReport] = []
    for report in reports:
        previous = states.get(report.thread_id)
        decision = apply_report(previous, report, settings, new_id)
        if decision.ignored:
            continue
        states[report.thread_id] = decision.state
        applied.append(AppliedReport(report, previous, decision))
    return applied


def _apply_level_actions(
    previous: ThreadState | None,
    state: ThreadState,
    changes: dict[str, Any],
    report: BudgetReport,
    settings: SchedulerSettings,
    new_id: Callable[[], str],
    compaction: CompactionSeen | None,
    handoff_missing: bool,
) -> Decision:
    """CB-7 flags and commands, then the CB-19 prepare_handoff rule. `state` is the thread's state
    before the report (its epoch already ended when the report shows a compaction) and `changes`
    holds the fields the report sets (none of which the rules read); the rules add theirs to it and
    the state is copied once with all of them (one copy per report instead of one per rule)."""
    flags = flags_for(report.level)
    at_risk = is_at_risk(report, settings)
    changes.update(
        no_large_context_appends=flags.no_large_context_appends,
        finish_current_subtask=flags.finish_current_subtask,
        context_growth_frozen=flags.context_growth_frozen,
    )
    relay_thread_id = state.relay_thread_id
    package_id, package_status, package_epoch = (
        state.current_package_id,
        state.current_package_status,
        state.package_epoch,
    )
    has_epoch_package = package_epoch == state.epoch and package_status in (
        PackageStatus.DRAFT,
        PackageStatus.READY,
    )
    new_package = None
    relay = ""
    if (flags.needs_relay_thread or at_risk) and not relay_thread_id:
        relay = relay_thread_id = f"relay-{new_id()}"
        changes["relay_thread_id"] = relay
    if (flags.needs_draft_package or at_risk) and not has_epoch_package:
        new_package = PackageIntent(handoff_package_id=new_id(), to_thread_id=relay_thread_id)
        package_id, package_status, package_epoch = (
            new_package.handoff_package_id,
            PackageStatus.DRAFT,
            state.epoch,
        )
        changes.update(
            current_package_id=package_id,
            current_package_status=package_status,
            package_epoch=package_epoch,
        )

    sent = set(state.commands_sent)
    commands: list[CommandIntent] = []
    reason_text = _level_text(report)
    for command_type in level_commands(report.level):
        if command_type.value in sent:
            continue
        sent.add(command_type.value)
        commands.append(CommandIntent(new_id(), command_type, reason_text, to_thread_id=relay_thread_id))

    required_reason = ""
    package_ready = package_status is PackageStatus.READY and package_epoch == state.epoch
    first_prepare = at_risk and state.prepare_issued_at is None
    critical_prepare = (
        report.level is Level.CRITICAL and not state.prepare_issued_at_critical and not package_ready
    )
    # A package made ready before critical is made again at the first critical report: what the
    # thread ran since (the last command, the last test) belongs in it. It stays ready meanwhile
    # (no "required" again), so the guarantee holds whichever upload the compaction meets.
    critical_refresh = (
        report.level is Level.CRITICAL
        and not state.prepare_issued_at_critical
        and package_ready
        and not first_prepare
    )
    if critical_refresh:
        commands.append(
            CommandIntent(
                new_id(),
                CommandType.PREPARE_HANDOFF,
                f"refresh the ready package at critical: {reason_text}",
                handoff_package_id=package_id,
                to_thread_id=relay_thread_id,
            )
        )
        changes["prepare_issued_at_critical"] = True
    if first_prepare or critical_prepare:
        required_reason = risk_reason(report)
        commands.append(
            CommandIntent(
                new_id(),
                CommandType.PREPARE_HANDOFF,
                f"{required_reason}: {reason_text}",
                handoff_package_id=package_id,
                to_thread_id=relay_thread_id,
            )
        )
        changes.update(
            prepare_issued_at=report.captured_at,
            prepare_issued_at_critical=state.prepare_issued_at_critical or report.level is Level.CRITICAL,
        )
    if at_risk:
        sent.add(AT_RISK_MARKER)
    changes["commands_sent"] = frozenset(sent)
    state = _evolve(state, **changes)
    return Decision(
        state=state,
        commands=tuple(commands),
        new_package=new_package,
        relay_thread_id=relay,
        compaction=compaction,
        handoff_missing=handoff_missing,
        handoff_required_reason=required_reason,
        level_changed=previous is None or previous.level != report.level,
        was_at_risk_in_epoch=AT_RISK_MARKER in sent,
    )


def _level_text(report: BudgetReport) -> str:
    """e.g. "level urgent (31.0 % left)"."""
    level = report.level.value if report.level is not None else "unknown"
    return f"level {level} ({report.remaining_pct:.1f} % left)"
