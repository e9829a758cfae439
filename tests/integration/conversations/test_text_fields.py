"""Text fields that reach storage, on SQLite and PostgreSQL alike: a thread's title, Codex folder and
Codex thread reference at RegisterThread, and a project's title at CreateGroupProject and
RenameProject. A control character (NUL, which PostgreSQL text cannot hold, ESC, C1), a
bidirectional override in a title or reference, or an over-long value is INVALID_ARGUMENT naming the
field, never INTERNAL, and nothing is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from boss.conversations.v1 import conversations_pb2 as pb
from grpc_status import rpc_status

from services.shared.errors import field_violations_of
from tests.conftest import DatabaseTarget
from tests.integration.conversations.stack import Stack, running_stack

BAD_TITLES = {
    "NUL": "North\x00line",
    "ESC": "North \x1b[31mline",
    "C1": "North\x85line",
    "bidi override": "North \u202eenil",
    "too long": "t" * 201,
}


@pytest.fixture
async def stack(database_target: DatabaseTarget, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_stack(database_target, tmp_path) as running:
        yield running


async def refused_fields(call: object) -> list[str]:
    """Awaits a call that must fail with INVALID_ARGUMENT; the fields its violations name."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    status = rpc_status.from_call(raised.value)
    assert status is not None
    return [violation.field for violation in field_violations_of(status)]


def registration(thread_id: str, **fields: str) -> pb.RegisterThreadRequest:
    values = {"codex_folder": f"/home/dev/{thread_id}", "codex_thread_ref": f"ref-{thread_id}", **fields}
    return pb.RegisterThreadRequest(thread_id=thread_id, node_id="node-a", worker_id="worker-a", **values)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *(("title", value) for value in BAD_TITLES.values()),
        ("codex_folder", "/home/dev/north\x00line"),
        ("codex_folder", "/home/dev/\x1b[2J"),
        ("codex_folder", "/" + "f" * 4096),
        ("codex_thread_ref", "ref\x00"),
        ("codex_thread_ref", "ref\u202e"),
        ("codex_thread_ref", "r" * 100_000),
    ],
    ids=[*BAD_TITLES, "folder NUL", "folder ESC", "folder too long", "ref NUL", "ref bidi", "ref too long"],
)
async def test_registration_refuses_a_bad_text_field_by_name(stack: Stack, field: str, value: str) -> None:
    fields = await refused_fields(
        stack.stub.RegisterThread(registration("th-bad", **{field: value}), metadata=stack.worker())
    )
    assert fields == [field]
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await stack.stub.GetThreadContextBudget(
            pb.GetThreadContextBudgetRequest(thread_id="th-bad"), metadata=stack.client()
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_registration_takes_text_fields_at_their_limits(stack: Stack) -> None:
    folder = "/" + "é" * 4095
    registered = await stack.stub.RegisterThread(
        registration(
            "th-ok", title="Ünïcode ✓ " + "t" * 190, codex_folder=folder, codex_thread_ref="r" * 200
        ),
        metadata=stack.worker(),
    )
    assert (registered.thread.codex_folder, registered.thread.codex_thread_ref) == (folder, "r" * 200)


@pytest.mark.parametrize("title", BAD_TITLES.values(), ids=BAD_TITLES.keys())
async def test_project_titles_refuse_control_and_bidi_characters_by_name(stack: Stack, title: str) -> None:
    first = await stack.stub.RegisterThread(registration("th-1", title="North"), metadata=stack.worker())
    await stack.stub.RegisterThread(registration("th-2"), metadata=stack.worker())
    created = stack.stub.CreateGroupProject(
        pb.CreateGroupProjectRequest(title=title, thread_ids=["th-1", "th-2"]), metadata=stack.client()
    )
    assert await refused_fields(created) == ["title"]
    renamed = stack.stub.RenameProject(
        pb.RenameProjectRequest(project_id=first.project_id, title=title), metadata=stack.client()
    )
    assert await refused_fields(renamed) == ["title"]
    project = await stack.stub.GetProject(
        pb.GetProjectRequest(project_id=first.project_id), metadata=stack.client()
    )
    assert project.project.conversation.project_title == "North"
