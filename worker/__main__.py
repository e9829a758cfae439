"""Command line of the Boss device worker: `boss-worker` where the worker package is installed
(packaging/worker/), `python -m worker` in a clone.

    python -m worker run [--codex-home DIR] [--worker-id ID] [--node-id ID]
                         [--context-budget-address HOST:PORT] [--token TOKEN]
                         [--poll-interval SECONDS] [--once [--timeout SECONDS]]
                         [--idle-after SECONDS] [--no-local-agent] [--codex-bin PATH]
                         [--codex-sandbox MODE] [--task-stall-timeout SECONDS]
                         [--task-turn-cap SECONDS] [--max-concurrent-tasks N]

    python -m worker enroll CODE [--node-id ID] [--worker-id ID] [--conversations-address HOST:PORT]
                                 [--credential-file PATH]

`enroll` trades the owner's one-time pairing code for this node's credential and stores it readable
by its owner only (worker/enrollment.py); `run` then uses it.
`run` follows `$CODEX_HOME/sessions/**/rollout-*.jsonl` and streams every thread's context budget to
the context_budget service until SIGTERM/SIGINT. Its local agent (unless `--no-local-agent`) claims
this node's chat tasks from the scheduler and runs each as a real `codex exec resume` turn
(worker/local_agent/agent_loop.py); on SIGTERM/SIGINT it interrupts the running turns and reports
them as interrupted before the worker exits. With `--once` it reads everything, reports each
thread's latest state, waits for the acks and exits: 0 when every snapshot was acknowledged, 1 when
not (server unreachable, rejections). Configuration errors exit with 2 and one line on stderr.
With OTEL_EXPORTER_OTLP_ENDPOINT set (and the package's `tracing` extra installed), `run` exports a
span per report over OTLP (worker/reporter.py, "Traces").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from boss_common.logging_setup import configure_logging
from boss_common.tracing import enable_otlp_from_environment
from worker.agent import run_worker
from worker.enrollment import (
    EnrollmentError,
    credential_path,
    default_conversations_address,
    enroll,
    write_credential,
)
from worker.local_agent.child_watcher import pidfd_child_watcher
from worker.settings import (
    CODEX_SANDBOXES,
    DEFAULT_CODEX_SANDBOX,
    DEFAULT_IDLE_AFTER_S,
    DEFAULT_MAX_CONCURRENT_TASKS,
    DEFAULT_ONCE_TIMEOUT_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_TASK_STALL_TIMEOUT_S,
    DEFAULT_TASK_TURN_CAP_S,
    SettingsError,
    WorkerSettings,
    hostname,
    settings_from_arguments,
)

EXIT_CONFIGURATION_ERROR = 2


def program_name() -> str:
    """How the worker was started, for its usage lines: "boss-worker" (the installed package's
    command) or "python -m worker"."""
    return "boss-worker" if Path(sys.argv[0]).name == "boss-worker" else "python -m worker"


def build_parser() -> argparse.ArgumentParser:
    """The worker's argument parser (`boss-worker` or `python -m worker`)."""
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description="Boss device worker: reports Codex threads' context budgets and runs their chat tasks.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="follow Codex sessions and report their context budgets")
    run.add_argument("--codex-home", type=Path, help="Codex home folder (default $CODEX_HOME, else ~/.codex)")
    run.add_argument("--worker-id", help="this worker's id (default worker-<hostname>)")
    run.add_argument("--node-id", help="this machine's id (default <hostname>)")
    run.add_argument(
        "--context-budget-address",
        help="gRPC address of context_budget (default BOSS_CONTEXT_BUDGET_ADDRESS, else 127.0.0.1:50051)",
    )
    run.add_argument(
        "--token",
        help="worker bearer token (default BOSS_WORKER_TOKEN, else the credential stored by enroll)",
    )
    run.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL_S,
        help=f"seconds between reads of the session files (default {DEFAULT_POLL_INTERVAL_S})",
    )
    run.add_argument("--once", action="store_true", help="report every thread once, wait for acks, exit")
    run.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_ONCE_TIMEOUT_S,
        help=f"with --once: seconds to wait for the acks (default {DEFAULT_ONCE_TIMEOUT_S:.0f})",
    )
    run.add_argument(
        "--idle-after",
        type=float,
        default=DEFAULT_IDLE_AFTER_S,
        help="seconds without a new reading after which a thread gets no more heartbeats "
        f"(default {DEFAULT_IDLE_AFTER_S:.0f})",
    )
    agent = run.add_argument_group("local agent", "runs this node's chat tasks through the real Codex CLI")
    agent.add_argument(
        "--no-local-agent",
        dest="local_agent",
        action="store_false",
        default=None,
        help="claim no tasks (default BOSS_WORKER_LOCAL_AGENT, else on; never with --once)",
    )
    agent.add_argument(
        "--codex-bin",
        type=Path,
        metavar="PATH",
        help="the Codex executable (default BOSS_WORKER_CODEX_BIN, else the project's installed Codex, "
        "else codex on PATH)",
    )
    agent.add_argument(
        "--codex-sandbox",
        metavar="MODE",
        help=f"Codex's sandbox: {', '.join(CODEX_SANDBOXES)} "
        f"(default BOSS_WORKER_CODEX_SANDBOX, else {DEFAULT_CODEX_SANDBOX})",
    )
    agent.add_argument(
        "--task-stall-timeout",
        type=float,
        metavar="SECONDS",
        help="seconds without output from Codex after which a turn is stopped "
        f"(default BOSS_WORKER_TASK_STALL_TIMEOUT, else {DEFAULT_TASK_STALL_TIMEOUT_S:.0f})",
    )
    agent.add_argument(
        "--task-turn-cap",
        type=float,
        metavar="SECONDS",
        help="seconds after which a turn is stopped however busy "
        f"(default BOSS_WORKER_TASK_TURN_CAP, else {DEFAULT_TASK_TURN_CAP_S:.0f})",
    )
    agent.add_argument(
        "--max-concurrent-tasks",
        type=int,
        metavar="N",
        help="turns run at the same time, 1-32 "
        f"(default BOSS_WORKER_MAX_CONCURRENT_TASKS, else {DEFAULT_MAX_CONCURRENT_TASKS})",
    )
    enroll = commands.add_parser("enroll", help="enroll this node with a pairing code from its owner")
    enroll.add_argument("code", help="the pairing code (e.g. K7QX-M2PD), valid 10 minutes, once")
    enroll.add_argument("--node-id", help="this machine's id (default <hostname>)")
    enroll.add_argument("--worker-id", help="this worker's id (default worker-<node id>)")
    enroll.add_argument(
        "--conversations-address",
        help="gRPC address of conversations (default BOSS_CONVERSATIONS_ADDRESS, else 127.0.0.1:50053)",
    )
    enroll.add_argument(
        "--credential-file",
        type=Path,
        help="where to store the credential (default BOSS_WORKER_CREDENTIAL, else "
        "$BOSS_DATA_DIR/worker-credential.json), readable by its owner only",
    )
    return parser


async def enroll_node(arguments: argparse.Namespace) -> int:
    """`enroll`: trades the code for this node's credential and stores it (worker/enrollment.py).
    Returns 0, or 1 (one line on stderr) when the code is refused or the file cannot be written."""
    node_id = arguments.node_id or hostname()
    worker_id = arguments.worker_id or f"worker-{node_id}"
    path = arguments.credential_file or credential_path()
    try:
        credential = await enroll(
            arguments.code,
            node_id=node_id,
            worker_id=worker_id,
            device_name=hostname(),
            conversations_address=arguments.conversations_address or default_conversations_address(),
        )
        write_credential(path, credential)
    except (EnrollmentError, OSError) as error:
        sys.stderr.write(f"worker: {error}\n")
        return 1
    sys.stdout.write(
        f"enrolled as device {credential.device_id} of {credential.owner_id} (worker {worker_id} on node "
        f"{node_id}); credential in {path}\n"
    )
    return 0


def settings_from_namespace(arguments: argparse.Namespace) -> WorkerSettings:
    """Resolve parsed arguments into settings. Raises SettingsError."""
    return settings_from_arguments(
        codex_home=arguments.codex_home,
        worker_id=arguments.worker_id,
        node_id=arguments.node_id,
        context_budget_address=arguments.context_budget_address,
        token=arguments.token,
        poll_interval_s=arguments.poll_interval,
        once=arguments.once,
        once_timeout_s=arguments.timeout,
        idle_after_s=arguments.idle_after,
        local_agent=arguments.local_agent,
        codex_bin=arguments.codex_bin,
        codex_sandbox=arguments.codex_sandbox,
        task_stall_timeout_s=arguments.task_stall_timeout,
        task_turn_cap_s=arguments.task_turn_cap,
        max_concurrent_tasks=arguments.max_concurrent_tasks,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 `--once` incomplete, 2 configuration error)."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    configure_logging()
    if arguments.command == "enroll":
        return asyncio.run(enroll_node(arguments))
    try:
        settings = settings_from_namespace(arguments)
    except SettingsError as error:
        sys.stderr.write(f"worker: {error}\n")
        return EXIT_CONFIGURATION_ERROR
    enable_otlp_from_environment("worker")
    return asyncio.run(_run(settings))


async def _run(settings: WorkerSettings) -> int:
    """`run_worker`, with Codex's exits watched through pidfds (worker/local_agent/child_watcher.py)."""
    with pidfd_child_watcher():
        return await run_worker(settings)


if __name__ == "__main__":
    sys.exit(main())
