"""Settings of the worker process: where Codex keeps its sessions, who this worker is, where to report.

Resolved once at start from command-line values and the environment (defaults in parentheses):

| setting | flag | environment / default |
|---|---|---|
| Codex home | --codex-home | $CODEX_HOME, else ~/.codex |
| worker id | --worker-id | the enrolled credential's, else worker-<hostname> |
| node id | --node-id | the enrolled credential's, else <hostname> |
| context_budget address | --context-budget-address | BOSS_CONTEXT_BUDGET_ADDRESS, else 127.0.0.1:50051 |
| token | --token | BOSS_WORKER_TOKEN, else the enrolled credential (:func:`resolve_token`) |
| poll interval | --poll-interval | 1.0 s |
| report once and exit | --once (with --timeout, 30 s) | off |
| no heartbeats after | --idle-after | 86,400 s without a new reading |
| run no local agent | --no-local-agent | BOSS_WORKER_LOCAL_AGENT=off, else on (never with --once) |
| Codex binary | --codex-bin | BOSS_WORKER_CODEX_BIN, else the runner's discovery |
| Codex sandbox | --codex-sandbox | BOSS_WORKER_CODEX_SANDBOX, else workspace-write |
| stall timeout of a turn | --task-stall-timeout | BOSS_WORKER_TASK_STALL_TIMEOUT, else 300 s |
| turn cap | --task-turn-cap | BOSS_WORKER_TASK_TURN_CAP, else 1,800 s |
| turns run at once | --max-concurrent-tasks | BOSS_WORKER_MAX_CONCURRENT_TASKS, else 2 |
| scheduler address (local agent) | | BOSS_SCHEDULER_ADDRESS, else 127.0.0.1:50052 |
| TLS to the services | | BOSS_GRPC_TLS (system roots) or BOSS_TLS_CA_FILE (a PEM CA), else plaintext |
| plaintext to a remote host | | BOSS_WORKER_ALLOW_PLAINTEXT, else refused (loopback is always allowed) |

Errors are :class:`SettingsError` with a message meant for the person at the terminal. Every address
the worker will call is checked at start (boss_common/channels.py, `check_worker_transport`): its
credential is never sent in plaintext to another machine unless BOSS_WORKER_ALLOW_PLAINTEXT is on.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from boss_common import config
from boss_common.channels import ChannelSecurity, ChannelSettingsError, check_worker_transport, switch
from worker.codex_sessions.follower import ARCHIVED_SESSIONS_SUBDIR, SESSIONS_SUBDIR, discover_rollout_files
from worker.enrollment import Credential, EnrollmentError, credential_path, read_credential

DEFAULT_POLL_INTERVAL_S = 1.0
DEFAULT_GIT_REFRESH_S = 10.0
DEFAULT_FLUSH_TIMEOUT_S = 5.0
DEFAULT_ONCE_TIMEOUT_S = 30.0
DEFAULT_IDLE_AFTER_S = 24 * 3600.0
CODEX_SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
DEFAULT_CODEX_SANDBOX = "workspace-write"
DEFAULT_TASK_STALL_TIMEOUT_S = 300.0
DEFAULT_TASK_TURN_CAP_S = 1800.0
DEFAULT_MAX_CONCURRENT_TASKS = 2
MAX_CONCURRENT_TASKS_LIMIT = 32


class SettingsError(Exception):
    """A setting is missing or wrong; the message says what to do."""


@dataclass(frozen=True)
class LocalAgentSettings:
    """What the worker's local agent (worker/local_agent/) needs: where to claim tasks and how to
    run Codex for them.

    Attributes:
        scheduler_address: gRPC target of the scheduler (ClaimTask and the other task calls).
        codex_bin: the Codex executable; None = the runner's own discovery.
        codex_sandbox: Codex's sandbox for a turn: read-only, workspace-write or danger-full-access.
        stall_timeout_s: a turn with no output from Codex for this long is stopped (seconds).
        turn_cap_s: a turn running longer than this in all is stopped (seconds).
        max_concurrent_tasks: turns run at the same time (claim slots), 1-32.
    """

    scheduler_address: str
    codex_bin: Path | None = None
    codex_sandbox: str = DEFAULT_CODEX_SANDBOX
    stall_timeout_s: float = DEFAULT_TASK_STALL_TIMEOUT_S
    turn_cap_s: float = DEFAULT_TASK_TURN_CAP_S
    max_concurrent_tasks: int = DEFAULT_MAX_CONCURRENT_TASKS


@dataclass(frozen=True)
class WorkerSettings:
    """Everything one worker process needs.

    Attributes:
        codex_home: the Codex home folder (holds `sessions/YYYY/MM/DD/rollout-*.jsonl`).
        worker_id: this worker's id (the token must be bound to it).
        node_id: this machine's id (the token must be bound to it).
        context_budget_address: gRPC target of the context_budget service.
        token: the worker bearer token (never shown in the settings' repr).
        poll_interval_s: seconds between two reads of the session files.
        git_refresh_s: a folder's git state is re-read at most this often (seconds).
        flush_timeout_s: on SIGTERM/SIGINT, seconds to wait for pending acks before exiting.
        once: read everything once, report, wait for acks, exit.
        once_timeout_s: with `once`, seconds to wait for every ack before giving up.
        idle_after_s: a thread whose latest reading is older than this (seconds) is reported, but
            no longer re-sent as a heartbeat until it moves again.
        local_agent: the local agent's settings; None runs no local agent (--no-local-agent, --once).
    """

    codex_home: Path
    worker_id: str
    node_id: str
    context_budget_address: str
    token: str = field(repr=False)
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    git_refresh_s: float = DEFAULT_GIT_REFRESH_S
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    once: bool = False
    once_timeout_s: float = DEFAULT_ONCE_TIMEOUT_S
    idle_after_s: float = DEFAULT_IDLE_AFTER_S
    local_agent: LocalAgentSettings | None = None

    @property
    def sessions_dir(self) -> Path:
        """`<codex_home>/sessions`."""
        return self.codex_home / SESSIONS_SUBDIR


def hostname() -> str:
    """This machine's short host name (lower case), "localhost" when it has none."""
    name = socket.gethostname().split(".", 1)[0].strip().lower()
    return name or "localhost"


def default_codex_home(environ: Mapping[str, str] | None = None) -> Path:
    """$CODEX_HOME when set, else ~/.codex (Codex's own default)."""
    environ = os.environ if environ is None else environ
    configured = environ.get("CODEX_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".codex"


def check_codex_home(codex_home: Path, *, require_sessions: bool) -> None:
    """Raise SettingsError when `codex_home` has neither `sessions` nor `archived_sessions` (or,
    with `require_sessions`, no rollout file, plain or `.jsonl.zst`, in either)."""
    sessions = codex_home / SESSIONS_SUBDIR
    folders = (sessions, codex_home / ARCHIVED_SESSIONS_SUBDIR)
    missing = not any(folder.is_dir() for folder in folders) or (
        require_sessions and not discover_rollout_files(codex_home)
    )
    if missing:
        raise SettingsError(f"no Codex sessions under {sessions}: point --codex-home at your ~/.codex")


def resolve_token(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The worker token: `explicit` (--token, or the enrolled credential's), else BOSS_WORKER_TOKEN.

    A worker never signs a token itself: a node gets its credential from `enroll` with its owner's
    pairing code (worker/enrollment.py), and `make run` gives its worker one through
    BOSS_WORKER_TOKEN. Raises SettingsError when there is none.
    """
    if explicit:
        return explicit
    environ = os.environ if environ is None else environ
    from_environment = environ.get("BOSS_WORKER_TOKEN")
    if from_environment:
        return from_environment
    raise SettingsError(
        "no worker token: enroll this node with a pairing code from its owner (boss-worker enroll CODE), "
        "or pass --token or set BOSS_WORKER_TOKEN"
    )


def stored_credential(environ: Mapping[str, str]) -> Credential | None:
    """The credential `python -m worker enroll` stored (worker/enrollment.py), or None. Raises
    SettingsError for a file others may read or that is not a credential."""
    try:
        return read_credential(credential_path(environ))
    except EnrollmentError as error:
        raise SettingsError(str(error)) from error


def _switch(name: str, environ: Mapping[str, str], default: bool) -> bool:
    """An on/off environment variable (1/0, true/false, yes/no, on/off; unset or empty = `default`).
    Raises SettingsError for any other value."""
    try:
        return switch(name, environ, default)
    except ChannelSettingsError as error:
        raise SettingsError(str(error)) from error


def _positive_seconds(
    value: float | None, flag: str, variable: str, environ: Mapping[str, str], default: float
) -> float:
    """The flag's value, else the environment variable's, else `default`; must be > 0 seconds."""
    source, raw = (flag, value) if value is not None else (variable, environ.get(variable) or None)
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise SettingsError(f"{source} must be a number of seconds, got {raw!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise SettingsError(f"{source} must be > 0 seconds, got {raw}")
    return seconds


def _task_slots(value: int | None, environ: Mapping[str, str]) -> int:
    """--max-concurrent-tasks, else BOSS_WORKER_MAX_CONCURRENT_TASKS, else 2; an integer 1-32."""
    variable = "BOSS_WORKER_MAX_CONCURRENT_TASKS"
    source, raw = (
        ("--max-concurrent-tasks", value) if value is not None else (variable, environ.get(variable))
    )
    if raw is None or raw == "":
        return DEFAULT_MAX_CONCURRENT_TASKS
    try:
        slots = int(raw)
    except ValueError:
        raise SettingsError(f"{source} must be a whole number, got {raw!r}") from None
    if not 1 <= slots <= MAX_CONCURRENT_TASKS_LIMIT:
        raise SettingsError(f"{source} must be from 1 to {MAX_CONCURRENT_TASKS_LIMIT}, got {slots}")
    return slots


def resolve_codex_bin(value: Path | None, environ: Mapping[str, str]) -> Path | None:
    """--codex-bin, else BOSS_WORKER_CODEX_BIN, else None (the runner discovers Codex itself).

    A bare name ("codex") is looked up on PATH. Raises SettingsError when the given program does
    not exist or is not executable.
    """
    variable = "BOSS_WORKER_CODEX_BIN"
    source, raw = ("--codex-bin", str(value)) if value is not None else (variable, environ.get(variable, ""))
    if not raw:
        return None
    if os.sep not in raw and "/" not in raw:
        found = shutil.which(raw)
        if found is None:
            raise SettingsError(f"{source}: no program {raw!r} on PATH")
        return Path(found)
    path = Path(raw).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SettingsError(f"{source}: {path} is not an executable file")
    return path.absolute()


def local_agent_settings(
    *,
    enabled: bool | None,
    codex_bin: Path | None = None,
    codex_sandbox: str | None = None,
    task_stall_timeout_s: float | None = None,
    task_turn_cap_s: float | None = None,
    max_concurrent_tasks: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> LocalAgentSettings | None:
    """The local agent's settings from the command line (None = not given), the environment
    (BOSS_WORKER_LOCAL_AGENT, BOSS_WORKER_CODEX_BIN, BOSS_WORKER_CODEX_SANDBOX,
    BOSS_WORKER_TASK_STALL_TIMEOUT, BOSS_WORKER_TASK_TURN_CAP, BOSS_WORKER_MAX_CONCURRENT_TASKS,
    BOSS_SCHEDULER_ADDRESS) and the defaults; None when the local agent is off (`enabled` False, or
    not given and BOSS_WORKER_LOCAL_AGENT=off). Every value is checked even then.

    Raises SettingsError naming the flag or variable: an unknown sandbox, a non-positive or
    non-numeric timeout, slots outside 1-32, a Codex binary that is not an executable file.
    """
    environ = os.environ if environ is None else environ
    on = _switch("BOSS_WORKER_LOCAL_AGENT", environ, default=True) if enabled is None else enabled
    sandbox_source = "--codex-sandbox" if codex_sandbox is not None else "BOSS_WORKER_CODEX_SANDBOX"
    sandbox = codex_sandbox if codex_sandbox is not None else environ.get("BOSS_WORKER_CODEX_SANDBOX", "")
    sandbox = sandbox or DEFAULT_CODEX_SANDBOX
    if sandbox not in CODEX_SANDBOXES:
        raise SettingsError(f"{sandbox_source} must be one of {', '.join(CODEX_SANDBOXES)}, got {sandbox!r}")
    settings = LocalAgentSettings(
        scheduler_address=config.service_address("scheduler"),
        codex_bin=resolve_codex_bin(codex_bin, environ),
        codex_sandbox=sandbox,
        stall_timeout_s=_positive_seconds(
            task_stall_timeout_s,
            "--task-stall-timeout",
            "BOSS_WORKER_TASK_STALL_TIMEOUT",
            environ,
            DEFAULT_TASK_STALL_TIMEOUT_S,
        ),
        turn_cap_s=_positive_seconds(
            task_turn_cap_s, "--task-turn-cap", "BOSS_WORKER_TASK_TURN_CAP", environ, DEFAULT_TASK_TURN_CAP_S
        ),
        max_concurrent_tasks=_task_slots(max_concurrent_tasks, environ),
    )
    return settings if on else None


def check_transport(addresses: Sequence[str], environ: Mapping[str, str]) -> None:
    """Raises SettingsError, naming the setting to change, when the transport settings are wrong
    or the worker would send its credential in plaintext to one of `addresses` on another machine
    (`check_worker_transport`)."""
    try:
        security = ChannelSecurity.from_environment(environ)
        for address in addresses:
            check_worker_transport(address, security)
    except ChannelSettingsError as error:
        raise SettingsError(str(error)) from None


def settings_from_arguments(
    *,
    codex_home: Path | None,
    worker_id: str | None,
    node_id: str | None,
    context_budget_address: str | None,
    token: str | None,
    poll_interval_s: float,
    once: bool,
    once_timeout_s: float = DEFAULT_ONCE_TIMEOUT_S,
    idle_after_s: float = DEFAULT_IDLE_AFTER_S,
    local_agent: bool | None = None,
    codex_bin: Path | None = None,
    codex_sandbox: str | None = None,
    task_stall_timeout_s: float | None = None,
    task_turn_cap_s: float | None = None,
    max_concurrent_tasks: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> WorkerSettings:
    """Resolve the command line (None = not given) against the environment and defaults.

    `local_agent` False is --no-local-agent; the local agent's other values are resolved by
    :func:`local_agent_settings`, and no local agent runs with `once`.

    Raises SettingsError for a missing Codex home (with `once`: one without any session), a
    non-positive interval or timeout, no way to get a token, a bad local-agent setting, or a
    transport that would carry the credential in plaintext to another machine (`check_transport`:
    context_budget's address, and with no `once` the conversations and scheduler addresses too).
    """
    home = (codex_home.expanduser() if codex_home else default_codex_home(environ)).resolve()
    check_codex_home(home, require_sessions=once)
    if poll_interval_s <= 0:
        raise SettingsError(f"--poll-interval must be > 0 seconds, got {poll_interval_s}")
    if once_timeout_s <= 0:
        raise SettingsError(f"--timeout must be > 0 seconds, got {once_timeout_s}")
    if idle_after_s <= 0:
        raise SettingsError(f"--idle-after must be > 0 seconds, got {idle_after_s}")
    agent = local_agent_settings(
        enabled=local_agent,
        codex_bin=codex_bin,
        codex_sandbox=codex_sandbox,
        task_stall_timeout_s=task_stall_timeout_s,
        task_turn_cap_s=task_turn_cap_s,
        max_concurrent_tasks=max_concurrent_tasks,
        environ=environ,
    )
    host = hostname()
    environ = os.environ if environ is None else environ
    enrolled = None if token or environ.get("BOSS_WORKER_TOKEN") else stored_credential(environ)
    if enrolled is not None:
        if (worker_id or enrolled.worker_id, node_id or enrolled.node_id) != (
            enrolled.worker_id,
            enrolled.node_id,
        ):
            raise SettingsError(
                f"this node is enrolled as worker {enrolled.worker_id!r} on node {enrolled.node_id!r}: "
                "drop --worker-id / --node-id, or enroll again with a new pairing code"
            )
        token = enrolled.worker_token
    resolved_worker = worker_id or (enrolled.worker_id if enrolled else f"worker-{host}")
    resolved_node = node_id or (enrolled.node_id if enrolled else host)
    budget_address = context_budget_address or config.service_address("context_budget")
    others = () if once else (config.service_address("conversations"), config.service_address("scheduler"))
    check_transport((budget_address, *others), environ)
    return WorkerSettings(
        codex_home=home,
        worker_id=resolved_worker,
        node_id=resolved_node,
        context_budget_address=budget_address,
        token=resolve_token(token, environ),
        poll_interval_s=poll_interval_s,
        once=once,
        once_timeout_s=once_timeout_s,
        idle_after_s=idle_after_s,
        local_agent=None if once else agent,
    )
