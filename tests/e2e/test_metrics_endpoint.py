"""A context_budget process with BOSS_CONTEXT_BUDGET_METRICS_LISTEN set serves Prometheus metrics
over HTTP: a worker's real report shows in the readings counter and the threads gauge. With
BOSS_LOG_FORMAT=json every line it logs is one JSON object, and refused requests log no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.shared.auth import TokenAuthority, bearer_metadata
from tests.conftest import REPOSITORY_ROOT
from tests.e2e.test_console_browser import free_port
from tests.integration.context_budget.support import snapshot
from tests.metrics_support import metric_value

SECRET = "metrics-endpoint-test-secret-0123456789"


@dataclass
class Process:
    """A running context_budget process: its gRPC address, metrics URL and stderr log."""

    address: str
    metrics_url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """SIGTERM, then waits (kills after 15 s)."""
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture
def context_budget(tmp_path: Path) -> Iterator[Process]:
    """context_budget as a process on SQLite, logging JSON lines."""
    grpc_port, metrics_port = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOSS_")}
    environment.update(
        {
            "BOSS_DATA_DIR": str(tmp_path / "var"),
            "BOSS_AUTH_SECRET": SECRET,
            "BOSS_CONTEXT_BUDGET_LISTEN": f"127.0.0.1:{grpc_port}",
            "BOSS_CONTEXT_BUDGET_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "BOSS_CONVERSATIONS_ADDRESS": f"127.0.0.1:{free_port()}",  # nothing there: not needed
            "BOSS_METRICS_SAMPLE_SECONDS": "0.2",
            "BOSS_LOG_FORMAT": "json",
            "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
        }
    )
    log_path = tmp_path / "context_budget.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.context_budget", "serve"],
            cwd=REPOSITORY_ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    running = Process(f"127.0.0.1:{grpc_port}", metrics_url, log_path, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(metrics_url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"context_budget did not start:\n{log_path.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.2)
        yield running
    finally:
        running.stop()


async def test_a_report_shows_in_the_scraped_metrics(context_budget: Process) -> None:
    address, metrics_url = context_budget.address, context_budget.metrics_url
    token = TokenAuthority(SECRET).issue_worker("worker-mac-01", "mac-01")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ContextBudgetServiceStub(channel)
        await stub.ReportThreadContext(
            pb.ReportThreadContextRequest(snapshot=snapshot("thread-m", 91.0)),
            metadata=bearer_metadata(token),
            wait_for_ready=True,
            timeout=20,
        )

    deadline = time.monotonic() + 10
    while True:
        exposition = httpx.get(metrics_url, timeout=2).text
        threads = metric_value(exposition, "boss_context_budget_threads", level="safe")
        if threads == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert threads == 1
    assert metric_value(exposition, "boss_context_budget_readings_total", level="safe") == 1
    assert metric_value(exposition, "boss_context_budget_snapshots_total", outcome="applied") == 1
    head = metric_value(exposition, "boss_outbox_head_sequence", service="context_budget")
    assert head is not None and head >= 1  # thread.context.updated and what else the reading opened
    assert 'service_name="boss-context_budget"' in exposition  # target_info names the process


async def test_json_log_lines_and_no_traceback_for_a_refused_report(context_budget: Process) -> None:
    token = TokenAuthority(SECRET).issue_worker("worker-mac-01", "mac-01")
    async with grpc.aio.insecure_channel(context_budget.address) as channel:
        stub = pb_grpc.ContextBudgetServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ReportThreadContext(
                pb.ReportThreadContextRequest(snapshot=snapshot("thread-m", 140.0)),
                metadata=bearer_metadata(token),
                wait_for_ready=True,
                timeout=20,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetThreadContext(
                pb.GetThreadContextRequest(thread_id="no-such-thread"), metadata=bearer_metadata(token)
            )
        assert missing.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
    context_budget.stop()

    lines = context_budget.log_path.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert any(entry["message"].startswith("context_budget serving on") for entry in entries)
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    assert not [entry for entry in entries if "exception" in entry]
    assert "Traceback" not in context_budget.log_path.read_text()
