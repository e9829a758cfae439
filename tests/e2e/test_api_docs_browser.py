"""`/docs` in a real headless browser with every request off the machine refused: Swagger UI loads
from the gateway's own assets and renders the gateway's operations (an OpenAPI 3.1 document).

Skipped, with the reason, only when /usr/bin/chromium is missing (`apt-get install -y chromium`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import REPOSITORY_ROOT
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, free_port

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`",
    ),
]


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    """The gateway process alone (the docs need no backend); yields its base URL."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOSS_")}
    environment.update(
        {
            "BOSS_DATA_DIR": str(tmp_path / "var"),
            "BOSS_AUTH_SECRET": "docs-browser-test-secret-0123456789",
            "BOSS_GATEWAY_LISTEN": f"127.0.0.1:{port}",
            "BOSS_LOG_LEVEL": "WARNING",
            "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
        }
    )
    log_path = tmp_path / "gateway.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.bff_gateway", "serve"],
            cwd=REPOSITORY_ROOT,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base_url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"gateway did not start:\n{log_path.read_text()[-2000:]}", pytrace=False)
            time.sleep(0.2)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def test_docs_render_with_no_network_beyond_the_gateway(gateway_url: str) -> None:
    from playwright.sync_api import Route, expect, sync_playwright

    refused: list[str] = []

    def only_the_gateway(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.route("**/*", only_the_gateway)
            page.goto(f"{gateway_url}/docs")

            expect(page.locator(".information-container .title")).to_contain_text(
                "Boss gateway", timeout=15_000
            )
            operation = page.locator(".opblock-summary-path[data-path='/api/v1/events']")
            expect(operation).to_have_count(1)
            assert page.locator(".opblock").count() > 10
            assert page.locator(".errors-wrapper").count() == 0
            assert refused == []
            assert errors == []
        finally:
            browser.close()
