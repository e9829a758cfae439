"""Follow one Codex thread's records in file order and turn them into context-budget readings.

Pure state machine, no I/O: :class:`ThreadBudgetTracker` is fed :mod:`rollout` records and yields a
:class:`ThreadBudgetReading` for every new *real* reading (a model response's token usage) and for
every compaction, following ``research/codex-context.md`` §2.5, ``research/real-codex.md`` §4-5 and
SPEC D-1..D-3:

- ``token_count`` lines with ``info: null`` are skipped (no response yet), and so are all-zero usages
  (``total_tokens: 0``: nothing was measured, not "100 % left");
- re-emitted lines whose ``total_token_usage`` is unchanged are skipped (Codex re-sends the same info
  on rate-limit updates, codex-rs/core/src/session/mod.rs:2795-2806);
- Codex's post-compaction estimates (every component zero, only a total) are never readings (D-3);
- the ``token_count`` of a local compaction request (0.169: right after the summary message marked
  ``compaction_output``, just before ``compacted``) is that request's own usage, never a reading;
- one compaction is counted per group of ``compacted`` / ``context_compacted`` / ``ContextCompaction``
  item records (any of them may appear alone). The first of them yields at once a reading that says
  "compacted, waiting for the first reading" (:attr:`ThreadBudgetReading.awaiting_reading_after_compaction`),
  so a compaction is reported without waiting for Codex's next response;
- growth estimates (D-2) restart at each compaction;
- the auto-compact limit L follows the thread's model (``turn_context`` / ``world_state``) and the Codex
  home's configuration (:mod:`worker.codex_sessions.codex_config`), and each reading says where it came
  from.

It also keeps the last activity facts a handoff needs (CB-18): the last agent message, the last tool
call with its output, the last shell command and the last test run with its outcome, from the tool
calls and (0.169) the ``CommandExecution`` items.
"""

import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Literal

from worker.codex_sessions.budget import (
    codex_context_left_percent,
    context_budget_remaining_percent,
    is_compaction_estimate,
    is_empty_usage,
)
from worker.codex_sessions.codex_config import (
    UNCONFIGURED,
    CodexConfiguration,
    CompactionLimit,
    LimitSource,
    resolve_compaction_limit,
)
from worker.codex_sessions.rollout import (
    AgentMessageRecord,
    CommandExecutionRecord,
    CompactedRecord,
    CompactionSummaryRecord,
    ContextCompactedRecord,
    ContextCompactionItemRecord,
    CustomToolCallOutputRecord,
    CustomToolCallRecord,
    FunctionCallOutputRecord,
    FunctionCallRecord,
    LocalShellCallRecord,
    ResponseUsageRecord,
    RolloutRecord,
    SessionMetaRecord,
    TaskStartedRecord,
    TokenCountRecord,
    TokenUsage,
    TurnContextRecord,
    WorldStateRecord,
    exit_code_from_output,
)

LARGE_MESSAGE_TOKENS = 8_000
"""Size of one "large message" for ``estimated_remaining_large_messages`` (tokens).

Boss's own convention, not a Codex figure: roughly a pasted log or a mid-sized source file. It is the
unit the master agent reasons in when deciding whether to append more background context (CB-7).
"""

GROWTH_WINDOW_TURNS = 8
"""How many recent growth steps (deltas between consecutive real readings) the D-2 estimates use.

A "turn" here is one model response (one sampling request), because Codex writes one real
``token_count`` per response (codex-rs/core/src/session/turn.rs:2132-2144); a user turn usually holds
several. Per-user-turn growth would leave a long autonomous turn without any estimate.
"""

AWAITING_READING_PERCENT = 100.0
"""``context_budget_remaining_pct`` of a "compacted, waiting for the first reading" report (percent).

Codex has just replaced the history with a summary, so the room before the next compaction is (about)
all of it again; the next real reading gives the exact figure. It is never Codex's own estimate.
"""

MAX_PROJECTION = timedelta(days=30)
"""A ``compaction_expected_at`` further out than this is not meaningful and is reported as None."""

OUTPUT_TAIL_CHARS = 4_000
"""Tool outputs are kept as their last this-many characters (memory stays bounded per thread)."""

ARGUMENTS_HEAD_CHARS = 4_000
"""Tool arguments (e.g. a whole patch) are kept as their first this-many characters."""

_MAX_PENDING_CALLS = 64

_TEST_COMMAND = re.compile(
    r"(?:^|[\s;&|(/])(?:"
    r"pytest|py\.test|python3? -m (?:pytest|unittest)|tox|nox|"
    r"cargo (?:test|nextest)|go test|"
    r"(?:npm|pnpm|yarn|bun)(?: run)? test|npx (?:jest|vitest)|jest|vitest|deno test|"
    r"make (?:test|check)|ctest|mvn(?:w)? (?:test|verify)|(?:gradle|\./gradlew) test|"
    r"rspec|phpunit|mix test|dotnet test|swift test|xcodebuild test"
    r")(?=$|[\s;&|)])"
)
_TEST_SUMMARY = re.compile(
    r"(\d+ (?:passed|failed|errors?)\b|test result:|^(?:ok|FAIL|PASS)\b|^Tests?:\s|\bTests run:)",
    re.IGNORECASE | re.MULTILINE,
)
_TEST_FAILURE = re.compile(
    r"(\b\d+ failed\b|\b\d+ errors?\b|^FAIL\b|test result: FAILED|\bFAILED\b)", re.MULTILINE
)
_TEST_SUCCESS = re.compile(r"(\b\d+ passed\b|test result: ok|^ok\b|^PASS\b)", re.MULTILINE)

_UsageKey = tuple[TokenUsage | None, TokenUsage | None]
"""A token_count's (total_token_usage, last_token_usage), used to spot re-emitted lines."""

TestOutcome = Literal["passed", "failed", "running", "unknown"]


@dataclass(frozen=True)
class TrackerSettings:
    """Per-thread configuration of the budget arithmetic.

    Attributes:
        large_message_tokens: size of a "large message" (tokens), see :data:`LARGE_MESSAGE_TOKENS`.
        growth_window_turns: growth steps used by the D-2 estimates, see :data:`GROWTH_WINDOW_TURNS`.
        max_projection: horizon beyond which ``compaction_expected_at`` is None.

    The Codex configuration that decides L is not a setting: it is given to the tracker (and changes
    while it runs), see :meth:`ThreadBudgetTracker.use_configuration`.
    """

    large_message_tokens: int = LARGE_MESSAGE_TOKENS
    growth_window_turns: int = GROWTH_WINDOW_TURNS
    max_projection: timedelta = MAX_PROJECTION


@dataclass(frozen=True)
class ThreadBudgetReading:
    """One context-budget reading of a Codex thread (SPEC D-1, D-2, D-3; CB-6 fields).

    Token figures are in tokens, percents in 0-100, datetimes are aware UTC. A reading is either a
    real one (a model response's usage) or, when ``awaiting_reading_after_compaction``, the report of
    a compaction recorded after the thread's last real reading: then ``last_total_tokens`` is 0 and
    ``codex_context_left_pct`` None (not measured yet), ``context_budget_remaining_pct`` is
    :data:`AWAITING_READING_PERCENT`, there are no D-2 estimates, and ``captured_at`` is the
    compaction record's time.

    Attributes:
        codex_thread_id: the thread's uuid (``session_meta.id``, else from the file name).
        cwd: the thread's working folder (latest ``turn_context.cwd``, else ``session_meta.cwd``).
        model: the model slug of the latest ``turn_context``, when known.
        last_total_tokens: T, ``last_token_usage.total_tokens`` of the latest model response.
        model_context_window: W, Codex's ``model_context_window`` (95 % of CW by default).
        context_window: CW, the full context window.
        auto_compact_token_limit: L, where Codex auto-compacts.
        compaction_limit_source: where L came from (configured, model default, assumed).
        compaction_limit_reason: why, in one sentence (e.g. "model_auto_compact_token_limit = 20000
            in config.toml").
        codex_context_left_pct: Codex's own "% context left", its formula exactly; None while
            awaiting the first reading after a compaction.
        context_budget_remaining_pct: Boss's budget before compaction, one decimal (D-1).
        compaction_count: compactions seen in this thread so far.
        last_compaction_at: when the latest compaction was recorded.
        estimated_remaining_turns: model responses left at the observed growth, or None (D-2; see
            :data:`GROWTH_WINDOW_TURNS` for what a turn is).
        estimated_remaining_large_messages: large messages that still fit before L, or None (D-2).
        compaction_expected_at: when L is reached at the observed tokens per minute, or None (D-2).
        captured_at: the ``token_count`` line's timestamp.
        reading_sequence: 1, 2, 3... per thread in file order; usable as ``snapshot_version``.
        awaiting_reading_after_compaction: Codex compacted the thread after its last real reading and
            has not answered since ("compacted, waiting for the first reading").
    """

    codex_thread_id: str | None
    cwd: str | None
    model: str | None
    last_total_tokens: int
    model_context_window: int
    context_window: int
    auto_compact_token_limit: int
    codex_context_left_pct: int | None
    context_budget_remaining_pct: float
    compaction_count: int
    last_compaction_at: datetime | None
    estimated_remaining_turns: int | None
    estimated_remaining_large_messages: int | None
    compaction_expected_at: datetime | None
    captured_at: datetime
    reading_sequence: int
    compaction_limit_source: LimitSource = LimitSource.ASSUMED
    compaction_limit_reason: str = ""
    awaiting_reading_after_compaction: bool = False


@dataclass(frozen=True)
class ToolRun:
    """A tool call and, once it arrived, its output.

    Attributes:
        call_id: Codex's call id linking call and output.
        tool_name: e.g. ``exec_command``, ``shell``, ``apply_patch``, ``local_shell``.
        command: the shell command, None for non-shell tools.
        arguments: the raw arguments (JSON string) or custom tool input, its first
            :data:`ARGUMENTS_HEAD_CHARS` characters.
        called_at: UTC time of the call record.
        output: the output text (its last :data:`OUTPUT_TAIL_CHARS` characters), None while running.
        exit_code: the exit code the output reports, when it reports one.
        finished_at: UTC time of the output record, None while running.
    """

    call_id: str
    tool_name: str
    command: str | None
    arguments: str
    called_at: datetime
    output: str | None = None
    exit_code: int | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class RecordedTestRun:
    """The latest test-looking command (pytest, cargo test, go test, npm test, make test...).

    Attributes:
        run: the tool run itself.
        outcome: ``passed`` / ``failed`` (exit code, else the output's summary), ``running`` (no
            output yet) or ``unknown``.
        summary: the output's last summary-looking line (e.g. ``3 passed in 0.41s``), when found.
    """

    run: ToolRun
    outcome: TestOutcome
    summary: str | None


@dataclass(frozen=True)
class LastActivity:
    """What the thread did last, for handoff packages (CB-18). Datetimes are aware UTC."""

    last_agent_message: str | None = None
    last_agent_message_at: datetime | None = None
    last_tool_call: ToolRun | None = None
    last_shell_command: ToolRun | None = None
    last_test_run: RecordedTestRun | None = None


@dataclass(frozen=True)
class GrowthEstimate:
    """D-2 estimates at one reading; each None when there is too little history."""

    remaining_turns: int | None
    remaining_large_messages: int | None
    compaction_expected_at: datetime | None


def is_test_command(command: str) -> bool:
    """True when a shell command looks like a test run (pytest, cargo test, go test, npm test...)."""
    return _TEST_COMMAND.search(command) is not None


def classify_test_run(run: ToolRun) -> RecordedTestRun:
    """Outcome and summary line of a test command's run.

    The exit code decides when present (0 = passed); otherwise the output's summary words do
    (``N failed`` / ``FAILED`` before ``N passed`` / ``ok``). No output yet gives ``running``.
    """
    if run.output is None:
        return RecordedTestRun(run, "running", None)
    summaries = _summary_lines(run.output)
    summary = summaries[-1] if summaries else None
    outcome: TestOutcome
    if run.exit_code is not None:
        outcome = "passed" if run.exit_code == 0 else "failed"
    elif _TEST_FAILURE.search(run.output):
        outcome = "failed"
    elif _TEST_SUCCESS.search(run.output):
        outcome = "passed"
    else:
        outcome = "unknown"
    return RecordedTestRun(run, outcome, summary)


def _summary_lines(output: str) -> list[str]:
    """The stripped lines of ``output`` that contain a test summary marker, in order."""
    stripped = (line.strip() for line in output.splitlines())
    return [line for line in stripped if line and _TEST_SUMMARY.search(line)]


def mean_positive_growth(totals: Sequence[int]) -> float | None:
    """Mean of the positive deltas between consecutive totals (tokens per turn), None if none grew."""
    deltas = [later - earlier for earlier, later in pairwise(totals) if later > earlier]
    return sum(deltas) / len(deltas) if deltas else None


def growth_per_minute(samples: Sequence[tuple[datetime, int]]) -> float | None:
    """Net growth (tokens per minute) between the first and last ``(captured_at, total)`` samples.

    None with fewer than two samples, no elapsed time, or no net growth.
    """
    if len(samples) < 2:
        return None
    (first_at, first_total), (last_at, last_total) = samples[0], samples[-1]
    minutes = (last_at - first_at).total_seconds() / 60.0
    growth = last_total - first_total
    if minutes <= 0 or growth <= 0:
        return None
    return growth / minutes


def estimate_growth(
    samples: Sequence[tuple[datetime, int]],
    auto_compact_limit: int,
    large_message_tokens: int,
    max_projection: timedelta,
) -> GrowthEstimate:
    """D-2 estimates from the recent real readings since the last compaction.

    Args:
        samples: ``(captured_at, T)`` of recent real readings in order; the last one is "now".
        auto_compact_limit: L in tokens.
        large_message_tokens: size of one large message in tokens.
        max_projection: a compaction further out than this gives ``compaction_expected_at = None``.

    Returns:
        ``remaining_turns = floor((L - T) / mean positive delta)``,
        ``remaining_large_messages = floor((L - T) / large_message_tokens)`` and
        ``compaction_expected_at = captured_at + (L - T) / tokens per minute``; all None with fewer
        than two samples or no positive growth (SPEC D-2: absent rather than invented).
    """
    per_turn = mean_positive_growth([total for _, total in samples])
    if len(samples) < 2 or per_turn is None:
        return GrowthEstimate(None, None, None)
    captured_at, total = samples[-1]
    headroom = max(0, auto_compact_limit - total)
    per_minute = growth_per_minute(samples)
    expected_at = None
    if per_minute is not None:
        until = timedelta(minutes=headroom / per_minute)
        expected_at = captured_at + until if until <= max_projection else None
    return GrowthEstimate(
        remaining_turns=math.floor(headroom / per_turn),
        remaining_large_messages=headroom // large_message_tokens,
        compaction_expected_at=expected_at,
    )


class ThreadBudgetTracker:
    """Budget state of one Codex thread, fed its rollout records in file order.

    Feed every record with :meth:`feed`; it returns a :class:`ThreadBudgetReading` when the record
    produced a new real reading or a compaction, else None. :attr:`last_activity`,
    :attr:`compaction_count` and :attr:`latest_reading` expose the current state between readings.
    """

    def __init__(
        self,
        fallback_thread_id: str | None = None,
        settings: TrackerSettings | None = None,
        configuration: CodexConfiguration = UNCONFIGURED,
    ) -> None:
        """Start an empty tracker.

        Args:
            fallback_thread_id: thread id to use until a ``session_meta`` names one (e.g. the uuid in
                the rollout file name).
            settings: growth-estimate settings; defaults per :class:`TrackerSettings`.
            configuration: the Codex home's configuration that decides L (:data:`UNCONFIGURED`: none).
        """
        self._settings = settings or TrackerSettings()
        self._configuration = configuration
        self._thread_id = fallback_thread_id
        self._thread_id_from_meta = False
        self._cwd: str | None = None
        self._model: str | None = None
        self._window: int | None = None
        self._last_seen_usage: _UsageKey | None = None
        self._growth: deque[tuple[datetime, int]] = deque(maxlen=self._settings.growth_window_turns + 1)
        self._compaction_count = 0
        self._last_compaction_at: datetime | None = None
        self._open_compaction: set[type] | None = None
        self._compaction_request_pending = False
        self._thread_token_usage: TokenUsage | None = None
        self._total_token_usage: TokenUsage | None = None
        self._sequence = 0
        self._latest: ThreadBudgetReading | None = None
        self._activity = LastActivity()
        self._pending_calls: dict[str, ToolRun] = {}

    def use_configuration(self, configuration: CodexConfiguration) -> None:
        """Use ``configuration`` for the readings made from now on (the user edited config.toml)."""
        self._configuration = configuration

    @property
    def codex_thread_id(self) -> str | None:
        """The thread's id: ``session_meta.id`` once seen, else the fallback id."""
        return self._thread_id

    @property
    def compaction_count(self) -> int:
        """Compactions seen so far (one per group of compaction records, see the module docstring)."""
        return self._compaction_count

    @property
    def last_compaction_at(self) -> datetime | None:
        """UTC time of the latest compaction record, None before any."""
        return self._last_compaction_at

    @property
    def latest_reading(self) -> ThreadBudgetReading | None:
        """The most recent reading (real, or awaiting one after a compaction), None before any."""
        return self._latest

    @property
    def total_token_usage(self) -> TokenUsage | None:
        """The thread's cumulative usage as Codex reports it to its clients (tokens): the latest
        ``token_count``'s ``total_token_usage``, which ``codex exec --json`` gives as
        ``turn.completed.usage`` and the app server as ``tokenUsage.total``. A remote compaction
        request is not in it (Codex writes no token_count for it). None before the first one."""
        return self._total_token_usage

    @property
    def thread_token_usage(self) -> TokenUsage | None:
        """Every request of the thread so far, remote compaction requests included (tokens), from the
        latest ``token_usage_record`` (0.15x+); after a remote compaction it exceeds
        :attr:`total_token_usage` by that request's usage. None before the first one."""
        return self._thread_token_usage

    @property
    def last_activity(self) -> LastActivity:
        """Last agent message, tool call, shell command and test run seen so far."""
        return self._activity

    def feed_many(self, records: Iterable[RolloutRecord]) -> list[ThreadBudgetReading]:
        """Feed records in order; return the readings they produced, in order."""
        readings = []
        for record in records:
            reading = self.feed(record)
            if reading is not None:
                readings.append(reading)
        return readings

    def feed(self, record: RolloutRecord) -> ThreadBudgetReading | None:
        """Apply one record; return the new reading it produced (real, or a compaction's), if any."""
        match record:
            case TokenCountRecord():
                return self._on_token_count(record)
            case CompactedRecord() | ContextCompactedRecord() | ContextCompactionItemRecord():
                return self._on_compaction(record)
            case CompactionSummaryRecord():
                self._compaction_request_pending = True
            case ResponseUsageRecord():
                self._thread_token_usage = record.thread_token_usage or self._thread_token_usage
            case SessionMetaRecord():
                self._on_session_meta(record)
            case TurnContextRecord():
                self._cwd = record.cwd or self._cwd
                self._model = record.model or self._model
            case WorldStateRecord():
                self._model = record.model or self._model
            case TaskStartedRecord():
                self._window = record.model_context_window or self._window
            case AgentMessageRecord():
                self._activity = replace(
                    self._activity, last_agent_message=record.text, last_agent_message_at=record.timestamp
                )
            case FunctionCallRecord():
                self._on_call(
                    ToolRun(record.call_id, record.name, record.command, record.arguments, record.timestamp)
                )
            case CustomToolCallRecord():
                self._on_call(ToolRun(record.call_id, record.name, None, record.input, record.timestamp))
            case LocalShellCallRecord() if record.call_id is not None:
                self._on_call(
                    ToolRun(
                        record.call_id, "local_shell", record.command, " ".join(record.argv), record.timestamp
                    )
                )
            case FunctionCallOutputRecord() | CustomToolCallOutputRecord():
                self._on_call_output(record.call_id, record.output, record.exit_code, record.timestamp)
            case CommandExecutionRecord():
                self._on_command_execution(record)
            case _:
                pass
        return None

    def _on_session_meta(self, record: SessionMetaRecord) -> None:
        """Take thread id and folder from the first ``session_meta`` (forks may carry the parent's too)."""
        if self._thread_id_from_meta:
            return
        self._thread_id = record.thread_id
        self._thread_id_from_meta = True
        self._cwd = self._cwd or record.cwd

    def _on_compaction(
        self, record: CompactedRecord | ContextCompactedRecord | ContextCompactionItemRecord
    ) -> ThreadBudgetReading | None:
        """Count one compaction per group of its records and report it at once.

        A record of a kind the open compaction has not seen yet only joins it (``compacted`` then
        sets ``last_compaction_at``); a kind seen already, or any record when none is open, starts a
        new compaction, which yields the "compacted, waiting for the first reading" report.
        """
        self._compaction_request_pending = False
        kind = type(record)
        if self._open_compaction is not None and kind not in self._open_compaction:
            self._open_compaction.add(kind)
            if isinstance(record, CompactedRecord):
                self._last_compaction_at = record.timestamp
            return None
        self._compaction_count += 1
        self._last_compaction_at = record.timestamp
        self._open_compaction = {kind}
        self._growth.clear()
        self._sequence += 1
        self._latest = self._awaiting_reading(record.timestamp)
        return self._latest

    def _on_token_count(self, record: TokenCountRecord) -> ThreadBudgetReading | None:
        """Turn a ``token_count`` into a reading unless it is empty, a re-emit, an estimate or the
        compaction request's own usage."""
        last = record.last_token_usage
        self._window = record.model_context_window or self._window
        self._total_token_usage = record.total_token_usage or self._total_token_usage
        if last is None or is_empty_usage(last):
            return None
        usage_key = (record.total_token_usage, last)
        if self._last_seen_usage is not None and _same_totals(self._last_seen_usage, usage_key):
            return None
        self._last_seen_usage = usage_key
        if is_compaction_estimate(last):
            return None
        if self._compaction_request_pending:
            self._compaction_request_pending = False
            return None
        self._open_compaction = None
        self._growth.append((record.timestamp, last.total_tokens))
        self._sequence += 1
        self._latest = self._reading(record, last.total_tokens)
        return self._latest

    def _limit(self) -> CompactionLimit:
        """L for the thread's current model and window under the current configuration."""
        return resolve_compaction_limit(self._configuration, self._model, self._window)

    def _reading(self, record: TokenCountRecord, total: int) -> ThreadBudgetReading:
        """Build the reading for a real ``token_count`` with ``last_token_usage.total_tokens = total``."""
        settings = self._settings
        limit = self._limit()
        growth = estimate_growth(
            list(self._growth), limit.limit, settings.large_message_tokens, settings.max_projection
        )
        return ThreadBudgetReading(
            codex_thread_id=self._thread_id,
            cwd=self._cwd,
            model=self._model,
            last_total_tokens=total,
            model_context_window=limit.model_context_window,
            context_window=limit.context_window,
            auto_compact_token_limit=limit.limit,
            compaction_limit_source=limit.source,
            compaction_limit_reason=limit.reason,
            codex_context_left_pct=codex_context_left_percent(total, limit.model_context_window),
            context_budget_remaining_pct=context_budget_remaining_percent(total, limit.limit),
            compaction_count=self._compaction_count,
            last_compaction_at=self._last_compaction_at,
            estimated_remaining_turns=growth.remaining_turns,
            estimated_remaining_large_messages=growth.remaining_large_messages,
            compaction_expected_at=growth.compaction_expected_at,
            captured_at=record.timestamp,
            reading_sequence=self._sequence,
        )

    def _awaiting_reading(self, compacted_at: datetime) -> ThreadBudgetReading:
        """The report of a compaction made before Codex's next response: nothing measured yet."""
        limit = self._limit()
        return ThreadBudgetReading(
            codex_thread_id=self._thread_id,
            cwd=self._cwd,
            model=self._model,
            last_total_tokens=0,
            model_context_window=limit.model_context_window,
            context_window=limit.context_window,
            auto_compact_token_limit=limit.limit,
            compaction_limit_source=limit.source,
            compaction_limit_reason=limit.reason,
            codex_context_left_pct=None,
            context_budget_remaining_pct=AWAITING_READING_PERCENT,
            compaction_count=self._compaction_count,
            last_compaction_at=self._last_compaction_at,
            estimated_remaining_turns=None,
            estimated_remaining_large_messages=None,
            compaction_expected_at=None,
            captured_at=compacted_at,
            reading_sequence=self._sequence,
            awaiting_reading_after_compaction=True,
        )

    def _on_call(self, run: ToolRun) -> None:
        """Remember a tool call until its output arrives; it becomes the last call (and command/test)."""
        run = replace(run, arguments=run.arguments[:ARGUMENTS_HEAD_CHARS])
        if len(self._pending_calls) >= _MAX_PENDING_CALLS:
            self._pending_calls.pop(next(iter(self._pending_calls)))
        self._pending_calls[run.call_id] = run
        self._publish_run(run)

    def _on_call_output(self, call_id: str, output: str, exit_code: int | None, at: datetime) -> None:
        """Attach an output to its pending call and refresh the activity facts that point at it."""
        run = self._pending_calls.pop(call_id, None)
        if run is None:
            return
        finished = replace(run, output=output[-OUTPUT_TAIL_CHARS:], exit_code=exit_code, finished_at=at)
        self._publish_run(finished)

    def _on_command_execution(self, record: CommandExecutionRecord) -> None:
        """A ``CommandExecution`` item (0.169): the output and exit code of the call that ran it, or,
        for a command without a pending call (run by the user), a finished run of its own. It comes
        before the call's ``function_call_output``, which then finds no pending call."""
        call_id = record.call_id or f"command-{record.timestamp.isoformat()}"
        exit_code = record.exit_code
        if exit_code is None:
            exit_code = exit_code_from_output(record.output)
        if call_id not in self._pending_calls:
            command = record.command
            self._on_call(ToolRun(call_id, "command_execution", command, command, record.timestamp))
        self._on_call_output(call_id, record.output, exit_code, record.timestamp)

    def _publish_run(self, run: ToolRun) -> None:
        """Make ``run`` the last tool call, and the last shell command / test run when it is one."""
        activity = self._activity
        command = run.command
        last_shell_command = activity.last_shell_command
        if command is not None and _supersedes(last_shell_command, run):
            last_shell_command = run
        last_test_run = activity.last_test_run
        previous_test = last_test_run.run if last_test_run else None
        if command is not None and is_test_command(command) and _supersedes(previous_test, run):
            last_test_run = classify_test_run(run)
        last_tool_call = run if _supersedes(activity.last_tool_call, run) else activity.last_tool_call
        self._activity = replace(
            activity,
            last_tool_call=last_tool_call,
            last_shell_command=last_shell_command,
            last_test_run=last_test_run,
        )


def _supersedes(existing: ToolRun | None, run: ToolRun) -> bool:
    """True when ``run`` replaces ``existing``: a new call, or the output of that same call.

    A late output of an older call never replaces a newer call.
    """
    return run.output is None or (existing is not None and existing.call_id == run.call_id)


def _same_totals(previous: _UsageKey, current: _UsageKey) -> bool:
    """True when a ``token_count`` repeats the previous one: same total usage (or, without one, same last)."""
    previous_total, previous_last = previous
    current_total, current_last = current
    if current_total is not None and previous_total is not None:
        return current_total == previous_total
    return current_total is None and previous_total is None and current_last == previous_last
