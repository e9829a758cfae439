"""What the master agent does at each level (CB-7), as flags on the thread and commands to its worker.

| level    | flags set                                   | commands (once per compaction epoch)          |
|----------|---------------------------------------------|-----------------------------------------------|
| safe     | none                                        | none                                          |
| watch    | no_large_context_appends; draft package     | avoid_large_context_append                    |
| urgent   | + finish_current_subtask; relay thread      | + finish_current_subtask, prepare_handoff     |
| critical | + context_growth_frozen                     | + freeze_context_growth, prepare_handoff now  |

These agree with context_budget's ingest ack (`master_actions`): at watch the ack says
avoid_large_context_append + prepare_handoff (here: the draft package is opened, "start preparing");
from urgent on the ack says prepare_handoff and the scheduler sends the command.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from services.scheduler.domain.model import CommandType, Level


@dataclass(frozen=True)
class LevelFlags:
    """CB-7 flags of a thread at one level."""

    no_large_context_appends: bool
    finish_current_subtask: bool
    context_growth_frozen: bool
    needs_draft_package: bool
    needs_relay_thread: bool


@functools.cache
def flags_for(level: Level | None) -> LevelFlags:
    """The CB-7 flags at `level` (no flags for an unknown level). Memoized: five possible inputs,
    asked for every applied report."""
    severity = level.severity if level is not None else 0
    return LevelFlags(
        no_large_context_appends=severity >= Level.WATCH.severity,
        finish_current_subtask=severity >= Level.URGENT.severity,
        context_growth_frozen=severity >= Level.CRITICAL.severity,
        needs_draft_package=severity >= Level.WATCH.severity,
        needs_relay_thread=severity >= Level.URGENT.severity,
    )


@functools.cache
def level_commands(level: Level | None) -> tuple[CommandType, ...]:
    """Commands due at `level` apart from prepare_handoff (which the guarantee decides), in order.
    Memoized, as `flags_for`."""
    severity = level.severity if level is not None else 0
    commands: list[CommandType] = []
    if severity >= Level.WATCH.severity:
        commands.append(CommandType.AVOID_LARGE_CONTEXT_APPEND)
    if severity >= Level.URGENT.severity:
        commands.append(CommandType.FINISH_CURRENT_SUBTASK)
    if severity >= Level.CRITICAL.severity:
        commands.append(CommandType.FREEZE_CONTEXT_GROWTH)
    return tuple(commands)
