"""The console's chat in a real headless browser at phone size (390x844; Debian's chromium driven by
Playwright), against the whole local stack as `make run` starts it in demo mode: every service, and a
worker whose local agent runs the real Codex CLI against Boss's built-in demo model.

A person opens a demo thread's conversation from the home list, sends a message, sees it queued for
the thread's device and then the thread working, and the thread's reply appears without a reload; a
reload or a lost stream mid-wait still ends in the reply; a turn the demo model fails
(`[[demo:http500]]`) ends in a system message with a Retry, and the retry is followed to its own end;
a turn that stalls (`[[demo:stall]]`) ends timed out, with its system message and a Retry. Nothing
overflows the phone's width. Client states: CHAT-6; the console's rules (the device-offline detail
of a queued task among them) are unit-tested in tests/unit/bff_gateway/test_console_chat.py.

Skipped, with the reason, only when /usr/bin/chromium is missing (`apt-get install -y chromium`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

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
PHONE = {"width": 390, "height": 844}
SERVICES = ("CONTEXT_BUDGET", "SCHEDULER", "CONVERSATIONS", "GATEWAY")
STARTUP_SECONDS = 150.0
STALL_TIMEOUT_SECONDS = 10
# How long a turn may take to end, in milliseconds (Playwright's unit): a Codex turn against the
# demo model takes a second or two, a failing one a few more.
TURN_TIMEOUT_MS = 60_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`",
    ),
]

# Records every task state the page ever shows (a state shown for a few milliseconds, such as
# "queued" before the device's agent claims the task, included), in order, into window.chatStates.
RECORD_STATES = """
window.chatStates = [];
new MutationObserver((mutations) => {
  for (const mutation of mutations) {
    for (const node of mutation.addedNodes) {
      if (!(node instanceof Element)) continue;
      for (const line of node.querySelectorAll(".task-state")) {
        const seen = [line.dataset.taskId, line.dataset.state, line.querySelector(".label").textContent];
        const last = window.chatStates[window.chatStates.length - 1];
        if (!last || last.join() !== seen.join()) window.chatStates.push(seen);
      }
    }
  }
}).observe(document, { childList: true, subtree: true });
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Stack:
    """The running local stack: the gateway's URL, a client token, and one chat-ready demo thread."""

    gateway: str
    token: str
    project_id: str
    thread_id: str
    thread_title: str
    node_id: str


def chat_ready_thread(gateway: str, token: str) -> dict[str, Any] | None:
    """A single-device conversation of the home list whose thread can be chatted with (it has a
    Codex session id and folder), with its thread page; None while there is none."""
    headers = {"Authorization": f"Bearer {token}"}
    rows = httpx.get(f"{gateway}/api/v1/conversations", headers=headers, timeout=5).json()["conversations"]
    for row in rows:
        if row["conversation_type"] != "single_device" or not row["context_budget_thread_id"]:
            continue
        page = httpx.get(
            f"{gateway}/api/v1/threads/{row['context_budget_thread_id']}/context-summary",
            headers=headers,
            timeout=5,
        )
        if page.status_code == 200 and page.json()["codex_thread_ref"] and page.json()["codex_folder"]:
            return {"row": row, "thread": page.json()}
    return None


@dataclass
class LocalStack:
    """`python -m services.local_stack --demo` running as a process: its gateway's URL, its data
    folder (the client token is its `var/client-token`) and the process."""

    gateway: str
    root: Path
    process: subprocess.Popen[bytes]

    def token(self) -> str:
        """The client token the stack wrote, "" until it has."""
        token_file = self.root / "var" / "client-token"
        return token_file.read_text().strip() if token_file.exists() else ""

    def failure(self, reason: str) -> str:
        """`reason` with the tails of the stack's output and of every service's log."""
        logs = [(self.root / "local-stack.out").read_text(errors="replace")[-3000:]]
        logs += [
            f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}"
            for log in self.root.glob("var/logs/*.log")
        ]
        return reason + "\n" + "\n".join(logs)

    def check_running(self, deadline: float, waiting_for: str) -> None:
        """Fails the test when the stack has exited or `deadline` (time.monotonic()) has passed."""
        if self.process.poll() is not None:
            pytest.fail(self.failure("the local stack exited during start-up"), pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(self.failure(f"{waiting_for} in time"), pytrace=False)


@contextlib.contextmanager
def local_stack(
    root: Path, arguments: list[str], environment_extra: dict[str, str] | None = None
) -> Iterator[LocalStack]:
    """The stack `make run` starts in demo mode, on free loopback ports and a fresh data folder under
    `root`, with `arguments` for services.local_stack and `environment_extra` on top of its
    environment (every other BOSS_ variable and CODEX_HOME removed); stopped with SIGINT after."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("BOSS_") and key != "CODEX_HOME"
    }
    environment.update(
        {
            "BOSS_DATA_DIR": str(root / "var"),
            "HOME": str(root),
            "BOSS_LOG_LEVEL": "WARNING",
            **(environment_extra or {}),
        }
    )
    for service in SERVICES:
        address = f"127.0.0.1:{free_port()}"
        environment[f"BOSS_{service}_LISTEN"] = environment[f"BOSS_{service}_ADDRESS"] = address
    output = (root / "local-stack.out").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.local_stack", "--demo", *arguments],
        cwd=REPOSITORY_ROOT,
        env=environment,
        stdout=output,
        stderr=subprocess.STDOUT,
    )
    try:
        yield LocalStack(f"http://{environment['BOSS_GATEWAY_ADDRESS']}", root, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        output.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`python -m services.local_stack --demo` on free loopback ports and a fresh data folder (the
    stack `make run` starts), until one demo thread is ready for chat."""
    root = tmp_path_factory.mktemp("chat-stack")
    # A stalled turn ends after this many silent seconds instead of the default five minutes.
    stall = {"BOSS_WORKER_TASK_STALL_TIMEOUT": str(STALL_TIMEOUT_SECONDS)}
    with local_stack(root, ["--refresh", "30"], stall) as running:
        deadline = time.monotonic() + STARTUP_SECONDS
        ready = None
        while ready is None:
            running.check_running(deadline, "no demo thread was ready for chat")
            if running.token():
                try:
                    ready = chat_ready_thread(running.gateway, running.token())
                except (httpx.HTTPError, KeyError):
                    ready = None
            time.sleep(0.5)
        thread = ready["thread"]
        yield Stack(
            gateway=running.gateway,
            token=running.token(),
            project_id=ready["row"]["project_id"],
            thread_id=thread["thread_id"],
            thread_title=thread["title"],
            node_id=thread["node_id"],
        )


@contextlib.contextmanager
def phone_page(init_scripts: list[str]) -> Iterator[Any]:
    """A page of Chromium at 390x844 (touch, mobile) running `init_scripts` in every document; fails
    the test on any uncaught error of the page's scripts."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
            for script in init_scripts:
                context.add_init_script(script)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page
            assert errors == []
        finally:
            browser.close()


@pytest.fixture
def phone(stack: Stack) -> Iterator[Any]:
    """A phone-sized page that records the chat's task states."""
    with phone_page([RECORD_STATES]) as page:
        yield page


def open_chat(page: Any, stack: Stack) -> None:
    """From the home list, the way a person gets there: tap the thread's conversation."""
    from playwright.sync_api import expect

    page.goto(f"{stack.gateway}/console/?token={stack.token}")
    row = page.locator(f"#conversations li[data-project-id='{stack.project_id}'] a")
    expect(row).to_be_visible(timeout=15_000)
    # The list re-renders when an event arrives; a tap that lands on a row just replaced is lost,
    # as a person's would be, so tap again (at most three times).
    for attempt in range(3):
        row.click()
        try:
            expect(page.locator("#composer textarea")).to_be_visible(timeout=5_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)


def send(page: Any, text: str) -> Any:
    """Types `text` and taps Send; returns the locator of the sent message once it is shown."""
    from playwright.sync_api import expect

    page.locator("#composer textarea").fill(text)
    page.locator("#composer button[type=submit]").tap()
    sent = page.locator(".message[data-author='user']", has=page.locator(".bubble", has_text=text))
    expect(sent).to_have_count(1, timeout=10_000)
    expect(page.locator("#composer textarea")).to_have_value("")
    return sent


def states_of(page: Any, task_id: str) -> list[str]:
    """The client states the page showed for one task, in order."""
    return [
        state for shown_task, state, _label in page.evaluate("window.chatStates") if shown_task == task_id
    ]


def assert_fits_the_phone(page: Any) -> None:
    """No horizontal overflow: the page is as wide as the phone and every message inside it."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width}px wide on a {PHONE['width']}px phone"
    overflowing = page.evaluate(
        """(limit) => [...document.querySelectorAll('.message, .bubble, .task-state, #composer')]
            .filter((node) => node.getBoundingClientRect().right > limit + 0.5)
            .map((node) => node.className)""",
        PHONE["width"],
    )
    assert overflowing == []


def test_a_message_is_queued_then_worked_on_and_the_reply_appears_live(phone: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    open_chat(phone, stack)
    sent = send(phone, "Which tests cover the parser? [[demo:slow=2]]")
    task_id = sent.get_attribute("data-task-id")
    assert task_id
    working = sent.locator(".task-state[data-state='awaiting_result']")
    expect(working).to_have_text(f"{stack.thread_title} is working…", timeout=TURN_TIMEOUT_MS)

    reply = phone.locator(f".message[data-author='thread'][data-task-id='{task_id}']")
    expect(reply).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    expect(reply.locator(".bubble")).not_to_be_empty()
    expect(reply.locator(".meta")).to_contain_text(stack.thread_title)
    expect(sent.locator(".task-state")).to_have_count(0)  # the reply ends the wait
    # Shown right after the send, from its answer: queued for the thread's device, then working.
    shown = states_of(phone, task_id)
    assert "pending_task" in shown and "awaiting_result" in shown, shown
    assert shown.index("pending_task") < shown.index("awaiting_result"), shown
    queued = [
        label
        for t, state, label in phone.evaluate("window.chatStates")
        if (t, state) == (task_id, "pending_task")
    ]
    assert queued[0].startswith(f"queued for {stack.node_id}"), queued
    # The reply comes after the message in the conversation's order.
    assert int(reply.get_attribute("data-sequence")) > int(sent.get_attribute("data-sequence"))
    assert_fits_the_phone(phone)
    composer = phone.locator("#composer").bounding_box()
    assert composer is not None and composer["y"] + composer["height"] <= PHONE["height"]


def test_a_reload_mid_wait_still_ends_in_the_reply(phone: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    open_chat(phone, stack)
    sent = send(phone, "Summarise the last change. [[demo:slow=5]]")
    task_id = sent.get_attribute("data-task-id")
    expect(sent.locator(".task-state[data-state='awaiting_result']")).to_be_visible(timeout=TURN_TIMEOUT_MS)

    phone.reload()
    again = phone.locator(f".message[data-author='user'][data-task-id='{task_id}']")
    # After the reload the page knows the task only from GET .../messages and GET /api/v1/tasks/{id}.
    expect(again.locator(".task-state[data-state='awaiting_result']")).to_be_visible(timeout=10_000)
    reply = phone.locator(f".message[data-author='thread'][data-task-id='{task_id}']")
    expect(reply).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    expect(again.locator(".task-state")).to_have_count(0)
    assert_fits_the_phone(phone)


def test_a_stream_lost_mid_wait_still_ends_in_the_reply(phone: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    open_chat(phone, stack)
    sent = send(phone, "List the open questions. [[demo:slow=4]]")
    task_id = sent.get_attribute("data-task-id")
    expect(sent.locator(".task-state[data-state='awaiting_result']")).to_be_visible(timeout=TURN_TIMEOUT_MS)

    # The stream drops and no new one gets through while the thread finishes its turn.
    phone.route("**/api/v1/events**", lambda route: route.abort())
    phone.evaluate("state.source.close()")
    headers = {"Authorization": f"Bearer {stack.token}"}
    url = f"{stack.gateway}/api/v1/tasks/{task_id}"
    deadline = time.monotonic() + TURN_TIMEOUT_MS / 1000
    while httpx.get(url, headers=headers, timeout=5).json()["task"]["status"] != "completed":
        assert time.monotonic() < deadline, "the thread did not reply"
        time.sleep(0.2)

    # The console's own reconnect (as after a stream the server refused) ends the wait.
    phone.unroute("**/api/v1/events**")
    phone.evaluate("connect()")
    expect(phone.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)
    reply = phone.locator(f".message[data-author='thread'][data-task-id='{task_id}']")
    expect(reply).to_have_count(1, timeout=10_000)
    expect(sent.locator(".task-state")).to_have_count(0)


def test_a_failed_turn_shows_the_system_message_and_retry_follows_the_new_task(
    phone: Any, stack: Stack
) -> None:
    from playwright.sync_api import expect

    open_chat(phone, stack)
    sent = send(phone, "Deploy it. [[demo:http500]]")
    task_id = sent.get_attribute("data-task-id")
    failure = phone.locator(f".message[data-author='system'][data-task-id='{task_id}']")
    expect(failure).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    expect(failure.locator(".bubble")).not_to_be_empty()
    expect(failure.locator(".task-state")).to_have_attribute("data-state", "failed")
    retry = failure.locator("button.retry")
    expect(retry).to_be_visible()
    assert_fits_the_phone(phone)

    retry.tap()
    # The retry is a new task for the same message, shown under it until it ends in a message of
    # its own: with the demo model, which fails the same text again, a second system message.
    expect(failure.locator(".task-state .detail")).to_have_text("retried", timeout=10_000)
    expect(failure.locator("button.retry")).to_have_count(0)
    outcome = phone.locator(".message[data-author='system'], .message[data-author='thread']").last
    expect(outcome).not_to_have_attribute("data-task-id", task_id, timeout=TURN_TIMEOUT_MS)
    retry_task_id = outcome.get_attribute("data-task-id")
    assert retry_task_id
    assert states_of(phone, retry_task_id)[0] == "pending_task"
    expect(sent.locator(".task-state")).to_have_count(0)
    expect(outcome).to_have_attribute("data-author", "system")
    expect(outcome.locator("button.retry")).to_be_visible()
    assert_fits_the_phone(phone)


def test_a_stalled_turn_ends_timed_out_with_its_system_message_and_retry(phone: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    open_chat(phone, stack)
    sent = send(phone, "Wait for the build. [[demo:stall]]")
    task_id = sent.get_attribute("data-task-id")
    expect(sent.locator(".task-state[data-state='awaiting_result']")).to_be_visible(timeout=TURN_TIMEOUT_MS)
    timed_out = phone.locator(f".message[data-author='system'][data-task-id='{task_id}']")
    expect(timed_out).to_have_count(1, timeout=TURN_TIMEOUT_MS + STALL_TIMEOUT_SECONDS * 1000)
    expect(timed_out.locator(".bubble")).not_to_be_empty()
    state = timed_out.locator(".task-state")
    expect(state).to_have_attribute("data-status", "timed_out")
    expect(state.locator(".label")).to_have_text("timed out")
    expect(state.locator("button.retry")).to_be_visible()
    expect(sent.locator(".task-state")).to_have_count(0)
    assert_fits_the_phone(phone)
