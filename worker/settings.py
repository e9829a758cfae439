"""Settings of the worker process: where Codex keeps its sessions, who this worker is, where to report.

Resolved once at start from command-line values and the environment (defaults in parentheses):

| setting | flag | environment / default |
|---|---|---|
| Codex home | --codex-home | $CODEX_HOME, else ~/.codex |
| worker id | --worker-id | worker-<hostname> |
| node id | --node-id | <hostname> |
| context_budget address | --context-budget-address | BOSS_CONTEXT_BUDGET_ADDRESS, else 127.0.0.1:50051 |
| token | --token | BOSS_WORKER_TOKEN, else minted from the local auth secret (see :func:`resolve_token`) |
| poll interval | --poll-interval | 1.0 s |
| report once and exit | --once (with --timeout, 30 s) | off |
| no heartbeats after | --idle-after | 86,400 s without a new reading |

Errors are :class:`SettingsError` with a message meant for the person at the terminal.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.shared import config
from services.shared.auth import TokenAuthority
from worker.codex_sessions.follower import SESSIONS_SUBDIR, discover_rollout_files

DEFAULT_POLL_INTERVAL_S = 1.0
DEFAULT_GIT_REFRESH_S = 10.0
DEFAULT_FLUSH_TIMEOUT_S = 5.0
DEFAULT_ONCE_TIMEOUT_S = 30.0
DEFAULT_IDLE_AFTER_S = 24 * 3600.0


class SettingsError(Exception):
    """A setting is missing or wrong; the message says what to do."""


@dataclass(frozen=True)
class WorkerSettings:
    """Everything one worker process needs.

    Attributes:
        codex_home: the Codex home folder (holds `sessions/YYYY/MM/DD/rollout-*.jsonl`).
        worker_id: this worker's id (the token must be bound to it).
        node_id: this machine's id (the token must be bound to it).
        context_budget_address: gRPC target of the context_budget service.
        token: the worker bearer token (never shown in the settings' repr).
        token_minted: the token was minted here from the local auth secret (and can be re-minted).
        poll_interval_s: seconds between two reads of the session files.
        git_refresh_s: a folder's git state is re-read at most this often (seconds).
        flush_timeout_s: on SIGTERM/SIGINT, seconds to wait for pending acks before exiting.
        once: read everything once, report, wait for acks, exit.
        once_timeout_s: with `once`, seconds to wait for every ack before giving up.
        idle_after_s: a thread whose latest reading is older than this (seconds) is reported, but
            no longer re-sent as a heartbeat until it moves again.
    """

    codex_home: Path
    worker_id: str
    node_id: str
    context_budget_address: str
    token: str = field(repr=False)
    token_minted: bool = False
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    git_refresh_s: float = DEFAULT_GIT_REFRESH_S
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    once: bool = False
    once_timeout_s: float = DEFAULT_ONCE_TIMEOUT_S
    idle_after_s: float = DEFAULT_IDLE_AFTER_S

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
    """Raise SettingsError when `codex_home/sessions` is missing (or, with `require_sessions`,
    holds no rollout file)."""
    sessions = codex_home / SESSIONS_SUBDIR
    missing = not sessions.is_dir() or (require_sessions and not discover_rollout_files(codex_home))
    if missing:
        raise SettingsError(f"no Codex sessions under {sessions}: point --codex-home at your ~/.codex")


def resolve_token(
    explicit: str | None, worker_id: str, node_id: str, environ: Mapping[str, str] | None = None
) -> str:
    """The worker token: `explicit` (--token), else BOSS_WORKER_TOKEN, else one minted here.

    Minting needs the deployment's auth secret on this machine (BOSS_AUTH_SECRET or
    `$BOSS_DATA_DIR/auth-secret`, see services/shared/config.py); it is never created here. The
    minted token is bound to `worker_id` and `node_id`. Raises SettingsError when none is available.
    """
    if explicit:
        return explicit
    environ = os.environ if environ is None else environ
    from_environment = environ.get("BOSS_WORKER_TOKEN")
    if from_environment:
        return from_environment
    try:
        secret = config.auth_secret(create=False)
    except RuntimeError as error:
        raise SettingsError(
            "no worker token: pass --token or set BOSS_WORKER_TOKEN "
            f"(or run where Boss keeps its auth secret: {error})"
        ) from error
    return mint_worker_token(secret, worker_id, node_id)


def mint_worker_token(secret: str, worker_id: str, node_id: str) -> str:
    """A fresh worker token (30 days) signed with `secret`. Raises SettingsError for a bad secret."""
    try:
        return TokenAuthority(secret).issue_worker(worker_id, node_id)
    except ValueError as error:
        raise SettingsError(f"cannot mint a worker token: {error}") from error


def token_provider(settings: WorkerSettings) -> Callable[[], str]:
    """What the reporter calls at each (re)connect: the configured token, or, when it was minted
    here, a freshly minted one (a worker running for weeks never outlives its token). Falls back to
    the settings' token when the secret became unreadable."""
    if not settings.token_minted:
        return lambda: settings.token

    def mint() -> str:
        try:
            return mint_worker_token(config.auth_secret(create=False), settings.worker_id, settings.node_id)
        except (RuntimeError, SettingsError):
            return settings.token

    return mint


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
    environ: Mapping[str, str] | None = None,
) -> WorkerSettings:
    """Resolve the command line (None = not given) against the environment and defaults.

    Raises SettingsError for a missing Codex home (with `once`: one without any session), a
    non-positive interval or timeout, or no way to get a token.
    """
    home = (codex_home.expanduser() if codex_home else default_codex_home(environ)).resolve()
    check_codex_home(home, require_sessions=once)
    if poll_interval_s <= 0:
        raise SettingsError(f"--poll-interval must be > 0 seconds, got {poll_interval_s}")
    if once_timeout_s <= 0:
        raise SettingsError(f"--timeout must be > 0 seconds, got {once_timeout_s}")
    if idle_after_s <= 0:
        raise SettingsError(f"--idle-after must be > 0 seconds, got {idle_after_s}")
    host = hostname()
    resolved_worker = worker_id or f"worker-{host}"
    resolved_node = node_id or host
    environ = os.environ if environ is None else environ
    minted = not token and not environ.get("BOSS_WORKER_TOKEN")
    return WorkerSettings(
        codex_home=home,
        worker_id=resolved_worker,
        node_id=resolved_node,
        context_budget_address=context_budget_address or config.service_address("context_budget"),
        token=resolve_token(token, resolved_worker, resolved_node, environ),
        token_minted=minted,
        poll_interval_s=poll_interval_s,
        once=once,
        once_timeout_s=once_timeout_s,
        idle_after_s=idle_after_s,
    )
