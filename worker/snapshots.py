"""From a Codex thread's budget reading to the `ThreadContextSnapshot` the worker reports, and when.

Pure functions, no I/O (tested with plain values):

- :func:`build_snapshot` maps a :class:`~worker.codex_sessions.tracker.ThreadBudgetReading` plus what
  the worker knows around it (git state of the thread's folder, its last activity, project and task)
  to the contract message of `protos/boss/context_budget/v1/context_budget.proto` (SPEC CB-6, D-1..D-4).
- :func:`must_finish_before_compaction` applies the CB-8 rules a worker can observe locally.
- :func:`level_for_percent` is the worker's own CB-7 classification (recorded by the server, never
  trusted: the server classifies with its threshold policy).
- :func:`significant_change`, :func:`report_interval_seconds` and :func:`next_report_due` are the
  CB-9 cadence: send at once on a significant change, otherwise re-send the latest snapshot when the
  server's `next_required_report_in_seconds` (30 / 15 / 5 s) has elapsed.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from boss.context_budget.v1 import context_budget_pb2

from boss_common.time import to_timestamp
from worker.codex_sessions.codex_config import LimitSource
from worker.codex_sessions.git_state import GitState
from worker.codex_sessions.tracker import LastActivity, ThreadBudgetReading

Level = context_budget_pb2.ContextBudgetLevel
"""A `boss.context_budget.v1.ContextBudgetLevel` value (an int)."""

SAFE: Level = context_budget_pb2.CONTEXT_BUDGET_LEVEL_SAFE
WATCH: Level = context_budget_pb2.CONTEXT_BUDGET_LEVEL_WATCH
URGENT: Level = context_budget_pb2.CONTEXT_BUDGET_LEVEL_URGENT
CRITICAL: Level = context_budget_pb2.CONTEXT_BUDGET_LEVEL_CRITICAL

SAFE_MIN_PCT = 60.0
WATCH_MIN_PCT = 40.0
URGENT_MIN_PCT = 25.0
"""CB-7 default thresholds (percent 0-100): safe >= 60, watch 40-59, urgent 25-39, critical < 25."""

DEFAULT_REPORT_INTERVAL_SECONDS: dict[Level, int] = {SAFE: 30, WATCH: 15, URGENT: 5, CRITICAL: 5}
"""CB-9 cadence by level, used until the server's first ack names its own interval."""

SIGNIFICANT_PERCENT_CHANGE = 2.0
"""A budget move of at least this many percentage points is a significant change (sent at once)."""

SNAPSHOT_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://boss.dev/context-budget/snapshot")
"""uuid5 namespace of snapshot ids: the one context_budget uses to derive the id of a snapshot sent
without one, so either way a reading gets the same id (fixed forever: changing it breaks
de-duplication)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

LIMIT_SOURCES: dict[LimitSource, context_budget_pb2.CompactionLimitSource] = {
    LimitSource.CONFIGURED: context_budget_pb2.COMPACTION_LIMIT_SOURCE_CONFIGURED,
    LimitSource.MODEL_DEFAULT: context_budget_pb2.COMPACTION_LIMIT_SOURCE_MODEL_DEFAULT,
    LimitSource.ASSUMED: context_budget_pb2.COMPACTION_LIMIT_SOURCE_ASSUMED,
}
"""A reading's limit source as the contract's enum."""

MAX_FILES_IN_REASON = 5
"""How many changed files `must_finish_reason` names before it abbreviates with an ellipsis."""

MAX_COMMAND_CHARS_IN_REASON = 80
"""A test command quoted in `must_finish_reason` is cut to this many characters."""

MAX_REASON_CHARS = 2_000
"""context_budget accepts a `must_finish_reason` of at most this many characters."""

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class ThreadFacts:
    """What the worker knows about a thread besides its budget reading.

    Attributes:
        git_state: git state of the thread's working folder, None when unknown (not a repository,
            folder gone, git missing, not read yet).
        last_activity: the thread's last agent message, tool call and test run (from the rollout).
        project_id: the Boss project the thread belongs to, empty until it is placed in one.
        task_id: the task the thread is running, empty when unknown.
    """

    git_state: GitState | None = None
    last_activity: LastActivity | None = None
    project_id: str = ""
    task_id: str = ""


@dataclass(frozen=True)
class MustFinish:
    """CB-8 verdict: whether the thread holds something to make durable before compaction, and why."""

    required: bool
    reason: str


def level_for_percent(percent: float) -> Level:
    """The CB-7 default level of a budget percent (0-100): safe >= 60, watch >= 40, urgent >= 25,
    else critical."""
    if percent >= SAFE_MIN_PCT:
        return SAFE
    if percent >= WATCH_MIN_PCT:
        return WATCH
    if percent >= URGENT_MIN_PCT:
        return URGENT
    return CRITICAL


def level_name(level: Level) -> str:
    """Lower-case name of a level ("safe", "watch", "urgent", "critical", "unspecified")."""
    name = context_budget_pb2.ContextBudgetLevel.Name(level)
    return name.removeprefix("CONTEXT_BUDGET_LEVEL_").lower()


def snapshot_id_for(worker_id: str, thread_id: str, snapshot_version: int, captured_at: datetime) -> str:
    """Stable snapshot id: uuid5 over (worker_id, thread_id, snapshot_version, captured_at).

    The name is `worker_id, thread_id, snapshot_version, captured_at in microseconds since the Unix
    epoch`, joined by newlines: the derivation context_budget applies to a snapshot sent without an
    id. The same reading always gets the same id, so a re-sent snapshot (heartbeat, reconnect) is a
    duplicate on the server, never a second row. Raises ValueError for a naive `captured_at`.
    """
    if captured_at.tzinfo is None:
        raise ValueError("captured_at must be timezone-aware")
    micros = (captured_at - _EPOCH) // timedelta(microseconds=1)
    name = f"{worker_id}\n{thread_id}\n{snapshot_version}\n{micros}"
    return str(uuid.uuid5(SNAPSHOT_ID_NAMESPACE, name))


def uncommitted_changes_reason(paths: Sequence[str]) -> str:
    """E.g. "uncommitted changes in 3 files: a.py, b.py, c.py" (at most MAX_FILES_IN_REASON names)."""
    count = len(paths)
    names = ", ".join(paths[:MAX_FILES_IN_REASON])
    if count > MAX_FILES_IN_REASON:
        names += ", …"
    noun = "file" if count == 1 else "files"
    return f"uncommitted changes in {count} {noun}: {names}"


def unrecorded_test_reason(activity: LastActivity | None) -> str | None:
    """Why the thread holds an unrecorded test conclusion, or None when it does not.

    A test run counts as unrecorded when it finished (outcome passed, failed or unknown) and no agent
    message came after its output: the conclusion exists only in a tool output, which compaction
    would summarise away (CB-8 "unrecorded test conclusions"). A run still in progress does not count.
    """
    if activity is None or activity.last_test_run is None:
        return None
    test = activity.last_test_run
    finished_at = test.run.finished_at
    if test.outcome == "running" or finished_at is None:
        return None
    message_at = activity.last_agent_message_at
    if message_at is not None and message_at >= finished_at:
        return None
    command = test.run.command or test.run.tool_name
    if len(command) > MAX_COMMAND_CHARS_IN_REASON:
        command = command[: MAX_COMMAND_CHARS_IN_REASON - 1] + "…"
    detail = f" ({test.summary})" if test.summary else ""
    return f"test result not yet summarised: `{command}` {test.outcome}{detail}"


def must_finish_before_compaction(git_state: GitState | None, activity: LastActivity | None) -> MustFinish:
    """The CB-8 rules a worker can observe, joined with "; " when several hold.

    - an uncommitted patch: the thread's git working folder has changed, staged or untracked files;
    - unrecorded test conclusions: see :func:`unrecorded_test_reason`.

    Not observable locally, so never set here: key decisions missing from project memory, an
    uninterruptible hardware step, waiting on another node's reply (the master agent sets those).
    """
    reasons = []
    if git_state is not None and git_state.has_uncommitted_changes:
        reasons.append(uncommitted_changes_reason([changed.path for changed in git_state.changed_files]))
    test_reason = unrecorded_test_reason(activity)
    if test_reason is not None:
        reasons.append(test_reason)
    return MustFinish(required=bool(reasons), reason=clean_reason("; ".join(reasons)))


def clean_reason(text: str) -> str:
    """`text` fit for `must_finish_reason`: ANSI colour codes are removed, other control characters
    (e.g. a newline in a file name) become spaces, and it is cut to MAX_REASON_CHARS with an ellipsis."""
    text = _CONTROL_CHARACTERS.sub(" ", _ANSI_ESCAPE.sub("", text))
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return text


def without_stale_prediction(reading: ThreadBudgetReading, now: datetime) -> ThreadBudgetReading:
    """The reading without `compaction_expected_at` when that instant has already passed.

    The prediction extrapolates the thread's recent growth from `captured_at`; a thread that went
    idle (say a session from last week) would otherwise report a compaction "expected" in the past.
    Codex only compacts on new activity, so a past prediction is no prediction (SPEC D-2: absent, not
    invented).
    """
    expected = reading.compaction_expected_at
    if expected is None or expected > now:
        return reading
    return dataclasses.replace(reading, compaction_expected_at=None)


def build_snapshot(
    reading: ThreadBudgetReading,
    *,
    thread_id: str,
    worker_id: str,
    node_id: str,
    facts: ThreadFacts | None = None,
    captured_at: datetime | None = None,
) -> context_budget_pb2.ThreadContextSnapshot:
    """The `ThreadContextSnapshot` for one reading (source WORKER_ESTIMATOR, SPEC D-4).

    Args:
        reading: the tracker's reading (percent 0-100, tokens, aware UTC datetimes).
        thread_id: the Codex thread id (the reading's, else the one from the rollout file name).
        worker_id, node_id: this worker; must match its token.
        facts: git state, last activity, project and task; empty facts when None.
        captured_at: when the reported state was observed (aware UTC). Defaults to the reading's
            `captured_at`; the agent passes a later instant when only the facts changed (e.g. the
            user committed), so the new state gets its own snapshot id.

    Returns:
        The message with snapshot_version = reading_sequence, the stable id of
        :func:`snapshot_id_for`, the worker's own CB-7 level, every D-1 raw figure with where L came
        from, the CB-8 verdict and codex_folder = the session's cwd. D-2 estimates stay unset when
        the reading has none; a reading awaiting its first measurement after a compaction sets
        `awaiting_reading_after_compaction` and leaves `codex_context_left_pct` unset.
    """
    facts = facts or ThreadFacts()
    when = captured_at or reading.captured_at
    verdict = must_finish_before_compaction(facts.git_state, facts.last_activity)
    snapshot = context_budget_pb2.ThreadContextSnapshot(
        snapshot_id=snapshot_id_for(worker_id, thread_id, reading.reading_sequence, when),
        project_id=facts.project_id,
        task_id=facts.task_id,
        thread_id=thread_id,
        node_id=node_id,
        worker_id=worker_id,
        source_kind=context_budget_pb2.SOURCE_KIND_WORKER_ESTIMATOR,
        context_budget_remaining_pct=reading.context_budget_remaining_pct,
        context_budget_level=level_for_percent(reading.context_budget_remaining_pct),
        must_finish_before_compaction=verdict.required,
        must_finish_reason=verdict.reason,
        compaction_count=reading.compaction_count,
        snapshot_version=reading.reading_sequence,
        captured_at=to_timestamp(when),
        last_total_tokens=reading.last_total_tokens,
        model_context_window=reading.model_context_window,
        auto_compact_token_limit=reading.auto_compact_token_limit,
        compaction_limit_source=LIMIT_SOURCES[reading.compaction_limit_source],
        awaiting_reading_after_compaction=reading.awaiting_reading_after_compaction,
        codex_folder=reading.cwd or "",
    )
    if reading.codex_context_left_pct is not None:
        snapshot.codex_context_left_pct = reading.codex_context_left_pct
    if reading.compaction_expected_at is not None:
        snapshot.compaction_expected_at.CopyFrom(to_timestamp(reading.compaction_expected_at))
    if reading.last_compaction_at is not None:
        snapshot.last_compaction_at.CopyFrom(to_timestamp(reading.last_compaction_at))
    if reading.estimated_remaining_turns is not None:
        snapshot.estimated_remaining_turns = reading.estimated_remaining_turns
    if reading.estimated_remaining_large_messages is not None:
        snapshot.estimated_remaining_large_messages = reading.estimated_remaining_large_messages
    return snapshot


def same_reported_state(
    first: context_budget_pb2.ThreadContextSnapshot, second: context_budget_pb2.ThreadContextSnapshot
) -> bool:
    """True when two snapshots report the same state, ignoring their id and capture instant."""
    first_copy, second_copy = type(first)(), type(second)()
    first_copy.CopyFrom(first)
    second_copy.CopyFrom(second)
    for copy in (first_copy, second_copy):
        copy.ClearField("snapshot_id")
        copy.ClearField("captured_at")
    return first_copy == second_copy


def significant_change(
    previous: context_budget_pb2.ThreadContextSnapshot | None,
    current: context_budget_pb2.ThreadContextSnapshot,
) -> str | None:
    """Why `current` must be sent at once rather than with the next heartbeat (CB-9), or None.

    Compared with the last snapshot *sent* for the thread (so slow drift adds up): the first report
    of a thread; a level change (the worker's CB-7 level); a change of compaction_count; the first
    reading after a compaction (awaiting_reading_after_compaction cleared: the shown "compacted,
    waiting for the first reading" must give way at once, however close the reading is to the 100 %
    placeholder); a flip of must_finish_before_compaction; or the percent moving by >=
    SIGNIFICANT_PERCENT_CHANGE points.
    """
    if previous is None:
        return "first report"
    if current.context_budget_level != previous.context_budget_level:
        return (
            f"level {level_name(previous.context_budget_level)} -> {level_name(current.context_budget_level)}"
        )
    if current.compaction_count != previous.compaction_count:
        return f"compaction count {previous.compaction_count} -> {current.compaction_count}"
    if previous.awaiting_reading_after_compaction and not current.awaiting_reading_after_compaction:
        return "first reading after the compaction"
    if current.must_finish_before_compaction != previous.must_finish_before_compaction:
        state = "set" if current.must_finish_before_compaction else "cleared"
        return f"must finish before compaction {state}"
    moved = current.context_budget_remaining_pct - previous.context_budget_remaining_pct
    if abs(moved) >= SIGNIFICANT_PERCENT_CHANGE:
        return f"moved {moved:+.1f} points"
    return None


def report_interval_seconds(server_interval_seconds: int | None, level: Level) -> int:
    """Seconds between reports of a thread: the server's value from its last ack when it gave one
    (> 0), else the CB-9 default of `level` (30 safe, 15 watch, 5 urgent or critical; 30 when the
    level is unspecified)."""
    if server_interval_seconds is not None and server_interval_seconds > 0:
        return server_interval_seconds
    return DEFAULT_REPORT_INTERVAL_SECONDS.get(level, DEFAULT_REPORT_INTERVAL_SECONDS[SAFE])


def next_report_due(last_sent_at: float, server_interval_seconds: int | None, level: Level) -> float:
    """When the thread's next heartbeat is due, in the same clock as `last_sent_at` (seconds).

    `server_interval_seconds` is `next_required_report_in_seconds` of the thread's last ack (None
    before any ack) and wins over the level's default (see :func:`report_interval_seconds`).
    """
    return last_sent_at + report_interval_seconds(server_interval_seconds, level)
