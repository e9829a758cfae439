"""The worker's transport at start: its credential never goes in plaintext to another machine unless
BOSS_WORKER_ALLOW_PLAINTEXT says the network is trusted; loopback and TLS need nothing (worker/settings.py,
worker/enrollment.py, boss_common/channels.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from worker.__main__ import main
from worker.enrollment import EnrollmentError, enroll
from worker.settings import SettingsError, WorkerSettings, settings_from_arguments

TRANSPORT_VARIABLES = ("BOSS_GRPC_TLS", "BOSS_TLS_CA_FILE", "BOSS_WORKER_ALLOW_PLAINTEXT")
SERVICE_ADDRESSES = ("BOSS_CONTEXT_BUDGET_ADDRESS", "BOSS_SCHEDULER_ADDRESS", "BOSS_CONVERSATIONS_ADDRESS")


@pytest.fixture(autouse=True)
def local_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every service on its loopback default; no transport setting from the caller's environment."""
    for variable in (*TRANSPORT_VARIABLES, *SERVICE_ADDRESSES):
        monkeypatch.delenv(variable, raising=False)


def codex_home(root: Path) -> Path:
    """A Codex home with one (empty) rollout file: enough for --once."""
    day = root / "sessions" / "2026" / "02" / "23"
    day.mkdir(parents=True)
    (day / "rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl").write_text("")
    return root


def settings(
    root: Path, address: str | None, environ: Mapping[str, str], *, once: bool = False
) -> WorkerSettings:
    return settings_from_arguments(
        codex_home=codex_home(root),
        worker_id="worker-1",
        node_id="node-1",
        context_budget_address=address,
        token="t",
        poll_interval_s=1.0,
        once=once,
        local_agent=False,
        environ=environ,
    )


def test_loopback_defaults_need_no_tls(tmp_path: Path) -> None:
    assert settings(tmp_path, None, {}).context_budget_address == "127.0.0.1:50051"


def test_plaintext_to_a_remote_context_budget_is_refused_naming_the_settings(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as error:
        settings(tmp_path, "grpc.boss.example:50051", {})

    assert str(error.value) == (
        "refusing to send this worker's credential in plaintext to grpc.boss.example:50051: turn TLS on "
        "(BOSS_GRPC_TLS=true, or BOSS_TLS_CA_FILE=<PEM file> for a private CA), or set "
        "BOSS_WORKER_ALLOW_PLAINTEXT=true when the network is one you trust (a VPN; an SSH tunnel needs "
        "nothing: its address here is loopback)"
    )


def test_tls_or_an_explicit_allowance_lets_the_worker_reach_another_machine(tmp_path: Path) -> None:
    address = "grpc.boss.example:443"

    assert settings(tmp_path / "a", address, {"BOSS_GRPC_TLS": "true"}).context_budget_address == address
    assert (
        settings(tmp_path / "b", address, {"BOSS_WORKER_ALLOW_PLAINTEXT": "yes"}).context_budget_address
        == address
    )


def test_the_scheduler_and_conversations_addresses_are_checked_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BOSS_SCHEDULER_ADDRESS", "10.0.0.7:50052")

    with pytest.raises(SettingsError, match=r"in plaintext to 10\.0\.0\.7:50052"):
        settings(tmp_path / "a", None, {})
    # --once reports to context_budget only
    assert settings(tmp_path / "b", None, {}, once=True).context_budget_address == "127.0.0.1:50051"

    monkeypatch.delenv("BOSS_SCHEDULER_ADDRESS")
    monkeypatch.setenv("BOSS_CONVERSATIONS_ADDRESS", "dns:///conversations.boss.example:50053")
    with pytest.raises(SettingsError, match=r"in plaintext to dns:///conversations\.boss\.example:50053"):
        settings(tmp_path / "c", None, {})


def test_a_bad_transport_setting_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^BOSS_WORKER_ALLOW_PLAINTEXT must be on or off, got 'sure'$"):
        settings(tmp_path / "a", None, {"BOSS_WORKER_ALLOW_PLAINTEXT": "sure"})
    with pytest.raises(SettingsError, match=r"^BOSS_TLS_CA_FILE: cannot read "):
        settings(tmp_path / "b", None, {"BOSS_TLS_CA_FILE": str(tmp_path / "no-ca.pem")})


def test_run_exits_2_in_one_line_before_sending_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = ["run", "--codex-home", str(codex_home(tmp_path)), "--token", "t", "--once"]

    code = main([*arguments, "--context-budget-address", "203.0.113.5:50051"])

    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "worker: refusing to send this worker's credential in plaintext to 203.0.113.5:50051"
    )
    assert error.count("\n") == 1


async def test_enroll_refuses_to_trade_a_pairing_code_in_plaintext_with_another_machine() -> None:
    with pytest.raises(
        EnrollmentError, match=r"in plaintext to 198\.51\.100\.9:50053.*BOSS_WORKER_ALLOW_PLAINTEXT"
    ):
        await enroll(
            "PAIR-CODE",
            node_id="node-1",
            worker_id="worker-1",
            device_name="laptop",
            conversations_address="198.51.100.9:50053",
        )


def test_the_enroll_command_says_why_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["enroll", "PAIR-CODE", "--conversations-address", "boss.example:50053"])

    assert code == 1
    assert capsys.readouterr().err.startswith(
        "worker: refusing to send this worker's credential in plaintext to boss.example:50053"
    )
