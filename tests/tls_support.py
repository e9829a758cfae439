"""Test certificates made with the `openssl` command: a self-signed CA and a server certificate it
signs for this machine (subjectAltName localhost, 127.0.0.1 and ::1), EC P-256 keys, valid a day.
gRPC checks the server's name against the subjectAltName only, never the common name."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1
"""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: `ca` (the CA's certificate, what clients trust), `cert` and `key` (the server's)."""

    ca: Path
    cert: Path
    key: Path


def _openssl(*arguments: str) -> None:
    subprocess.run(["openssl", *arguments], check=True, capture_output=True, timeout=30)


def make_certificates(folder: Path) -> TlsFiles:
    """Writes a CA and a server certificate for this machine into `folder`. Skips the test when
    there is no `openssl` command."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make test certificates with")
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, request = folder / "server.pem", folder / "server.key", folder / "server.csr"
    extensions = folder / "server.ext"
    extensions.write_text(SERVER_EXTENSIONS)
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
        "-subj", "/CN=Boss test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _openssl("req", *curve, "-keyout", str(key), "-out", str(request), "-subj", "/CN=localhost")
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
        "-set_serial", "1", "-days", "1", "-extfile", str(extensions), "-out", str(cert),
    )  # fmt: skip
    return TlsFiles(ca=ca, cert=cert, key=key)
