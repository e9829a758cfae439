"""The worker's side of the scheduler's command stream: receive, act at most once, acknowledge.

:class:`HandoffWorker` keeps `StreamWorkerCommands` open for this worker and node (reconnecting with
backoff, 0.5 s doubling to 15 s), and for each command:

- a command id already handled is only acknowledged again (the scheduler re-delivers until it has
  the ack, so an ack lost in transit must not make the worker act twice);
- `prepare_handoff`: gathers the thread's facts (session activity from the tracker through
  `facts_lookup`, git state of its folder in a thread off the event loop), builds the CB-18 package
  (:func:`~worker.handoff.builder.build_package`), uploads it, then acknowledges `done`. A
  transient upload failure (UNAVAILABLE, DEADLINE_EXCEEDED) leaves the command unacknowledged so it
  is re-delivered; a permanent one (package consumed or expired, unknown) is acknowledged `failed`
  with the reason;
- the level commands (avoid_large_context_append, finish_current_subtask, freeze_context_growth)
  are recorded in :attr:`HandoffWorker.directives` per thread and acknowledged `done`.

Handled command ids are kept in memory and, when `journal_path` is set, appended to that file (one id
per line) before the ack, so a restarted worker does not act twice either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from boss.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

from boss_common.bearer import bearer_metadata
from boss_common.channels import open_channel
from boss_common.reconnection import Reconnection
from boss_common.time import to_timestamp
from worker.codex_sessions.git_state import read_git_state
from worker.codex_sessions.tracker import LastActivity
from worker.handoff.builder import BuiltPackage, SessionFacts, build_package, find_artefacts

log = logging.getLogger(__name__)

TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
"""Upload failures after which the command stays unacknowledged (the scheduler re-delivers it)."""

CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ThreadSession:
    """What the worker agent knows of one thread: its working folder, session file and last activity."""

    folder: str | None
    rollout_path: Path | None
    activity: LastActivity | None


FactsLookup = Callable[[str], ThreadSession | None]
"""Returns what the worker agent knows of a Codex thread id (None when it never read the thread)."""


def lookup_from_agent(agent: object) -> FactsLookup:
    """A FactsLookup over a running `worker.agent.WorkerAgent` (its `threads` mapping of ThreadState
    with `folder`, `path` and `activity`)."""

    def lookup(thread_id: str) -> ThreadSession | None:
        state = agent.threads.get(thread_id)  # type: ignore[attr-defined]
        if state is None:
            return None
        return ThreadSession(folder=state.folder, rollout_path=state.path, activity=state.activity)

    return lookup


def gather_facts(thread_id: str, session: ThreadSession | None, command_folder: str) -> SessionFacts:
    """The thread's facts: session activity from `session`, git state of its folder (the session's
    cwd, else the folder the command names). Blocking (runs git): call it in a thread."""
    folder = (session.folder if session else None) or command_folder or None
    path = Path(folder) if folder else None
    git = read_git_state(path) if path is not None else None
    return SessionFacts(
        thread_id=thread_id,
        folder=folder,
        rollout_path=session.rollout_path if session else None,
        activity=session.activity if session else None,
        git=git,
        artefacts=find_artefacts(path, git),
    )


def package_message(package_id: str, built: BuiltPackage) -> scheduler_pb2.HandoffPackage:
    """The upload form of a built package."""
    statuses = {
        "done": scheduler_pb2.CHECKLIST_ITEM_STATUS_DONE,
        "missing": scheduler_pb2.CHECKLIST_ITEM_STATUS_MISSING,
    }
    message = scheduler_pb2.HandoffPackage(
        handoff_package_id=package_id,
        summary_text=built.summary_text,
        open_questions=built.open_questions,
        critical_files=built.critical_files,
        critical_artifacts=built.critical_artifacts,
        patches_done=built.patches_done,
        patches_not_done=built.patches_not_done,
        suggested_next_actions=built.suggested_next_actions,
        checklist=[
            scheduler_pb2.ChecklistItem(item=c.item, status=statuses[c.status], detail=c.detail)
            for c in built.checklist
        ],
    )
    for run in built.critical_commands:
        record = message.critical_commands.add(command=run.command, output_tail=run.output_tail)
        if run.exit_code is not None:
            record.exit_code = run.exit_code
        if run.ran_at is not None:
            record.ran_at.CopyFrom(to_timestamp(run.ran_at))
    for test in built.critical_tests:
        record = message.critical_tests.add(command=test.command, outcome=test.outcome, summary=test.summary)
        if test.ran_at is not None:
            record.ran_at.CopyFrom(to_timestamp(test.ran_at))
    return message


@dataclass
class HandoffWorker:
    """Follows the scheduler's command stream for one worker on one node (see the module docstring).

    Attributes:
        scheduler_address: gRPC target of the scheduler (e.g. 127.0.0.1:50052).
        token: the worker token (bound to worker_id and node_id).
        worker_id / node_id: who this is.
        facts_lookup: what the worker agent knows of a thread (see :func:`lookup_from_agent`).
        journal_path: file of handled command ids (kept across restarts), None for memory only.
        directives: level commands received, per thread id (command type names, in arrival order).
        uploaded: package ids uploaded by this process, in order.
    """

    scheduler_address: str
    token: str
    worker_id: str
    node_id: str
    facts_lookup: FactsLookup
    journal_path: Path | None = None
    directives: dict[str, list[str]] = field(default_factory=dict)
    uploaded: list[str] = field(default_factory=list)
    _handled: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.journal_path is not None and self.journal_path.exists():
            self._handled.update(
                line.strip() for line in self.journal_path.read_text().splitlines() if line.strip()
            )

    async def run(self) -> None:
        """Follows the command stream until cancelled, reconnecting as `Reconnection` says: at once
        after a healthy stream ended (the scheduler recycles connections every few minutes: INFO),
        with backoff while the scheduler is unreachable (WARNING)."""
        reconnection = Reconnection()
        while True:
            reconnection.attempt_started()
            try:
                async with open_channel(self.scheduler_address, for_worker=True) as channel:
                    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
                    call = stub.StreamWorkerCommands(
                        scheduler_pb2.StreamWorkerCommandsRequest(
                            worker_id=self.worker_id, node_id=self.node_id
                        ),
                        metadata=bearer_metadata(self.token),
                    )
                    async for response in call:
                        reconnection.delivered()
                        await self.handle(stub, response.command)
                delay = reconnection.ended(log, "command stream", "closed by the scheduler")
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    delay = reconnection.next_delay()
                    log.error("scheduler refused the command stream: %s", error.details())
                else:
                    delay = reconnection.ended(log, "command stream", error.code())
            await asyncio.sleep(delay)

    async def handle(
        self, stub: scheduler_pb2_grpc.SchedulerServiceStub, command: scheduler_pb2.WorkerCommand
    ) -> None:
        """Acts on one command at most once, then acknowledges it (see the module docstring)."""
        if command.command_id in self._handled:
            await self._ack(stub, command, scheduler_pb2.COMMAND_OUTCOME_DONE, "already handled")
            return
        outcome: scheduler_pb2.CommandOutcome = scheduler_pb2.COMMAND_OUTCOME_DONE
        detail = ""
        if command.command_type == scheduler_pb2.COMMAND_TYPE_PREPARE_HANDOFF:
            log.info(
                "thread %s: prepare_handoff for package %s (%s)",
                command.thread_id,
                command.handoff_package_id,
                command.reason,
            )
            try:
                detail = await self._prepare_handoff(stub, command)
            except grpc.aio.AioRpcError as error:
                if error.code() in TRANSIENT_CODES:
                    log.warning(
                        "upload of package %s failed (%s); waiting for re-delivery",
                        command.handoff_package_id,
                        error.code(),
                    )
                    return
                outcome, detail = (
                    scheduler_pb2.COMMAND_OUTCOME_FAILED,
                    f"{error.code().name}: {error.details()}",
                )
        else:
            name = scheduler_pb2.CommandType.Name(command.command_type).removeprefix("COMMAND_TYPE_").lower()
            self.directives.setdefault(command.thread_id, []).append(name)
            detail = f"{name} noted for thread {command.thread_id}"
            log.info("thread %s: %s (%s)", command.thread_id, name, command.reason)
        self._remember(command.command_id)
        await self._ack(stub, command, outcome, detail)

    async def _prepare_handoff(
        self, stub: scheduler_pb2_grpc.SchedulerServiceStub, command: scheduler_pb2.WorkerCommand
    ) -> str:
        """Builds and uploads the package; returns what was done, in words."""
        session = self.facts_lookup(command.thread_id)
        facts = await asyncio.to_thread(gather_facts, command.thread_id, session, command.codex_folder)
        built = build_package(facts)
        await stub.UploadHandoffPackage(
            scheduler_pb2.UploadHandoffPackageRequest(
                worker_id=self.worker_id,
                node_id=self.node_id,
                command_id=command.command_id,
                handoff_package=package_message(command.handoff_package_id, built),
            ),
            metadata=bearer_metadata(self.token),
            timeout=CALL_TIMEOUT_S,
        )
        self.uploaded.append(command.handoff_package_id)
        missing = ", ".join(built.missing_items) or "nothing"
        log.info(
            "thread %s: handoff package %s uploaded (missing: %s)",
            command.thread_id,
            command.handoff_package_id,
            missing,
        )
        return f"package {command.handoff_package_id} uploaded; missing: {missing}"

    def _remember(self, command_id: str) -> None:
        self._handled.add(command_id)
        if self.journal_path is not None:
            with self.journal_path.open("a") as journal:
                journal.write(command_id + "\n")

    async def _ack(
        self,
        stub: scheduler_pb2_grpc.SchedulerServiceStub,
        command: scheduler_pb2.WorkerCommand,
        outcome: scheduler_pb2.CommandOutcome,
        detail: str,
    ) -> None:
        """Acknowledges; a failed ack is logged (the command comes again and is only re-acked)."""
        try:
            await stub.AckWorkerCommand(
                scheduler_pb2.AckWorkerCommandRequest(
                    worker_id=self.worker_id,
                    node_id=self.node_id,
                    command_id=command.command_id,
                    outcome=outcome,
                    detail=detail,
                ),
                metadata=bearer_metadata(self.token),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "ack of command %s failed (%s); it will be re-delivered", command.command_id, error.code()
            )
