"""The console's devices page in a real headless browser (Debian's chromium driven by Playwright),
served by the gateway in front of a running conversations service (real gRPC, SQLite): the owner
makes a pairing code, a device enrolls with it and shows up in the list, and revoking it from the
page refuses its credential at once.

Skipped, with the reason, only when /usr/bin/chromium is missing (`apt-get install -y chromium`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from tests.conftest import DatabaseTarget
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS
from tests.integration.bff_gateway_conversations.support import RunningGateway, serve_gateway
from tests.integration.conversations.stack import Stack, running_stack

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`",
    ),
]


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[RunningGateway]:
    target = DatabaseTarget("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'conversations.sqlite3'}", "")
    async with running_stack(target, tmp_path) as stack, serve_gateway(stack) as running:
        yield running


async def test_the_owner_enrolls_lists_and_revokes_a_device_from_the_console(gateway: RunningGateway) -> None:
    from playwright.async_api import async_playwright, expect

    stack: Stack = gateway.stack
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            await page.goto(f"{gateway.base_url}/console/?token={gateway.token('alice')}#/devices")
            await expect(page.locator("h1")).to_have_text("Devices", timeout=10_000)
            await expect(page.locator(".empty")).to_contain_text("No device enrolled yet")

            await page.locator("[data-action='pairing-code']").click()
            shown = page.locator("[data-role='pairing-code'] code").first
            await expect(shown).to_contain_text("boss-worker enroll ", timeout=10_000)
            in_a_clone = page.locator("[data-role='pairing-code'] code").nth(1)
            await expect(in_a_clone).to_contain_text("python -m worker enroll ")
            first = await shown.inner_text()
            # A live event redraws the page (as the stream opening does): the code stays on it.
            await page.evaluate("render()")
            await expect(page.locator(".empty")).to_contain_text("No device enrolled yet")
            await expect(shown).to_have_text(first)
            code = re.sub(r"^.*enroll ", "", await shown.inner_text())
            enrolled = await stack.stub.EnrollDevice(
                pb.EnrollDeviceRequest(
                    pairing_code=code,
                    node_id="laptop",
                    worker_id="worker-laptop",
                    device_name="Alice's laptop",
                )
            )
            assert enrolled.device.owner_id == "alice"

            await page.reload()
            row = page.locator(f"li[data-device-id='{enrolled.device.device_id}']")
            await expect(row).to_have_attribute("data-active", "true", timeout=10_000)
            await expect(row.locator(".name")).to_have_text("Alice's laptop")
            await expect(row.locator(".node")).to_have_text("worker-laptop on laptop")

            await row.locator("[data-action='revoke']").click()
            revoked = page.locator(f"li[data-device-id='{enrolled.device.device_id}'][data-active='false']")
            await expect(revoked).to_have_count(1, timeout=10_000)
            await expect(revoked.locator(".revoked")).to_contain_text("revoked")
            assert errors == []
        finally:
            await browser.close()

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.RegisterThread(
            pb.RegisterThreadRequest(thread_id="t-1", node_id="laptop", worker_id="worker-laptop"),
            metadata=(("authorization", f"Bearer {enrolled.worker_token}"),),
        )
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
