"""The client side of gRPC transport security: every channel a worker, the gateway or a service opens
to a Boss gRPC service is made by `open_channel`, plaintext or TLS as the environment says.

| variable | default | meaning |
|---|---|---|
| BOSS_GRPC_TLS | off | on: channels use TLS, checked against the system's root certificates |
| BOSS_TLS_CA_FILE | (unset) | PEM file of the CA certificates to trust instead; setting it turns TLS on |
| BOSS_WORKER_ALLOW_PLAINTEXT | off | on: a worker may send its credential over plaintext to a remote host |

The switches take 1/0, true/false, yes/no, on/off. Servers listen with TLS when given a certificate
and key (BOSS_TLS_CERT_FILE, BOSS_TLS_KEY_FILE: services/shared/config.py).

A worker's channels carry its bearer token (and, for `enroll`, the pairing code and the credential
it is traded for), so `open_channel(..., for_worker=True)` refuses plaintext to anything but this
machine (`is_loopback`) unless BOSS_WORKER_ALLOW_PLAINTEXT is on: a VPN or an SSH tunnel the person
trusts. Loopback stays plaintext-OK, so a one-machine installation needs no certificate.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

TLS_SWITCH = "BOSS_GRPC_TLS"
CA_FILE = "BOSS_TLS_CA_FILE"
ALLOW_PLAINTEXT = "BOSS_WORKER_ALLOW_PLAINTEXT"

_SWITCH_VALUES = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


class ChannelSettingsError(ValueError):
    """A transport setting is wrong, or forbids the channel asked for; the message names the setting."""


def switch(name: str, environ: Mapping[str, str], default: bool = False) -> bool:
    """An on/off variable (1/0, true/false, yes/no, on/off; unset or empty = `default`). Raises
    ChannelSettingsError for any other value."""
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in _SWITCH_VALUES:
        raise ChannelSettingsError(f"{name} must be on or off, got {environ[name]!r}")
    return _SWITCH_VALUES[raw]


def read_pem(variable: str, path: str, marker: str) -> bytes:
    """The bytes of the PEM file `path` named by `variable`, which must hold a `-----BEGIN <marker>`
    block ("CERTIFICATE", "PRIVATE KEY"). Raises ChannelSettingsError naming the variable and the
    file when it is missing, unreadable or holds no such block."""
    file = Path(path).expanduser()
    try:
        data = file.read_bytes()
    except OSError as error:
        raise ChannelSettingsError(f"{variable}: cannot read {file}: {error.strerror or error}") from None
    if b"-----BEGIN " not in data or marker.encode() not in data:
        raise ChannelSettingsError(f"{variable}: {file} is not a PEM file with a {marker}")
    return data


@dataclass(frozen=True)
class ChannelSecurity:
    """How channels are secured.

    Attributes:
        tls: True for TLS channels, False for plaintext.
        root_certificates: PEM of the CAs to trust (BOSS_TLS_CA_FILE); None with `tls`: the system's.
        allow_plaintext_remote: a worker may send its credential over plaintext to a remote host.
    """

    tls: bool = False
    root_certificates: bytes | None = field(default=None, repr=False)
    allow_plaintext_remote: bool = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ChannelSecurity:
        """Reads the module table's variables (the CA file at once). Raises ChannelSettingsError: a
        switch that is not on or off, a CA file that cannot be read or holds no certificate, or
        BOSS_GRPC_TLS off together with a BOSS_TLS_CA_FILE."""
        environ = os.environ if environ is None else environ
        ca_file = environ.get(CA_FILE, "").strip()
        explicit = environ.get(TLS_SWITCH, "").strip()
        tls = switch(TLS_SWITCH, environ)
        if ca_file and explicit and not tls:
            raise ChannelSettingsError(f"{TLS_SWITCH} is off but {CA_FILE} is set: unset one of them")
        return cls(
            tls=tls or bool(ca_file),
            root_certificates=read_pem(CA_FILE, ca_file, "CERTIFICATE") if ca_file else None,
            allow_plaintext_remote=switch(ALLOW_PLAINTEXT, environ),
        )

    def credentials(self) -> grpc.ChannelCredentials | None:
        """The channel credentials for TLS, None for plaintext."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates)


def _split_host(host_port: str) -> str:
    """The host of "host:port", "[v6]:port", "host" or a bare IPv6 address ("::1")."""
    if host_port.startswith("["):
        return host_port[1:].partition("]")[0]
    if host_port.count(":") > 1:
        return host_port
    return host_port.partition(":")[0]


def target_hosts(target: str) -> list[str] | None:
    """The hosts a gRPC target names: one for "host:port", "dns:///host:port" or "dns:host:port",
    each of the list for "ipv4:a:p,b:p" / "ipv6:[a]:p"; [] for a local socket ("unix:",
    "unix-abstract:"); None when the target cannot be judged (another scheme, a DNS server given in
    the authority, "dns://8.8.8.8/name": its answer for a name is its own)."""
    target = target.strip()
    scheme, colon, rest = target.partition(":")
    scheme = scheme.lower() if colon else ""
    if scheme in ("unix", "unix-abstract"):
        return []
    if scheme in ("ipv4", "ipv6"):
        return [_split_host(address.strip()) for address in rest.split(",")]
    if scheme == "dns":
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:
                host = _split_host(rest)
                return [host] if _is_ip(host) else None
        return [_split_host(rest)]
    if "://" in target:
        return None
    return [_split_host(target)]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback_host(host: str) -> bool:
    """True for "localhost" (any case, a trailing dot allowed) and loopback IP addresses
    (127.0.0.0/8, ::1, ::ffff:127.x.y.z). Names are not resolved: any other name is remote."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback(target: str) -> bool:
    """True when the gRPC `target` reaches only this machine: a local socket, or loopback hosts
    only (`target_hosts`, `is_loopback_host`). An empty or unjudgeable target is not."""
    hosts = target_hosts(target)
    if hosts is None:
        return False
    return all(host and is_loopback_host(host) for host in hosts)


def check_worker_transport(target: str, security: ChannelSecurity) -> None:
    """Raises ChannelSettingsError when a worker would send its credential to `target` over
    plaintext: no TLS, a target that is not loopback, and BOSS_WORKER_ALLOW_PLAINTEXT off."""
    if security.tls or security.allow_plaintext_remote or is_loopback(target):
        return
    raise ChannelSettingsError(
        f"refusing to send this worker's credential in plaintext to {target}: turn TLS on "
        f"({TLS_SWITCH}=true, or {CA_FILE}=<PEM file> for a private CA), or set "
        f"{ALLOW_PLAINTEXT}=true when the network is one you trust (a VPN; an SSH tunnel needs "
        "nothing: its address here is loopback)"
    )


_VARIABLES = (TLS_SWITCH, CA_FILE, ALLOW_PLAINTEXT)


def environment_security() -> ChannelSecurity:
    """`ChannelSecurity.from_environment()` of this process, read once for each set of values of
    the module table's variables: the CA file is not read again at every reconnection (so it cannot
    fail halfway through a run; replace it, then restart). Raises ChannelSettingsError."""
    return _security_of(tuple(os.environ.get(name, "") for name in _VARIABLES))


@functools.lru_cache(maxsize=8)
def _security_of(values: tuple[str, ...]) -> ChannelSecurity:
    return ChannelSecurity.from_environment(dict(zip(_VARIABLES, values, strict=True)))


def open_channel(
    target: str,
    options: Sequence[tuple[str, Any]] = (),
    *,
    for_worker: bool = False,
    security: ChannelSecurity | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target` (host:port or a gRPC target such as dns:///x:50051) with
    `options`, TLS or plaintext as `security` (default: `environment_security()`) says. With
    `for_worker`, `check_worker_transport` applies first. Call it inside the event loop that will
    use the channel. Raises ChannelSettingsError."""
    security = environment_security() if security is None else security
    if for_worker:
        check_worker_transport(target, security)
    credentials = security.credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)
