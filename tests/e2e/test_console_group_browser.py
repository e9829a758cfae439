"""The console's master agent chat and group chat in a real headless browser at phone size (390x844;
Debian's chromium driven by Playwright), against the whole local stack as `make run` starts it in
demo mode: every service, the master agent answering through Boss's built-in demo model (not a real
model), and a worker whose local agent runs the real Codex CLI against that model. Parametrised
over SQLite and PostgreSQL (the stack on a database of its own).

The demo threads do not grow on their own here (a live tick an hour). Two of them cannot take new
work (firmware-flasher is critical, ios-sync-client must finish its uncommitted change); the fixture
adds two fresh real Codex threads, north and south, in the demo's Codex home, as a person's new
threads: the worker finds and reports them like any other. The groups are north, south,
ios-sync-client and firmware-flasher, and every plan proposes north and south and says why the
other two are left out.

- The master agent: a question answered within the inline wait shows the reply with no waiting
  state at all; a slow one (`[[demo:slow=6]]`) shows the master agent working, then the reply arrives
  without a reload. Both answers are true to the threads' reported budgets.
- A group made with the home page's "New group" form: a message gets the plan card (targets with
  reasons and budgets, the critical thread left out and why); Reject ends it with nothing sent.
- A plan card survives a reload while it waits; a target is dropped, the plan confirmed; the
  progress (k of N) survives a reload while the kept thread works; the raw result arrives named by
  its thread, then the master agent's summary.
- Both targets kept: both threads' results, each named by its thread, and the summary.
- A group none of whose threads can take work (a long name, wrapped at phone width): the plan
  proposes a relay, "<host> (relay)", shown as a new thread; another tab (storage of its own) shows
  its progress; real Codex starts the new thread, which comes back as a thread of its own: its
  result in the group, its row in the home list, its page with the instruction and its answer.

Client states: CHAT-6; the console's rules are unit-tested in tests/unit/bff_gateway/
test_console_group.py and test_console_chat.py. Skipped, with the reason, only when
/usr/bin/chromium is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo_model import demo_model_environment
from tests.e2e.test_chat_end_to_end import own_postgres_database
from tests.e2e.test_console_chat_browser import (
    CHROMIUM,
    PHONE,
    RECORD_STATES,
    STARTUP_SECONDS,
    TURN_TIMEOUT_MS,
    local_stack,
    phone_page,
    states_of,
)
from worker.local_agent.codex_exec import CodexRunSettings, create_codex_thread
from worker.local_agent.codex_install import find_codex_binary

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is missing: install Debian's browser with `apt-get install -y chromium`",
    ),
]

DEMO_THREADS = ("billing-api", "ios-sync-client", "firmware-flasher")
FRESH_THREADS = ("north", "south")
# The group of every test here: the two fresh threads, and two demo threads that cannot take work.
GROUP_THREADS = ("north", "south", "ios-sync-client", "firmware-flasher")
# How long after its first turn a fresh thread takes its next: the worker projects a compaction
# from the growth per minute, and two turns seconds apart would project one within the ten-minute
# risk horizon (a handoff, and no new work).
FIRST_TURN_AGE_SECONDS = 75.0
# How long a send to the master agent waits for its answer before it answers the queued task.
MASTER_INLINE_WAIT_SECONDS = 10
# How long a plan may take to be proposed, in milliseconds: the demo model drafts it (a slow marker
# in the message makes the draft as slow), and the send answers with the plan.
PLAN_TIMEOUT_MS = 30_000
# A plan's whole run: the threads' Codex turns, then the master agent's summary.
RUN_TIMEOUT_MS = 2 * TURN_TIMEOUT_MS

# Records every state and label a plan card ever shows, per plan, in order, into window.planStates.
RECORD_PLANS = """
window.planStates = [];
new MutationObserver(() => {
  for (const card of document.querySelectorAll(".plan")) {
    const label = card.querySelector(".plan-head .label").textContent;
    const seen = [card.dataset.planId, card.dataset.state, label];
    const last = window.planStates.filter((shown) => shown[0] === seen[0]).at(-1);
    if (!last || last.join() !== seen.join()) window.planStates.push(seen);
  }
}).observe(document, { childList: true, subtree: true });
"""


@dataclass(frozen=True)
class DemoStack:
    """The running stack: the gateway's URL, a client token and the demo threads' pages by title."""

    gateway: str
    token: str
    threads: dict[str, dict[str, Any]]

    def get(self, path: str) -> Any:
        answer = httpx.get(
            f"{self.gateway}{path}", headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        answer = httpx.post(
            f"{self.gateway}{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )
        assert answer.status_code in (200, 201), answer.text
        return answer.json()


def thread_pages(gateway: str, token: str) -> dict[str, dict[str, Any]]:
    """The thread page of every single-device conversation's thread, by title."""
    headers = {"Authorization": f"Bearer {token}"}
    rows = httpx.get(f"{gateway}/api/v1/conversations", headers=headers, timeout=5).json()["conversations"]
    pages = {}
    for row in rows:
        if row["conversation_type"] != "single_device" or not row["context_budget_thread_id"]:
            continue
        page = httpx.get(
            f"{gateway}/api/v1/threads/{row['context_budget_thread_id']}/context-summary",
            headers=headers,
            timeout=5,
        ).json()
        pages[page["title"]] = page
    return pages


def ready(pages: dict[str, dict[str, Any]], titles: tuple[str, ...]) -> bool:
    """Every thread of `titles` has reported its budget and can take work (a Codex session id and
    folder)."""
    return all(
        title in pages
        and pages[title].get("codex_thread_ref")
        and pages[title].get("codex_folder")
        and pages[title]["context"]["reported"]
        for title in titles
    )


def readiness(pages: dict[str, dict[str, Any]]) -> str:
    """What each thread lacks, for a failure message."""
    return "; ".join(
        f"{title}: ref={page.get('codex_thread_ref')!r} folder={bool(page.get('codex_folder'))} "
        f"reported={page['context']['reported']}"
        for title, page in sorted(pages.items())
    )


async def fresh_threads(root: Path, codex_home: Path) -> None:
    """FRESH_THREADS as real Codex threads (one `codex exec` turn each, in a folder of its own
    under `root`) in the demo's Codex home, against the demo model its config.toml names."""
    settings = CodexRunSettings(
        codex_bin=find_codex_binary(),
        codex_home=codex_home,
        extra_env=demo_model_environment(),
        stall_timeout_s=30.0,
        turn_timeout_s=90.0,
    )
    folders = [root / "workspaces" / name for name in FRESH_THREADS]
    for folder in folders:
        folder.mkdir(parents=True)
    await asyncio.gather(
        *(create_codex_thread(folder, f"start {folder.name}", settings) for folder in folders)
    )


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    """The demo stack on SQLite or PostgreSQL with the two fresh threads, once every thread has
    reported and the fresh ones' first turns are FIRST_TURN_AGE_SECONDS old."""
    root = tmp_path_factory.mktemp(f"group-console-{request.param}")
    # A send into a group waits for the demo model's draft: a slow marker makes it slower than the
    # gateway's default 5 s deadline of a backend call. The master agent's inline wait is longer
    # than its default 3 s, so an answer is inline on a busy machine too.
    extra = {
        "BOSS_GATEWAY_RPC_TIMEOUT_SECONDS": "30",
        "BOSS_MASTER_INLINE_WAIT_SECONDS": str(MASTER_INLINE_WAIT_SECONDS),
    }
    with contextlib.ExitStack() as cleanup:
        if request.param == "postgresql":
            if os.environ.get("BOSS_TEST_SKIP_POSTGRES") == "1":
                pytest.skip("BOSS_TEST_SKIP_POSTGRES=1")
            extra["BOSS_DATABASE_URL"] = cleanup.enter_context(own_postgres_database())
        running = cleanup.enter_context(
            local_stack(root, ["--demo-interval", "3600", "--refresh", "60"], extra)
        )
        deadline = time.monotonic() + STARTUP_SECONDS
        pages: dict[str, dict[str, Any]] = {}
        created_at = None
        while not ready(pages, DEMO_THREADS + FRESH_THREADS):
            running.check_running(deadline, f"not every thread was reported ({readiness(pages)})")
            time.sleep(0.5)
            if not running.token():
                continue
            try:
                pages = thread_pages(running.gateway, running.token())
            except (httpx.HTTPError, KeyError, ValueError):
                continue
            if created_at is None and ready(pages, DEMO_THREADS):
                # The demo's threads exist, and with them its Codex home: add the fresh ones.
                asyncio.run(fresh_threads(root, root / "var" / "demo-codex-home"))
                created_at = time.monotonic()
                # Their own time to be found and reported, whatever the demo's start took.
                deadline = max(deadline, created_at + STARTUP_SECONDS / 2)
        threads = pages
        assert created_at is not None
        levels = {title: threads[title]["context"]["level"] for title in GROUP_THREADS}
        assert levels == {
            "north": "safe",
            "south": "safe",
            "ios-sync-client": "watch",
            "firmware-flasher": "critical",
        }
        time.sleep(max(0.0, created_at + FIRST_TURN_AGE_SECONDS - time.monotonic()))
        yield DemoStack(running.gateway, running.token(), threads)


@pytest.fixture
def phone(demo: DemoStack) -> Iterator[Any]:
    """A phone-sized page that records the chat's task states and every plan card's states."""
    with phone_page([RECORD_STATES, RECORD_PLANS]) as page:
        yield page


def open_conversation(page: Any, demo: DemoStack, project_id: str) -> None:
    """From the home list, the way a person gets there: tap the conversation's row."""
    from playwright.sync_api import expect

    page.goto(f"{demo.gateway}/console/?token={demo.token}")
    row = page.locator(f"#conversations li[data-project-id='{project_id}'] a")
    expect(row).to_be_visible(timeout=15_000)
    # The list re-renders when an event arrives; a tap on a row just replaced is lost, as a
    # person's would be: tap again (at most three times).
    for attempt in range(3):
        row.tap()
        try:
            expect(page.locator("#composer textarea")).to_be_visible(timeout=5_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)


def send(
    page: Any, text: str, timeout_ms: int = 10_000, while_sending: Callable[[], None] | None = None
) -> Any:
    """Types `text` and taps Send (then runs `while_sending`, when given); returns the sent
    message's locator once the send has answered."""
    from playwright.sync_api import expect

    page.locator("#composer textarea").fill(text)
    page.locator("#composer button[type=submit]").tap()
    if while_sending is not None:
        while_sending()
    sent = page.locator(".message[data-author='user']", has=page.locator(".bubble", has_text=text))
    expect(sent).to_have_count(1, timeout=timeout_ms)
    expect(page.locator("#composer textarea")).to_have_value("", timeout=timeout_ms)
    return sent


def posted_message(response: Any) -> bool:
    """True for the answer of a send (`POST /api/v1/projects/{id}/messages`)."""
    return bool(response.request.method == "POST" and response.url.endswith("/messages"))


def plan_states(page: Any, plan_id: str) -> list[tuple[str, str]]:
    """The states and labels a plan's card showed, in order."""
    return [(state, label) for shown, state, label in page.evaluate("window.planStates") if shown == plan_id]


def assert_fits_the_phone(page: Any) -> None:
    """No horizontal overflow: the page is as wide as the phone, and so is every card and message."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width}px wide on a {PHONE['width']}px phone"
    overflowing = page.evaluate(
        """(limit) => [...document.querySelectorAll(
              'h1, .title, .message, .bubble, .plan, .target, .plan-actions, .task-state, #composer, '
              + '#new-group')]
            .filter((node) => node.getBoundingClientRect().right > limit + 0.5)
            .map((node) => node.className || node.id)""",
        PHONE["width"],
    )
    assert overflowing == []


def ring_percent(demo: DemoStack, title: str) -> int:
    """A demo thread's budget as every ring shows it (rounded down)."""
    return int(
        demo.get(f"/api/v1/threads/{demo.threads[title]['thread_id']}/context-summary")["context"]["percent"]
    )


def new_group_by_api(demo: DemoStack, title: str) -> str:
    thread_ids = [demo.threads[name]["thread_id"] for name in GROUP_THREADS]
    return str(
        demo.post("/api/v1/projects", {"project_title": title, "thread_ids": thread_ids})["project_id"]
    )


def proposed_card(page: Any, sent: Any) -> Any:
    """The plan card under the sent message once it waits for confirmation."""
    from playwright.sync_api import expect

    card = sent.locator(".plan")
    expect(card).to_have_attribute("data-state", "pending_dispatch_plan", timeout=PLAN_TIMEOUT_MS)
    return card


def target_row(card: Any, title: str) -> Any:
    """The card's row of the target named `title`."""
    return card.locator(".target", has=card.page.locator(".title", has_text=re.compile(f"^{title}$")))


def assert_the_plan_avoids_the_threads_that_cannot_take_work(card: Any, demo: DemoStack) -> None:
    """The card proposes north and south (the healthier first), each with its reason, its budget as
    its ring shows it and the instruction the master agent drafted, and says why ios-sync-client
    (must finish its change) and firmware-flasher (critical) are left out."""
    from playwright.sync_api import expect

    expect(card.locator(".target")).to_have_count(2)
    percents = {title: ring_percent(demo, title) for title in FRESH_THREADS}
    first = max(FRESH_THREADS, key=lambda title: (percents[title], -FRESH_THREADS.index(title)))
    expect(card.locator(".target[data-target-id='t1'] .title")).to_have_text(first)
    for title in FRESH_THREADS:
        row = target_row(card, title)
        expect(row.locator(".budget")).to_have_text(f"{percents[title]}% left · safe")
        expect(row.locator(".reason")).to_contain_text(
            re.compile(rf"^safe, {percents[title]}\.\d % left, (idle|busy)")
        )
        expect(row.locator(".instruction")).to_contain_text(f"drafted this for {title}")
        expect(row.locator("button.drop")).to_have_text("Drop")
    left_out = card.locator(".left-out li")
    expect(left_out).to_have_count(2)
    flasher = card.locator(f".left-out li[data-thread-id='{demo.threads['firmware-flasher']['thread_id']}']")
    expect(flasher).to_contain_text(re.compile(r"firmware-flasher: critical \(\d+\.\d % left\)"))
    ios = card.locator(f".left-out li[data-thread-id='{demo.threads['ios-sync-client']['thread_id']}']")
    expect(ios).to_contain_text("ios-sync-client: it must finish its current work before compaction")


def test_the_master_agent_answers_inline_and_a_slow_answer_arrives_later(phone: Any, demo: DemoStack) -> None:
    from playwright.sync_api import expect

    [master] = [
        row
        for row in demo.get("/api/v1/conversations")["conversations"]
        if row["conversation_type"] == "master_agent"
    ]
    open_conversation(phone, demo, master["project_id"])
    expect(phone.locator("#chat")).to_have_attribute("data-kind", "master")
    # The master agent's strategy is about every thread it oversees, though none is its own.
    expect(phone.locator("#strategy")).to_contain_text(
        re.compile(r"Critical: [^:]*firmware-flasher \([\d.]+%\): run the pre-compaction wrap-up now")
    )

    with phone.expect_response(posted_message) as inline:
        asked = send(phone, "Which thread is closest to compaction?")
    task_id = asked.get_attribute("data-task-id")
    assert task_id
    # Answered within the send's inline wait: the send's answer carries the reply, its task done.
    answer = inline.value.json()
    assert answer["masterReply"] and answer["task"]["status"] == "completed"
    reply = phone.locator(f".message[data-author='master'][data-task-id='{task_id}']")
    expect(reply).to_have_count(1, timeout=10_000)
    expect(reply.locator(".bubble")).to_have_text(answer["masterReply"])
    flasher = demo.threads["firmware-flasher"]["thread_id"]
    expect(reply.locator(".bubble")).to_contain_text(
        f'The thread closest to compaction is "firmware-flasher" ({flasher})'
    )
    expect(reply.locator(".meta")).to_contain_text("master agent")
    expect(asked.locator(".task-state")).to_have_count(0)

    with phone.expect_response(posted_message) as queued:
        slow = send(
            phone, f"What is billing-api doing? [[demo:slow={MASTER_INLINE_WAIT_SECONDS + 4}]]", 20_000
        )
    slow_task = slow.get_attribute("data-task-id")
    assert slow_task
    # Not answered within the wait: the send answers the task, and the page waits on it.
    assert queued.value.json()["masterReply"] is None
    working = slow.locator(".task-state[data-state='awaiting_result']")
    expect(working).to_have_text("the master agent is working…", timeout=10_000)
    later = phone.locator(f".message[data-author='master'][data-task-id='{slow_task}']")
    expect(later).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    billing = demo.threads["billing-api"]["thread_id"]
    percent = math.floor(demo.threads["billing-api"]["context"]["percent"])
    expect(later.locator(".bubble")).to_contain_text(
        re.compile(
            rf'"billing-api" \({billing}\) on \S+ has {percent}(\.\d+)? % of its context budget left \(safe\)'
        )
    )
    expect(slow.locator(".task-state")).to_have_count(0)
    assert "awaiting_result" in states_of(phone, slow_task)
    assert_fits_the_phone(phone)


def test_a_group_made_in_the_console_proposes_a_plan_that_can_be_rejected(
    phone: Any, demo: DemoStack
) -> None:
    from playwright.sync_api import expect

    phone.goto(f"{demo.gateway}/console/?token={demo.token}")
    form = phone.locator("#new-group")
    expect(form).to_be_visible(timeout=15_000)
    form.locator("summary").tap()
    for title in GROUP_THREADS:
        form.locator(f"li[data-thread-id='{demo.threads[title]['thread_id']}'] input").check()
    form.locator("input[name='title']").fill("Release train")
    assert_fits_the_phone(phone)
    form.locator("button[type='submit']").tap()
    expect(phone.locator("#chat")).to_have_attribute("data-kind", "group", timeout=10_000)
    expect(phone.locator("h1")).to_have_text("Release train")
    expect(phone.locator("#threads li")).to_have_count(4)
    expect(phone.locator("#live")).to_have_attribute("data-state", "live", timeout=10_000)

    sent = send(phone, "Plan the next release.", timeout_ms=PLAN_TIMEOUT_MS)
    card = proposed_card(phone, sent)
    expect(card.locator(".plan-head .label")).to_have_text("waiting for your confirmation")
    assert_the_plan_avoids_the_threads_that_cannot_take_work(card, demo)
    expect(phone.locator("#gate")).to_have_attribute("data-state", "awaiting_confirmation")
    expect(phone.locator("#gate")).to_contain_text(
        "a dispatch plan for 2 threads waits for your confirmation"
    )
    expect(card.locator("button.confirm")).to_have_text("Send to 2 threads")
    assert_fits_the_phone(phone)

    card.locator("button.reject").tap()
    expect(card).to_have_attribute("data-state", "done", timeout=10_000)
    expect(card.locator(".plan-head .label")).to_have_text("rejected: nothing was sent")
    expect(card.locator(".plan-actions")).to_have_count(0)
    expect(card.locator(".target[data-state='not_sent']")).to_have_count(2)
    said = phone.locator(".message[data-author='system'] .bubble", has_text="You rejected the dispatch plan")
    expect(said).to_have_count(1, timeout=10_000)
    expect(phone.locator("#gate")).to_be_hidden()
    plan_id = card.get_attribute("data-plan-id")
    assert plan_states(phone, plan_id) == [
        ("pending_dispatch_plan", "waiting for your confirmation"),
        ("done", "rejected: nothing was sent"),
    ]


def test_reloads_return_to_the_waiting_plan_and_to_the_progress_of_its_run(
    phone: Any, demo: DemoStack
) -> None:
    from playwright.sync_api import expect

    group = new_group_by_api(demo, "Reload check")
    open_conversation(phone, demo, group)
    text = "Write the release notes for your part. [[demo:slow=6]]"
    # The demo model takes six seconds over the drafts: the send box says what the send waits for.
    gate = phone.locator("#gate")
    sent = send(
        phone,
        text,
        timeout_ms=PLAN_TIMEOUT_MS,
        while_sending=lambda: expect(gate).to_have_attribute("data-state", "drafting"),
    )
    card = proposed_card(phone, sent)
    plan_id = card.get_attribute("data-plan-id")

    # A reload while the plan waits comes back to the plan card, ready to be decided.
    phone.reload()
    sent = phone.locator(".message[data-author='user']", has=phone.locator(".bubble", has_text=text))
    card = sent.locator(f".plan[data-plan-id='{plan_id}']")
    expect(card).to_have_attribute("data-state", "pending_dispatch_plan", timeout=10_000)
    assert_the_plan_avoids_the_threads_that_cannot_take_work(card, demo)
    expect(phone.locator("#gate")).to_have_attribute("data-state", "awaiting_confirmation")

    # Drop south: north alone gets the message.
    dropped = target_row(card, "south")
    dropped.locator("button.drop").tap()
    expect(dropped).to_have_attribute("data-state", "dropped")
    expect(dropped.locator(".target-state .label")).to_have_text("dropped: it will not be sent")
    expect(card.locator("button.confirm")).to_have_text("Send to 1 thread")
    card.locator("button.confirm").tap()

    north = target_row(card, "north")
    expect(card.locator(".plan-head .label")).to_have_text("sent to 1 thread: 0 of 1 done", timeout=10_000)
    expect(dropped.locator(".target-state .label")).to_have_text("dropped by you: not sent")
    confirmation = phone.locator(
        ".message[data-author='master'] .bubble", has_text="Sent to 1 thread: north."
    )
    expect(confirmation).to_have_count(1)
    expect(north.locator(".target-state .label")).to_have_text("north is working…", timeout=TURN_TIMEOUT_MS)
    expect(phone.locator("#gate")).to_have_text("executing: 0 of 1 done")

    # A reload while the thread works comes back to the progress.
    phone.reload()
    card = phone.locator(f".plan[data-plan-id='{plan_id}']")
    expect(card).to_have_attribute("data-state", "awaiting_result", timeout=10_000)
    expect(card.locator(".plan-head .label")).to_have_text("sent to 1 thread: 0 of 1 done")
    expect(target_row(card, "north").locator(".target-state .label")).to_have_text("north is working…")
    expect(target_row(card, "south").locator(".target-state .label")).to_have_text("dropped by you: not sent")
    expect(phone.locator("#gate")).to_have_text("executing: 0 of 1 done")

    result = phone.locator(
        f".message[data-author='thread'][data-thread-id='{demo.threads['north']['thread_id']}']"
    )
    expect(result).to_have_count(1, timeout=TURN_TIMEOUT_MS)
    expect(result.locator(".meta")).to_contain_text("north")
    expect(result.locator(".bubble")).to_contain_text(
        "Demo model (not a real model): you said: Write the release notes"
    )
    expect(result.locator(".bubble")).to_contain_text("drafted this for north.")
    summary = phone.locator(f".message[data-author='master'][data-summary-of='{plan_id}']")
    expect(summary).to_have_count(1, timeout=RUN_TIMEOUT_MS)
    expect(summary.locator(".bubble")).to_contain_text(
        "Demo model (not a real model), summarising: 1 of 1 threads answered."
    )
    expect(card).to_have_attribute("data-state", "done")
    expect(card.locator(".plan-head .label")).to_have_text("done: 1 of 1 thread answered")
    expect(target_row(card, "north").locator(".target-state .label")).to_have_text("answered")
    expect(phone.locator("#gate")).to_be_hidden()
    # The result came in after the confirmation and before the summary.
    assert int(summary.get_attribute("data-sequence")) > int(result.get_attribute("data-sequence"))
    # Since the last reload (the record starts anew with each page): the progress, the master agent
    # summing up (the demo model takes its six seconds over the summary too), the end.
    assert plan_states(phone, plan_id) == [
        ("awaiting_result", "sent to 1 thread: 0 of 1 done"),
        ("awaiting_result", "1 of 1 done; the master agent is summarising…"),
        ("done", "done: 1 of 1 thread answered"),
    ]
    assert_fits_the_phone(phone)


def test_a_plan_for_two_threads_brings_back_each_result_named_by_its_thread(
    phone: Any, demo: DemoStack
) -> None:
    from playwright.sync_api import expect

    group = new_group_by_api(demo, "Both threads")
    open_conversation(phone, demo, group)
    sent = send(phone, "Report what you changed today.", timeout_ms=PLAN_TIMEOUT_MS)
    card = proposed_card(phone, sent)
    plan_id = card.get_attribute("data-plan-id")
    card.locator("button.confirm").tap()

    summary = phone.locator(f".message[data-author='master'][data-summary-of='{plan_id}']")
    expect(summary).to_have_count(1, timeout=RUN_TIMEOUT_MS)
    expect(summary.locator(".bubble")).to_contain_text("summarising: 2 of 2 threads answered.")
    for title in FRESH_THREADS:
        result = phone.locator(
            f".message[data-author='thread'][data-thread-id='{demo.threads[title]['thread_id']}']"
        )
        expect(result).to_have_count(1)
        expect(result.locator(".meta")).to_contain_text(title)
        expect(result.locator(".bubble")).to_contain_text(f"drafted this for {title}")
    expect(card.locator(".plan-head .label")).to_have_text("done: 2 of 2 threads answered")
    labels = [label for _state, label in plan_states(phone, plan_id)]
    progress = [label for label in labels if label.startswith("sent to 2 threads: ")]
    assert progress and progress[0] == "sent to 2 threads: 0 of 2 done", labels
    # k of N only ever grows, through every label the card showed.
    done = [
        int(re.search(r"(\d) of 2 done", label)[1]) for label in labels if re.search(r"(\d) of 2 done", label)
    ]
    assert done == sorted(done) and done[-1] == 2, labels
    assert labels[-1] == "done: 2 of 2 threads answered"
    assert_fits_the_phone(phone)


def test_a_relay_thread_takes_a_message_no_member_can_and_becomes_a_thread_of_its_own(
    phone: Any, demo: DemoStack
) -> None:
    from playwright.sync_api import expect

    title = "Relay check: a group named at more length than a phone is wide " + "x" * 60
    members = [demo.threads[name]["thread_id"] for name in ("ios-sync-client", "firmware-flasher")]
    group = str(demo.post("/api/v1/projects", {"project_title": title, "thread_ids": members})["project_id"])
    open_conversation(phone, demo, group)
    assert_fits_the_phone(phone)  # the long name wraps

    # The demo model takes eight seconds over each answer: the relay still runs when a second tab
    # opens the group.
    sent = send(phone, "Write a changelog entry. [[demo:slow=8]]", timeout_ms=PLAN_TIMEOUT_MS)
    card = proposed_card(phone, sent)
    plan_id = card.get_attribute("data-plan-id")
    expect(card.locator(".target")).to_have_count(1)
    relay = card.locator(".target[data-kind='relay']")
    expect(relay.locator(".title")).to_have_text("ios-sync-client (relay)")
    expect(relay.locator(".budget")).to_have_text("new thread")
    expect(relay.locator(".reason")).to_contain_text(
        re.compile(r"^new Codex thread in \S+ on \S+, the folder of ios-sync-client: no member can take")
    )
    card.locator("button.confirm").tap()
    expect(card.locator(".plan-head .label")).to_have_text("sent to 1 thread: 0 of 1 done", timeout=10_000)
    assert_fits_the_phone(phone)

    # Another tab, which did not confirm and remembers nothing, shows the progress too.
    other_context = phone.context.browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        other = other_context.new_page()
        open_conversation(other, demo, group)
        other_card = other.locator(f".plan[data-plan-id='{plan_id}']")
        expect(other_card.locator(".plan-head .label")).to_have_text(
            re.compile(r"^sent to 1 thread: 0 of 1 done$|^1 of 1 done; the master agent is summarising"),
            timeout=10_000,
        )
    finally:
        other_context.close()

    # Real Codex started a new thread: its result is named by that thread, not by the relay target.
    result = phone.locator(".message[data-author='thread']")
    expect(result).to_have_count(1, timeout=RUN_TIMEOUT_MS)
    session = result.get_attribute("data-thread-id")
    assert session and not session.startswith("relay-")
    expect(result.locator(".meta")).to_contain_text("ios-sync-client (relay)")
    summary = phone.locator(f".message[data-author='master'][data-summary-of='{plan_id}']")
    expect(summary).to_have_count(1, timeout=RUN_TIMEOUT_MS)

    # It is a thread of its own: in the home list, and its page shows the instruction and the answer.
    phone.goto(f"{demo.gateway}/console/?token={demo.token}")
    row = phone.locator("#conversations li", has=phone.locator(".title", has_text="ios-sync-client (relay)"))
    expect(row).to_have_count(1, timeout=15_000)
    row.locator("a").tap()
    expect(phone.locator("h1")).to_have_text("ios-sync-client (relay)", timeout=10_000)
    expect(phone.locator(".message[data-author='master'] .bubble")).to_contain_text("Write a changelog entry")
    answer = phone.locator(f".message[data-author='thread'][data-thread-id='{session}'] .bubble")
    expect(answer).to_contain_text("Demo model (not a real model): you said:", timeout=10_000)
    assert_fits_the_phone(phone)
