"""The web console in a real headless browser (Debian's chromium driven by Playwright): with
context_budget, conversations and the gateway running as processes, a worker's report moves the
thread's ring on the home list, in the project detail and on the thread page without a reload, and
the three show the same percent and level (CB-16, CB-19); at phone size, a thread Codex has just
compacted reads "compacted" on the home list, not the 100 % nobody measured, until its next real
reading, live and after a reload; the thread page marks each wrap-up
checklist item as done, missing or to do so a person sees what is missing, and shows the handoff
reason's time as local time with the ISO value on hover; an owner with no conversation gets an empty
state telling how to start a worker.

Skipped, with the reason, only when /usr/bin/chromium is missing (`apt-get install -y chromium`).
"""

from __future__ import annotations

import os
import re
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
PHONE = {"width": 390, "height": 844}

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


def report(base_url: str, worker_token: str, pct: float, level: str, **extra: object) -> None:
    """A worker's report through the gateway's REST ingest (CB-10); `extra` fields are added."""
    body: dict[str, object] = {
        "node_id": "node-e2e",
        "worker_id": "worker-e2e",
        "thread_id": "thread-e2e",
        "source_kind": "worker_estimator",
        "context_budget_remaining_pct": pct,
        "context_budget_level": level,
        "must_finish_before_compaction": False,
        "compaction_count": 0,
        "captured_at": datetime.now(UTC).isoformat(),
        **extra,
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
            errors: list[str] = []  # uncaught exceptions of the page's scripts (live handlers too)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{services}/console/?token={client_token}")
            ring = page.locator("#conversations .ring[data-thread-id='thread-e2e']")
            expect(ring).to_have_attribute("data-percent", "81", timeout=15_000)
            expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)
            assert "token=" not in page.url

            report(services, worker_token, 36.6, "urgent")  # no reload: the stream moves the ring
            expect(ring).to_have_attribute("data-percent", "36", timeout=10_000)
            expect(ring).to_have_attribute("data-level", "urgent")
            assert ring.locator(".percent").inner_text() == "36%"

            # The list re-renders when an event arrives; a click that lands on a row just replaced
            # is lost, as a person's tap would be, so the test taps again (at most three times).
            for attempt in range(3):
                ring.click()
                try:
                    expect(page).to_have_url(re.compile(r"#/projects/"), timeout=3_000)
                    break
                except AssertionError:
                    if attempt == 2:
                        raise
            detail_ring = page.locator("#threads .ring[data-thread-id='thread-e2e']")
            expect(detail_ring).to_have_attribute("data-percent", "36", timeout=10_000)
            report(services, worker_token, 22.0, "critical")
            expect(detail_ring).to_have_attribute("data-percent", "22", timeout=10_000)
            expect(detail_ring).to_have_attribute("data-level", "critical")
            expect(page.locator("#strategy")).to_contain_text("Critical", timeout=10_000)
            # Threads are named by title (here the default title, the thread id: no folder given).
            expect(page.locator("#risk")).to_contain_text("next compaction risk: thread-e2e")

            detail_ring.click()
            expect(page.locator("#budget-percent")).to_have_text("22% (critical)", timeout=10_000)
            items = page.locator(".checklist li")
            expect(items).to_have_count(7)
            # Critical with no handoff package yet: every item is still to do, and says so.
            expect(page.locator(".checklist li[data-status='pending']")).to_have_count(7)
            expect(items.first.locator(".mark")).to_have_text("○ to do")
            expect(items.first.locator(".label")).to_have_css("text-decoration-line", "none")
            report(services, worker_token, 18.0, "critical")
            expect(page.locator("#budget-percent")).to_have_text("18% (critical)", timeout=10_000)
            # Codex compacted before its next response: the page says so, not a stale critical.
            report(
                services,
                worker_token,
                100.0,
                "safe",
                compaction_count=1,
                last_compaction_at=datetime.now(UTC).isoformat(),
                awaiting_reading_after_compaction=True,
                compaction_limit_source="configured",
            )
            expect(page.locator("#budget-percent")).to_have_text(
                "compacted, waiting for the first reading", timeout=10_000
            )
            expect(page.locator("h1 .ring .percent")).to_have_text("compacted")
            expect(page.locator("#budget-limit")).to_have_text("set in Codex's config.toml")
            report(
                services, worker_token, 86.3, "safe", compaction_count=1, compaction_limit_source="assumed"
            )
            expect(page.locator("#budget-percent")).to_have_text("86% (safe)", timeout=10_000)
            expect(page.locator("h1 .ring .percent")).to_have_text("86%")
            expect(page.locator("#budget-limit")).to_have_text(
                "assumed: Codex's settings for it could not be read"
            )
            # The thread page leads to the thread's conversation, where its chat is.
            page.locator("#thread-conversations a").first.click()
            expect(page).to_have_url(re.compile(r"#/projects/proj-"), timeout=5_000)
            expect(page.locator("#threads .ring[data-thread-id='thread-e2e']")).to_have_attribute(
                "data-percent", "86", timeout=10_000
            )
            assert errors == []
        finally:
            browser.close()


def test_home_ring_reads_compacted_until_the_next_reading_at_phone_size(services: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    authority = TokenAuthority(SECRET)
    worker_token = authority.issue_worker("worker-e2e", "node-e2e")
    report(services, worker_token, 12.0, "critical")
    report(services, worker_token, 55.0, "watch", thread_id="thread-e2e-other")  # the group form shows

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{services}/console/?token={authority.issue_client('local')}")
            ring = page.locator("#conversations .ring[data-thread-id='thread-e2e']")
            label = ring.locator(".percent")
            expect(label).to_have_text("12%", timeout=15_000)
            expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)

            # Codex compacted the thread before its next response: the ring has nothing measured.
            compacted = {"compaction_count": 1, "last_compaction_at": datetime.now(UTC).isoformat()}
            report(services, worker_token, 100.0, "safe", awaiting_reading_after_compaction=True, **compacted)
            expect(label).to_have_text("compacted", timeout=10_000)
            expect(ring).to_have_attribute("data-awaiting", "true")
            expect(ring).to_have_attribute("title", "compacted, waiting for the first reading")
            assert "100%" not in page.locator("#conversations").inner_text()
            page.reload()  # the same from the home list's REST answer
            expect(label).to_have_text("compacted", timeout=15_000)
            assert "100%" not in page.locator("#conversations").inner_text()
            # The "New group" form's choice says it in words, as the thread page does.
            choice = page.locator(".group-choices li[data-thread-id='thread-e2e']")
            expect(choice).to_contain_text("compacted, waiting for the first reading")
            expect(choice).not_to_contain_text("100%")
            # Read in one step in the page: the list may re-render between two separate reads.
            assert ring.evaluate("element => element.getBoundingClientRect().right") <= PHONE["width"]

            expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)
            report(services, worker_token, 86.3, "safe", compaction_count=1)
            expect(label).to_have_text("86%", timeout=10_000)
            expect(ring).to_have_attribute("data-awaiting", "false")
            expect(ring).to_have_attribute("data-percent", "86")
            assert errors == []
        finally:
            browser.close()


def wait_for_checklist(base_url: str, client_token: str, thread_id: str) -> None:
    """Waits (up to 15 s) until the projection shows the thread's wrap-up checklist."""
    deadline = time.monotonic() + 15
    url = f"{base_url}/api/v1/threads/{thread_id}/context-summary"
    while True:
        response = httpx.get(url, headers={"Authorization": f"Bearer {client_token}"}, timeout=5)
        if response.status_code == 200 and response.json()["wrap_up_checklist"]:
            return
        assert time.monotonic() < deadline, f"no checklist for {thread_id}: {response.text}"
        time.sleep(0.1)


def test_checklist_marks_done_and_missing_items_differently(services: str) -> None:
    """A ready package's checklist (the scheduler is not running here, so the thread page's answer
    is taken from the real gateway and its statuses set as a ready package with two missing items
    would set them): done items are ticked and struck through, missing ones flagged in red. The
    handoff line shows the reason's instant as local time, the ISO value only in the title."""
    from playwright.sync_api import Route, expect, sync_playwright

    authority = TokenAuthority(SECRET)
    client_token = authority.issue_client("local")
    report(services, authority.issue_worker("worker-e2e", "node-e2e"), 20.0, "critical")
    wait_for_checklist(services, client_token, "thread-e2e")
    statuses = ["done", "done", "done", "missing", "done", "done", "missing"]
    expected_at = "2026-03-25T08:08:30+00:00"

    def ready_package(route: Route) -> None:
        response = route.fetch()
        page_json = response.json()
        assert len(page_json["wrap_up_checklist"]) == len(statuses)
        for item, status in zip(page_json["wrap_up_checklist"], statuses, strict=True):
            item["status"] = status
            item["detail"] = "not in the handoff package" if status == "missing" else ""
        page_json["handoff_status"], page_json["handoff_package_id"] = "ready", "hp-e2e"
        page_json["handoff_reason"] = f"compaction expected at {expected_at}"
        route.fulfill(response=response, json=page_json)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/api/v1/threads/thread-e2e/context-summary", ready_package)
            page.goto(f"{services}/console/?token={client_token}#/threads/thread-e2e")
            items = page.locator(".checklist li")
            expect(items).to_have_count(7, timeout=15_000)
            done = page.locator(".checklist li[data-status='done']")
            missing = page.locator(".checklist li[data-status='missing']")
            expect(done).to_have_count(5)
            expect(missing).to_have_count(2)
            expect(missing.first).to_have_attribute("data-key", "last_test_run")
            expect(missing.first.locator(".mark")).to_have_text("✗ missing")
            expect(missing.first.locator(".detail")).to_have_text("not in the handoff package")
            expect(done.first.locator(".mark")).to_have_text("✓ done")
            expect(done.first).to_have_attribute("data-done", "true")
            expect(missing.first).to_have_attribute("data-done", "false")
            # Live updates may re-render the list at any moment: assertions on computed styles must
            # retry (a detached node has no computed style).
            expect(done.first.locator(".label")).to_have_css("text-decoration-line", "line-through")
            expect(missing.first.locator(".label")).to_have_css("text-decoration-line", "none")
            expect(missing.first.locator(".label")).to_have_css("color", "rgb(176, 0, 32)")
            done_background = done.first.evaluate("(node) => getComputedStyle(node).backgroundColor")
            expect(missing.first).not_to_have_css("background-color", done_background)

            local = page.evaluate("(iso) => new Date(iso).toLocaleString()", expected_at)
            handoff = page.locator("#handoff")
            expect(handoff).to_have_text(f"ready hp-e2e — compaction expected at {local}")
            expect(handoff.locator("time")).to_have_attribute("title", expected_at)
            expect(handoff.locator("time")).to_have_attribute("datetime", expected_at)
        finally:
            browser.close()


def test_owner_without_conversations_sees_how_to_start_a_worker(services: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    token = TokenAuthority(SECRET).issue_client("nobody-yet")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{services}/console/?token={token}")
            empty = page.locator("#empty-home")
            expect(empty).to_be_visible(timeout=15_000)
            expect(empty).to_contain_text("No conversations yet for owner nobody-yet — start a worker:")
            expect(empty.locator("pre")).to_contain_text("python -m worker run --codex-home")
            expect(empty.locator("pre")).to_contain_text("python -m services.bff_gateway token --worker")
            expect(page.locator("#conversations")).to_have_count(0)
        finally:
            browser.close()
