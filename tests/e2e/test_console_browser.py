"""The web console in a real headless browser (Debian's chromium driven by Playwright): with
context_budget, conversations and the gateway running as processes, a worker's report moves the
thread's ring on the home list, in the project detail and on the thread page without a reload, and
the three show the same percent and level (CB-16, CB-19).

Skipped, with the reason, only when /usr/bin/chromium is missing (`apt-get install -y chromium`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from services.shared.auth import TokenAuthority
from tests.conftest import REPOSITORY_ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SECRET = "browser-test-secret-0123456789abcdef0123"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`",
    ),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def services(tmp_path: Path) -> Iterator[str]:
    """context_budget, conversations and the gateway on free ports; yields the gateway's base URL."""
    ports = {name: free_port() for name in ("CONTEXT_BUDGET", "CONVERSATIONS", "GATEWAY", "SCHEDULER")}
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOSS_")}
    environment.update(
        {
            "BOSS_DATA_DIR": str(tmp_path / "var"),
            "BOSS_AUTH_SECRET": SECRET,
            "BOSS_CONVERSATIONS_FOLLOW_SCHEDULER": "false",
            "BOSS_LOG_LEVEL": "WARNING",
            "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
        }
    )
    for name, port in ports.items():
        environment[f"BOSS_{name}_LISTEN"] = environment[f"BOSS_{name}_ADDRESS"] = f"127.0.0.1:{port}"
    commands = [
        ["services.context_budget", "serve"],
        ["services.conversations", "serve"],
        ["services.bff_gateway", "serve"],
    ]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=REPOSITORY_ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"{command[0]}.log", "wb"),  # noqa: SIM115
        )
        for command in commands
    ]
    base_url = f"http://127.0.0.1:{ports['GATEWAY']}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base_url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
                pytest.fail(f"services did not start:\n{logs}", pytrace=False)
            time.sleep(0.2)
        yield base_url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def report(base_url: str, worker_token: str, pct: float, level: str) -> None:
    """A worker's report through the gateway's REST ingest (CB-10)."""
    body = {
        "node_id": "node-e2e",
        "worker_id": "worker-e2e",
        "thread_id": "thread-e2e",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": pct,
        "context_budget_level": level,
        "must_finish_before_compaction": False,
        "compaction_count": 0,
        "captured_at": datetime.now(UTC).isoformat(),
    }
    response = httpx.post(
        f"{base_url}/api/v1/workers/worker-e2e/thread-context",
        json=body,
        headers={"Authorization": f"Bearer {worker_token}"},
        timeout=5,
    )
    assert response.status_code == 200, response.text


def test_ring_moves_live_and_agrees_everywhere(services: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    authority = TokenAuthority(SECRET)
    worker_token = authority.issue_worker("worker-e2e", "node-e2e")
    client_token = authority.issue_client("local")
    report(services, worker_token, 81.0, "safe")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{services}/console/?token={client_token}")
            ring = page.locator("#conversations .ring[data-thread-id='thread-e2e']")
            expect(ring).to_have_attribute("data-percent", "81", timeout=15_000)
            expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)
            assert "token=" not in page.url

            report(services, worker_token, 36.6, "urgent")  # no reload: the stream moves the ring
            expect(ring).to_have_attribute("data-percent", "36", timeout=10_000)
            expect(ring).to_have_attribute("data-level", "urgent")
            assert ring.locator(".percent").inner_text() == "36%"

            ring.click()
            detail_ring = page.locator("#threads .ring[data-thread-id='thread-e2e']")
            expect(detail_ring).to_have_attribute("data-percent", "36", timeout=10_000)
            report(services, worker_token, 22.0, "critical")
            expect(detail_ring).to_have_attribute("data-percent", "22", timeout=10_000)
            expect(detail_ring).to_have_attribute("data-level", "critical")
            expect(page.locator("#strategy")).to_contain_text("Critical", timeout=10_000)

            detail_ring.click()
            expect(page.locator("#budget-percent")).to_have_text("22% (critical)", timeout=10_000)
            expect(page.locator(".checklist li")).to_have_count(7)
            report(services, worker_token, 18.0, "critical")
            expect(page.locator("#budget-percent")).to_have_text("18% (critical)", timeout=10_000)
        finally:
            browser.close()
