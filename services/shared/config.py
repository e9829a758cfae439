"""Configuration from the environment, with defaults that run everything on one machine.

| variable | default | meaning |
|---|---|---|
| BOSS_DATA_DIR | ./var | where the embedded SQLite files, the local auth secret and logs live |
| BOSS_DATABASE_URL | (unset) | one SQLAlchemy URL for every service (each gets its own PostgreSQL schema) |
| BOSS_<SERVICE>_DATABASE_URL | (unset) | per-service URL; wins over BOSS_DATABASE_URL |
| BOSS_AUTH_SECRET | contents of $BOSS_DATA_DIR/auth-secret | HS256 signing key for tokens |
| BOSS_<SERVICE>_LISTEN | 127.0.0.1:<port> | where a service listens |
| BOSS_<SERVICE>_ADDRESS | 127.0.0.1:<port> | where clients find a service |
| BOSS_DATABASE_WAIT_SECONDS | 300 | how long a starting service waits for its PostgreSQL (db.py) |
| BOSS_MIGRATE_ON_START | true | apply Alembic migrations when a service starts (false in production) |
| BOSS_LOG_LEVEL | INFO | Python logging level |
| BOSS_LOG_FORMAT | text | `text` or `json` (one JSON object per line: logging_setup.py) |
| BOSS_<SERVICE>_METRICS_LISTEN | (unset) | host:port of the Prometheus `/metrics` listener (metrics.py) |
| BOSS_METRICS_SAMPLE_SECONDS | 15 | time between two samples of the gauges (metrics.py) |
| BOSS_RETENTION_* | see retention.py | how long history and outbox events are kept |
| BOSS_DEFAULT_OWNER_ID | local | owner of threads registered without one (one person's installation) |
| BOSS_TLS_CERT_FILE | (unset) | PEM certificate chain a gRPC service serves TLS with |
| BOSS_TLS_KEY_FILE | (unset) | PEM private key of that certificate; neither variable set: plaintext |
| BOSS_GRPC_TLS | off | the services' own channels use TLS (boss_common/channels.py) |
| BOSS_TLS_CA_FILE | (unset) | PEM CA certificates those channels trust instead of the system's |

Services are named `context_budget`, `scheduler`, `conversations` and `gateway`. What the worker
reads as well (BOSS_DATA_DIR, BOSS_<SERVICE>_ADDRESS: `data_dir`, `service_address`) is defined in
boss_common/config.py and used from here; the channels' transport settings in boss_common/channels.py.
"""

from __future__ import annotations

import os
import secrets
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path

from boss_common.channels import ChannelSettingsError, environment_security, read_pem
from boss_common.config import DEFAULT_PORTS, data_dir, setting
from boss_common.config import service_address as service_address  # the services import it from here


def write_private(path: Path, text: str) -> None:
    """Writes `text` to `path` readable and writable by its owner only (mode 0600, set before a
    byte is written; an existing file's wider mode is narrowed first)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
        os.fchmod(stream.fileno(), 0o600)
        stream.write(text)


def make_private(path: Path) -> None:
    """Narrows an existing file's mode to its owner (0600 at most). Raises OSError."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & 0o700)


def database_url(service: str) -> str:
    """The SQLAlchemy URL of a service's database.

    Order: BOSS_<SERVICE>_DATABASE_URL, then BOSS_DATABASE_URL, then an embedded SQLite file
    `$BOSS_DATA_DIR/<service>.sqlite3`. PostgreSQL URLs use the psycopg 3 driver; a plain
    `postgresql://` URL is rewritten to `postgresql+psycopg://`.
    """
    url = setting(f"BOSS_{service.upper()}_DATABASE_URL") or setting("BOSS_DATABASE_URL")
    if url is None:
        return f"sqlite+aiosqlite:///{data_dir() / f'{service}.sqlite3'}"
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def listen_address(service: str) -> str:
    """host:port a service binds to."""
    return setting(f"BOSS_{service.upper()}_LISTEN") or f"127.0.0.1:{DEFAULT_PORTS[service]}"


def default_owner_id() -> str:
    """The owner of threads that workers register without naming one, and of `make run`'s client
    token: a one-person installation has a single owner."""
    return setting("BOSS_DEFAULT_OWNER_ID") or "local"


def migrate_on_start() -> bool:
    """Whether services apply their migrations at start (local mode) or leave it to `migrate`."""
    return (setting("BOSS_MIGRATE_ON_START") or "true").lower() in {"1", "true", "yes"}


def auth_secret(create: bool = True) -> str:
    """The HS256 signing key: BOSS_AUTH_SECRET, else `$BOSS_DATA_DIR/auth-secret`.

    With `create`, a missing file is made with 256 random bits (mode 0600), the way a local
    notebook server makes its token; an existing file that others may read is narrowed to 0600.
    Raises RuntimeError when no secret exists and create is False.
    """
    configured = setting("BOSS_AUTH_SECRET")
    if configured:
        return configured
    path = data_dir() / "auth-secret"
    if path.exists():
        make_private(path)  # a secret others may read is not one
        return path.read_text().strip()
    if not create:
        raise RuntimeError(f"no auth secret: set BOSS_AUTH_SECRET or create {path}")
    secret = secrets.token_urlsafe(32)
    write_private(path, secret + "\n")
    return secret


TLS_CERT_FILE = "BOSS_TLS_CERT_FILE"
TLS_KEY_FILE = "BOSS_TLS_KEY_FILE"


@dataclass(frozen=True)
class ServerTls:
    """The certificate a gRPC server serves TLS with.

    Attributes:
        certificate_chain: PEM, the server's certificate first, then any intermediates.
        private_key: PEM, the key of the first certificate (never shown in the repr).
    """

    certificate_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)

    @classmethod
    def from_files(cls, cert_file: str | Path, key_file: str | Path) -> ServerTls:
        """Reads both PEM files and checks that they load as a certificate chain and its key (Python's
        ssl module: gRPC itself would only refuse to listen, without saying why). Raises
        ChannelSettingsError naming BOSS_TLS_CERT_FILE or BOSS_TLS_KEY_FILE and the file when one is
        missing, unreadable or not PEM, or both when they do not load together (the key of another
        certificate, a key protected by a passphrase: gRPC takes none)."""
        certificate_chain = read_pem(TLS_CERT_FILE, str(cert_file), "CERTIFICATE")
        private_key = read_pem(TLS_KEY_FILE, str(key_file), "PRIVATE KEY")
        problem = _certificate_and_key_problem(Path(cert_file).expanduser(), Path(key_file).expanduser())
        if problem is not None:
            raise ChannelSettingsError(
                f"{TLS_CERT_FILE} {cert_file} and {TLS_KEY_FILE} {key_file} are not a certificate and "
                f"its private key: {problem}"
            )
        return cls(certificate_chain=certificate_chain, private_key=private_key)


class _PassphraseNeeded(Exception):
    """The private key is encrypted (ssl asked for its passphrase)."""


def _refuse_passphrase() -> str:
    raise _PassphraseNeeded


def _certificate_and_key_problem(cert_file: Path, key_file: Path) -> str | None:
    """Why `cert_file` and `key_file` do not load as a certificate chain and its key, or None."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file, password=_refuse_passphrase)
    except _PassphraseNeeded:
        return "the key is protected by a passphrase (decrypt it: openssl pkey -in KEY -out KEY.plain)"
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            return "the key is another certificate's"
        return f"one of them holds no valid certificate or key ({error})"
    return None


def server_tls() -> ServerTls | None:
    """BOSS_TLS_CERT_FILE and BOSS_TLS_KEY_FILE read (`ServerTls.from_files`), or None (plaintext)
    when neither is set. Raises ChannelSettingsError when only one is set or a file is bad."""
    cert_file, key_file = setting(TLS_CERT_FILE), setting(TLS_KEY_FILE)
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        given, missing = (TLS_CERT_FILE, TLS_KEY_FILE) if key_file is None else (TLS_KEY_FILE, TLS_CERT_FILE)
        raise ChannelSettingsError(f"{given} is set but {missing} is not: set both (PEM files) or neither")
    return ServerTls.from_files(cert_file, key_file)


@dataclass(frozen=True)
class ServiceSettings:
    """Everything one service process needs to start."""

    service: str
    database_url: str
    listen: str
    migrate_on_start: bool
    auth_secret: str
    tls: ServerTls | None = None
    """The certificate to serve TLS with; None listens in plaintext."""

    @classmethod
    def from_environment(cls, service: str) -> ServiceSettings:
        """Reads the settings of `service` from the environment (see the module table), the
        channels' transport settings included, so that a bad one stops the process at start.
        Raises SystemExit naming the setting and the file when a TLS setting is wrong."""
        try:
            tls = server_tls()
            environment_security()
        except ChannelSettingsError as error:
            raise SystemExit(f"{service}: {error}") from None
        return cls(
            service=service,
            database_url=database_url(service),
            listen=listen_address(service),
            migrate_on_start=migrate_on_start(),
            auth_secret=auth_secret(),
            tls=tls,
        )
