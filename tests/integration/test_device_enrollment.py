"""Enrollment by pairing code and revocation, through the three real services (SQLite, PostgreSQL):
`python -m worker enroll CODE` stores an owner-only credential; the enrolled device reports and
registers only its own threads; once its owner revokes it, every service refuses it and its open
ingest stream, command stream and claim end, also after context_budget restarts."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2 as cb_pb
from boss.context_budget.v1 import context_budget_pb2_grpc as cb_grpc
from boss.conversations.v1 import conversations_pb2 as conv_pb
from boss.conversations.v1 import conversations_pb2_grpc as conv_grpc
from boss.scheduler.v1 import scheduler_pb2 as sched_pb
from grpc_status import rpc_status

from services.context_budget.server import build_service
from services.conversations.devices import MAX_FAILED_ATTEMPTS
from services.shared.auth import bearer_metadata
from services.shared.config import ServiceSettings
from tests.conftest import DatabaseTarget
from tests.integration.test_trust_boundaries import OWNER_A, Caller, World
from tests.integration.trust_stack import SECRET, TrustStack, free_port, running_trust_stack
from worker.__main__ import build_parser, enroll_node
from worker.enrollment import read_credential
from worker.settings import settings_from_arguments


def reason_of(status: object) -> str:
    """The ErrorInfo reason of a google.rpc.Status."""
    from google.rpc import error_details_pb2

    for detail in status.details:  # type: ignore[attr-defined]
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    return ""


async def failure_reason(call: object) -> tuple[grpc.StatusCode, str]:
    """Awaits a call that must fail; its code and ErrorInfo reason."""
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as error:
        status = await rpc_status.aio.from_call(call)  # type: ignore[arg-type]
        return error.code(), reason_of(status) if status else ""
    raise AssertionError("the call succeeded")


async def ended(call: Any) -> None:
    """Reads a stream until it ends; returns only when it ended without an error."""
    while await call.read() is not grpc.aio.EOF:
        pass


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[TrustStack]:
    async with running_trust_stack(database_target, tmp_path) as running:
        yield running


async def test_an_enrolled_device_reports_only_its_own_threads_and_loses_access_when_revoked(
    stack: TrustStack, tmp_path: Path
) -> None:
    client_a = stack.client(OWNER_A)
    code = await stack.conversations.CreatePairingCode(conv_pb.CreatePairingCodeRequest(), metadata=client_a)
    assert len(code.pairing_code) == 9 and code.pairing_code[4] == "-"

    # `python -m worker enroll CODE` on the node: an owner-only credential file.
    credential_file = tmp_path / "node" / "worker-credential.json"
    arguments = build_parser().parse_args(
        [
            "enroll",
            code.pairing_code.lower(),
            "--node-id",
            "laptop",
            "--worker-id",
            "worker-laptop",
            "--conversations-address",
            stack.addresses["conversations"],
            "--credential-file",
            str(credential_file),
        ]
    )
    assert await enroll_node(arguments) == 0
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(credential_file.parent.stat().st_mode) == 0o700
    credential = read_credential(credential_file)
    assert credential is not None and credential.owner_id == OWNER_A and credential.node_id == "laptop"
    # The code worked once.
    assert await enroll_node(arguments) == 1

    # `python -m worker run` takes the node, the worker and the token from the credential.
    codex_home = tmp_path / "codex"
    (codex_home / "sessions").mkdir(parents=True)
    settings = settings_from_arguments(
        codex_home=codex_home,
        worker_id=None,
        node_id=None,
        context_budget_address=None,
        token=None,
        poll_interval_s=1.0,
        once=False,
        local_agent=False,
        environ={"BOSS_WORKER_CREDENTIAL": str(credential_file)},
    )
    assert (settings.worker_id, settings.node_id, settings.token) == (
        "worker-laptop",
        "laptop",
        credential.worker_token,
    )
    device = Caller("laptop", "worker", False, bearer_metadata(settings.token), "worker-laptop", "laptop")
    world = World(stack)

    async def report(thread_id: str, caller: Caller = device) -> cb_pb.ThreadContextAck:
        snapshot = world.snapshot(thread_id, 30.0, caller)
        response = await stack.budget.ReportThreadContext(
            cb_pb.ReportThreadContextRequest(snapshot=snapshot), metadata=caller.metadata
        )
        return response.ack

    # Its own threads: yes. Another owner's thread: no.
    assert (await report("laptop-thread")).accepted
    other = Caller(
        "other",
        "worker",
        True,
        bearer_metadata(stack.authority.issue_worker("w-x", "n-x", owner_id="owner-x")),
        "w-x",
        "n-x",
    )
    assert (await report("someone-elses", other)).accepted
    code_of_other, reason = await failure_reason(
        stack.budget.ReportThreadContext(
            cb_pb.ReportThreadContextRequest(snapshot=world.snapshot("someone-elses", 12.5, device)),
            metadata=device.metadata,
        )
    )
    assert (code_of_other, reason) == (grpc.StatusCode.PERMISSION_DENIED, "THREAD_BOUND_TO_OTHER_DEVICE")
    registered = await stack.conversations.RegisterThread(
        conv_pb.RegisterThreadRequest(thread_id="laptop-thread", node_id="laptop", worker_id="worker-laptop"),
        metadata=device.metadata,
    )
    assert registered.thread.owner_id == OWNER_A
    # It may not name another owner.
    refused, reason = await failure_reason(
        stack.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(
                thread_id="laptop-thread-2", node_id="laptop", worker_id="worker-laptop", owner_id="owner-x"
            ),
            metadata=device.metadata,
        )
    )
    assert (refused, reason) == (grpc.StatusCode.PERMISSION_DENIED, "OWNER_MISMATCH")

    # Open calls: the ingest stream, the command stream and a claim's long poll.
    ingest = stack.budget.StreamThreadContext(metadata=device.metadata)
    await ingest.write(
        cb_pb.StreamThreadContextRequest(
            batch_id=1, snapshots=[world.snapshot("laptop-thread", 28.0, device)]
        )
    )
    assert (await ingest.read()).acks[0].accepted
    commands = stack.scheduler.StreamWorkerCommands(
        sched_pb.StreamWorkerCommandsRequest(worker_id="worker-laptop", node_id="laptop"),
        metadata=device.metadata,
    )
    first_command = await asyncio.wait_for(commands.read(), 10)
    assert first_command.command.thread_id == "laptop-thread"
    claim = asyncio.ensure_future(
        stack.scheduler.ClaimTask(
            sched_pb.ClaimTaskRequest(worker_id="worker-laptop", node_id="laptop", wait_seconds=60),
            metadata=device.metadata,
        )
    )

    devices = await stack.conversations.ListDevices(conv_pb.ListDevicesRequest(), metadata=client_a)
    assert [d.device_id for d in devices.devices] == [credential.device_id]
    revoked = await stack.conversations.RevokeDevice(
        conv_pb.RevokeDeviceRequest(device_id=credential.device_id), metadata=client_a
    )
    assert revoked.device.HasField("revoked_at")

    # The open calls end with UNAUTHENTICATED (DEVICE_REVOKED) as soon as the revocation arrives
    # (a stream may first deliver what it had in hand).
    for name, pending in (
        ("ingest stream", ended(ingest)),
        ("command stream", ended(commands)),
        ("claim", claim),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(pending, 10)
        assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED, name
        assert "revoked" in (raised.value.details() or ""), name

    # New calls are refused by every service.
    code_now, reason = await failure_reason(
        stack.conversations.RegisterThread(
            conv_pb.RegisterThreadRequest(
                thread_id="laptop-thread", node_id="laptop", worker_id="worker-laptop"
            ),
            metadata=device.metadata,
        )
    )
    assert (code_now, reason) == (grpc.StatusCode.UNAUTHENTICATED, "DEVICE_REVOKED")
    for refused_call in (
        lambda: stack.budget.ReportThreadContext(
            cb_pb.ReportThreadContextRequest(snapshot=world.snapshot("laptop-thread", 20.0, device)),
            metadata=device.metadata,
        ),
        lambda: stack.scheduler.ClaimTask(
            sched_pb.ClaimTaskRequest(worker_id="worker-laptop", node_id="laptop"), metadata=device.metadata
        ),
    ):
        code_now, reason = await failure_reason(refused_call())
        assert (code_now, reason) == (grpc.StatusCode.UNAUTHENTICATED, "DEVICE_REVOKED")
    listed = await stack.conversations.ListDevices(conv_pb.ListDevicesRequest(), metadata=client_a)
    assert listed.devices[0].HasField("revoked_at")

    # A context_budget started afresh on the same database refuses the device from its first call.
    settings = stack.budget_service.settings
    restarted = build_service(
        ServiceSettings("context_budget", settings.database_url, f"127.0.0.1:{free_port()}", False, SECRET),
        schema=stack.budget_service.schema,
    )
    await restarted.start()
    try:
        async with grpc.aio.insecure_channel(restarted.address) as channel:
            code_now, reason = await failure_reason(
                cb_grpc.ContextBudgetServiceStub(channel).ReportThreadContext(
                    cb_pb.ReportThreadContextRequest(snapshot=world.snapshot("laptop-thread", 20.0, device)),
                    metadata=device.metadata,
                )
            )
        assert (code_now, reason) == (grpc.StatusCode.UNAUTHENTICATED, "DEVICE_REVOKED")
    finally:
        await restarted.stop(grace=0.1)


async def test_a_wrong_or_used_code_enrolls_nothing_and_guessing_is_cut_off(stack: TrustStack) -> None:
    code = await stack.conversations.CreatePairingCode(
        conv_pb.CreatePairingCodeRequest(), metadata=stack.client(OWNER_A)
    )
    request = conv_pb.EnrollDeviceRequest(pairing_code=code.pairing_code, node_id="n1", worker_id="w1")
    await stack.conversations.EnrollDevice(request)
    used, reason = await failure_reason(stack.conversations.EnrollDevice(request))
    unknown, unknown_reason = await failure_reason(
        stack.conversations.EnrollDevice(
            conv_pb.EnrollDeviceRequest(pairing_code="ZZZZ-ZZZZ", node_id="n2", worker_id="w2")
        )
    )
    assert (
        (used, reason)
        == (unknown, unknown_reason)
        == (grpc.StatusCode.PERMISSION_DENIED, "PAIRING_CODE_INVALID")
    )
    # The same node and worker enrolled again for the same owner is refused while the first is active.
    again = await stack.conversations.CreatePairingCode(
        conv_pb.CreatePairingCodeRequest(), metadata=stack.client(OWNER_A)
    )
    twice, reason = await failure_reason(
        stack.conversations.EnrollDevice(
            conv_pb.EnrollDeviceRequest(pairing_code=again.pairing_code, node_id="n1", worker_id="w1")
        )
    )
    assert (twice, reason) == (grpc.StatusCode.ALREADY_EXISTS, "DEVICE_ALREADY_ENROLLED")
    # 8 more wrong codes from this peer make 10: the next attempt is cut off, even with a good code.
    for _ in range(8):
        await failure_reason(
            stack.conversations.EnrollDevice(
                conv_pb.EnrollDeviceRequest(pairing_code="ZZZZ-ZZZY", node_id="n3", worker_id="w3")
            )
        )
    good = await stack.conversations.CreatePairingCode(
        conv_pb.CreatePairingCodeRequest(), metadata=stack.client(OWNER_A)
    )
    cut_off, reason = await failure_reason(
        stack.conversations.EnrollDevice(
            conv_pb.EnrollDeviceRequest(pairing_code=good.pairing_code, node_id="n4", worker_id="w4")
        )
    )
    assert (cut_off, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "PAIRING_ATTEMPTS_EXCEEDED")
    devices = await stack.conversations.ListDevices(
        conv_pb.ListDevicesRequest(), metadata=stack.client(OWNER_A)
    )
    assert [d.node_id for d in devices.devices] == ["n1"]


async def test_guessing_on_a_new_connection_each_time_is_cut_off_after_ten_wrong_codes(
    stack: TrustStack,
) -> None:
    async def guess(code: str) -> tuple[grpc.StatusCode, str]:
        # A local subchannel pool: a new TCP connection (a new source port), not the process's shared one.
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(stack.addresses["conversations"], options) as channel:
            return await failure_reason(
                conv_grpc.ConversationsServiceStub(channel).EnrollDevice(
                    conv_pb.EnrollDeviceRequest(pairing_code=code, node_id="n1", worker_id="w1")
                )
            )

    answers = [await guess(f"ZZZZ-ZZ{index:02d}") for index in range(MAX_FAILED_ATTEMPTS + 2)]
    wrong = (grpc.StatusCode.PERMISSION_DENIED, "PAIRING_CODE_INVALID")
    cut_off = (grpc.StatusCode.RESOURCE_EXHAUSTED, "PAIRING_ATTEMPTS_EXCEEDED")
    assert answers == [wrong] * MAX_FAILED_ATTEMPTS + [cut_off] * 2
