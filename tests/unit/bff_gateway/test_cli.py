"""`python -m services.bff_gateway token ...` prints tokens the gateway accepts; settings parsing."""

from __future__ import annotations

import pytest

from services.bff_gateway.__main__ import main
from services.bff_gateway.settings import split_host_port
from services.shared.auth import SCOPE_CONTEXT_READ, SCOPE_CONTEXT_REPORT, TokenAuthority

SECRET = "cli-tests-secret-0123456789abcdef-0123"


@pytest.fixture(autouse=True)
def configured_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOSS_AUTH_SECRET", SECRET)


def test_worker_token_is_bound_to_worker_and_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--worker", "worker-mac-01", "--node", "mac-01"]) == 0

    principal = TokenAuthority(SECRET).verify(capsys.readouterr().out.strip())

    assert (principal.kind, principal.worker_id, principal.node_id) == ("worker", "worker-mac-01", "mac-01")
    assert SCOPE_CONTEXT_REPORT in principal.scopes


def test_client_token_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--client", "alice", "--days", "1"]) == 0

    principal = TokenAuthority(SECRET).verify(capsys.readouterr().out.strip())

    assert (principal.kind, principal.owner_id) == ("client", "alice")
    assert SCOPE_CONTEXT_READ in principal.scopes


def test_worker_token_without_node_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--worker", "worker-mac-01"]) == 2
    assert "--node" in capsys.readouterr().err


def test_listen_addresses_split_into_host_and_port() -> None:
    assert split_host_port("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert split_host_port("[::]:8443") == ("::", 8443)
    assert split_host_port(":9000") == ("127.0.0.1", 9000)
    with pytest.raises(ValueError):
        split_host_port("localhost")
