"""A service's TLS settings (services/shared/config.py): plaintext unless both files are set, and a
start refused with the setting's name when either is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.shared.config import ServerTls, ServiceSettings, server_tls
from tests.tls_support import TlsFiles, make_certificates


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for variable in ("BOSS_TLS_CERT_FILE", "BOSS_TLS_KEY_FILE", "BOSS_GRPC_TLS", "BOSS_TLS_CA_FILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("BOSS_AUTH_SECRET", "a-test-secret-of-at-least-32-characters")
    monkeypatch.setenv("BOSS_DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def test_neither_file_set_listens_in_plaintext(environment: pytest.MonkeyPatch) -> None:
    assert server_tls() is None
    assert ServiceSettings.from_environment("context_budget").tls is None


def test_both_files_set_serve_tls(environment: pytest.MonkeyPatch, certificates: TlsFiles) -> None:
    environment.setenv("BOSS_TLS_CERT_FILE", str(certificates.cert))
    environment.setenv("BOSS_TLS_KEY_FILE", str(certificates.key))

    settings = ServiceSettings.from_environment("scheduler")

    assert settings.tls == ServerTls(certificates.cert.read_bytes(), certificates.key.read_bytes())
    assert "BEGIN" not in repr(settings)


@pytest.mark.parametrize(
    ("given", "missing"),
    [("BOSS_TLS_CERT_FILE", "BOSS_TLS_KEY_FILE"), ("BOSS_TLS_KEY_FILE", "BOSS_TLS_CERT_FILE")],
)
def test_one_file_without_the_other_stops_the_service(
    environment: pytest.MonkeyPatch, certificates: TlsFiles, given: str, missing: str
) -> None:
    environment.setenv(given, str(certificates.cert))

    with pytest.raises(SystemExit) as stopped:
        ServiceSettings.from_environment("conversations")

    assert (
        str(stopped.value)
        == f"conversations: {given} is set but {missing} is not: set both (PEM files) or neither"
    )


def test_an_unreadable_key_stops_the_service_naming_the_setting_and_file(
    environment: pytest.MonkeyPatch, certificates: TlsFiles, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.key"
    environment.setenv("BOSS_TLS_CERT_FILE", str(certificates.cert))
    environment.setenv("BOSS_TLS_KEY_FILE", str(missing))

    with pytest.raises(SystemExit) as stopped:
        ServiceSettings.from_environment("context_budget")

    assert (
        str(stopped.value)
        == f"context_budget: BOSS_TLS_KEY_FILE: cannot read {missing}: No such file or directory"
    )


def test_a_certificate_file_that_is_not_pem_is_named(
    environment: pytest.MonkeyPatch, certificates: TlsFiles
) -> None:
    environment.setenv("BOSS_TLS_CERT_FILE", str(certificates.key))
    environment.setenv("BOSS_TLS_KEY_FILE", str(certificates.key))

    with pytest.raises(SystemExit) as stopped:
        ServiceSettings.from_environment("context_budget")

    assert str(stopped.value) == (
        f"context_budget: BOSS_TLS_CERT_FILE: {certificates.key} is not a PEM file with a CERTIFICATE"
    )


def test_the_key_of_another_certificate_is_refused(certificates: TlsFiles, tmp_path: Path) -> None:
    other = make_certificates(tmp_path / "other")

    with pytest.raises(ValueError) as error:
        ServerTls.from_files(certificates.cert, other.key)

    assert str(error.value) == (
        f"BOSS_TLS_CERT_FILE {certificates.cert} and BOSS_TLS_KEY_FILE {other.key} are not a certificate "
        "and its private key: the key is another certificate's"
    )


def test_a_bad_client_setting_stops_a_service_too(environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    environment.setenv("BOSS_TLS_CA_FILE", str(tmp_path / "ca.pem"))

    with pytest.raises(SystemExit, match=r"^scheduler: BOSS_TLS_CA_FILE: cannot read "):
        ServiceSettings.from_environment("scheduler")
