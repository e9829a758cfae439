"""`make run`: the whole of Boss on one machine, on the embedded SQLite default.

Starts every service as its own process (context_budget, scheduler, conversations, gateway), waits
until each passes its health check, then starts a device worker that follows Codex session files
and, through its local agent, answers chat messages with a real `codex exec resume` turn:

- with your own `$CODEX_HOME` (default ~/.codex) when it has sessions: your threads, run by your
  Codex with your login;
- otherwise the demo, under `$BOSS_DATA_DIR/demo-codex-home`: Boss's built-in demo model (not a real
  model; `python -m demo_model serve`, on a free port or `BOSS_DEMO_MODEL_LISTEN`) and real Codex
  threads driven against it (`python -m demo_model.threads --live`), which grow a turn at a time into
  real compactions while you chat with them. Needs the real Codex CLI (`make codex`).

The master agent's chat answers through the demo model too (BOSS_MASTER_BACKEND=openai_api against
its Chat Completions endpoint), unless BOSS_MASTER_BACKEND is set already: then the master agent
uses what you configured (services/conversations/master/settings.py), e.g. a real endpoint.

It prints which Codex answers chat, a client token and the URLs to open, then a table of every
thread's context budget as the gateway reports it, refreshed every few seconds, and a "Ready:" line
once every thread has one. Ctrl-C stops everything cleanly. Logs of each process are in
`$BOSS_DATA_DIR/logs/`.

Usage: python -m services.local_stack [--codex-home DIR] [--demo] [--demo-interval SECONDS]
                                      [--until-ready SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boss_common.channels import open_channel
from boss_common.waiting import wait_until_set
from demo_model.codex_home import API_KEY_VALUE, demo_model_environment
from demo_model.responses import MODEL_NAME as DEMO_MODEL_NAME
from demo_model.threads import DEFAULT_INTERVAL_S, DemoThread, read_demo_threads
from services.shared import config
from services.shared.auth import TokenAuthority
from worker.enrollment import credential_path
from worker.local_agent.codex_install import ENV_VAR as CODEX_BIN_VARIABLE
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.settings import hostname

log = logging.getLogger("boss.local")
ROOT = Path(__file__).resolve().parent.parent
GRPC_SERVICES = ("context_budget", "scheduler", "conversations")
STARTUP_TIMEOUT_SECONDS = 60.0
DEMO_THREADS_TIMEOUT_SECONDS = 180.0
"""How long the demo threads may take to be created (a dozen real Codex turns on a busy machine)."""
DEMO_MASTER_CONTEXT_WINDOW_TOKENS = 32_000
"""The window the master conversation's ring is measured against when the demo model answers it."""
DEMO_MODEL_LISTEN_VARIABLE = "BOSS_DEMO_MODEL_LISTEN"
# The worker's token (`worker_environment`) outlasts any run of the stack, as the services' own do.
WORKER_TOKEN_LIFETIME = timedelta(days=365)
"""host:port for the demo model; unset, it listens on a free loopback port."""


@dataclass
class Process:
    """One child process of the local stack and where its log goes."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, environment: dict[str, str]) -> None:
        """Starts the process with its output appended to its log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.log_path.open("wb")
        # A session of its own: a terminal's Ctrl-C reaches only the launcher, which then stops
        # every child in order (gateway and worker before the services they call).
        self.popen = subprocess.Popen(
            self.argv, cwd=ROOT, env=environment, stdout=log_file, stderr=log_file, start_new_session=True
        )

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        if not self.alive() or self.popen is None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass(frozen=True)
class ChatCodex:
    """The Codex CLI that answers chat messages: its binary and its version ("0.169.0")."""

    binary: Path
    version: str


def codex_version(binary: Path) -> str:
    """The version `binary --version` reports ("codex-cli 0.169.0" -> "0.169.0"), or "of unknown
    version" when it does not answer within 20 seconds."""
    try:
        answer = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "of unknown version"
    words = answer.stdout.split()
    return words[-1] if words else "of unknown version"


def find_chat_codex() -> ChatCodex | None:
    """The Codex the local agent will run (worker/local_agent/codex_install.py), None when none is
    installed."""
    try:
        binary = find_codex_binary()
    except CodexNotFoundError:
        return None
    return ChatCodex(binary, codex_version(binary))


def require_demo_codex() -> ChatCodex:
    """The Codex the demo drives; exits with what to do when it is not installed."""
    try:
        binary = find_codex_binary()
    except CodexNotFoundError as error:
        raise SystemExit(
            "The demo runs real Codex threads and needs the Codex CLI: run `make codex` (it installs "
            f"the pinned version into {ROOT / '.tools' / 'codex'}).\n({error})"
        ) from None
    return ChatCodex(binary, codex_version(binary))


def chat_line(codex: ChatCodex | None, demo: bool, codex_home: Path) -> str:
    """The line saying who answers chat messages in this run."""
    if demo and codex is not None:
        return (
            f"Chat: demo threads answer through real Codex {codex.version} against the built-in demo "
            "model (not a real model)"
        )
    if codex is None:
        return (
            "Chat: no Codex CLI found, so chat messages fail with 'could not start' until you run "
            f"`make codex` or install Codex (or set {CODEX_BIN_VARIABLE})"
        )
    return (
        f"Chat: your threads answer through your own Codex {codex.version} ({codex.binary}) "
        f"with the login in {codex_home}"
    )


def demo_model_listen() -> str:
    """host:port for the demo model: BOSS_DEMO_MODEL_LISTEN, else a free loopback port."""
    configured = os.environ.get(DEMO_MODEL_LISTEN_VARIABLE, "").strip()
    if configured:
        return configured
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def has_sessions(codex_home: Path) -> bool:
    """True when `codex_home/sessions` or `archived_sessions` holds at least one rollout file
    (`rollout-*.jsonl`, or `rollout-*.jsonl.zst` as Codex compresses idle ones)."""
    folders = (codex_home / "sessions", codex_home / "archived_sessions")
    return any(
        folder.is_dir() and any(folder.rglob(pattern))
        for folder in folders
        for pattern in ("rollout-*.jsonl", "rollout-*.jsonl.zst")
    )


def choose_codex_home(requested: str | None, force_demo: bool) -> tuple[Path, bool, str]:
    """The Codex home to follow, whether it is Boss's own demo data, and why it was chosen."""
    if force_demo:
        return config.data_dir() / "demo-codex-home", True, "--demo given"
    candidate = Path(requested or os.environ.get("CODEX_HOME") or Path.home() / ".codex").expanduser()
    if has_sessions(candidate):
        return candidate, False, f"found Codex sessions under {candidate}/sessions"
    if requested:
        raise SystemExit(
            f"no Codex sessions (sessions/**/rollout-*.jsonl) under {candidate}: "
            "point --codex-home at your ~/.codex"
        )
    why = f"no Codex sessions (sessions/**/rollout-*.jsonl) under {candidate}"
    return config.data_dir() / "demo-codex-home", True, why


def reset_demo_state(data: Path, codex_home: Path) -> None:
    """Demo runs start from nothing: the previous demo Codex home (its sessions and workspaces) and
    the embedded databases they fed are removed, so no frozen threads from an earlier run linger.
    Never touches a PostgreSQL database or a real Codex home."""
    shutil.rmtree(codex_home, ignore_errors=True)
    for service in GRPC_SERVICES:
        if config.database_url(service).startswith("sqlite"):
            for leftover in data.glob(f"{service}.sqlite3*"):
                leftover.unlink()


async def grpc_healthy(address: str, timeout: float = 1.0) -> bool:
    """One gRPC health check of the whole server at `address`."""
    async with open_channel(address) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


async def http_healthy(url: str) -> bool:
    """True when GET `url` answers 200."""
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            return (await client.get(url)).status_code == 200
    except httpx.HTTPError:
        return False


def port_hint(name: str, target: str) -> str:
    """What to do when `name`'s address `target` is taken by another program."""
    variables = f"BOSS_{name.upper()}_LISTEN=127.0.0.1:PORT"
    if name != "demo_model":
        variables += f" and BOSS_{name.upper()}_ADDRESS=127.0.0.1:PORT"
    return f"\n{target} is taken by another program: stop it, or move {name} with {variables}"


def exit_with_log(process: Process, what: str, target: str = "") -> NoReturn:
    """Exits naming `what` happened to `process`, with the last lines of its log."""
    log_text = process.log_path.read_text(errors="replace")
    tail = "\n".join(log_text.splitlines()[-20:])
    hint = ""
    if target and ("Failed to bind" in log_text or "address already in use" in log_text.lower()):
        hint = port_hint(process.name, target)
    raise SystemExit(f"{process.name} {what}; last log lines ({process.log_path}):\n{tail}{hint}")


async def wait_until_healthy(process: Process, check: object, target: str) -> None:
    """Polls the health check until it passes; exits with the log's tail if the process dies."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if not process.alive():
            exit_with_log(process, "exited during start-up", target)
        if await check(target):  # type: ignore[operator]
            print(f"  ok  {process.name:<15} {target}")
            return
        await asyncio.sleep(0.3)
    raise SystemExit(
        f"{process.name} did not become healthy within {STARTUP_TIMEOUT_SECONDS:.0f} s "
        f"(log: {process.log_path})"
    )


async def wait_for_demo_threads(process: Process, codex_home: Path, stop: asyncio.Event) -> list[DemoThread]:
    """Waits until the grower has listed the demo threads it created; exits with its log's tail
    when it stops first or takes longer than DEMO_THREADS_TIMEOUT_SECONDS, and at once on `stop`
    (Ctrl-C)."""
    deadline = time.monotonic() + DEMO_THREADS_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if stop.is_set():
            raise SystemExit("Interrupted while the demo threads were being created.")
        threads = read_demo_threads(codex_home)
        if threads is not None:
            names = ", ".join(thread.name for thread in threads)
            print(f"  ok  {'demo threads':<15} {names} (real Codex threads under {codex_home})")
            return threads
        if not process.alive():
            exit_with_log(process, "could not create the demo threads")
        await asyncio.sleep(0.3)
    exit_with_log(process, f"did not create the demo threads within {DEMO_THREADS_TIMEOUT_SECONDS:.0f} s")


async def start_demo_model(data: Path, environment: dict[str, str], processes: list[Process]) -> str:
    """Starts the demo model (it joins `processes`) and waits for its health check; returns its
    host:port."""
    listen = demo_model_listen()
    host, _, port = listen.rpartition(":")
    model = Process(
        "demo_model",
        [sys.executable, "-m", "demo_model", "serve", "--host", host, "--port", port],
        data / "logs" / "demo-model.log",
    )
    model.start(environment)
    processes.append(model)
    await wait_until_healthy(model, http_healthy, f"http://{listen}/healthz")
    return listen


def master_on_demo_model(listen: str) -> dict[str, str]:
    """The conversations settings that make the master agent answer through the demo model's Chat
    Completions endpoint at `listen` (its window: DEMO_MASTER_CONTEXT_WINDOW_TOKENS)."""
    return {
        "BOSS_MASTER_BACKEND": "openai_api",
        "BOSS_MASTER_OPENAI_BASE_URL": f"http://{listen}/v1",
        "BOSS_MASTER_OPENAI_API_KEY": API_KEY_VALUE,
        "BOSS_MASTER_MODEL": DEMO_MODEL_NAME,
        "BOSS_MASTER_CONTEXT_WINDOW_TOKENS": str(DEMO_MASTER_CONTEXT_WINDOW_TOKENS),
    }


def master_line(environment: dict[str, str]) -> str:
    """The line saying who answers the master agent's chat in this run."""
    backend = environment.get("BOSS_MASTER_BACKEND", "none")
    if environment.get("BOSS_MASTER_MODEL") == DEMO_MODEL_NAME and backend == "openai_api":
        return (
            "Master agent: the built-in demo model (not a real model) answers from Boss's real state; "
            "set BOSS_MASTER_BACKEND, BOSS_MASTER_OPENAI_BASE_URL, BOSS_MASTER_MODEL and "
            "BOSS_MASTER_OPENAI_API_KEY for a real endpoint"
        )
    if backend == "openai_api":
        model, url = environment.get("BOSS_MASTER_MODEL"), environment.get("BOSS_MASTER_OPENAI_BASE_URL")
        return f"Master agent: {model} at {url}"
    return f"Master agent: backend {backend} (BOSS_MASTER_BACKEND)"


async def start_demo(
    data: Path,
    codex_home: Path,
    environment: dict[str, str],
    interval: float,
    processes: list[Process],
    listen: str,
) -> Process:
    """Starts the demo threads' grower against the demo model at `listen`, which creates the
    threads in the background (see wait_for_demo_threads); it joins `processes`. Returns it."""
    python = sys.executable
    grower = Process(
        "demo_threads",
        [
            python,
            "-m",
            "demo_model.threads",
            "--codex-home",
            str(codex_home),
            "--model-url",
            f"http://{listen}/v1",
            "--live",
            "--interval",
            str(interval),
        ],
        data / "logs" / "demo-threads.log",
    )
    grower.start(environment)
    processes.append(grower)
    return grower


def thread_ids_under(codex_home: Path) -> list[str]:
    """Codex thread ids of the session files under `codex_home`, newest files first."""
    from worker.codex_sessions.follower import discover_rollout_files
    from worker.codex_sessions.rollout import thread_id_from_rollout_name

    files = sorted(discover_rollout_files(codex_home), key=lambda p: p.stat().st_mtime, reverse=True)
    return [thread_id for path in files if (thread_id := thread_id_from_rollout_name(path.name))]


def handoff_summary(package: dict[str, object] | None) -> str:
    """'ready -> relay-1a2b3c' style text for a thread's handoff package, or '-' when it has none."""
    if not package:
        return "-"
    relay = str(package.get("to_thread_id") or "")
    return f"{package.get('package_status')}" + (f" -> {relay[:14]}" if relay else "")


async def print_budgets(gateway: str, token: str, thread_ids: list[str]) -> int:
    """Prints one table row per thread from GET /api/v1/threads/{id}/context-budget; returns how many
    threads have a budget."""
    try:
        rows = await fetch_budgets(gateway, token, thread_ids)
    except httpx.HTTPError as error:
        print(f"\n  gateway unreachable ({error.__class__.__name__}); see its log")
        return 0
    print_table(rows)
    return len(rows)


async def fetch_budgets(gateway: str, token: str, thread_ids: list[str]) -> list[dict[str, Any]]:
    """GET /api/v1/threads/{id}/context-budget for up to 20 threads (the ones that answer 200), each
    with the `title` of its conversation on the home list (GET /api/v1/conversations), sorted by
    title so the table keeps its order."""
    rows = []
    async with httpx.AsyncClient(
        base_url=gateway, timeout=2.0, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        listed = await client.get("/api/v1/conversations", params={"page_size": 200})
        titles = {}
        if listed.status_code == 200:
            for conversation in listed.json().get("conversations", []):
                if conversation.get("conversation_type") == "single_device":
                    titles[conversation.get("context_budget_thread_id")] = conversation.get("project_title")
        for thread_id in thread_ids[:20]:
            response = await client.get(f"/api/v1/threads/{thread_id}/context-budget")
            if response.status_code == 200:
                rows.append({**response.json(), "title": titles.get(thread_id) or thread_id})
    return sorted(rows, key=lambda row: (row["title"], row["thread_id"]))


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per thread: budget, level, Codex's own percent, compactions, handoff, must-finish."""
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"\n[{stamp}] context budgets (GET /api/v1/threads/{{thread_id}}/context-budget)")
    print(
        f"  {'thread':<38} {'budget':>7} {'level':<9} {'codex':>6} {'compactions':>11}"
        f"  {'handoff':<24} must finish"
    )
    for row in rows:
        codex_percent = row.get("codex_context_left_pct")
        codex_left = "-" if codex_percent is None else f"{codex_percent}%"
        budget = f"{row['context_budget_remaining_pct']:>6.1f}%"
        level = row["context_budget_level"]
        if row.get("awaiting_reading_after_compaction"):
            budget, level = "compacted", "(waiting)"  # no reading since the compaction yet
        must_finish = "no"
        if row.get("must_finish_before_compaction"):
            must_finish = "yes: " + row.get("must_finish_reason", "")
        compactions = row.get("compaction_count", 0)
        handoff = handoff_summary(row.get("handoff_package"))
        print(
            f"  {str(row.get('title') or row['thread_id'])[:38]:<38} {budget:>7}"
            f" {level:<9} {codex_left:>6} {compactions:>11}"
            f"  {handoff:<24} {must_finish}"
        )
    if not rows:
        print("  (waiting for the worker's first reports)")


def worker_environment(authority: TokenAuthority, environment: dict[str, str]) -> dict[str, str]:
    """The worker's environment: `environment` with BOSS_WORKER_TOKEN, a token for this machine's
    worker (worker-<hostname> on <hostname>, for the installation's owner, valid
    WORKER_TOKEN_LIFETIME), unless the worker has a token already (BOSS_WORKER_TOKEN is set, or this
    data folder holds the credential of `python -m worker enroll`). The worker signs no tokens
    itself: its package carries no signing code and a node has no auth secret."""
    if environment.get("BOSS_WORKER_TOKEN") or credential_path(environment).exists():
        return environment
    node = hostname()
    token = authority.issue_worker(
        f"worker-{node}", node, WORKER_TOKEN_LIFETIME, owner_id=config.default_owner_id()
    )
    return {**environment, "BOSS_WORKER_TOKEN": token}


async def run_stack(arguments: argparse.Namespace) -> int:
    """Starts the stack, prints budgets until interrupted (or until ready, with --until-ready)."""
    data = config.data_dir()
    secret = config.auth_secret()
    authority = TokenAuthority(secret)
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "gen"), environment.get("PYTHONPATH", "")]
    )
    environment["BOSS_DATA_DIR"] = str(data)
    python = sys.executable
    processes: list[Process] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop.set)
    codex_home, demo, why = choose_codex_home(arguments.codex_home, arguments.demo)
    codex = require_demo_codex() if demo else find_chat_codex()
    grower: Process | None = None
    print(f"Boss local stack: data in {data}, logs in {data / 'logs'}")
    if demo:
        reset_demo_state(data, codex_home)
        # Every child runs the Codex checked here; the worker's local agent gets the demo model's key.
        environment[CODEX_BIN_VARIABLE] = str(codex.binary) if codex else ""
        environment.update(demo_model_environment())
    try:
        model_listen = ""
        if demo or "BOSS_MASTER_BACKEND" not in environment:
            model_listen = await start_demo_model(data, environment, processes)
        if "BOSS_MASTER_BACKEND" not in environment:
            environment.update(master_on_demo_model(model_listen))
        if demo:
            print(f"Demo mode ({why}): real Codex threads against the built-in demo model (not a real model)")
            # The grower creates the threads (a dozen Codex turns) while the services start.
            grower = await start_demo(
                data, codex_home, environment, arguments.demo_interval, processes, model_listen
            )
        for service in GRPC_SERVICES:
            if not (ROOT / "services" / service / "__main__.py").exists():
                print(f"  --  {service:<15} not built yet, skipped")
                continue
            process = Process(
                service, [python, "-m", f"services.{service}", "serve"], data / "logs" / f"{service}.log"
            )
            process.start(environment)
            processes.append(process)
            await wait_until_healthy(process, grpc_healthy, config.service_address(service))
        gateway = Process(
            "gateway", [python, "-m", "services.bff_gateway", "serve"], data / "logs" / "gateway.log"
        )
        gateway.start(environment)
        processes.append(gateway)
        gateway_url = f"http://{config.service_address('gateway')}"
        await wait_until_healthy(gateway, http_healthy, f"{gateway_url}/healthz")

        if grower is not None:
            await wait_for_demo_threads(grower, codex_home, stop)
        worker = Process(
            "worker",
            [python, "-m", "worker", "run", "--codex-home", str(codex_home)],
            data / "logs" / "worker.log",
        )
        worker.start(worker_environment(authority, environment))
        processes.append(worker)
        print(f"  ok  {'worker':<15} following {codex_home}/sessions" + ("" if demo else f" ({why})"))
        print(f"\n{chat_line(codex, demo, codex_home)}")
        print(master_line(environment))

        client_token = authority.issue_client(config.default_owner_id())
        config.write_private(data / "client-token", client_token + "\n")
        print(f"\nOpen the console:  {gateway_url}/console/?token={client_token}")
        if demo:
            print(
                "  then tap a demo thread (billing-api, ios-sync-client, firmware-flasher) and send it a "
                "message: real Codex answers through the demo model"
            )
        print(f"API docs:          {gateway_url}/docs")
        print(f"Client token (also in {data / 'client-token'}):\n  {client_token}")
        question = '{"text": "which thread is close to compaction?", "client_message_id": "ask-1"}'
        print(
            f'Ask the master:    curl -H "Authorization: Bearer $(cat {data / "client-token"})" '
            f"-H 'Content-Type: application/json' -d '{question}' "
            f"{gateway_url}/api/v1/projects/master-agent/messages"
        )
        thread_ids = thread_ids_under(codex_home)
        if thread_ids:
            print(
                f'Try:  curl -H "Authorization: Bearer $(cat {data / "client-token"})" '
                f"{gateway_url}/api/v1/threads/{thread_ids[0]}/context-budget"
            )

        started = time.monotonic()
        announced = False
        while True:
            thread_ids = thread_ids_under(codex_home)
            ready = await print_budgets(gateway_url, client_token, thread_ids)
            for process in processes:
                if not process.alive():
                    raise SystemExit(f"{process.name} stopped unexpectedly (log: {process.log_path})")
            every_thread = bool(thread_ids) and ready == min(len(thread_ids), 20)
            if every_thread and not announced:
                print("\nReady: every thread has a budget, the stack works end to end.")
                announced = True
            if arguments.until_ready is not None:
                if every_thread:
                    return 0
                if time.monotonic() - started > arguments.until_ready:
                    print("\nTimed out before every thread had a budget.", file=sys.stderr)
                    return 1
            if await wait_until_set(stop, arguments.refresh):
                return 0
    finally:
        print("\nStopping…")
        for process in reversed(processes):
            process.stop()
        print("Stopped: every service and the worker have exited.")


def main() -> None:
    """Entry point of `python -m services.local_stack`."""
    parser = argparse.ArgumentParser(
        prog="python -m services.local_stack", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--codex-home", help="Codex home to follow (default $CODEX_HOME or ~/.codex)")
    parser.add_argument(
        "--demo", action="store_true", help="use Boss's demo threads even if you have your own"
    )
    parser.add_argument(
        "--demo-interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between the demo threads' turns (default 4)",
    )
    parser.add_argument(
        "--refresh", type=float, default=3.0, help="seconds between budget tables (default 3)"
    )
    parser.add_argument(
        "--until-ready",
        type=float,
        metavar="SECONDS",
        help="exit 0 once every thread has a budget (1 after SECONDS)",
    )
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # One line at a time even into a pipe or a file, so a reader sees each as it happens.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(run_stack(arguments)))


if __name__ == "__main__":
    main()
