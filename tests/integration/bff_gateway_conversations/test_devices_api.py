"""The gateway's device and thread-move routes against a running conversations service (real gRPC,
SQLite and PostgreSQL): a pairing code enrolls one device, the owner lists and revokes it, a thread
moves only to one of its owner's devices, and other owners and other kinds of token get nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb

from tests.conftest import DatabaseTarget
from tests.integration.bff_gateway_conversations.support import RunningGateway, serve_gateway
from tests.integration.conversations.stack import Stack, running_stack

PROBLEM = "application/problem+json"


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[RunningGateway]:
    async with serve_gateway(stack) as running:
        yield running


async def test_a_code_enrolls_one_device_that_its_owner_lists_and_revokes(
    gateway: RunningGateway, stack: Stack
) -> None:
    http = gateway.http
    created = await http.post("/api/v1/devices/pairing-codes", headers=gateway.headers("alice"))
    assert created.status_code == 201
    code = created.json()["pairing_code"]
    enrolled = await stack.stub.EnrollDevice(
        pb.EnrollDeviceRequest(
            pairing_code=code, node_id="laptop", worker_id="worker-laptop", device_name="laptop"
        )
    )
    assert enrolled.device.owner_id == "alice" and enrolled.worker_token

    listed = (await http.get("/api/v1/devices", headers=gateway.headers("alice"))).json()["devices"]
    assert [(d["device_id"], d["node_id"], d["active"]) for d in listed] == [
        (enrolled.device.device_id, "laptop", True)
    ]
    assert (await http.get("/api/v1/devices", headers=gateway.headers("bob"))).json() == {"devices": []}

    path = f"/api/v1/devices/{enrolled.device.device_id}/revoke"
    foreign = await http.post(path, headers=gateway.headers("bob"))
    assert foreign.status_code == 404 and foreign.headers["content-type"].startswith(PROBLEM)
    revoked = await http.post(path, headers=gateway.headers("alice"))
    assert revoked.status_code == 200 and revoked.json()["active"] is False and revoked.json()["revoked_at"]
    # The revoked credential is refused by the service at once.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.RegisterThread(
            pb.RegisterThreadRequest(thread_id="t-1", node_id="laptop", worker_id="worker-laptop"),
            metadata=(("authorization", f"Bearer {enrolled.worker_token}"),),
        )
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

    # Worker and service tokens do not use these routes; no token is 401.
    worker = {"Authorization": f"Bearer {stack.authority.issue_worker('w', 'n')}"}
    service = {"Authorization": f"Bearer {stack.authority.issue_service('x')}"}
    assert (await http.get("/api/v1/devices", headers=worker)).status_code == 403
    assert (await http.post("/api/v1/devices/pairing-codes", headers=service)).status_code == 403
    assert (await http.get("/api/v1/devices")).status_code == 401


async def test_a_thread_moves_only_to_a_device_of_its_owner(gateway: RunningGateway, stack: Stack) -> None:
    http = gateway.http
    for thread_id, node_id in (("th-1", "node-a"), ("th-2", "node-b")):
        await stack.stub.RegisterThread(
            pb.RegisterThreadRequest(thread_id=thread_id, node_id=node_id, worker_id="worker-a"),
            metadata=stack.worker("worker-a", node_id),
        )
    move = "/api/v1/threads/th-1/move"
    moved = await http.post(
        move, headers=gateway.headers(), json={"node_id": "node-b", "worker_id": "worker-a"}
    )
    assert moved.status_code == 200 and moved.json()["node_id"] == "node-b"
    # The old device may no longer register the thread; the new one may.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.stub.RegisterThread(
            pb.RegisterThreadRequest(thread_id="th-1", node_id="node-a", worker_id="worker-a"),
            metadata=stack.worker("worker-a", "node-a"),
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    await stack.stub.RegisterThread(
        pb.RegisterThreadRequest(thread_id="th-1", node_id="node-b", worker_id="worker-a", title="moved"),
        metadata=stack.worker("worker-a", "node-b"),
    )

    unknown = await http.post(move, headers=gateway.headers(), json={"node_id": "nowhere", "worker_id": "w"})
    assert unknown.status_code == 409 and unknown.json()["reason"] == "UNKNOWN_DEVICE"
    foreign = await http.post(
        move, headers=gateway.headers("bob"), json={"node_id": "node-a", "worker_id": "worker-a"}
    )
    assert foreign.status_code == 404
    bad = await http.post(move, headers=gateway.headers(), json={"node_id": "", "worker_id": "worker-a"})
    assert bad.status_code == 422
    page = (await http.get("/api/v1/threads/th-1/context-summary", headers=gateway.headers())).json()
    assert page["node_id"] == "node-b"
