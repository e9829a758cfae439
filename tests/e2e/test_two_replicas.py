"""Two replicas of every service against one PostgreSQL database, under a steady load of workers'
reports, one replica of each killed (SIGKILL) midway.

context_budget A and B share their schema: the reporters send to both (thread-n to one of them) and
switch to the other replica when theirs stops answering, as a worker behind a Service would. The
scheduler and conversations replicas follow context_budget's stream, and each other's, through one
gRPC target naming both replicas of the upstream (the outbox is one, whichever replica serves it;
the target fails over as a Service would), into one shared cursor per stream: while both run they
share the batches (a batch applied by the other replica meanwhile is detected and applied once:
`EventConsumer.apply`), and the survivor carries on alone once its peer is killed.

Two gateways each serve a person's SSE stream; the killed one's client is cut off (it would
reconnect to the other behind a Service), the other's keeps seeing the rings move.

Checked: every acknowledged report is stored exactly once; the scheduler and conversations end on
every thread's very last reading and on the stream's last event; no log holds a traceback or a
PostgreSQL deadlock. The counts are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path

import grpc
import httpx
import pytest

from services.shared.auth import TokenAuthority
from tests.e2e.test_service_lifecycle import (
    EXPECTED_FAILURES,
    OWNER,
    SECRET,
    SENDERS,
    Database,
    ReportLoad,
    ServiceProcess,
    database,
    gateway_ready,
    grow,
    latest_versions,
    serving,
)

pytestmark = pytest.mark.postgres
__all__ = ["database"]  # the fixture, used by name

CONSUMERS = {
    "scheduler": ("scheduler.scheduled_threads", "context_budget"),
    "conversations": ("conversations.threads", "context_budget"),
}
"""For each following service: where it keeps each thread's last reading, and the stream it follows."""


class SpreadReportLoad(ReportLoad):
    """Workers' reports spread over the replicas at `addresses`; a sender whose replica stops
    answering sends its next report to the next replica."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(addresses[0])
        self.addresses = addresses

    async def run(self) -> None:
        channels = [grpc.aio.insecure_channel(address) for address in self.addresses]
        try:
            await asyncio.gather(*(self._spread(channels, n) for n in range(SENDERS)))
        finally:
            for channel in channels:
                await channel.close()

    async def _spread(self, channels: list[grpc.aio.Channel], n: int) -> None:
        thread_id = f"thread-{n}"
        choice = itertools.cycle(range(len(channels)))
        for _ in range(n % len(channels)):
            next(choice)
        replica = next(choice)
        for number in itertools.count(1):
            if self._stop.is_set():
                return
            try:
                await self.write(channels[replica], thread_id, str(number))
            except grpc.aio.AioRpcError as error:
                if error.code() not in EXPECTED_FAILURES:
                    self.unexpected.append(f"{thread_id} {number}: {error.code()} {error.details()}")
                self.failed += 1
                replica = next(choice)  # the next report goes to the other replica
                await asyncio.sleep(0.05)
            else:
                self.acked.add((thread_id, str(number)))


async def count_indicator_events(gateway_url: str, seen: list[float]) -> None:
    """Follows a gateway's SSE stream as the owner of the reported threads, adding the time of
    every ring update (`conversation.context_indicator.updated`) to `seen`, until the stream ends or
    the gateway dies."""
    token = TokenAuthority(SECRET).issue_client(OWNER)
    try:
        async with (
            httpx.AsyncClient(base_url=gateway_url, timeout=httpx.Timeout(5, read=120)) as http,
            http.stream("GET", "/api/v1/events", headers={"Authorization": f"Bearer {token}"}) as response,
        ):
            async for line in response.aiter_lines():
                if line == "event: conversation.context_indicator.updated":
                    seen.append(time.monotonic())
    except httpx.HTTPError:
        return


def both(replicas: list[ServiceProcess]) -> str:
    """One gRPC target for every replica of a service (as a Kubernetes Service gives)."""
    return "ipv4:" + ",".join(replica.address for replica in replicas)


def following_progress(database: Database, service: str) -> tuple[dict[str, str], str]:
    """A following service's last reading per thread and its cursor on the stream it follows."""
    table, stream = CONSUMERS[service]
    versions = dict(database.rows(f"SELECT thread_id, snapshot_version FROM {table}"))
    rows = database.rows(
        f"SELECT stream_name, last_sequence FROM {service}.event_cursors WHERE stream_name = '{stream}'"
    )
    return versions, rows[0][1] if rows else "0"


async def test_two_replicas_of_each_service_lose_nothing_when_one_of_each_is_killed(
    database: Database, tmp_path: Path
) -> None:
    database.create()
    budget = [
        ServiceProcess("context_budget", database.url, tmp_path / f"context_budget_{r}.log") for r in "ab"
    ]
    # Each follower reaches its peers as through a Service: one target naming both replicas
    # (gRPC's ipv4: resolver, pick_first), so it fails over when the replica it uses is gone.
    budget_target = both(budget)
    followers = {
        name: [
            ServiceProcess(
                name, database.url, tmp_path / f"{name}_{r}.log", peers={"context_budget": budget_target}
            )
            for r in "ab"
        ]
        for name in CONSUMERS
    }
    for scheduler in followers["scheduler"]:
        scheduler.peers["conversations"] = both(followers["conversations"])
    for conversations in followers["conversations"]:
        conversations.peers["scheduler"] = both(followers["scheduler"])
    gateways = [
        ServiceProcess(
            "bff_gateway",
            database.url,
            tmp_path / f"gateway_{r}.log",
            peers={"conversations": both(followers["conversations"]), "context_budget": budget_target},
        )
        for r in "ab"
    ]
    everything = [*budget, *followers["scheduler"], *followers["conversations"], *gateways]
    try:
        # The first replica of each service migrates its schema; then the second ones start.
        for replica in (0, 1):
            chosen = [budget[replica], followers["scheduler"][replica], followers["conversations"][replica]]
            for process in chosen:
                process.start()
            for process in chosen:
                await serving(process.address)

        # Two gateways, a person's SSE stream on each (the gateway keeps no state of its own).
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            await gateway_ready(f"http://{gateway.address}")
        rings: list[list[float]] = [[], []]
        streams = [
            asyncio.ensure_future(count_indicator_events(f"http://{gateway.address}", seen))
            for gateway, seen in zip(gateways, rings, strict=True)
        ]

        load = SpreadReportLoad([replica.address for replica in budget])
        reporters = asyncio.ensure_future(load.run())
        await grow(load, 2.0)
        assert rings[0] and rings[1], "both gateways' clients see the rings move"

        # One replica of each service killed under load; the others carry on.
        killed = (budget[1], followers["scheduler"][0], followers["conversations"][1], gateways[0])
        for process in killed:
            process.signal(signal.SIGKILL)
        for process in killed:
            assert await process.ended(10) == -signal.SIGKILL
        killed_at = time.monotonic()
        after_kill = await grow(load, 2.0)
        await asyncio.wait_for(streams[0], 10)  # the dead gateway's client was cut off
        load.stop()
        await asyncio.wait_for(reporters, 30)

        stored = ReportLoad.stored(database)
        latest = latest_versions(stored)
        [(_, head)] = database.rows("SELECT 'head', last_sequence FROM context_budget.outbox_sequencer")
        for name in CONSUMERS:
            deadline = time.monotonic() + 30
            while (progress := following_progress(database, name)) != (latest, head):
                assert time.monotonic() < deadline, f"{name} stopped at {progress}; latest {latest}, {head}"
                await asyncio.sleep(0.2)
        # The surviving gateway's client kept seeing the rings move after the kills.
        assert [t for t in rings[1] if t > killed_at], "no ring update reached the surviving gateway"
        streams[1].cancel()
    finally:
        for process in everything:
            process.stop()

    assert len(stored) == len(set(stored)), "a report was stored twice"
    lost = load.acked - set(stored)
    print(
        f"\ntwo replicas: acknowledged {len(load.acked)} reports ({after_kill} after the kills), "
        f"stored {len(stored)}, failed and not acknowledged {load.failed}, lost {len(lost)}; "
        f"scheduler and conversations followed the stream to its event {head}"
    )
    assert lost == set(), f"acknowledged but not stored: {sorted(lost)[:10]}"
    assert load.unexpected == []
    assert len(latest) == SENDERS
    for process in everything:
        log = process.log()
        assert "Traceback" not in log, (
            f"{process.log_path.name}: " + log[log.find("Traceback") - 500 :][:4000]
        )
        assert "deadlock detected" not in log, f"{process.log_path.name}: {log[-3000:]}"
