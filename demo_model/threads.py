"""The demo's threads: real Codex threads, driven by the real Codex CLI against the demo model.

``make run`` without a Codex home of your own shows these. Nothing here writes a session file:
every line of every rollout is what the installed Codex writes (``session_meta.cli_version`` says
which), so resuming a demo thread, from a chat message or from a terminal, works like any thread.
The model behind them is :mod:`demo_model`, **not a real model**: every reply says so.

What :func:`main` does:

1. writes the demo Codex home's ``config.toml`` (:func:`demo_model.write_codex_home`) with a
   :data:`DEMO_CONTEXT_WINDOW`-token window, small enough that a thread goes from safe through
   watch, urgent and critical into a real compaction within a few minutes of turns (table below);
2. creates one small git workspace per thread under ``<codex home>/workspaces/<name>`` (a Python
   module, its unittest tests, one commit; ``ios-sync-client`` keeps an uncommitted change, so a
   handoff has something to find);
3. creates each thread with a real ``codex exec`` in its workspace and runs its
   :attr:`DemoThreadPlan.initial_turns` (``codex exec resume``), all threads at once, so the demo
   starts with threads at different levels; then writes :data:`STATE_FILE` (``read_demo_threads``
   reads it: the launcher waits for it);
4. with ``--live``, every ``--interval`` seconds gives each due thread (every
   :attr:`DemoThreadPlan.turn_every` ticks) one more real ``codex exec resume`` turn. A turn takes the
   same per-thread lock as the local agent's chat turns
   (:func:`worker.local_agent.codex_exec.run_codex_turn`), so a thread a chat turn holds is skipped,
   and a thread somebody else wrote to (a chat message) is left alone for :data:`CHAT_QUIET_S`
   seconds, so a conversation is not interleaved with demo turns.

Some prompts carry the demo model's ``[[demo:shell=CMD]]`` marker, so Codex really runs a command
in the workspace (``git diff --stat``, the tests) and the session records it. Demo turns run in
Codex's read-only sandbox.

Context with the default usage model (T = 12,100 + 2,000 tokens per user turn since the last
compaction; window 48,000, W = 45,600, L = 43,200; the ring is (L - T) / (L - 12,000)):

| user turns | T               | ring    | level                                             |
|------------|-----------------|---------|---------------------------------------------------|
| 1-6        | 14,100-24,100   | 93-61 % | safe                                              |
| 7-9        | 26,100-30,100   | 55-42 % | watch                                             |
| 10-11      | 32,100-34,100   | 36-29 % | urgent                                            |
| 12-15      | 36,100-42,100   | 23-4 %  | critical                                          |
| 16         | 44,100          | 0 %     | past L: Codex compacts before the next turn       |

After the compaction the next turn is back at 14,100.

Progress goes to stdout, one line per event; a Codex failure is said in words (exit 1 when a thread
cannot be created). CLI::

    python -m demo_model.threads --codex-home DIR --model-url http://127.0.0.1:8123/v1
                                 [--threads 3] [--live --interval 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from boss_common.waiting import wait_until_set
from demo_model.codex_home import demo_model_environment, write_codex_home
from worker.local_agent.codex_exec import (
    CodexRunSettings,
    CodexThreadCreationError,
    CodexTurnRequest,
    CodexTurnResult,
    create_codex_thread,
    run_codex_turn,
)
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary
from worker.local_agent.codex_outcome import FailureKind

DEMO_CONTEXT_WINDOW = 48_000
"""``model_context_window`` of the demo Codex home (tokens); see the table in the module docstring."""

DEFAULT_INTERVAL_S = 4.0
"""Seconds between live ticks."""

CHAT_QUIET_S = 60.0
"""After somebody else wrote to a thread (a chat turn), the grower leaves it alone this long (seconds)."""

DEMO_SANDBOX = "read-only"
"""Codex's sandbox for demo turns: their commands only read."""

STALL_TIMEOUT_S = 30.0
"""A demo turn with no output from Codex for this long is stopped (seconds)."""

TURN_TIMEOUT_S = 120.0
"""A demo turn is stopped after this long in all (seconds)."""

STATE_FILE = Path("boss") / "demo-threads.json"
"""Relative to the Codex home: the demo threads, written once they are all created."""

WORKSPACES_DIR = "workspaces"
"""Relative to the Codex home: the threads' git workspaces."""

_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Boss Demo",
    "GIT_AUTHOR_EMAIL": "demo@boss.invalid",
    "GIT_COMMITTER_NAME": "Boss Demo",
    "GIT_COMMITTER_EMAIL": "demo@boss.invalid",
}
_RUN_TESTS = "Run the tests. [[demo:shell=python3 -m unittest discover -s tests]]"


@dataclass(frozen=True)
class DemoThreadPlan:
    """The script of one demo thread.

    Attributes:
        name: workspace folder name (the thread's title in Boss, which names a project by its folder).
        module: the Python module of the workspace (``src/<module>.py``, ``tests/test_<module>.py``).
        prompts: the user messages of its turns, used in turn (the first one creates the thread).
        initial_turns: user turns run before the demo is ready (at least 1: the creating one).
        turn_every: in live mode the thread gets a turn every this many ticks (1 = every tick).
        uncommitted_change: leave a modified file in the workspace.
    """

    name: str
    module: str
    prompts: tuple[str, ...]
    initial_turns: int
    turn_every: int
    uncommitted_change: bool = False

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"demo thread {self.name} needs at least one prompt")
        if self.initial_turns < 1:
            raise ValueError(f"initial_turns of {self.name} must be 1 or more, got {self.initial_turns}")
        if self.turn_every < 1:
            raise ValueError(f"turn_every of {self.name} must be 1 or more, got {self.turn_every}")

    def prompt(self, turn_index: int) -> str:
        """The message of user turn ``turn_index`` (0 = the one creating the thread), cycling the prompts."""
        return self.prompts[turn_index % len(self.prompts)]


DEMO_PLANS: tuple[DemoThreadPlan, ...] = (
    DemoThreadPlan(
        name="billing-api",
        module="invoices",
        prompts=(
            "Add a rounding rule for invoice totals in EUR and cover it with tests.",
            "Where is the total computed? [[demo:shell=grep -n 'def ' src/invoices.py]]",
            _RUN_TESTS,
            "Make the late-fee calculation use the due date in the customer's time zone.",
            "Refactor the invoice total so discounts apply before tax.",
        ),
        initial_turns=1,
        # The calm thread: one turn to start (no growth rate yet, so no compaction expected soon),
        # then a turn every 150 ticks (10 minutes at the default interval): safe for its first hour
        # and idle half of the time, with its expected compaction far beyond the scheduler's
        # 10-minute horizon, so a group plan can send it work, while the others, a turn every few
        # seconds, are always near a compaction (critical, or handing off ahead of the next one).
        turn_every=150,
    ),
    DemoThreadPlan(
        name="ios-sync-client",
        module="sync_queue",
        prompts=(
            "The offline queue drops edits made while the app is backgrounded; find out why.",
            "What have we changed so far? [[demo:shell=git diff --stat]]",
            "Retry failed uploads with exponential backoff capped at five minutes.",
            _RUN_TESTS,
            "Persist the queue between launches and add a test for the restore path.",
        ),
        initial_turns=8,
        turn_every=3,
        uncommitted_change=True,
    ),
    DemoThreadPlan(
        name="firmware-flasher",
        module="flasher",
        prompts=(
            "Verify the image checksum before flashing and refuse mismatched images.",
            "Show me the flasher module. [[demo:shell=sed -n '1,40p' src/flasher.py]]",
            "Read the bootloader version over serial and log it with each flash.",
            _RUN_TESTS,
            "Split flashing into erase, write and verify steps with progress reporting.",
        ),
        initial_turns=13,
        turn_every=1,
    ),
)
"""The built-in demo threads: one safe and calm (new work can go to it), one at watch with an
uncommitted change (must finish first), one critical and about to compact."""


def demo_plans(count: int) -> list[DemoThreadPlan]:
    """The plans of ``count`` demo threads: :data:`DEMO_PLANS`, then numbered copies (``billing-api-2``).

    Raises:
        ValueError: ``count`` is less than 1.
    """
    if count < 1:
        raise ValueError(f"--threads must be 1 or more, got {count}")
    plans = []
    for index in range(count):
        plan = DEMO_PLANS[index % len(DEMO_PLANS)]
        round_number = index // len(DEMO_PLANS)
        plans.append(plan if round_number == 0 else replace(plan, name=f"{plan.name}-{round_number + 1}"))
    return plans


def due_on_tick(plans: Sequence[DemoThreadPlan], tick: int) -> list[DemoThreadPlan]:
    """The plans whose thread gets a turn on live tick ``tick`` (1, 2, 3, ...)."""
    return [plan for plan in plans if tick % plan.turn_every == 0]


def quiet_until(now: float, written_by_others: bool, previous: float, quiet_s: float = CHAT_QUIET_S) -> float:
    """Until when (monotonic seconds) the grower leaves a thread alone.

    Args:
        now: the monotonic clock now (seconds).
        written_by_others: the thread's session file changed since the grower's last look (a chat turn).
        previous: the quiet-until time so far (0.0 for none).
        quiet_s: how long a change by somebody else keeps the grower away (seconds).
    """
    return max(previous, now + quiet_s) if written_by_others else previous


@dataclass(frozen=True)
class DemoThread:
    """A created demo thread.

    Attributes:
        name: its plan's name (and workspace folder name).
        session_id: Codex's session id (what ``codex exec resume`` takes; Boss's thread id).
        folder: its git workspace, where Codex runs.
        turns: user turns the grower has run in it so far.
    """

    name: str
    session_id: str
    folder: Path
    turns: int


def state_path(codex_home: Path) -> Path:
    """Where the demo threads are listed: ``<codex_home>/boss/demo-threads.json``."""
    return codex_home / STATE_FILE


def write_demo_threads(codex_home: Path, threads: Sequence[DemoThread], model_url: str) -> Path:
    """Writes :data:`STATE_FILE` at once (a temporary file renamed over it); returns its path.

    Shape: ``{"model_url": str, "written_at": RFC 3339 UTC, "threads": [{"name", "session_id",
    "folder", "turns"}]}``. Raises OSError when it cannot be written.
    """
    path = state_path(codex_home)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "model_url": model_url,
        "written_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "threads": [
            {"name": t.name, "session_id": t.session_id, "folder": str(t.folder), "turns": t.turns}
            for t in threads
        ],
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


def read_demo_threads(codex_home: Path) -> list[DemoThread] | None:
    """The demo threads listed under ``codex_home``, or None when there is no (readable) list yet."""
    try:
        document = json.loads(state_path(codex_home).read_text(encoding="utf-8"))
        return [
            DemoThread(str(t["name"]), str(t["session_id"]), Path(t["folder"]), int(t["turns"]))
            for t in document["threads"]
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def rollout_file(codex_home: Path, session_id: str) -> Path | None:
    """The session file Codex writes for ``session_id`` (``sessions/**/rollout-*-<id>.jsonl``), if any."""
    return next((codex_home / "sessions").rglob(f"rollout-*-{session_id}.jsonl"), None)


def _git(workspace: Path, *arguments: str) -> None:
    """Runs git in ``workspace`` with the demo identity. Raises CalledProcessError on failure."""
    subprocess.run(
        ["git", "-C", str(workspace), *arguments],
        check=True,
        capture_output=True,
        env={**os.environ, **_GIT_IDENTITY},
    )


def create_workspace(root: Path, plan: DemoThreadPlan) -> Path:
    """Creates ``root/<plan.name>``: a small Python project committed to git on ``main``.

    ``src/<module>.py`` has a ``<module>_total`` function, ``tests/test_<module>.py`` three unittest
    tests of it (``python3 -m unittest discover -s tests`` passes). With
    :attr:`DemoThreadPlan.uncommitted_change` a ``<module>_count`` function is added after the commit
    and left uncommitted. Without git installed the folder has no repository. An existing workspace
    is kept as it is.

    Returns:
        The workspace folder. Raises OSError or CalledProcessError when it cannot be made.
    """
    workspace = root / plan.name
    if workspace.is_dir():
        return workspace
    module = plan.module
    (workspace / "src").mkdir(parents=True)
    (workspace / "tests").mkdir()
    (workspace / "src" / f"{module}.py").write_text(
        f'"""{plan.name}: demo module."""\n\n\ndef {module}_total(items):\n    return sum(items)\n'
    )
    (workspace / "tests" / f"test_{module}.py").write_text(
        "import sys\nimport unittest\nfrom pathlib import Path\n\n"
        'sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))\n\n'
        f"from {module} import {module}_total\n\n\n"
        f"class {module.title().replace('_', '')}TotalTest(unittest.TestCase):\n"
        f"    def test_empty(self):\n        self.assertEqual({module}_total([]), 0)\n\n"
        f"    def test_one(self):\n        self.assertEqual({module}_total([2]), 2)\n\n"
        f"    def test_many(self):\n        self.assertEqual({module}_total([1, 2, 3]), 6)\n"
    )
    (workspace / "README.md").write_text(f"# {plan.name}\n\nA demo workspace of Boss (not a real project).\n")
    if shutil.which("git") is not None:
        _git(workspace, "init", "--quiet", "--initial-branch=main")
        _git(workspace, "add", "--all")
        _git(workspace, "-c", "commit.gpgsign=false", "commit", "--quiet", "-m", f"Start {plan.name}")
    if plan.uncommitted_change:
        with (workspace / "src" / f"{module}.py").open("a") as handle:
            handle.write(f"\n\ndef {module}_count(items):\n    return len(items)\n")
    return workspace


def say(text: str) -> None:
    """One progress line on stdout, with the UTC time."""
    sys.stdout.write(f"[{datetime.now(UTC):%H:%M:%S}] {text}\n")
    sys.stdout.flush()


def describe_failure(result: CodexTurnResult) -> str:
    """A failed run in words: ``"<kind, spaced>: <Codex's detail>"``."""
    kind = (result.failure_kind or FailureKind.OTHER).value.replace("_", " ")
    return f"{kind}: {result.failure_detail}" if result.failure_detail else kind


def model_health_url(model_url: str) -> str:
    """The demo model's ``/healthz`` URL for its base URL (``http://HOST:PORT/v1`` -> ``.../healthz``)."""
    base = model_url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/healthz"


def check_model(model_url: str, timeout_s: float = 3.0) -> str | None:
    """None when the demo model answers ``GET /healthz`` with 200, else what went wrong, in words."""
    url = model_health_url(model_url)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            if answer.status == 200:
                return None
            return f"the demo model answered {answer.status} at {url}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return f"the demo model does not answer at {url} ({reason})"


@dataclass(frozen=True)
class GrowerSettings:
    """How the grower runs Codex (the demo Codex home, the demo model's key, read-only sandbox)."""

    codex: CodexRunSettings
    codex_home: Path
    model_url: str


def grower_settings(codex_home: Path, model_url: str, codex_bin: Path | None = None) -> GrowerSettings:
    """Run settings for demo turns in ``codex_home``; ``codex_bin`` None finds Codex at each run."""
    codex = CodexRunSettings(
        codex_bin=codex_bin,
        codex_home=codex_home,
        sandbox=DEMO_SANDBOX,
        stall_timeout_s=STALL_TIMEOUT_S,
        turn_timeout_s=TURN_TIMEOUT_S,
        extra_env=demo_model_environment(),
    )
    return GrowerSettings(codex=codex, codex_home=codex_home, model_url=model_url)


class DemoThreadError(Exception):
    """A demo thread could not be created or brought to its first level; the message says why."""


async def create_demo_thread(
    plan: DemoThreadPlan, settings: GrowerSettings, stop: asyncio.Event | None = None
) -> DemoThread:
    """Creates the thread's workspace, the thread (``codex exec``) and its remaining initial turns.

    Raises:
        DemoThreadError: Codex failed (the message has Codex's words), or the workspace cannot be made.
    """
    try:
        folder = create_workspace(settings.codex_home / WORKSPACES_DIR, plan)
    except (OSError, subprocess.CalledProcessError) as error:
        raise DemoThreadError(f"{plan.name}: cannot create its workspace: {error}") from error
    try:
        session_id = await create_codex_thread(folder, plan.prompt(0), settings.codex, stop=stop)
    except CodexThreadCreationError as error:
        detail = describe_failure(error.result)
        raise DemoThreadError(f"{plan.name}: Codex did not create the thread: {detail}") from error
    say(f"{plan.name}: created Codex thread {session_id} in {folder}")
    thread = DemoThread(plan.name, session_id, folder, turns=1)
    while thread.turns < plan.initial_turns:
        result = await run_turn(thread, plan, settings, stop)
        if not result.succeeded:
            raise DemoThreadError(f"{plan.name}: turn {thread.turns + 1} failed: {describe_failure(result)}")
        thread = replace(thread, turns=thread.turns + 1)
    return thread


async def run_turn(
    thread: DemoThread, plan: DemoThreadPlan, settings: GrowerSettings, stop: asyncio.Event | None
) -> CodexTurnResult:
    """One real ``codex exec resume`` turn of ``thread`` with its next prompt (never raises for a
    failed run; a thread another run holds comes back as ``thread_busy``)."""
    request = CodexTurnRequest(
        codex_thread_ref=thread.session_id,
        codex_folder_ref=str(thread.folder),
        message=plan.prompt(thread.turns),
    )
    return await run_codex_turn(request, settings.codex, stop=stop)


async def prepare_demo(
    plans: Sequence[DemoThreadPlan], settings: GrowerSettings, stop: asyncio.Event | None = None
) -> list[DemoThread]:
    """The demo threads: the ones :data:`STATE_FILE` lists when they still match ``plans`` and exist,
    else new ones (:func:`create_demo_thread` for every plan at once), then lists them.

    Raises:
        DemoThreadError: a thread could not be created (the others are stopped).
    """
    listed = read_demo_threads(settings.codex_home)
    if listed is not None and _still_there(listed, plans, settings.codex_home):
        for thread in listed:
            say(f"{thread.name}: resuming Codex thread {thread.session_id} ({thread.turns} turns so far)")
        return listed
    tasks = [asyncio.create_task(create_demo_thread(plan, settings, stop)) for plan in plans]
    try:
        threads = list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    write_demo_threads(settings.codex_home, threads, settings.model_url)
    return threads


def _still_there(threads: Sequence[DemoThread], plans: Sequence[DemoThreadPlan], codex_home: Path) -> bool:
    names = [plan.name for plan in plans]
    return [t.name for t in threads] == names and all(
        t.folder.is_dir() and rollout_file(codex_home, t.session_id) is not None for t in threads
    )


@dataclass(frozen=True)
class LiveThread:
    """A thread as the live loop sees it: the thread, its plan, the size of its session file at the
    grower's last look (bytes) and until when it is left alone (monotonic seconds, 0.0 for never)."""

    thread: DemoThread
    plan: DemoThreadPlan
    known_size: int
    quiet_until: float = 0.0


def _file_size(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def grow_once(live: LiveThread, settings: GrowerSettings, stop: asyncio.Event) -> LiveThread:
    """One tick of one due thread: skipped while quiet (a chat wrote to it lately) or busy (a chat
    turn holds it), else one turn; says what happened. Returns the thread's new live state."""
    name = live.plan.name
    now = time.monotonic()
    size = _file_size(rollout_file(settings.codex_home, live.thread.session_id))
    until = quiet_until(now, size != live.known_size, live.quiet_until)
    if until > live.quiet_until:
        say(f"{name}: somebody else wrote to the thread (a chat?): no demo turns for {CHAT_QUIET_S:.0f} s")
    if now < until:
        return replace(live, known_size=size, quiet_until=until)
    result = await run_turn(live.thread, live.plan, settings, stop)
    after = _file_size(rollout_file(settings.codex_home, live.thread.session_id))
    if result.failure_kind is FailureKind.THREAD_BUSY:
        say(f"{name}: skipped, the thread is busy in another Codex run: {result.failure_detail}")
        return replace(live, known_size=after, quiet_until=max(until, time.monotonic() + CHAT_QUIET_S))
    if result.failure_kind is FailureKind.INTERRUPTED:
        return live
    turn_number = live.thread.turns + 1
    thread = replace(live.thread, turns=turn_number)
    if result.succeeded:
        say(f"{name}: turn {turn_number} done in {result.duration_s:.1f} s")
    else:
        say(f"{name}: turn {turn_number} failed: {describe_failure(result)}")
    return replace(live, thread=thread, known_size=after, quiet_until=until)


async def grow_live(
    threads: Sequence[DemoThread],
    plans: Sequence[DemoThreadPlan],
    settings: GrowerSettings,
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Every ``interval_s`` seconds, one turn for each due thread (all at once), until ``stop`` is set."""
    by_name = {plan.name: plan for plan in plans}
    live = {
        t.name: LiveThread(t, by_name[t.name], _file_size(rollout_file(settings.codex_home, t.session_id)))
        for t in threads
    }
    started = time.monotonic()
    tick = 0
    while not stop.is_set():
        tick += 1
        if await wait_until_set(stop, max(0.0, started + tick * interval_s - time.monotonic())):
            return
        due = [live[plan.name] for plan in due_on_tick([v.plan for v in live.values()], tick)]
        for updated in await asyncio.gather(*(grow_once(entry, settings, stop) for entry in due)):
            live[updated.plan.name] = updated
        # Ticks missed while the turns ran are dropped, not caught up in a burst.
        tick = max(tick, int((time.monotonic() - started) // interval_s))


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m demo_model.threads`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m demo_model.threads",
        description="Boss's demo threads: real Codex threads against the demo model (not a real model).",
    )
    parser.add_argument("--codex-home", type=Path, required=True, help="the demo Codex home (created)")
    parser.add_argument(
        "--model-url", required=True, help="the demo model's base URL, e.g. http://127.0.0.1:8123/v1"
    )
    parser.add_argument("--threads", type=int, default=len(DEMO_PLANS), help="how many threads (default 3)")
    parser.add_argument("--live", action="store_true", help="keep giving the threads turns until stopped")
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between live ticks (default 4)"
    )
    parser.add_argument(
        "--context-window",
        type=int,
        default=DEMO_CONTEXT_WINDOW,
        help=f"the Codex home's model_context_window in tokens (default {DEMO_CONTEXT_WINDOW})",
    )
    return parser


async def run(arguments: argparse.Namespace) -> int:
    """Prepares the demo threads and, with ``--live``, grows them until SIGTERM/SIGINT; the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop.set)
    codex_home = arguments.codex_home.expanduser().resolve()
    try:
        codex_bin = find_codex_binary()
    except CodexNotFoundError as error:
        say(f"cannot run the demo threads: {error}")
        return 1
    problem = check_model(arguments.model_url)
    if problem:
        say(f"cannot run the demo threads: {problem}; start it with `python -m demo_model serve`")
        return 1
    write_codex_home(codex_home, arguments.model_url, context_window=arguments.context_window)
    settings = grower_settings(codex_home, arguments.model_url, codex_bin)
    plans = demo_plans(arguments.threads)
    say(f"demo threads (Codex {codex_bin}, demo model at {arguments.model_url}, not a real model)")
    try:
        threads = await prepare_demo(plans, settings, stop)
    except DemoThreadError as error:
        if stop.is_set():
            say("stopped before the demo threads were ready")
            return 0
        say(f"cannot run the demo threads: {error}")
        return 1
    if stop.is_set():
        return 0
    say(f"ready: {len(threads)} demo threads listed in {state_path(codex_home)}")
    if arguments.live:
        say(f"growing them live, a tick every {arguments.interval:g} s (Ctrl-C stops)")
        await grow_live(threads, plans, settings, arguments.interval, stop)
        say("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m demo_model.threads``; returns the exit code (2 for bad options)."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.threads < 1:
        parser.error(f"--threads must be 1 or more, got {arguments.threads}")
    if not arguments.interval > 0:
        parser.error(f"--interval must be > 0 seconds, got {arguments.interval}")
    if arguments.context_window <= 0:
        parser.error(f"--context-window must be positive, got {arguments.context_window}")
    return asyncio.run(run(arguments))


if __name__ == "__main__":
    sys.exit(main())
