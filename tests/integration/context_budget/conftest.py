"""Fixtures: a real context_budget server in-process on 127.0.0.1:0 over each database backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import grpc
import pytest
from boss.context_budget.v1 import context_budget_pb2_grpc as pb_grpc

from services.context_budget.server import ContextBudgetService, build_service
from services.shared.config import ServiceSettings
from tests.conftest import DatabaseTarget
from tests.integration.context_budget.support import NODE_ID, WORKER_ID

SECRET = "context-budget-integration-secret-0123456789"
OWNER_ID = "owner-1"


@dataclass
class Tokens:
    """Bearer tokens of every kind the tests need."""

    worker: str
    other_worker: str
    client: str
    admin: str
    expired: str
    forged: str


@pytest.fixture
async def service(database_target: DatabaseTarget) -> AsyncIterator[ContextBudgetService]:
    """A started context_budget service with a migrated, empty database."""
    settings = ServiceSettings(
        service="context_budget",
        database_url=database_target.url,
        listen="127.0.0.1:0",
        migrate_on_start=True,
        auth_secret=SECRET,
    )
    started = build_service(settings, schema=database_target.schema or "context_budget")
    await started.start()
    try:
        yield started
    finally:
        await started.stop(grace=0.2)


@pytest.fixture
async def stub(service: ContextBudgetService) -> AsyncIterator[pb_grpc.ContextBudgetServiceStub]:
    """A client stub on a channel to the service."""
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield pb_grpc.ContextBudgetServiceStub(channel)


@pytest.fixture
def tokens(service: ContextBudgetService) -> Tokens:
    """Tokens signed with the service's secret (and one forged with another)."""
    from services.shared.auth import TokenAuthority

    authority = service.authority
    return Tokens(
        worker=authority.issue_worker(WORKER_ID, NODE_ID, owner_id=OWNER_ID),
        other_worker=authority.issue_worker("worker-win-02", "win-02", owner_id=OWNER_ID),
        client=authority.issue_client(OWNER_ID),
        admin=authority.issue_service("scheduler"),
        expired=authority.issue_worker(WORKER_ID, NODE_ID, lifetime=timedelta(seconds=-10)),
        forged=TokenAuthority("some-other-secret-0123456789abcdefghij").issue_worker(WORKER_ID, NODE_ID),
    )
