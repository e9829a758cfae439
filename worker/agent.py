"""The worker's main loop: follow Codex sessions, build snapshots, send what is due, until stopped.

Every poll interval (1 s by default) :class:`WorkerAgent`:

1. asks the :class:`~worker.codex_sessions.follower.RolloutFollower` for what was appended to the
   rollout files (file reading runs in a thread, off the event loop);
2. keeps, per Codex thread, its latest reading and last activity, and re-reads the git state of the
   thread's working folder at most every 10 s per folder (only for active threads; an idle thread's
   folder is read once);
3. builds the thread's snapshot (:func:`worker.snapshots.build_snapshot`). When only the facts around
   an unchanged reading changed (the user committed, a test result got summarised), the new state is
   re-stamped `captured_at = reading time + n µs` (n = how often that reading was re-evaluated), so it
   gets its own stable id and orders after the reading and before the next one;
4. decides what is due (CB-9): a thread's first report and every significant change go at once; the
   latest snapshot is otherwise re-sent as a heartbeat when the interval of the thread's last ack
   (`next_required_report_in_seconds`: 30 / 15 / 5 s) has elapsed since it was last sent. Threads
   idle for longer than `idle_after_s` (no new reading) get no heartbeats until they move again;
5. hands everything due to the :class:`~worker.reporter.StreamReporter` in one call, which batches it.

Only the latest reading of a thread in one poll is reported; the readings in between are history the
server does not need (the latest carries compaction_count and last_compaction_at).

:func:`run_worker` is the composition root used by `python -m worker run`. Besides this loop it runs
the worker's companions: the thread registrar (conversations), the handoff command listener
(scheduler) and the local agent (worker/local_agent/: claims this node's chat tasks and runs them
through Codex), each with the same worker token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from time import monotonic
from typing import Protocol

from boss.context_budget.v1 import context_budget_pb2
from boss.scheduler.v1 import scheduler_pb2

from boss_common import config
from boss_common.time import utc_now
from boss_common.waiting import wait_until_set
from worker.codex_sessions.follower import FileUpdate, RolloutFollower
from worker.codex_sessions.git_state import GitState, read_git_state
from worker.codex_sessions.tracker import LastActivity, ThreadBudgetReading
from worker.handoff import HandoffWorker, lookup_from_agent
from worker.local_agent.agent_loop import LocalAgent
from worker.local_agent.codex_turns import codex_run_turn
from worker.local_agent.outcomes import RunTurn
from worker.registration import ThreadRegistrar
from worker.reporter import StreamReporter
from worker.settings import WorkerSettings
from worker.snapshots import (
    ThreadFacts,
    build_snapshot,
    level_name,
    next_report_due,
    same_reported_state,
    significant_change,
    without_stale_prediction,
)

log = logging.getLogger(__name__)

Snapshot = context_budget_pb2.ThreadContextSnapshot
Ack = context_budget_pb2.ThreadContextAck

GIT_READ_CONCURRENCY = 4
"""Git folders read at the same time (each read is a few `git` subprocesses in a worker thread)."""

MAX_CATCH_UP_POLLS = 10_000
"""`--once` polls until the files are read to the end; this bounds it for files that never stop growing."""

LOCAL_AGENT_STOP_TIMEOUT_S = 45.0
"""On stop, how long the local agent gets to interrupt its running turns and finish them (seconds)."""


class RolloutSource(Protocol):
    """What the agent needs from a follower (RolloutFollower implements it)."""

    def poll(self) -> list[FileUpdate]:
        """What was appended to the rollout files since the last poll."""
        ...


class SnapshotSink(Protocol):
    """What the agent needs from a reporter (StreamReporter implements it)."""

    def submit(self, snapshots: Iterable[Snapshot]) -> int:
        """Queue snapshots for delivery."""
        ...

    def last_ack(self, thread_id: str) -> Ack | None:
        """The thread's latest accepted ack."""
        ...

    async def flush(self, timeout: float) -> bool:
        """Wait until everything submitted is acked (True) or `timeout` seconds passed (False)."""
        ...

    @property
    def rejected_count(self) -> int:
        """Snapshots the server rejected so far."""
        ...


@dataclass
class ThreadState:
    """What the agent knows about one Codex thread.

    Attributes:
        thread_id: the Codex thread id.
        path: the rollout file it was last read from.
        reading: the latest reading.
        activity: the thread's last activity (CB-8 test rule, CB-18).
        latest: the snapshot of the current state (None until built).
        last_sent: the snapshot last handed to the reporter.
        last_sent_at: when it was handed over (monotonic seconds).
        re_evaluations: how often the current reading was re-stamped because its facts changed.
        dirty: the snapshot must be rebuilt.
        reading_changed: a new reading arrived since the last build.
        last_ack: the last ack that was logged (to log changes only).
    """

    thread_id: str
    path: Path
    reading: ThreadBudgetReading
    activity: LastActivity
    latest: Snapshot | None = None
    last_sent: Snapshot | None = None
    last_sent_at: float | None = None
    re_evaluations: int = 0
    dirty: bool = True
    reading_changed: bool = True
    last_ack: Ack | None = None

    @property
    def folder(self) -> str | None:
        """The thread's working folder (the session's cwd), None when unknown."""
        return self.reading.cwd


class GitStateCache:
    """Git state per folder, re-read at most every `refresh_s` seconds."""

    def __init__(
        self,
        reader: Callable[[Path], GitState | None] = read_git_state,
        refresh_s: float = 10.0,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._reader = reader
        self._refresh_s = refresh_s
        self._clock = clock
        self._states: dict[str, GitState | None] = {}
        self._read_at: dict[str, float] = {}

    def get(self, folder: str | None) -> GitState | None:
        """The last state read for `folder` (None when never read, unknown or not a repository)."""
        return self._states.get(folder) if folder else None

    def has_read(self, folder: str) -> bool:
        """True once `folder` was read at least once."""
        return folder in self._read_at

    def is_stale(self, folder: str) -> bool:
        """True when `folder` was never read or its last read is `refresh_s` seconds old."""
        read_at = self._read_at.get(folder)
        return read_at is None or self._clock() - read_at >= self._refresh_s

    async def refresh(self, folders: Iterable[str]) -> set[str]:
        """Re-read `folders` (in worker threads, GIT_READ_CONCURRENCY at a time).

        Returns the folders whose uncommitted changes differ from the previous read.
        """
        limit = asyncio.Semaphore(GIT_READ_CONCURRENCY)

        async def read(folder: str) -> tuple[str, GitState | None]:
            async with limit:
                return folder, await asyncio.to_thread(self._reader, Path(folder))

        changed = set()
        for folder, state in await asyncio.gather(*(read(folder) for folder in folders)):
            previous = self._states.get(folder)
            if folder not in self._read_at or _uncommitted(previous) != _uncommitted(state):
                changed.add(folder)
            self._states[folder] = state
            self._read_at[folder] = self._clock()
        return changed


def _uncommitted(state: GitState | None) -> tuple[str, ...]:
    """The changed paths of a git state (empty when unknown)."""
    if state is None:
        return ()
    return tuple(changed.path for changed in state.changed_files)


class WorkerAgent:
    """Turns followed Codex sessions into snapshots handed to a reporter (see the module docstring)."""

    def __init__(
        self,
        settings: WorkerSettings,
        follower: RolloutSource,
        reporter: SnapshotSink,
        *,
        git_cache: GitStateCache | None = None,
        clock: Callable[[], float] = monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
        on_new_thread: Callable[[str, ThreadBudgetReading, Path], None] | None = None,
        project_of: Callable[[str], str] | None = None,
    ) -> None:
        """Wire the agent; nothing is read until :meth:`step`.

        Args:
            settings: worker identity, intervals and limits.
            follower: reads the rollout files of `settings.codex_home`.
            reporter: delivers snapshots and exposes the server's acks.
            git_cache: git state per folder (default: `read_git_state`, `settings.git_refresh_s`).
            clock: monotonic seconds (cadence).
            wall_clock: aware UTC now (which threads are idle).
            on_new_thread: called (synchronously, no I/O) with (thread_id, first reading, session
                file) the first time a thread is seen, e.g. to register it with conversations.
            project_of: the Boss project id of a thread ("" until it is registered), carried in
                its snapshots so the scheduler can summarise per project.
        """
        self._on_new_thread = on_new_thread
        self._project_of = project_of
        self._settings = settings
        self._follower = follower
        self._reporter = reporter
        self._git = git_cache or GitStateCache(refresh_s=settings.git_refresh_s, clock=clock)
        self._clock = clock
        self._wall_clock = wall_clock
        self._threads: dict[str, ThreadState] = {}
        self._unnamed_files: set[Path] = set()

    @property
    def threads(self) -> dict[str, ThreadState]:
        """The threads seen so far, by Codex thread id."""
        return self._threads

    async def step(self) -> list[Snapshot]:
        """One poll: read new lines, refresh git state, rebuild snapshots, hand over what is due.

        Returns the snapshots handed to the reporter (first reports, significant changes, heartbeats).
        """
        updates = await asyncio.to_thread(self._follower.poll)
        self._absorb(updates)
        await self._refresh_git(everything=False)
        self._rebuild()
        due = self._take_due()
        if due:
            self._reporter.submit(due)
        self._log_acks()
        return due

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every `poll_interval_s` until `stop` is set. A failing poll is logged, not fatal."""
        while not stop.is_set():
            try:
                await self.step()
            except Exception:
                log.exception("poll of %s failed; trying again", self._settings.codex_home)
            await wait_until_set(stop, self._settings.poll_interval_s)

    async def run_once(self) -> bool:
        """Read every session to its end, report each thread's latest state, wait for the acks.

        Returns True when every snapshot was acked within `once_timeout_s` and none was rejected.
        """
        for _ in range(MAX_CATCH_UP_POLLS):
            updates = await asyncio.to_thread(self._follower.poll)
            if not updates:
                break
            self._absorb(updates)
        await self._refresh_git(everything=True)
        self._rebuild()
        due = self._take_due()
        if not due:
            log.warning("no context-budget readings under %s: nothing to report", self._settings.sessions_dir)
            return True
        self._reporter.submit(due)
        acked = await self._reporter.flush(self._settings.once_timeout_s)
        self._log_acks()
        rejected = self._reporter.rejected_count
        if not acked:
            log.error(
                "not every snapshot was acknowledged within %.0f s (is context_budget at %s running?)",
                self._settings.once_timeout_s,
                self._settings.context_budget_address,
            )
        elif rejected:
            log.error("%d snapshot(s) were rejected by context_budget", rejected)
        else:
            log.info("reported %d thread(s); every snapshot acknowledged", len(due))
        return acked and not rejected

    def _absorb(self, updates: Sequence[FileUpdate]) -> None:
        """Take the latest reading and the last activity of every updated file."""
        for update in updates:
            if update.restarted:
                log.info("re-reading %s from its start (it was truncated or replaced)", update.path)
            reading = update.readings[-1] if update.readings else None
            thread_id = (reading.codex_thread_id if reading else None) or update.codex_thread_id
            if thread_id is None:
                if update.path not in self._unnamed_files:
                    self._unnamed_files.add(update.path)
                    log.warning(
                        "no thread id in %s (no session_meta, no uuid in the name); skipped", update.path
                    )
                continue
            state = self._threads.get(thread_id)
            if reading is None:
                if state is not None and state.activity != update.last_activity:
                    state.activity = update.last_activity
                    state.dirty = True
                continue
            if state is None:
                self._threads[thread_id] = ThreadState(thread_id, update.path, reading, update.last_activity)
                if self._on_new_thread is not None:
                    self._on_new_thread(thread_id, reading, update.path)
                continue
            if update.path != state.path and reading.captured_at < state.reading.captured_at:
                continue
            if reading.cwd and not state.reading.cwd and self._on_new_thread is not None:
                self._on_new_thread(thread_id, reading, update.path)  # its folder is known now
            state.path = update.path
            state.reading = reading
            state.activity = update.last_activity
            state.re_evaluations = 0
            state.dirty = state.reading_changed = True

    def _is_active(self, state: ThreadState) -> bool:
        """True when the thread's latest reading is at most `idle_after_s` old."""
        age = self._wall_clock() - state.reading.captured_at
        return age <= timedelta(seconds=self._settings.idle_after_s)

    async def _refresh_git(self, *, everything: bool) -> None:
        """Re-read stale folders of active threads (and never-read folders of idle ones)."""
        folders = set()
        for state in self._threads.values():
            folder = state.folder
            if not folder:
                continue
            wanted = everything or self._is_active(state) or not self._git.has_read(folder)
            if wanted and self._git.is_stale(folder):
                folders.add(folder)
        if not folders:
            return
        changed = await self._git.refresh(sorted(folders))
        for state in self._threads.values():
            if state.folder in changed:
                state.dirty = True

    def _facts(self, state: ThreadState) -> ThreadFacts:
        project_id = self._project_of(state.thread_id) if self._project_of is not None else ""
        return ThreadFacts(
            git_state=self._git.get(state.folder), last_activity=state.activity, project_id=project_id
        )

    def _rebuild(self) -> None:
        """Rebuild the snapshot of every thread whose reading or facts changed, or whose predicted
        compaction time has passed (an idle thread: the prediction is dropped, `without_stale_prediction`,
        and the thread reported again, so no "compaction expected" alert stays open on it).

        A reading whose prediction was dropped is a different reading from the one with it, which an
        earlier run of the worker may have reported: it is stamped a microsecond after its capture,
        so its snapshot id differs (the same id for other content is refused: ALREADY_EXISTS)."""
        settings = self._settings
        now = self._wall_clock()
        for state in self._threads.values():
            expected = state.reading.compaction_expected_at
            passed = expected is not None and expected <= now
            if not state.dirty and not passed:
                continue
            state.dirty = False
            state.reading = without_stale_prediction(state.reading, now)
            snapshot = build_snapshot(
                state.reading,
                thread_id=state.thread_id,
                worker_id=settings.worker_id,
                node_id=settings.node_id,
                facts=self._facts(state),
                captured_at=state.reading.captured_at + timedelta(microseconds=1) if passed else None,
            )
            if state.reading_changed or state.latest is None:
                state.reading_changed = False
                state.latest = snapshot
                continue
            if same_reported_state(snapshot, state.latest):
                continue
            state.re_evaluations += 1
            state.latest = build_snapshot(
                state.reading,
                thread_id=state.thread_id,
                worker_id=settings.worker_id,
                node_id=settings.node_id,
                facts=self._facts(state),
                captured_at=state.reading.captured_at + timedelta(microseconds=state.re_evaluations),
            )

    def _take_due(self) -> list[Snapshot]:
        """The snapshots to send now; marks them sent."""
        now = self._clock()
        due = []
        for state in self._threads.values():
            latest = state.latest
            if latest is None:
                continue
            reason = self._due_reason(state, latest, now)
            if reason is None:
                continue
            if reason == "heartbeat":
                log.debug(
                    "thread %s heartbeat at %.1f%%", state.thread_id, latest.context_budget_remaining_pct
                )
            else:
                log.info(
                    "thread %s at %.1f%% (%s)", state.thread_id, latest.context_budget_remaining_pct, reason
                )
            state.last_sent = latest
            state.last_sent_at = now
            due.append(latest)
        return due

    def _due_reason(self, state: ThreadState, latest: Snapshot, now: float) -> str | None:
        """Why `latest` is due now ("heartbeat" or a significant change), None when it is not."""
        if state.last_sent is None or state.last_sent_at is None:
            return significant_change(None, latest)
        changed = latest.snapshot_id != state.last_sent.snapshot_id
        if changed:
            reason = significant_change(state.last_sent, latest)
            if reason is not None:
                return reason
        ack = self._reporter.last_ack(state.thread_id)
        interval = ack.next_required_report_in_seconds if ack is not None else None
        level = latest.context_budget_level
        if ack is not None and ack.context_budget_level:
            level = ack.context_budget_level
        if now < next_report_due(state.last_sent_at, interval, level):
            return None
        if changed or self._is_active(state):
            return "heartbeat"
        return None

    def _log_acks(self) -> None:
        """Log when the server's level or master actions for a thread change."""
        for state in self._threads.values():
            ack = self._reporter.last_ack(state.thread_id)
            if ack is None or ack is state.last_ack:
                continue
            previous = state.last_ack
            state.last_ack = ack
            if (
                previous is not None
                and previous.context_budget_level == ack.context_budget_level
                and list(previous.master_actions) == list(ack.master_actions)
            ):
                continue
            actions = ", ".join(
                context_budget_pb2.MasterAction.Name(action).removeprefix("MASTER_ACTION_").lower()
                for action in ack.master_actions
            )
            log.info(
                "thread %s: server level %s, report every %d s, master actions: %s",
                state.thread_id,
                level_name(ack.context_budget_level),
                ack.next_required_report_in_seconds,
                actions or "none",
            )


class Registrar(Protocol):
    """What registration needs from a registrar (ThreadRegistrar implements it)."""

    def note(
        self, thread_id: str, *, codex_folder: str = "", codex_thread_ref: str = "", title: str = ""
    ) -> None:
        """Queues a thread for registration."""
        ...


def registration_callback(registrar: Registrar) -> Callable[[str, ThreadBudgetReading, Path], None]:
    """The agent's `on_new_thread`: registers a newly seen thread with its working folder (the
    session's cwd) and, as its Codex thread reference, Codex's session id (the thread id), which is
    what `codex exec resume` takes."""

    def register(thread_id: str, reading: ThreadBudgetReading, path: Path) -> None:
        registrar.note(thread_id, codex_folder=reading.cwd or "", codex_thread_ref=thread_id)

    return register


def build_local_agent(settings: WorkerSettings, run_turn: RunTurn | None = None) -> LocalAgent | None:
    """The worker's local agent, None when `settings.local_agent` is None (--no-local-agent, --once).

    Its turns run through `run_turn`, by default the Codex runner configured by the settings
    (:func:`worker.local_agent.codex_turns.codex_run_turn`): the agent lets it prepare each turn
    while starting the task, and completes (or kills) its cleanups of what Codex left running when
    it stops. Same token as the reporter.
    """
    agent_settings = settings.local_agent
    if agent_settings is None:
        return None
    on_stopped: Callable[[], Awaitable[None]] | None = None
    prepare_turn: Callable[[scheduler_pb2.Task], None] | None = None
    if run_turn is None:
        codex_runner = codex_run_turn(settings.codex_home, agent_settings)
        run_turn, on_stopped, prepare_turn = codex_runner, codex_runner.close, codex_runner.prepare
    return LocalAgent(
        scheduler_address=agent_settings.scheduler_address,
        token=lambda: settings.token,
        worker_id=settings.worker_id,
        node_id=settings.node_id,
        run_turn=run_turn,
        max_concurrent_tasks=agent_settings.max_concurrent_tasks,
        on_stopped=on_stopped,
        prepare_turn=prepare_turn,
    )


async def _stop_local_agent(task: asyncio.Task[None], timeout: float) -> None:
    """Waits up to `timeout` seconds for the local agent to finish its interrupted turns, then
    cancels it."""
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        log.warning("the local agent did not stop within %.0f s; cancelling it", timeout)
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _install_stop_signals(stop: asyncio.Event) -> list[signal.Signals]:
    """SIGTERM and SIGINT set `stop`; returns the signals handled (none where unsupported)."""
    loop = asyncio.get_running_loop()
    installed = []
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal_number, stop.set)
            installed.append(signal_number)
    return installed


async def run_worker(
    settings: WorkerSettings, stop: asyncio.Event | None = None, *, run_turn: RunTurn | None = None
) -> int:
    """Run the worker until `stop` is set or SIGTERM/SIGINT arrives (or once, with `settings.once`).

    On stop, pending snapshots get up to `settings.flush_timeout_s` seconds to be acked, and the
    local agent (when `settings.local_agent` is set) up to LOCAL_AGENT_STOP_TIMEOUT_S seconds to
    finish its interrupted turns. `run_turn` replaces the Codex runner of the local agent.

    Returns the process exit code: 0, or 1 when `--once` could not get every snapshot acked.
    """
    follower = RolloutFollower(settings.codex_home)
    reporter = StreamReporter(settings.context_budget_address, settings.token)
    reporter.start()
    stop = stop or asyncio.Event()
    registrar = (
        None
        if settings.once
        else ThreadRegistrar(
            config.service_address("conversations"),
            settings.token,
            worker_id=settings.worker_id,
            node_id=settings.node_id,
        )
    )

    register = registration_callback(registrar) if registrar is not None else None

    def project_of(thread_id: str) -> str:
        return registrar.registered.get(thread_id, "") if registrar is not None else ""

    agent = WorkerAgent(settings, follower, reporter, on_new_thread=register, project_of=project_of)
    companions: list[asyncio.Task[None]] = []
    local_agent = None if settings.once else build_local_agent(settings, run_turn)
    local_agent_task = (
        asyncio.create_task(local_agent.run(stop), name="local-agent") if local_agent is not None else None
    )
    if registrar is not None:
        companions.append(asyncio.create_task(registrar.run(stop), name="thread-registrar"))
        handoff = HandoffWorker(
            scheduler_address=config.service_address("scheduler"),
            token=settings.token,
            worker_id=settings.worker_id,
            node_id=settings.node_id,
            facts_lookup=lookup_from_agent(agent),
            journal_path=config.data_dir() / f"handoff-commands-{settings.worker_id}.txt",
        )
        companions.append(asyncio.create_task(handoff.run(), name="handoff-worker"))
    installed = _install_stop_signals(stop)
    log.info(
        "worker %s on node %s: following %s, reporting to %s%s",
        settings.worker_id,
        settings.node_id,
        settings.sessions_dir,
        settings.context_budget_address,
        "" if local_agent is not None else " (no local agent)",
    )
    try:
        if settings.once:
            return 0 if await agent.run_once() else 1
        await agent.run(stop)
        log.info("stopping: waiting up to %.0f s for pending acks", settings.flush_timeout_s)
        if not await reporter.flush(settings.flush_timeout_s):
            log.warning("stopped with %d snapshot(s) not acknowledged", reporter.unacked_count)
        return 0
    finally:
        stop.set()
        if local_agent_task is not None:
            await _stop_local_agent(local_agent_task, LOCAL_AGENT_STOP_TIMEOUT_S)
        loop = asyncio.get_running_loop()
        for signal_number in installed:
            loop.remove_signal_handler(signal_number)
        for task in companions:
            task.cancel()
        for task in companions:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if registrar is not None:
            await registrar.close()
        await reporter.close()
