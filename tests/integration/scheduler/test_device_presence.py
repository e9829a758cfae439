"""Device presence as the scheduler answers it (ListDevicePresence, for conversations' dispatch
plans), on SQLite and PostgreSQL: a node whose local agent claimed within the presence window is
online with its last sign of life, one not seen since is offline, one never seen is offline with no
time; only service tokens may ask; bad ids are named; a node id names a device only with its owner
(two owners' machines may share a host name). And conversations' adapter over it, which answers
"presence unknown" when the scheduler cannot be asked."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb

from services.conversations.groups.choice import DevicePresence
from services.conversations.groups.presence import GrpcSchedulerPresence
from services.scheduler.tasks.model import TaskSettings
from services.shared.time import from_timestamp
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import running_task_scheduler, task_request

WINDOW = TaskSettings(
    sweep_interval=timedelta(hours=1),
    presence_window=timedelta(seconds=1),
    presence_write_interval=timedelta(0),
)


async def test_a_node_seen_within_the_window_is_online_and_others_offline(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target, WINDOW) as scheduler:
        await scheduler.claim("w1", "n1")
        await scheduler.claim("w2", "n2")
        await asyncio.sleep(1.2)  # n2 stays quiet for longer than the presence window
        await scheduler.claim("w1", "n1")

        answer = await scheduler.stub.ListDevicePresence(
            pb.ListDevicePresenceRequest(owner_id="owner-1", node_ids=["n1", "n2", "n3", "n1"]),
            metadata=scheduler.service(),
        )

        assert [(d.node_id, d.online, d.HasField("last_seen_at")) for d in answer.devices] == [
            ("n1", True, True),
            ("n2", False, True),
            ("n3", False, False),
        ]
        assert answer.presence_window.ToTimedelta() == timedelta(seconds=1)
        assert from_timestamp(answer.devices[0].last_seen_at) > from_timestamp(answer.devices[1].last_seen_at)


async def test_two_owners_with_the_same_node_id_each_see_only_their_own_presence(
    database_target: DatabaseTarget,
) -> None:
    """Enrollment takes any node id: mallory's machine polling as "n1" keeps only mallory's "n1"
    online, never alice's (her queued task still says her device never connected, and expires)."""
    settings = replace(WINDOW, queue_expiry=timedelta(seconds=1.2))
    async with running_task_scheduler(database_target, settings) as scheduler:
        await scheduler.enqueue(task_request("alice-task", node="n1", owner="alice"))
        mallory = scheduler.worker("w1", "n1", owner_id="mallory")

        async def mallory_polls() -> None:
            claim = await scheduler.stub.ClaimTask(
                pb.ClaimTaskRequest(worker_id="w1", node_id="n1", wait_seconds=0), metadata=mallory
            )
            assert claim.task.task_id != "alice-task"

        await mallory_polls()
        await scheduler.enqueue(task_request("mallory-task", thread="thread-m", node="n1", owner="mallory"))

        alice_task = await scheduler.get("alice-task")
        assert not alice_task.HasField("device_last_seen_at")
        assert alice_task.status_detail == "device n1 has not connected yet"
        mallory_task = await scheduler.get("mallory-task")
        assert mallory_task.HasField("device_last_seen_at") and mallory_task.status_detail == ""

        async def online(owner_id: str) -> list[tuple[str, bool, bool]]:
            answer = await scheduler.stub.ListDevicePresence(
                pb.ListDevicePresenceRequest(owner_id=owner_id, node_ids=["n1"]), metadata=scheduler.service()
            )
            return [(d.node_id, d.online, d.HasField("last_seen_at")) for d in answer.devices]

        assert await online("alice") == [("n1", False, False)]
        assert await online("mallory") == [("n1", True, True)]

        await asyncio.sleep(1.3)
        await mallory_polls()
        swept = {task.task_id: task for task in await scheduler.app.tasks.sweep()}
        assert swept["alice-task"].status.value == "expired"
        assert (await scheduler.get("mallory-task")).status == pb.TASK_STATUS_CLAIMED


async def test_only_services_may_ask_and_bad_ids_are_named(database_target: DatabaseTarget) -> None:
    async with running_task_scheduler(database_target, WINDOW) as scheduler:
        for metadata in (scheduler.worker(), scheduler.client()):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await scheduler.stub.ListDevicePresence(
                    pb.ListDevicePresenceRequest(node_ids=["n1"]), metadata=metadata
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await scheduler.stub.ListDevicePresence(
                pb.ListDevicePresenceRequest(node_ids=["", "n\x00"]), metadata=scheduler.service()
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "node_ids" in (
            bad.value.details() or ""
        )


async def test_conversations_adapter_reads_presence_and_says_unknown_when_it_cannot(
    database_target: DatabaseTarget,
) -> None:
    # A window nothing here outlasts, however busy the machine: n1 is online for the whole test.
    wide = replace(WINDOW, presence_window=timedelta(seconds=60))
    async with running_task_scheduler(database_target, wide) as scheduler:
        await scheduler.claim("w1", "n1")
        token = scheduler.authority.issue_service("conversations")
        adapter = GrpcSchedulerPresence("unused", token, channel=scheduler.channel)

        presence = await adapter.presence("owner-1", ["n1", "n9"])
        elsewhere = await adapter.presence("someone-else", ["n1"])
        assert elsewhere.of("n1") == DevicePresence("n1", False, None)

        assert presence.known
        assert presence.of("n1") == DevicePresence("n1", True, presence.devices["n1"].last_seen_at)
        assert presence.devices["n1"].last_seen_at is not None
        assert presence.of("n9") == DevicePresence("n9", False, None)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    unreachable = GrpcSchedulerPresence(address, token, timeout_s=0.5)
    try:
        unknown = await unreachable.presence("owner-1", ["n1"])
    finally:
        await unreachable.close()
    assert not unknown.known and unknown.of("n1") is None
