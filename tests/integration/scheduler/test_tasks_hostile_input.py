"""The task RPCs called directly on the scheduler's gRPC port by another node's worker, by tokens of
the wrong kind and with malformed input, on SQLite and PostgreSQL: another node's task cannot be
started, heartbeated or finished even with its lease id, a forged lease changes nothing, client and
service tokens cannot act as an agent; ids and texts PostgreSQL cannot store (NUL) or that no id is
(too long, control or bidirectional formatting characters) are INVALID_ARGUMENT naming the field on
both databases; and a `task.requested` holding NUL neither
stalls the creation of every later task nor is lost (it is stored failed, so the conversation gets
its system message)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from grpc_status import rpc_status

from services.shared.errors import field_violations_of, reason_of
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.tasks_harness import TaskScheduler, running_task_scheduler, task_request


async def refused(call: Any) -> tuple[grpc.StatusCode, str | None, list[str]]:
    """Awaits a call that must fail; its code, ErrorInfo reason and violated fields."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    status = rpc_status.from_call(raised.value)
    return (
        raised.value.code(),
        reason_of(status),
        [v.field for v in field_violations_of(status)] if status else [],
    )


async def running_task(running: TaskScheduler, task_id: str = "task-1") -> str:
    """Enqueues, claims and starts `task_id` on n1 as w1; returns its lease id."""
    await running.enqueue(task_request(task_id))
    claim = await running.claim()
    assert claim.task.task_id == task_id
    await running.start(task_id, claim.lease_id)
    return claim.lease_id


async def test_another_node_or_kind_of_token_cannot_drive_a_task_even_with_its_lease(
    database_target: DatabaseTarget,
) -> None:
    async with running_task_scheduler(database_target) as running:
        lease_id = await running_task(running)
        before = await running.get("task-1")

        for call in (
            running.heartbeat("task-1", lease_id, "w2", "n2"),
            running.finish("task-1", lease_id, reply_text="forged reply", worker_id="w2", node_id="n2"),
            running.heartbeat("task-1", "f" * 32),
            running.finish("task-1", "f" * 32, reply_text="forged reply"),
        ):
            code, _reason, _fields = await refused(call)
            assert code in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        for metadata in (running.client("owner-1"), running.service()):
            finish = running.stub.FinishTask(
                pb.FinishTaskRequest(
                    worker_id="w1",
                    node_id="n1",
                    task_id="task-1",
                    lease_id=lease_id,
                    status=pb.TASK_STATUS_COMPLETED,
                    reply_text="forged reply",
                ),
                metadata=metadata,
            )
            assert (await refused(finish))[:2] == (grpc.StatusCode.PERMISSION_DENIED, "WORKER_TOKEN_REQUIRED")
        other_node = running.stub.GetTask(
            pb.GetTaskRequest(task_id="task-1"), metadata=running.worker("w2", "n2")
        )
        assert (await refused(other_node))[:2] == (grpc.StatusCode.NOT_FOUND, "TASK_NOT_FOUND")

        assert await running.get("task-1") == before
        done = await running.finish("task-1", lease_id, reply_text="the real reply")
        assert (done.status, done.reply_text) == (pb.TASK_STATUS_COMPLETED, "the real reply")


async def test_the_lease_fences_the_claiming_worker_not_only_its_node(
    database_target: DatabaseTarget,
) -> None:
    """Another worker token bound to the same node is not the lease's holder: its heartbeat and
    finish are refused even when it presents the lease id."""
    async with running_task_scheduler(database_target) as running:
        lease_id = await running_task(running)
        before = await running.get("task-1")

        for call in (
            running.heartbeat("task-1", lease_id, "w2", "n1"),
            running.finish("task-1", lease_id, reply_text="forged reply", worker_id="w2", node_id="n1"),
        ):
            assert (await refused(call))[0] in (
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        assert await running.get("task-1") == before


@pytest.mark.parametrize(
    ("task_id", "lease_id", "field"),
    [
        ("task-1\x00", "lease", "task_id"),
        ("task-1", "lease\x00", "lease_id"),
        ("t" * 100_000, "lease", "task_id"),
        ("task-1", "l" * 100_000, "lease_id"),
        ("task-1\x1b", "lease", "task_id"),
        ("task-\u202e1", "lease", "task_id"),
    ],
    ids=["nul-task-id", "nul-lease-id", "huge-task-id", "huge-lease-id", "escape-task-id", "bidi-task-id"],
)
async def test_ids_no_task_or_lease_has_are_invalid_argument_naming_them(
    database_target: DatabaseTarget, task_id: str, lease_id: str, field: str
) -> None:
    """The same answer on both databases (PostgreSQL cannot even compare a NUL), and never an
    echo of a huge id that overflows the error's metadata."""
    async with running_task_scheduler(database_target) as running:
        await running_task(running)
        before = await running.get("task-1")

        for call in (
            running.start(task_id, lease_id),
            running.heartbeat(task_id, lease_id),
            running.finish(task_id, lease_id, reply_text="done"),
        ):
            assert await refused(call) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", [field])
        if field == "task_id":
            lookup = running.stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=running.service())
            assert await refused(lookup) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", [field])
        assert await running.get("task-1") == before


@pytest.mark.parametrize(
    ("field", "value"),
    [("worker_id", "w1\x1b[2J"), ("node_id", "n1\u202e"), ("worker_id", "w1\x85"), ("node_id", "\u2066n1")],
    ids=["escape-worker-id", "bidi-node-id", "c1-worker-id", "isolate-node-id"],
)
async def test_agent_ids_holding_control_or_bidirectional_characters_are_invalid_argument(
    database_target: DatabaseTarget, field: str, value: str
) -> None:
    """Even with a worker token issued for those ids: no task is claimed, started, heartbeated or
    finished under an id the console would show as another (or not at all)."""
    agent = {"worker_id": "w1", "node_id": "n1", field: value}
    worker_id, node_id = agent["worker_id"], agent["node_id"]
    async with running_task_scheduler(database_target) as running:
        lease_id = await running_task(running)
        before = await running.get("task-1")

        for call in (
            running.claim(worker_id, node_id),
            running.start("task-1", lease_id, worker_id, node_id),
            running.heartbeat("task-1", lease_id, worker_id, node_id),
            running.finish("task-1", lease_id, reply_text="done", worker_id=worker_id, node_id=node_id),
        ):
            assert await refused(call) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", [field])
        assert await running.get("task-1") == before


@pytest.mark.parametrize(
    "fields",
    [
        {"status": pb.TASK_STATUS_COMPLETED, "reply_text": "bytes \x00 end"},
        {
            "status": pb.TASK_STATUS_FAILED,
            "failure_kind": pb.FAILURE_KIND_OTHER,
            "status_detail": "codex said \x00",
        },
        {
            "status": pb.TASK_STATUS_FAILED,
            "failure_kind": pb.FAILURE_KIND_OTHER,
            "codex_session_id": "0199\x00",
        },
    ],
    ids=["reply_text", "status_detail", "codex_session_id"],
)
async def test_a_finish_holding_nul_is_invalid_argument_naming_the_field(
    database_target: DatabaseTarget, fields: dict[str, Any]
) -> None:
    async with running_task_scheduler(database_target) as running:
        lease_id = await running_task(running)
        before = await running.get("task-1")
        name = next(key for key, value in fields.items() if isinstance(value, str) and "\x00" in value)

        assert await refused(running.finish("task-1", lease_id, **fields)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            [name],
        )
        assert await running.get("task-1") == before
        assert (
            await running.finish("task-1", lease_id, reply_text="clean")
        ).status == pb.TASK_STATUS_COMPLETED


async def test_a_task_request_holding_nul_is_stored_failed_and_later_requests_are_created(
    database_target: DatabaseTarget,
) -> None:
    """On PostgreSQL the request's NUL made the task insert fail for ever: the consumer retried the
    same batch and no later task of any owner was created."""
    async with running_task_scheduler(database_target) as running:
        sequence = await running.conversations.publish(
            task_request("task-nul", thread="thread-1", text="run \x00 the tests")
        )
        await running.conversations.publish(task_request("task-after", thread="thread-2", owner="owner-2"))
        assert running.app.task_consumer is not None
        await running.app.task_consumer.wait_for(sequence + 1, timeout=10)

        poisoned = await running.get("task-nul")
        assert (poisoned.status, poisoned.failure_kind) == (pb.TASK_STATUS_FAILED, pb.FAILURE_KIND_OTHER)
        assert "instruction_text" in poisoned.status_detail
        assert "\x00" not in poisoned.instruction_text
        assert (await running.get("task-after")).status == pb.TASK_STATUS_QUEUED
