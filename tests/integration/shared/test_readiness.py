"""Readiness follows the database: while the check fails the business service reports NOT_SERVING
(readiness probes stop traffic) but the whole server stays SERVING (liveness does not restart it)."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from services.shared.db import Database
from services.shared.grpc_server import watch_readiness
from tests.conftest import DatabaseTarget

SERVICE = "boss.test.v1.TestService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def status_of(health: health_aio.HealthServicer, name: str) -> int:
    response = await health.Check(health_pb2.HealthCheckRequest(service=name), context=None)
    return int(response.status)


async def test_business_service_goes_not_serving_while_the_check_fails_and_recovers() -> None:
    health = health_aio.HealthServicer()
    for name in ("", SERVICE):
        await health.set(name, SERVING)
    database_up = True

    async def check() -> None:
        if not database_up:
            raise ConnectionError("database unreachable")

    watcher = asyncio.create_task(watch_readiness(health, check, [SERVICE], interval=0.02))
    try:
        await asyncio.sleep(0.05)
        assert await status_of(health, SERVICE) == SERVING
        database_up = False
        await asyncio.sleep(0.1)
        assert await status_of(health, SERVICE) == NOT_SERVING
        assert await status_of(health, "") == SERVING
        database_up = True
        await asyncio.sleep(0.1)
        assert await status_of(health, SERVICE) == SERVING
    finally:
        watcher.cancel()


async def test_ping_reaches_a_real_database_and_fails_for_a_dead_one(database_target: DatabaseTarget) -> None:
    database = Database.connect(database_target.url, database_target.schema or "unused")
    try:
        await database.ping()
    finally:
        await database.dispose()
    if database_target.backend == "postgresql":
        dead = Database.connect("postgresql+psycopg://postgres@127.0.0.1:1/test", "unused")
        try:
            try:
                await dead.ping()
            except Exception as error:
                assert "127.0.0.1" in str(error) or "connect" in str(error).lower()
            else:
                raise AssertionError("ping of a closed port succeeded")
        finally:
            await dead.dispose()
