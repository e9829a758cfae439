"""Chat, end to end, as processes (issue 12): context_budget, scheduler, conversations and the gateway
run as `python -m services.<name> serve`, Boss's built-in demo model (not a real model) as `python -m
demo_model serve`, and a real worker as `python -m worker run`, whose local agent runs the REAL Codex
CLI (`codex exec resume`) against the demo model. The thread is a real Codex thread, created
beforehand by a real `codex exec` in a temporary folder, so the worker registers it as it would any
of a person's threads. Everything a client does goes through the gateway's REST API and SSE stream.

- A message sent to the thread's project comes back as the thread's reply: an SSE client sees the
  task's statuses (`task.updated`) and the reply (`conversation.message.created`) whose text is the
  demo model's exact reply; `GET .../messages?after=<the user message's sequence>` answers exactly
  that reply; the thread's one session file grew by the turn (it was resumed, not a new thread).
- The worker killed with SIGKILL mid-turn (Codex waiting on the model): with the scheduler's short
  leases, the task ends failed with a system message saying the device stopped answering, and no
  Codex process of that run is left running by then (the kernel ends it with the worker: its
  parent-death signal).
- The gateway restarted (SIGTERM, then started again on the same port) mid-turn: a client that
  reconnects SSE with Last-Event-ID receives the reply, and `GET .../messages` shows it.

Parametrised over SQLite and PostgreSQL. On PostgreSQL every service keeps its fixed schema
(`context_budget`, `scheduler`, `conversations`: services/shared/config.py gives one URL, each
service its own schema in it), so each run gets a database of its own, created and dropped here:
runs in parallel never share a schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from demo_model import reply_text, write_codex_home
from demo_model.codex_home import demo_model_environment
from services.local_stack import grpc_healthy, http_healthy
from services.shared.auth import TokenAuthority
from tests.conftest import POSTGRES_URL, REPOSITORY_ROOT
from worker.local_agent.codex_exec import CodexRunSettings, create_codex_thread
from worker.local_agent.codex_guard import CodexProcess, codex_processes_using
from worker.local_agent.codex_install import CodexNotFoundError, find_codex_binary

SECRET = "e2e-secret-for-chat-0123456789abcdef0123456789"
OWNER = "local"
WORKER_ID = "worker-chat-e2e"
NODE_ID = "node-chat-e2e"
GRPC_SERVICES = ("context_budget", "scheduler", "conversations")
STARTUP_SECONDS = 60.0
TURN_SECONDS = 30.0
"""How long one turn may take to end here (a demo-model turn takes well under a second)."""
CLAIM_LEASE_SECONDS = 3.0
RUN_LEASE_SECONDS = 4.0
"""The scheduler's leases for this stack (seconds): a running task whose agent stops heartbeating
is failed as device_lost within about RUN_LEASE_SECONDS (heartbeats every third of it). Short for
the test's sake, yet long enough that a worker slowed by a busy machine (Codex starting takes more
than a core) keeps its lease: at 1.5 s, a run of the suite beside other work lost two."""
SWEEP_SECONDS = 0.2
SLOW_TURN_SECONDS = 5.0
"""How long the demo model waits before answering a slow turn (`[[demo:slow=...]]`), seconds."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def eventually(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool], what: str, timeout: float = TURN_SECONDS
) -> None:
    """Polls `condition` (sync or async) every 0.1 s until it is true; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = condition()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)


# ---- the database ------------------------------------------------------------------------------


@contextlib.contextmanager
def own_postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database on the test server (dropped afterwards); yields its URL."""
    server, _, _ = POSTGRES_URL.rpartition("/")
    name = f"e2e_chat_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:  # a clear message beats a stack of driver frames
        admin.dispose()
        pytest.fail(
            f"PostgreSQL at {POSTGRES_URL} is not reachable ({error}); start it or set "
            "BOSS_TEST_SKIP_POSTGRES=1",
            pytrace=False,
        )
    try:
        yield f"{server}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ---- the processes -----------------------------------------------------------------------------


@dataclass
class Child:
    """One process of the stack, its command line and its log file."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, environment: dict[str, str]) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=REPOSITORY_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Sends `sig` and waits for the exit (SIGKILL after `timeout` s); returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def log_tail(self, characters: int = 3000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-characters:]


@dataclass
class ChatStack:
    """Boss as processes, the demo model, a Codex home written for it, and a real Codex thread."""

    root: Path
    environment: dict[str, str]
    codex_bin: Path
    codex_home: Path
    addresses: dict[str, str]
    children: dict[str, Child] = field(default_factory=dict)
    worker_count: int = 0

    @property
    def gateway(self) -> str:
        return f"http://{self.addresses['gateway']}"

    @property
    def client_token(self) -> str:
        return TokenAuthority(SECRET).issue_client(OWNER)

    def child(self, name: str, argv: list[str]) -> Child:
        """A child process named `name`, logging to `<root>/logs/<name>.log` (not started)."""
        (self.root / "logs").mkdir(exist_ok=True)
        child = Child(name, argv, self.root / "logs" / f"{name}.log")
        self.children[name] = child
        return child

    async def start_service(self, service: str) -> None:
        """Starts `python -m services.<service> serve` and waits for its health check."""
        module = "services.bff_gateway" if service == "gateway" else f"services.{service}"
        child = self.child(service, [sys.executable, "-m", module, "serve"])
        child.start(self.environment)
        if service == "gateway":
            await self.wait_healthy(child, lambda: http_healthy(f"{self.gateway}/healthz"))
        else:
            await self.wait_healthy(child, lambda: grpc_healthy(self.addresses[service]))

    async def wait_healthy(self, child: Child, check: Callable[[], Awaitable[bool]]) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not await check():
            if not child.alive:
                raise AssertionError(f"{child.name} exited during start-up:\n{child.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{child.name} not healthy in {STARTUP_SECONDS:.0f} s:\n{child.log_tail()}"
                )
            await asyncio.sleep(0.1)

    def start_worker(self) -> Child:
        """`python -m worker run` on this stack's Codex home (its local agent claims this node's
        tasks and runs them with this stack's Codex binary)."""
        self.worker_count += 1
        child = self.child(
            f"worker-{self.worker_count}",
            [
                sys.executable,
                "-m",
                "worker",
                "run",
                "--codex-home",
                str(self.codex_home),
                "--worker-id",
                WORKER_ID,
                "--node-id",
                NODE_ID,
                "--poll-interval",
                "0.2",
                "--codex-bin",
                str(self.codex_bin),
                "--task-stall-timeout",
                "20",
                "--task-turn-cap",
                str(TURN_SECONDS),
            ],
        )
        # The worker signs no tokens: it gets one as `make run` hands its worker one.
        token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID)
        child.start({**self.environment, "BOSS_WORKER_TOKEN": token})
        return child

    async def new_thread(self, name: str) -> str:
        """A real Codex thread (one `codex exec` turn) in a new folder; returns its session id."""
        folder = self.root / "workspaces" / name
        folder.mkdir(parents=True)
        settings = CodexRunSettings(
            codex_bin=self.codex_bin,
            codex_home=self.codex_home,
            extra_env=demo_model_environment(),
            stall_timeout_s=20.0,
            turn_timeout_s=TURN_SECONDS,
        )
        return await create_codex_thread(folder, f"start {name}", settings)

    def rollouts_of(self, session_id: str) -> list[Path]:
        """The session files of a Codex thread under the Codex home."""
        return sorted((self.codex_home / "sessions").rglob(f"rollout-*{session_id}.jsonl"))

    def logs(self) -> str:
        """The tail of every child's log, for a failure message."""
        return "\n".join(f"--- {child.name}\n{child.log_tail(1500)}" for child in self.children.values())

    def stop(self) -> None:
        """Stops every child: SIGTERM to all at once (a service waits out its grace period for
        the streams other services hold open), then waits for each."""
        children = [child for child in self.children.values() if child.alive]
        for child in children:
            if child.popen is not None:
                child.popen.send_signal(signal.SIGTERM)
        for child in children:
            child.stop()


async def start_stack(
    root: Path,
    database_url: str | None,
    overrides: Callable[[dict[str, str]], dict[str, str]] | None = None,
) -> ChatStack:
    """Starts the demo model, writes a Codex home for it, then every service (in parallel).
    `overrides` gets the services' addresses (by name, "demo_model" included) and returns more
    environment variables for every process."""
    try:
        codex_bin = find_codex_binary()
    except CodexNotFoundError as error:
        pytest.fail(f"the real Codex CLI is needed: run `make codex` ({error})", pytrace=False)
    addresses = {name: f"127.0.0.1:{free_port()}" for name in (*GRPC_SERVICES, "gateway", "demo_model")}
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("BOSS_") and key != "CODEX_HOME"
    }
    environment.update(
        {
            "PYTHONPATH": f"{REPOSITORY_ROOT}{os.pathsep}{REPOSITORY_ROOT / 'gen'}",
            "BOSS_DATA_DIR": str(root / "var"),
            "BOSS_AUTH_SECRET": SECRET,
            "BOSS_LOG_LEVEL": "INFO",
            "BOSS_SCHEDULER_TASK_CLAIM_LEASE_SECONDS": str(CLAIM_LEASE_SECONDS),
            "BOSS_SCHEDULER_TASK_RUN_LEASE_SECONDS": str(RUN_LEASE_SECONDS),
            "BOSS_SCHEDULER_TASK_SWEEP_SECONDS": str(SWEEP_SECONDS),
            **demo_model_environment(),
        }
    )
    if database_url is not None:
        environment["BOSS_DATABASE_URL"] = database_url
    if overrides is not None:
        environment.update(overrides(addresses))
    for name in (*GRPC_SERVICES, "gateway"):
        variable = f"BOSS_{name.upper()}"
        environment[f"{variable}_LISTEN"] = environment[f"{variable}_ADDRESS"] = addresses[name]
    stack = ChatStack(root, environment, codex_bin, root / "codex-home", addresses)
    host, _, port = addresses["demo_model"].rpartition(":")
    model = stack.child(
        "demo_model", [sys.executable, "-m", "demo_model", "serve", "--host", host, "--port", port]
    )
    model.start(environment)
    try:
        await stack.wait_healthy(model, lambda: http_healthy(f"http://{addresses['demo_model']}/healthz"))
        write_codex_home(stack.codex_home, f"http://{addresses['demo_model']}/v1")
        await asyncio.gather(*(stack.start_service(name) for name in GRPC_SERVICES))
        await stack.start_service("gateway")
    except BaseException:
        stack.stop()
        raise
    return stack


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def chat_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChatStack]:
    """The whole stack on SQLite files or on a PostgreSQL database of its own, for this module."""
    root = tmp_path_factory.mktemp(f"chat-{request.param}")
    with contextlib.ExitStack() as cleanup:
        database_url = None
        if request.param == "postgresql":
            if os.environ.get("BOSS_TEST_SKIP_POSTGRES") == "1":
                pytest.skip("BOSS_TEST_SKIP_POSTGRES=1")
            database_url = cleanup.enter_context(own_postgres_database())
        stack = asyncio.run(start_stack(root, database_url))
        try:
            yield stack
        finally:
            stack.stop()


# ---- the client --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    """One event of `GET /api/v1/events`: its id (sequence), type and JSON data."""

    id: int
    type: str
    data: dict[str, Any]


class SseClient:
    """An httpx streaming client of the gateway's `GET /api/v1/events`, collecting every event."""

    def __init__(self, gateway: str, token: str, last_event_id: int | None = None) -> None:
        self.events: list[SseEvent] = []
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()
        self._gateway = gateway
        self._token = token
        self._last_event_id = last_event_id
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SseClient:
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.opened.wait(), 10)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._task

    @property
    def last_id(self) -> int:
        """The id of the last event received (what a reconnect sends as Last-Event-ID)."""
        return self.events[-1].id

    async def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "text/event-stream"}
        if self._last_event_id is not None:
            headers["Last-Event-ID"] = str(self._last_event_id)
        try:
            async with (
                httpx.AsyncClient(base_url=self._gateway, timeout=httpx.Timeout(5, read=None)) as http,
                http.stream("GET", "/api/v1/events", headers=headers) as response,
            ):
                response.raise_for_status()
                self.opened.set()
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                        continue
                    if "data" in fields:
                        data = json.loads(fields["data"])
                        self.events.append(
                            SseEvent(int(fields.get("id", "0")), fields.get("event", ""), data)
                        )
                    fields = {}
        except httpx.HTTPError:
            pass
        finally:
            self.opened.set()
            self.ended.set()

    def task_statuses(self, task_id: str) -> list[str]:
        """The statuses of `task_id` in the `task.updated` events received, in order."""
        return [
            event.data["task"]["status"]
            for event in self.events
            if event.type == "task.updated" and event.data["task"]["taskId"] == task_id
        ]

    def messages_created(self, project_id: str) -> list[dict[str, Any]]:
        """The `message` of every `conversation.message.created` of `project_id` received."""
        return [
            event.data["message"]
            for event in self.events
            if event.type == "conversation.message.created"
            and event.data["message"]["projectId"] == project_id
        ]

    def result_message(self, project_id: str, task_id: str) -> dict[str, Any] | None:
        """The message that ended `task_id` (reply or system message), once received."""
        for message in self.messages_created(project_id):
            if message["taskId"] == task_id and message["authorKind"] != "user":
                return message
        return None


@contextlib.asynccontextmanager
async def gateway_client(stack: ChatStack) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {stack.client_token}"}
    async with httpx.AsyncClient(base_url=stack.gateway, headers=headers, timeout=10) as http:
        yield http


async def project_of(http: httpx.AsyncClient, session_id: str, logs: Callable[[], str] | None = None) -> str:
    """The project of the Codex thread `session_id` once the worker registered it with its Codex
    references (from the home list and the thread page, as a client finds it). On a timeout the
    failure names what was last seen, then `logs()` (the services' log tails) when given."""
    found: dict[str, str] = {}
    seen: dict[str, Any] = {}

    async def registered() -> bool:
        rows = (await http.get("/api/v1/conversations", params={"page_size": 200})).json()["conversations"]
        seen["rows"] = [row for row in rows if row["context_budget_thread_id"] == session_id]
        for row in seen["rows"]:
            page = await http.get(f"/api/v1/threads/{session_id}/context-summary")
            seen["thread_page"] = (page.status_code, page.text[:600])
            if page.status_code == 200 and page.json()["codex_thread_ref"] and page.json()["codex_folder"]:
                found["project_id"] = row["project_id"]
                return True
        return False

    # A worker starting on a loaded machine takes a while: its discovery, then the registration.
    try:
        await eventually(registered, f"the worker to register thread {session_id}", timeout=90)
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen: {seen!r}\n{logs() if logs else ''}") from None
    return found["project_id"]


async def send(http: httpx.AsyncClient, project_id: str, message: str) -> dict[str, Any]:
    """POST a message; returns the answer (201)."""
    response = await http.post(
        f"/api/v1/projects/{project_id}/messages",
        json={"text": message, "client_message_id": f"c-{uuid.uuid4().hex}"},
    )
    assert response.status_code == 201, response.text
    return response.json()


async def task_status(http: httpx.AsyncClient, task_id: str) -> str:
    response = await http.get(f"/api/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    return str(response.json()["task"]["status"])


async def messages_after(http: httpx.AsyncClient, project_id: str, sequence: int) -> list[dict[str, Any]]:
    response = await http.get(f"/api/v1/projects/{project_id}/messages", params={"after": sequence})
    assert response.status_code == 200, response.text
    return list(response.json()["messages"])


@contextlib.contextmanager
def worker_of(stack: ChatStack) -> Iterator[Child]:
    """A worker process for one test, stopped (SIGTERM) at its end, however it ends."""
    worker = stack.start_worker()
    try:
        yield worker
    finally:
        worker.stop()


def kill_codex_left_on(session_id: str) -> None:
    """Teardown only: SIGKILLs any Codex process still running on the thread."""
    for left in codex_processes_using(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(left.pid, signal.SIGKILL)


# ---- the tests ---------------------------------------------------------------------------------


async def test_a_message_is_answered_by_real_codex_resuming_the_thread(chat_stack: ChatStack) -> None:
    session_id = await chat_stack.new_thread("reply")
    [rollout] = chat_stack.rollouts_of(session_id)
    lines_before = rollout.read_text().splitlines()
    message = "what changed in the parser?"
    with worker_of(chat_stack):
        async with gateway_client(chat_stack) as http:
            project_id = await project_of(http, session_id, chat_stack.logs)
            async with SseClient(chat_stack.gateway, chat_stack.client_token) as sse:
                answer = await send(http, project_id, message)
                task_id = answer["task"]["taskId"]
                await eventually(
                    lambda: sse.result_message(project_id, task_id) is not None,
                    f"the reply event\n{chat_stack.logs()}",
                )
                await eventually(
                    lambda: "completed" in sse.task_statuses(task_id), "the completed task event"
                )
                reply = sse.result_message(project_id, task_id)
                after = await messages_after(http, project_id, answer["message"]["sequence"])

    assert answer["task"]["status"] == "queued"
    assert answer["task"]["codexThreadRef"] == session_id
    assert answer["task"]["deviceId"] == NODE_ID
    statuses = sse.task_statuses(task_id)
    assert statuses[0] == "queued" and statuses[-1] == "completed"
    assert [status for status in ("claimed", "running") if status in statuses] == ["claimed", "running"]
    assert reply is not None
    assert (reply["authorKind"], reply["threadId"]) == ("thread", session_id)
    assert reply["text"] == reply_text(message)
    assert reply["sequence"] == answer["message"]["sequence"] + 1
    assert after == [reply]
    # Resumed, not a new thread: still one session file, grown by this turn, which holds the
    # message and the reply.
    assert chat_stack.rollouts_of(session_id) == [rollout]
    new_lines = rollout.read_text().splitlines()[len(lines_before) :]
    assert new_lines
    assert not any(json.loads(line)["type"] == "session_meta" for line in new_lines)
    turn = "\n".join(new_lines)
    assert json.dumps(message)[1:-1] in turn
    assert json.dumps(reply_text(message))[1:-1] in turn


@dataclass(frozen=True)
class KilledTurn:
    """What a client saw of a turn whose worker was killed with SIGKILL while Codex waited on the
    model: the send's answer, the SSE events, the task and the messages after the user message once
    the task had ended, and the Codex processes of the run still running at that moment."""

    project_id: str
    answer: dict[str, Any]
    sse: SseClient
    task: dict[str, Any]
    after: list[dict[str, Any]]
    codex_left: list[CodexProcess]


async def kill_worker_mid_turn(stack: ChatStack, name: str) -> KilledTurn:
    """Sends a slow turn to a new thread, SIGKILLs the worker once Codex has begun the turn (the
    message is in the thread's session file: Codex is waiting on the model), and waits, through the
    gateway, for the message that ends the task. Any Codex left over is killed afterwards."""
    session_id = await stack.new_thread(name)
    message = f"[[demo:slow={SLOW_TURN_SECONDS:g}]] take your time ({name})"
    [rollout] = stack.rollouts_of(session_id)
    try:
        with worker_of(stack) as worker:
            async with gateway_client(stack) as http:
                project_id = await project_of(http, session_id, stack.logs)
                async with SseClient(stack.gateway, stack.client_token) as sse:
                    answer = await send(http, project_id, message)
                    task_id = answer["task"]["taskId"]
                    await eventually(lambda: "running" in sse.task_statuses(task_id), "the turn to run")
                    await eventually(
                        lambda: json.dumps(message)[1:-1] in rollout.read_text(), "Codex to begin the turn"
                    )
                    assert codex_processes_using(session_id)
                    assert worker.stop(signal.SIGKILL) == -signal.SIGKILL
                    await eventually(
                        lambda: sse.result_message(project_id, task_id) is not None,
                        f"the message ending the task\n{stack.logs()}",
                    )
                    codex_left = codex_processes_using(session_id)
                    task = (await http.get(f"/api/v1/tasks/{task_id}")).json()["task"]
                    after = await messages_after(http, project_id, answer["message"]["sequence"])
    finally:
        kill_codex_left_on(session_id)
    return KilledTurn(project_id, answer, sse, task, after, codex_left)


async def test_a_worker_killed_mid_turn_ends_the_task_failed_with_a_system_message(
    chat_stack: ChatStack,
) -> None:
    killed = await kill_worker_mid_turn(chat_stack, "killed")

    task_id = killed.answer["task"]["taskId"]
    system = killed.sse.result_message(killed.project_id, task_id)
    assert system is not None
    assert (killed.task["status"], killed.task["failureKind"]) == ("failed", "device_lost")
    assert killed.task["resultMessageId"] == system["messageId"]
    assert killed.sse.task_statuses(task_id)[-1] == "failed"
    assert system["authorKind"] == "system"
    assert system["text"].startswith(f"The device {NODE_ID} stopped answering at ")
    assert "it was not run again automatically" in system["text"]
    assert killed.after == [system]


async def test_no_codex_of_a_killed_workers_run_is_left_running(chat_stack: ChatStack) -> None:
    killed = await kill_worker_mid_turn(chat_stack, "orphan")

    assert killed.task["failureKind"] == "device_lost"
    assert killed.codex_left == []


async def test_a_client_waiting_across_a_gateway_restart_gets_the_reply(chat_stack: ChatStack) -> None:
    session_id = await chat_stack.new_thread("restart")
    message = f"[[demo:slow={SLOW_TURN_SECONDS:g}]] survive a restart"
    with worker_of(chat_stack):
        async with gateway_client(chat_stack) as http:
            project_id = await project_of(http, session_id, chat_stack.logs)
            async with SseClient(chat_stack.gateway, chat_stack.client_token) as sse:
                answer = await send(http, project_id, message)
                task_id = answer["task"]["taskId"]
                await eventually(lambda: "running" in sse.task_statuses(task_id), "the turn to run")
                # A graceful stop (uvicorn re-raises the signal once it has shut down).
                assert chat_stack.children["gateway"].stop(signal.SIGTERM) in (0, -signal.SIGTERM)
                await asyncio.wait_for(sse.ended.wait(), 10)
                resume_from = sse.last_id
            assert sse.result_message(project_id, task_id) is None
            await chat_stack.start_service("gateway")
            async with SseClient(chat_stack.gateway, chat_stack.client_token, resume_from) as resumed:
                await eventually(
                    lambda: resumed.result_message(project_id, task_id) is not None,
                    f"the reply after the restart\n{chat_stack.logs()}",
                )
                await eventually(
                    lambda: "completed" in resumed.task_statuses(task_id), "the completed task event"
                )
            after = await messages_after(http, project_id, answer["message"]["sequence"])
            status = await task_status(http, task_id)

    reply = resumed.result_message(project_id, task_id)
    assert reply is not None
    assert (reply["authorKind"], reply["text"]) == ("thread", reply_text(message))
    assert after == [reply]
    # Resumed after the last event seen, nothing seen before is repeated.
    assert all(event.id > resume_from for event in resumed.events if event.type != "stream.opened")
    assert status == "completed"
