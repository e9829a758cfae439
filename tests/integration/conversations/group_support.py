"""Helpers of the group chat tests: a group of threads with budgets, device presence as the
scheduler would report it, plan RPCs, and waiting for what the background posts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from boss.conversations.v1 import conversations_pb2 as pb

from services.conversations.groups.choice import DevicePresence, Presence
from tests.integration.conversations.chat_support import messages_of, task_status
from tests.integration.conversations.stack import T0, Stack, budget_payload

STATUS_CHANGED = "task.status_changed"


class ReportedPresence:
    """Device presence as the scheduler answers ListDevicePresence, from `last_seen` (node ->
    last seen; absent: never seen) and the nodes `online`; records every ask."""

    def __init__(self, online: Mapping[str, datetime], offline: Mapping[str, datetime | None]) -> None:
        self.devices = {node: DevicePresence(node, True, seen) for node, seen in online.items()}
        self.devices.update({node: DevicePresence(node, False, seen) for node, seen in offline.items()})
        self.asked: list[list[str]] = []
        self.owners: list[str] = []

    async def presence(self, owner_id: str, node_ids: Sequence[str]) -> Presence:
        self.asked.append(list(node_ids))
        self.owners.append(owner_id)
        return Presence({node: self.devices[node] for node in node_ids if node in self.devices})


async def thread_with_budget(
    stack: Stack,
    thread_id: str,
    pct: float | None,
    level: str = "safe",
    *,
    node_id: str = "node-a",
    version: int = 1,
    **budget: object,
) -> None:
    """Registers a thread (complete metadata) on `node_id` and, unless `pct` is None, publishes its
    budget, captured long before the tests' now (so it counts as idle)."""
    worker = "worker-a" if node_id == "node-a" else f"worker-{node_id}"
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(
            thread_id=thread_id,
            node_id=node_id,
            worker_id=worker,
            codex_folder=f"/home/dev/{thread_id}",
            codex_thread_ref=f"0199-{thread_id}",
            title=thread_id.removeprefix("th-"),
        ),
        metadata=stack.worker(worker, node_id),
    )
    if pct is not None:
        payload = budget_payload(thread_id, pct, level, node_id=node_id, version=version, **budget)
        await stack.budget.publish("thread.context.updated", payload)
        await stack.settle()


async def group_of(stack: Stack, *thread_ids: str, title: str = "Pilot line") -> str:
    """A group project of `thread_ids`; returns its id."""
    created = await stack.stub.CreateGroupProject(
        pb.CreateGroupProjectRequest(title=title, thread_ids=list(thread_ids)), metadata=stack.client()
    )
    return created.project.conversation.project_id


async def confirm(
    stack: Stack, plan_id: str, dropped: Sequence[str] = (), owner: str = "local"
) -> pb.ConfirmDispatchPlanResponse:
    return await stack.stub.ConfirmDispatchPlan(
        pb.ConfirmDispatchPlanRequest(plan_id=plan_id, dropped_target_ids=list(dropped)),
        metadata=stack.client(owner),
    )


async def reject(stack: Stack, plan_id: str, owner: str = "local") -> pb.RejectDispatchPlanResponse:
    return await stack.stub.RejectDispatchPlan(
        pb.RejectDispatchPlanRequest(plan_id=plan_id), metadata=stack.client(owner)
    )


async def get_plan(stack: Stack, plan_id: str, owner: str = "local") -> pb.GetDispatchPlanResponse:
    return await stack.stub.GetDispatchPlan(
        pb.GetDispatchPlanRequest(plan_id=plan_id), metadata=stack.client(owner)
    )


async def report(stack: Stack, task: pb.ChatTask, status: str, second: int, **fields: object) -> None:
    """The scheduler's status change of a task, applied."""
    payload = task_status(task, status, T0 + timedelta(seconds=second), **fields)  # type: ignore[arg-type]
    await stack.scheduler.publish(STATUS_CHANGED, payload)
    await stack.settle()


async def wait_for_message(
    stack: Stack, project_id: str, matches: Callable[[pb.Message], bool], timeout: float = 10.0
) -> pb.Message:
    """The first message of the project that `matches`, once it is there (the background posts
    summaries and expiries)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        listed = await messages_of(stack, project_id)
        found = [message for message in listed if matches(message)]
        if found:
            return found[0]
        if loop.time() > deadline:
            shown = [(message.author_kind, message.text[:80]) for message in listed]
            raise AssertionError(f"no such message in {project_id}: {shown}")
        await asyncio.sleep(0.05)
