"""`make run`: the whole of Boss on one machine, on the embedded SQLite default.

Starts every service as its own process (context_budget, scheduler, conversations, gateway), waits
until each passes its health check, then starts a device worker that follows Codex session files:
your own `$CODEX_HOME` (default ~/.codex) when it has sessions, otherwise demo sessions that Boss
writes and grows live under `$BOSS_DATA_DIR/demo-codex-home`. It prints a client token and the URLs
to open, then a table of every thread's context budget as the gateway reports it, refreshed every few
seconds. Ctrl-C stops everything cleanly. Logs of each process are in `$BOSS_DATA_DIR/logs/`.

Usage: python -m services.local_stack [--codex-home DIR] [--demo] [--until-ready SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.shared import config
from services.shared.auth import TokenAuthority

log = logging.getLogger("boss.local")
ROOT = Path(__file__).resolve().parent.parent
GRPC_SERVICES = ("context_budget", "scheduler", "conversations")
STARTUP_TIMEOUT_SECONDS = 60.0


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


def has_sessions(codex_home: Path) -> bool:
    """True when `codex_home/sessions` holds at least one rollout file."""
    sessions = codex_home / "sessions"
    return sessions.is_dir() and any(sessions.rglob("rollout-*.jsonl"))


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
    """Demo runs start from nothing: the previous demo sessions and the embedded databases they fed
    are removed, so no frozen threads from an earlier run linger. Never touches a PostgreSQL
    database or a real Codex home."""
    shutil.rmtree(codex_home, ignore_errors=True)
    for service in GRPC_SERVICES:
        if config.database_url(service).startswith("sqlite"):
            for leftover in data.glob(f"{service}.sqlite3*"):
                leftover.unlink()


async def grpc_healthy(address: str, timeout: float = 1.0) -> bool:
    """One gRPC health check of the whole server at `address`."""
    async with grpc.aio.insecure_channel(address) as channel:
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


async def wait_until_healthy(process: Process, check: object, target: str) -> None:
    """Polls the health check until it passes; exits with the log's tail if the process dies."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if not process.alive():
            log_text = process.log_path.read_text(errors="replace")
            tail = "\n".join(log_text.splitlines()[-20:])
            hint = ""
            if "Failed to bind" in log_text or "address already in use" in log_text.lower():
                variable = f"BOSS_{process.name.upper()}_LISTEN"
                hint = (
                    f"\n{target} is taken by another program: stop it, or move {process.name} with "
                    f"{variable}=127.0.0.1:PORT and BOSS_{process.name.upper()}_ADDRESS=127.0.0.1:PORT"
                )
            raise SystemExit(f"{process.name} exited during start-up; last log lines:\n{tail}{hint}")
        if await check(target):  # type: ignore[operator]
            print(f"  ok  {process.name:<15} {target}")
            return
        await asyncio.sleep(0.3)
    raise SystemExit(
        f"{process.name} did not become healthy within {STARTUP_TIMEOUT_SECONDS:.0f} s "
        f"(log: {process.log_path})"
    )


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
    """GET /api/v1/threads/{id}/context-budget for up to 20 threads; the ones that answer 200."""
    rows = []
    async with httpx.AsyncClient(
        base_url=gateway, timeout=2.0, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        for thread_id in thread_ids[:20]:
            response = await client.get(f"/api/v1/threads/{thread_id}/context-budget")
            if response.status_code == 200:
                rows.append(response.json())
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per thread: budget, level, Codex's own percent, compactions, handoff, must-finish."""
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"\n[{stamp}] context budgets (GET /api/v1/threads/{{thread_id}}/context-budget)")
    print(
        f"  {'thread':<38} {'budget':>7} {'level':<9} {'codex':>6} {'compactions':>11}"
        f"  {'handoff':<24} must finish"
    )
    for row in rows:
        codex_left = f"{row.get('codex_context_left_pct', '?')}%"
        must_finish = "no"
        if row.get("must_finish_before_compaction"):
            must_finish = "yes: " + row.get("must_finish_reason", "")
        compactions = row.get("compaction_count", 0)
        handoff = handoff_summary(row.get("handoff_package"))
        print(
            f"  {row['thread_id']:<38} {row['context_budget_remaining_pct']:>6.1f}%"
            f" {row['context_budget_level']:<9} {codex_left:>6} {compactions:>11}"
            f"  {handoff:<24} {must_finish}"
        )
    if not rows:
        print("  (waiting for the worker's first reports)")


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
    print(f"Boss local stack: data in {data}, logs in {data / 'logs'}")
    if demo:
        reset_demo_state(data, codex_home)
    try:
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

        if demo:
            print(f"\nDemo mode ({why}): writing demo sessions under {codex_home}")
            player = Process(
                "demo-sessions",
                [
                    python,
                    "-m",
                    "worker.demo_sessions",
                    "--codex-home",
                    str(codex_home),
                    "--live",
                    "--interval",
                    str(arguments.demo_interval),
                ],
                data / "logs" / "demo-sessions.log",
            )
            player.start(environment)
            processes.append(player)
            deadline = time.monotonic() + 20
            while not has_sessions(codex_home) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
        worker = Process(
            "worker",
            [python, "-m", "worker", "run", "--codex-home", str(codex_home)],
            data / "logs" / "worker.log",
        )
        worker.start(environment)
        processes.append(worker)
        print(f"  ok  {'worker':<15} following {codex_home}/sessions" + ("" if demo else f" ({why})"))

        client_token = authority.issue_client(config.default_owner_id())
        (data / "client-token").write_text(client_token + "\n")
        print(f"\nOpen the console:  {gateway_url}/console/?token={client_token}")
        print(f"API docs:          {gateway_url}/docs")
        print(f"Client token (also in {data / 'client-token'}):\n  {client_token}")
        thread_ids = thread_ids_under(codex_home)
        if thread_ids:
            print(
                f'Try:  curl -H "Authorization: Bearer $(cat {data / "client-token"})" '
                f"{gateway_url}/api/v1/threads/{thread_ids[0]}/context-budget"
            )

        started = time.monotonic()
        while True:
            thread_ids = thread_ids_under(codex_home)
            ready = await print_budgets(gateway_url, client_token, thread_ids)
            for process in processes:
                if not process.alive():
                    raise SystemExit(f"{process.name} stopped unexpectedly (log: {process.log_path})")
            if arguments.until_ready is not None:
                if thread_ids and ready == min(len(thread_ids), 20):
                    print("\nEvery thread has a budget: the stack works end to end.")
                    return 0
                if time.monotonic() - started > arguments.until_ready:
                    print("\nTimed out before every thread had a budget.", file=sys.stderr)
                    return 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), arguments.refresh)
            if stop.is_set():
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
        "--demo", action="store_true", help="use Boss's demo sessions even if you have your own"
    )
    parser.add_argument(
        "--demo-interval", type=float, default=4.0, help="seconds between demo turns (default 4)"
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
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(run_stack(arguments)))


if __name__ == "__main__":
    main()
