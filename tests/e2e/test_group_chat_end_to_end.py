"""Group chat (CHAT-4), end to end, as processes: context_budget, scheduler, conversations and the
gateway as `python -m services.<name> serve`, Boss's built-in demo model (not a real model) serving
both Codex (the Responses API) and the master agent (Chat Completions, `BOSS_MASTER_BACKEND=
openai_api`), and a real worker whose local agent runs the REAL Codex CLI. Two real Codex threads,
created beforehand by `codex exec` in folders of their own, are registered and report their budgets
as any person's threads would.

Through the gateway only: the two threads form a group; a message into it answers a dispatch plan
whose instructions the master model drafted, one per thread with its reason and budget; the plan
waits (the project detail shows it); confirming it runs one dispatch_execution task per thread
through `codex exec resume`; each thread's raw reply comes back into the group named by its thread
(the demo model's exact reply to the drafted instruction), the gate moves executing k of N ->
summarising -> open, and the master agent posts its summary; both session files grew by the turn.
Parametrised over SQLite and PostgreSQL (a database of its own per run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from demo_model import reply_text
from tests.e2e.test_chat_end_to_end import (
    ChatStack,
    SseClient,
    eventually,
    gateway_client,
    own_postgres_database,
    project_of,
    start_stack,
    worker_of,
)


def master_on_demo_model(addresses: dict[str, str]) -> dict[str, str]:
    """The master agent on the demo model's Chat Completions, and quick plan expiry checks."""
    return {
        "BOSS_MASTER_BACKEND": "openai_api",
        "BOSS_MASTER_OPENAI_BASE_URL": f"http://{addresses['demo_model']}/v1",
        "BOSS_MASTER_MODEL": "boss-demo-model",
        "BOSS_DISPATCH_EXPIRY_CHECK_SECONDS": "1",
    }


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def group_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChatStack]:
    """The whole stack, with the master agent on the demo model, on SQLite or PostgreSQL."""
    root = tmp_path_factory.mktemp(f"group-{request.param}")
    with contextlib.ExitStack() as cleanup:
        database_url = None
        if request.param == "postgresql":
            if os.environ.get("BOSS_TEST_SKIP_POSTGRES") == "1":
                pytest.skip("BOSS_TEST_SKIP_POSTGRES=1")
            database_url = cleanup.enter_context(own_postgres_database())
        stack = asyncio.run(start_stack(root, database_url, master_on_demo_model))
        try:
            yield stack
        finally:
            stack.stop()


async def reported_group(http: httpx.AsyncClient, thread_ids: list[str]) -> str:
    """A group of `thread_ids` once every one of them has reported its budget; returns its id."""
    created = await http.post("/api/v1/projects", json={"project_title": "Release", "thread_ids": thread_ids})
    assert created.status_code == 201, created.text
    group = str(created.json()["project_id"])

    async def all_reported() -> bool:
        detail = (await http.get(f"/api/v1/projects/{group}")).json()
        return sorted(t["thread_id"] for t in detail["active_thread_contexts"] if t["reported"]) == sorted(
            thread_ids
        )

    await eventually(all_reported, "both threads' budgets")
    return group


def plan_events(sse: SseClient, plan_id: str) -> list[dict[str, Any]]:
    return [
        event.data
        for event in sse.events
        if event.type == "dispatch_plan.updated" and event.data["dispatchPlan"]["planId"] == plan_id
    ]


async def test_a_group_message_runs_on_both_threads_through_real_codex_and_is_summarised(
    group_stack: ChatStack,
) -> None:
    north = await group_stack.new_thread("north")
    south = await group_stack.new_thread("south")
    rollouts = {session: group_stack.rollouts_of(session) for session in (north, south)}
    before = {session: len(paths[0].read_text().splitlines()) for session, paths in rollouts.items()}
    message = "write the release notes for your part"
    with worker_of(group_stack):
        async with gateway_client(group_stack) as http:
            for session in (north, south):
                await project_of(http, session)
            group = await reported_group(http, [north, south])
            async with SseClient(group_stack.gateway, group_stack.client_token) as sse:
                sent = await http.post(
                    f"/api/v1/projects/{group}/messages", json={"text": message, "client_message_id": "g-1"}
                )
                assert sent.status_code == 201, sent.text
                plan = sent.json()["dispatchPlan"]
                waiting = (await http.get(f"/api/v1/projects/{group}")).json()
                confirmed = await http.post(f"/api/v1/dispatch-plans/{plan['planId']}/confirm")
                assert confirmed.status_code == 200, confirmed.text

                def summarised() -> bool:
                    return any(
                        m["authorKind"] == "master" and "summarising" in m["text"]
                        for m in sse.messages_created(group)
                    )

                await eventually(summarised, f"the master agent's summary\n{group_stack.logs()}", timeout=90)
                final = (await http.get(f"/api/v1/dispatch-plans/{plan['planId']}")).json()
                listed = (await http.get(f"/api/v1/projects/{group}/messages")).json()

    assert plan["status"] == "proposed" and plan["draftedBy"] == "master_model"
    assert sorted(t["threadId"] for t in plan["targets"]) == sorted([north, south])
    for target in plan["targets"]:
        assert (
            target["instruction"]
            == f"{message}\n\n(Demo model (not a real model) drafted this for {target['threadTitle']}.)"
        )
        assert target["level"] in ("safe", "watch") and target["remainingPct"] is not None
        assert target["reason"].startswith(target["level"])
        assert "presence unknown" not in target["reason"]  # the scheduler answered the device's presence
    assert sent.json()["collaborationGate"]["state"] == "awaiting_confirmation"
    assert waiting["pending_dispatch_plan"]["planId"] == plan["planId"]

    tasks = confirmed.json()["tasks"]
    assert [t["taskType"] for t in tasks] == ["dispatch_execution", "dispatch_execution"]
    by_thread = {t["threadId"]: t for t in plan["targets"]}
    replies = [m for m in listed["messages"] if m["authorKind"] == "thread"]
    said = [(m["authorKind"], m["text"][:300]) for m in listed["messages"]]
    assert sorted(m["threadId"] for m in replies) == sorted([north, south]), said
    for reply in replies:
        assert reply["text"] == reply_text(by_thread[reply["threadId"]]["instruction"])
    summary = listed["messages"][-1]
    assert summary["authorKind"] == "master" and summary["text"].startswith(
        "Demo model (not a real model), summarising: 2 of 2 threads answered."
    )
    assert final["dispatchPlan"]["summaryStatus"] == "posted"
    assert final["dispatchPlan"]["summaryMessageId"] == summary["messageId"]
    assert [t["taskStatus"] for t in final["dispatchPlan"]["targets"]] == ["completed", "completed"]
    assert final["collaborationGate"]["state"] == "open"

    gates = [event["collaborationGate"] for event in plan_events(sse, plan["planId"])]
    states = [gate["state"] for gate in gates]
    assert states[0] == "awaiting_confirmation" and states[-1] == "open"
    assert "executing" in states and "summarising" in states
    assert [gate["tasksDone"] for gate in gates if gate["state"] == "executing"][-1] == 1
    # Resumed, not new threads: one session file each, grown by the dispatched turn.
    for session, paths in rollouts.items():
        assert group_stack.rollouts_of(session) == paths
        assert len(paths[0].read_text().splitlines()) > before[session]
