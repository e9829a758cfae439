"""Helpers for the context_budget integration tests: snapshots, tokens, error details, row counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import grpc
from boss.context_budget.v1 import context_budget_pb2 as pb
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc
from google.rpc import status_pb2
from grpc_status import rpc_status
from sqlalchemy import Table, func, select

from services.context_budget.server import ContextBudgetService
from services.shared.auth import bearer_metadata
from services.shared.errors import field_violations_of
from services.shared.time import utc_now

WORKER_ID = "worker-mac-01"
NODE_ID = "mac-01"
# Readings without an explicit captured_at are taken this long ago plus their version in seconds:
# one instant for the whole run, so a snapshot built twice is the same reading (a true repeat).
BASE_CAPTURED_AT = utc_now() - timedelta(hours=1)


def snapshot(
    thread_id: str = "thread-abc",
    pct: float = 80.0,
    *,
    version: int = 1,
    captured_at: datetime | None = None,
    worker_id: str = WORKER_ID,
    node_id: str = NODE_ID,
    project_id: str = "proj-001",
    **fields: Any,
) -> pb.ThreadContextSnapshot:
    """A valid snapshot (source worker_estimator) with `fields` set on top. Without `captured_at`
    it was captured at BASE_CAPTURED_AT plus `version` seconds, so higher versions are newer
    readings and the same arguments make the same reading."""
    fields.setdefault("source_kind", pb.SOURCE_KIND_WORKER_ESTIMATOR)
    message = pb.ThreadContextSnapshot(
        thread_id=thread_id,
        node_id=node_id,
        worker_id=worker_id,
        project_id=project_id,
        context_budget_remaining_pct=pct,
        snapshot_version=version,
        **fields,
    )
    if not message.HasField("captured_at"):
        default = BASE_CAPTURED_AT + timedelta(seconds=version)
        message.captured_at.FromDatetime(captured_at or default)
    return message


def auth(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata with a bearer token."""
    return bearer_metadata(token)


async def report(
    stub: pb_grpc.ContextBudgetServiceStub, token: str, message: pb.ThreadContextSnapshot
) -> pb.ThreadContextAck:
    """ReportThreadContext; returns the ack."""
    response = await stub.ReportThreadContext(
        pb.ReportThreadContextRequest(snapshot=message), metadata=auth(token)
    )
    return response.ack


async def rpc_failure(call: Any) -> tuple[grpc.StatusCode, status_pb2.Status | None]:
    """Awaits a unary call that must fail; returns its code and rich status (None without details)."""
    try:
        await call
    except grpc.aio.AioRpcError:
        pass
    else:
        raise AssertionError("the call succeeded")
    return await call.code(), await rpc_status.aio.from_call(call)


def violation_fields(status: status_pb2.Status | None) -> list[str]:
    """The BadRequest field paths of a rich status."""
    assert status is not None, "no google.rpc.Status details"
    return [violation.field for violation in field_violations_of(status)]


async def count_rows(service: ContextBudgetService, table: Table, **equal: Any) -> int:
    """Rows of `table` (optionally where column == value)."""
    query = select(func.count()).select_from(table)
    for name, value in equal.items():
        query = query.where(table.c[name] == value)
    async with service.database.read() as connection:
        return int((await connection.execute(query)).scalar_one())


async def read_events(
    stub: pb_grpc.ContextBudgetServiceStub,
    token: str,
    after_sequence: int,
    count: int,
    types: Sequence[str] = (),
    timeout: float = 10.0,
) -> list[tuple[int, str, dict[str, Any]]]:
    """Reads exactly `count` events from WatchEvents after `after_sequence`, then cancels the stream."""
    call = stub.WatchEvents(
        pb.WatchEventsRequest(after_sequence=after_sequence, types=list(types)), metadata=auth(token)
    )
    events: list[tuple[int, str, dict[str, Any]]] = []

    async def collect() -> None:
        async for response in call:
            assert response.events, "a WatchEvents response is never empty"
            for event in response.events:
                events.append((event.sequence, event.type, json.loads(event.payload_json)))
            if len(events) >= count:
                del events[count:]
                return

    try:
        await asyncio.wait_for(collect(), timeout)
    finally:
        call.cancel()
    return events
