"""worker/registration.py against the running conversations service: a noted thread is registered
once with its metadata and gets its conversation; a token for another node is refused."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from tests.conftest import DatabaseTarget
from tests.integration.conversations.stack import running_stack
from worker.registration import ThreadRegistrar, ThreadToRegister


async def test_noted_thread_is_registered_once_with_metadata(
    database_target: DatabaseTarget, tmp_path: Path
) -> None:
    async with running_stack(database_target, tmp_path) as stack:
        token = stack.authority.issue_worker("worker-a", "node-a")
        registrar = ThreadRegistrar(stack.address, token, worker_id="worker-a", node_id="node-a")
        stop = asyncio.Event()
        task = asyncio.create_task(registrar.run(stop))
        try:
            registrar.note("th-9", codex_folder="/srv/pilot", codex_thread_ref="rollout-th-9.jsonl")
            registrar.note("th-9", codex_folder="/srv/pilot")
            for _ in range(100):
                if "th-9" in registrar.registered:
                    break
                await asyncio.sleep(0.02)
            page = (
                await stack.stub.GetThreadContextBudget(
                    pb.GetThreadContextBudgetRequest(thread_id="th-9"), metadata=stack.client()
                )
            ).thread_context_budget
            assert (page.thread.codex_folder, page.thread.codex_thread_ref, page.thread.title) == (
                "/srv/pilot",
                "rollout-th-9.jsonl",
                "pilot",
            )
            assert list(page.project_ids) == [registrar.registered["th-9"]]
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
            await registrar.close()


async def test_token_of_another_node_is_refused(database_target: DatabaseTarget, tmp_path: Path) -> None:
    async with running_stack(database_target, tmp_path) as stack:
        token = stack.authority.issue_worker("worker-a", "node-b")
        registrar = ThreadRegistrar(stack.address, token, worker_id="worker-a", node_id="node-a")
        try:
            with pytest.raises(Exception) as raised:
                await registrar.register(ThreadToRegister("th-1"))
            assert "node" in str(raised.value)
            registrar.note("th-1")
            assert await registrar.flush() == 0  # dropped, not retried forever
            assert "th-1" not in registrar.registered
        finally:
            await registrar.close()
