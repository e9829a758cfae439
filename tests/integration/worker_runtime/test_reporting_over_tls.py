"""The worker reporting to the real context_budget service over TLS: a certificate for this machine
signed by a test CA (tests/tls_support.py), trusted through BOSS_TLS_CA_FILE, and a service
following its events the same way; clients that do not trust it, or speak plaintext, are refused;
and the worker never sends its credential in plaintext to another machine unless told it may."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from boss_common.channels import ChannelSettingsError, open_channel
from services.scheduler.server import budget_stream_opener
from services.shared.config import ServerTls
from services.shared.time import utc_now
from tests.integration.worker_runtime.support import (
    NODE_ID,
    WORKER_ID,
    ContextBudgetHarness,
    RecordingReporter,
)
from tests.integration.worker_runtime.test_reporter_stream import make_snapshot
from tests.tls_support import TlsFiles, make_certificates
from worker.agent import run_worker
from worker.demo_sessions import write_demo_codex_home
from worker.settings import settings_from_arguments


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def tls_context_budget(tmp_path: Path, certificates: TlsFiles) -> AsyncIterator[ContextBudgetHarness]:
    """context_budget serving TLS with the test certificate."""
    harness = ContextBudgetHarness(
        f"sqlite+aiosqlite:///{tmp_path / 'context_budget.sqlite3'}",
        tls=ServerTls.from_files(certificates.cert, certificates.key),
    )
    await harness.start()
    try:
        yield harness
    finally:
        await harness.stop()


@pytest.fixture
def clean_transport(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No transport setting from the caller's environment."""
    for variable in ("BOSS_GRPC_TLS", "BOSS_TLS_CA_FILE", "BOSS_WORKER_ALLOW_PLAINTEXT"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


async def health_check(address: str) -> tuple[grpc.StatusCode | int, str]:
    """One health check of the whole server through `open_channel`: the status it answers, or the
    code and details of the call's failure."""
    async with open_channel(address) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
    return response.status, ""


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_the_reporter_reports_through_tls_trusting_the_ca_file(
    tls_context_budget: ContextBudgetHarness,
    certificates: TlsFiles,
    clean_transport: pytest.MonkeyPatch,
    host: str,
) -> None:
    clean_transport.setenv("BOSS_TLS_CA_FILE", str(certificates.ca))
    reporter = RecordingReporter(f"{host}:{tls_context_budget.port}", tls_context_budget.worker_token())
    reporter.start()
    try:
        reporter.submit([make_snapshot(f"thread-{index}") for index in range(20)])

        assert await reporter.flush(10.0), f"{reporter.unacked_count} snapshot(s) never acked"
        assert reporter.stats.acked == 20
        assert await tls_context_budget.stored_snapshot_ids() == reporter.submitted_ids
    finally:
        await reporter.close()


async def test_a_worker_run_once_reports_over_tls(
    tls_context_budget: ContextBudgetHarness,
    certificates: TlsFiles,
    clean_transport: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    clean_transport.setenv("BOSS_TLS_CA_FILE", str(certificates.ca))
    codex_home = tmp_path / "codex"
    write_demo_codex_home(codex_home, utc_now(), threads=2)
    settings = settings_from_arguments(
        codex_home=codex_home,
        worker_id=WORKER_ID,
        node_id=NODE_ID,
        context_budget_address=tls_context_budget.address,
        token=tls_context_budget.worker_token(),
        poll_interval_s=0.05,
        once=True,
        once_timeout_s=10.0,
        environ=os.environ,
    )

    assert await run_worker(settings) == 0
    assert len(await tls_context_budget.stored_snapshot_ids()) >= 2


async def test_a_service_follows_the_reported_events_over_tls(
    tls_context_budget: ContextBudgetHarness, certificates: TlsFiles, clean_transport: pytest.MonkeyPatch
) -> None:
    clean_transport.setenv("BOSS_TLS_CA_FILE", str(certificates.ca))
    reporter = RecordingReporter(tls_context_budget.address, tls_context_budget.worker_token())
    reporter.start()
    try:
        reporter.submit([make_snapshot(f"thread-{index}") for index in range(3)])
        assert await reporter.flush(10.0)
    finally:
        await reporter.close()
    open_stream = budget_stream_opener(
        tls_context_budget.address, tls_context_budget.authority.issue_service("scheduler")
    )

    async with contextlib.aclosing(open_stream(0)) as batches:
        events = await asyncio.wait_for(anext(batches), 10.0)

    assert {event.type for event in events} == {"thread.context.updated"}
    assert {event.thread_id for event in events} == {"thread-0", "thread-1", "thread-2"}


async def test_a_client_that_does_not_trust_the_ca_is_refused(
    tls_context_budget: ContextBudgetHarness, clean_transport: pytest.MonkeyPatch
) -> None:
    clean_transport.setenv("BOSS_GRPC_TLS", "true")  # the system's roots: the test CA is not among them

    code, details = await health_check(tls_context_budget.address)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "CERTIFICATE_VERIFY_FAILED" in details

    reporter = RecordingReporter(tls_context_budget.address, tls_context_budget.worker_token())
    reporter.start()
    try:
        reporter.submit([make_snapshot("thread-untrusted")])
        assert not await reporter.flush(1.0)
        assert reporter.stats.acked == 0 and reporter.stats.stream_failures >= 1
    finally:
        await reporter.close()
    assert await tls_context_budget.stored_snapshot_ids() == set()


async def test_a_plaintext_client_is_refused_by_a_tls_server(
    tls_context_budget: ContextBudgetHarness, clean_transport: pytest.MonkeyPatch
) -> None:
    code, _ = await health_check(tls_context_budget.address)
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_a_tls_client_of_a_plaintext_server_is_refused(
    context_budget: ContextBudgetHarness, certificates: TlsFiles, clean_transport: pytest.MonkeyPatch
) -> None:
    assert await health_check(context_budget.address) == (health_pb2.HealthCheckResponse.SERVING, "")

    clean_transport.setenv("BOSS_TLS_CA_FILE", str(certificates.ca))

    code, _ = await health_check(context_budget.address)
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_the_reporter_refuses_plaintext_to_another_machine_before_connecting(
    clean_transport: pytest.MonkeyPatch,
) -> None:
    reporter = RecordingReporter("192.0.2.10:50051", "a-token")  # TEST-NET-1: nothing answers there

    with pytest.raises(
        ChannelSettingsError, match=r"in plaintext to 192\.0\.2\.10:50051.*BOSS_WORKER_ALLOW_PLAINTEXT"
    ):
        reporter.start()

    clean_transport.setenv("BOSS_WORKER_ALLOW_PLAINTEXT", "true")
    reporter.start()
    await reporter.close()
