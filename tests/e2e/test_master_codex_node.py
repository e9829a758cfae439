"""The master agent's chat with the master_codex_node backend, end to end as processes on SQLite and
PostgreSQL: every service as `python -m services.<name> serve` (conversations with
BOSS_MASTER_BACKEND=master_codex_node), the demo model (not a real model) as its own process, and a
real worker whose local agent runs the REAL Codex CLI. The master's own thread is a real Codex
thread, registered as the master's (`is_master_main_thread`); a message to
`/api/v1/projects/master-agent/messages` becomes a task for that thread, `codex exec resume` runs it
with the state prompt, and the master's answer (the demo model answering from the state the prompt
carried) comes back as the master's message, true to the other thread's reported budget."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Iterator

import grpc
import httpx
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc

from services.shared.auth import TokenAuthority, bearer_metadata
from tests.e2e.test_chat_end_to_end import (
    NODE_ID,
    SECRET,
    WORKER_ID,
    ChatStack,
    eventually,
    gateway_client,
    kill_codex_left_on,
    own_postgres_database,
    project_of,
    start_stack,
    worker_of,
)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def master_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChatStack]:
    """The whole stack with the master agent in its own Codex thread."""
    root = tmp_path_factory.mktemp(f"master-{request.param}")
    with contextlib.ExitStack() as cleanup:
        database_url = None
        if request.param == "postgresql":
            if os.environ.get("BOSS_TEST_SKIP_POSTGRES") == "1":
                pytest.skip("BOSS_TEST_SKIP_POSTGRES=1")
            database_url = cleanup.enter_context(own_postgres_database())
        stack = asyncio.run(
            start_stack(root, database_url, lambda _addresses: {"BOSS_MASTER_BACKEND": "master_codex_node"})
        )
        try:
            yield stack
        finally:
            stack.stop()


async def register_as_master(stack: ChatStack, session_id: str, folder: str) -> None:
    """Registers the thread as the master's main thread, as its worker would (worker token)."""
    token = TokenAuthority(SECRET).issue_worker(WORKER_ID, NODE_ID)
    async with grpc.aio.insecure_channel(stack.addresses["conversations"]) as channel:
        await conversations_pb2_grpc.ConversationsServiceStub(channel).RegisterThread(
            pb.RegisterThreadRequest(
                thread_id=session_id,
                node_id=NODE_ID,
                worker_id=WORKER_ID,
                codex_folder=folder,
                codex_thread_ref=session_id,
                title="master agent",
                is_master_main_thread=True,
            ),
            metadata=bearer_metadata(token),
        )


async def budget_percent(http: httpx.AsyncClient, session_id: str) -> int:
    """The thread's reported budget, rounded down as every ring shows it."""
    found: dict[str, float] = {}

    async def reported() -> bool:
        page = await http.get(f"/api/v1/threads/{session_id}/context-budget")
        if page.status_code == 200:
            found["pct"] = page.json()["context_budget_remaining_pct"]
        return "pct" in found

    await eventually(reported, f"the budget of {session_id}")
    return math.floor(found["pct"])


async def test_a_master_message_runs_in_the_masters_own_codex_thread(master_stack: ChatStack) -> None:
    master_session = await master_stack.new_thread("master")
    parser_session = await master_stack.new_thread("parser-e2e")
    [rollout] = master_stack.rollouts_of(master_session)
    lines_before = len(rollout.read_text().splitlines())
    try:
        with worker_of(master_stack):
            async with gateway_client(master_stack) as http:
                await project_of(http, master_session)
                await project_of(http, parser_session)
                percent = await budget_percent(http, parser_session)
                folder = str(master_stack.root / "workspaces" / "master")
                await register_as_master(master_stack, master_session, folder)

                question = "What is parser-e2e doing?"
                sent = await http.post(
                    "/api/v1/projects/master-agent/messages",
                    json={"text": question, "client_message_id": "e2e-master-1"},
                )
                assert sent.status_code == 201, sent.text
                answer = sent.json()
                assert answer["masterReply"] is None
                task = answer["task"]
                assert (task["targetThreadId"], task["codexThreadRef"], task["deviceId"]) == (
                    master_session,
                    master_session,
                    NODE_ID,
                )
                replies: list[dict[str, object]] = []

                async def replied() -> bool:
                    listed = (await http.get("/api/v1/projects/master-agent/messages")).json()["messages"]
                    replies[:] = [
                        m for m in listed if m["taskId"] == task["taskId"] and m["authorKind"] != "user"
                    ]
                    return bool(replies)

                await eventually(replied, f"the master's reply\n{master_stack.logs()}", timeout=60)
                [reply] = replies
                assert reply["authorKind"] == "master", reply
                assert reply["threadId"] == master_session
                text = str(reply["text"])
                assert text.startswith("Demo model (not a real model), answering from Boss's state")
                assert (
                    f'"parser-e2e" ({parser_session}) on {NODE_ID} has {percent} % of its context budget left'
                    in text
                )
                finished = (await http.get(f"/api/v1/tasks/{task['taskId']}")).json()["task"]
                assert finished["status"] == "completed"
    finally:
        kill_codex_left_on(master_session)

    # A real turn of the master's thread: Codex appended the instruction (with the state) to it.
    grown = rollout.read_text()
    assert len(grown.splitlines()) > lines_before
    assert "[boss:master_chat]" in grown and "What is parser-e2e doing?" in grown
