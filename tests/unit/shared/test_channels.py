"""Channel transport settings and the worker's plaintext rule (boss_common/channels.py): which gRPC
targets stay on this machine, what the environment turns on, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from boss_common.channels import (
    ChannelSecurity,
    ChannelSettingsError,
    check_worker_transport,
    environment_security,
    is_loopback,
    target_hosts,
)

PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    "target",
    [
        "127.0.0.1:50051",
        "127.8.9.10:50051",
        "localhost:50051",
        "LOCALHOST:50051",
        "localhost.:50051",
        "localhost",
        "[::1]:50051",
        "::1",
        "[::ffff:127.0.0.1]:50051",
        "dns:///localhost:50051",
        "dns:localhost:50051",
        "dns://8.8.8.8/127.0.0.1:50051",
        "ipv4:127.0.0.1:50051,127.0.0.2:50052",
        "ipv6:[::1]:50051",
        "unix:/run/boss/context_budget.sock",
        "unix:///run/boss/context_budget.sock",
        "unix-abstract:boss",
    ],
)
def test_targets_on_this_machine_are_loopback(target: str) -> None:
    assert is_loopback(target)


@pytest.mark.parametrize(
    "target",
    [
        "10.0.0.5:50051",
        "0.0.0.0:50051",
        "[::]:50051",
        "grpc.boss.example:443",
        "localhost.example.com:50051",
        "mylocalhost:50051",
        "dns:///grpc.boss.example:443",
        "dns://8.8.8.8/localhost:50051",
        "ipv4:127.0.0.1:50051,10.0.0.5:50051",
        "xds:///boss-context-budget",
        "",
        ":50051",
    ],
)
def test_other_targets_are_remote(target: str) -> None:
    assert not is_loopback(target)


def test_target_hosts_reads_grpc_name_syntax() -> None:
    assert target_hosts("[2001:db8::1]:443") == ["2001:db8::1"]
    assert target_hosts("dns:///context-budget-headless:50051") == ["context-budget-headless"]
    assert target_hosts("ipv4:10.0.0.1:1,10.0.0.2:2") == ["10.0.0.1", "10.0.0.2"]
    assert target_hosts("unix:/tmp/socket") == []
    assert target_hosts("xds:///service") is None


def test_plaintext_is_the_default() -> None:
    security = ChannelSecurity.from_environment({})

    assert security == ChannelSecurity(tls=False, root_certificates=None, allow_plaintext_remote=False)
    assert security.credentials() is None


def test_the_switch_turns_tls_on_with_the_system_roots() -> None:
    security = ChannelSecurity.from_environment({"BOSS_GRPC_TLS": "true"})

    assert security.tls
    assert security.root_certificates is None
    assert security.credentials() is not None


def test_a_ca_file_turns_tls_on_with_its_certificates(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(PEM_CERTIFICATE)

    security = ChannelSecurity.from_environment({"BOSS_TLS_CA_FILE": str(ca)})

    assert security.tls
    assert security.root_certificates == PEM_CERTIFICATE


def test_a_missing_ca_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"

    with pytest.raises(ChannelSettingsError) as error:
        ChannelSecurity.from_environment({"BOSS_TLS_CA_FILE": str(missing)})

    assert str(error.value) == f"BOSS_TLS_CA_FILE: cannot read {missing}: No such file or directory"


def test_a_ca_file_without_a_certificate_is_refused(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")

    with pytest.raises(ChannelSettingsError) as error:
        ChannelSecurity.from_environment({"BOSS_TLS_CA_FILE": str(ca)})

    assert str(error.value) == f"BOSS_TLS_CA_FILE: {ca} is not a PEM file with a CERTIFICATE"


def test_tls_off_beside_a_ca_file_is_a_contradiction(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(PEM_CERTIFICATE)

    with pytest.raises(ChannelSettingsError, match="BOSS_GRPC_TLS is off but BOSS_TLS_CA_FILE is set"):
        ChannelSecurity.from_environment({"BOSS_GRPC_TLS": "off", "BOSS_TLS_CA_FILE": str(ca)})


@pytest.mark.parametrize("variable", ["BOSS_GRPC_TLS", "BOSS_WORKER_ALLOW_PLAINTEXT"])
def test_switches_take_on_or_off_only(variable: str) -> None:
    with pytest.raises(ChannelSettingsError, match=f"^{variable} must be on or off, got 'maybe'$"):
        ChannelSecurity.from_environment({variable: "maybe"})


def test_a_worker_refuses_plaintext_to_another_machine() -> None:
    with pytest.raises(ChannelSettingsError) as error:
        check_worker_transport("grpc.boss.example:50051", ChannelSecurity())

    message = str(error.value)
    assert message.startswith("refusing to send this worker's credential in plaintext to grpc.boss.example:")
    assert "BOSS_GRPC_TLS=true" in message
    assert "BOSS_TLS_CA_FILE" in message
    assert "BOSS_WORKER_ALLOW_PLAINTEXT=true" in message


def test_a_worker_may_use_plaintext_on_loopback_tls_anywhere_or_when_allowed() -> None:
    check_worker_transport("127.0.0.1:50051", ChannelSecurity())
    check_worker_transport("grpc.boss.example:443", ChannelSecurity(tls=True))
    check_worker_transport("10.0.0.5:50051", ChannelSecurity(allow_plaintext_remote=True))


def test_a_process_reads_its_ca_file_once_for_each_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(PEM_CERTIFICATE)
    monkeypatch.delenv("BOSS_GRPC_TLS", raising=False)
    monkeypatch.delenv("BOSS_WORKER_ALLOW_PLAINTEXT", raising=False)
    monkeypatch.setenv("BOSS_TLS_CA_FILE", str(ca))

    first = environment_security()
    ca.unlink()  # a reconnection does not read it again, so it cannot fail halfway through a run

    assert environment_security() is first
    monkeypatch.setenv("BOSS_TLS_CA_FILE", str(tmp_path / "other.pem"))
    with pytest.raises(ChannelSettingsError, match="BOSS_TLS_CA_FILE: cannot read"):
        environment_security()
