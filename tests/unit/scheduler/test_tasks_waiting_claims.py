"""Handing a new task straight to a claim waiting on its node, without I/O: which new tasks an
enqueue hands over (`rules.handed_to_waiting_claims`), what a claim and a start write
(`claimed_by`, `started`), and the waiting claims' answers (`waiting_claims`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from services.scheduler.tasks.model import TaskStatus
from services.scheduler.tasks.repository import ClaimCall
from services.scheduler.tasks.rules import claimed_by, handed_to_waiting_claims, started
from services.scheduler.tasks.waiting_claims import WaitingClaims
from tests.unit.scheduler.test_tasks_rules import queued_task

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
N1 = ("owner-1", "mac-01")


def test_each_waiting_claim_takes_the_first_new_task_of_a_free_thread_on_its_node() -> None:
    created = [
        queued_task(task_id="a1", target_thread_id="thread-a"),
        queued_task(task_id="a2", target_thread_id="thread-a"),  # after a1: waits for it
        queued_task(task_id="b1", target_thread_id="thread-b"),  # its thread has an open task
        queued_task(task_id="c1", target_thread_id="thread-c"),
        queued_task(task_id="d1", target_thread_id="thread-d"),  # no third waiting claim
    ]
    handed = handed_to_waiting_claims(created, open_threads={"thread-b"}, waiting={N1: 2})
    assert [task.task_id for task in handed] == ["a1", "c1"]


def test_tasks_of_other_nodes_or_owners_and_tasks_created_terminal_are_not_handed_over() -> None:
    created = [
        queued_task(task_id="elsewhere", device_id="linux-02"),
        queued_task(task_id="theirs", owner_id="owner-2", target_thread_id="thread-2"),
        queued_task(task_id="failed", status=TaskStatus.FAILED, target_thread_id="thread-3"),
        queued_task(task_id="next-of-3", target_thread_id="thread-3"),
    ]
    handed = handed_to_waiting_claims(created, open_threads=set(), waiting={N1: 5})
    # A task created failed holds no thread: the thread's next new task is handed over.
    assert [task.task_id for task in handed] == ["next-of-3"]
    assert handed_to_waiting_claims(created, open_threads=set(), waiting={}) == []


def test_a_handed_task_is_written_as_a_claim_and_a_start_would_write_it() -> None:
    offline = replace(queued_task(), status_detail="device mac-01 is offline", device_offline=True)
    claimed = claimed_by(offline, "worker-1", "lease-1", NOW, timedelta(seconds=30))
    assert (claimed.status, claimed.worker_id, claimed.lease_id, claimed.attempt) == (
        TaskStatus.CLAIMED,
        "worker-1",
        "lease-1",
        1,
    )
    assert claimed.claimed_at == NOW and claimed.lease_expires_at == NOW + timedelta(seconds=30)
    assert claimed.status_detail == "" and not claimed.device_offline
    running = started(claimed, NOW, timedelta(seconds=45))
    assert running.status is TaskStatus.RUNNING and running.started_at == NOW
    assert running.lease_expires_at == NOW + timedelta(seconds=45) and running.lease_id == "lease-1"


async def test_a_waiting_claim_gets_the_task_offered_to_it() -> None:
    claims = WaitingClaims()
    claim = claims.add(ClaimCall("mac-01", "worker-1", "lease-1", "owner-1"))
    assert claims.count(*N1) == 1
    waiting = asyncio.ensure_future(claim.wait(asyncio.Event(), 5.0))
    await asyncio.sleep(0)
    assert claims.take(*N1) is claim and claims.count(*N1) == 0
    task = queued_task()
    assert claim.offer(task)
    assert await waiting is task
    assert claims.withdraw(claim) is task


async def test_a_withdrawn_claim_refuses_a_later_offer_and_a_declined_one_answers_none() -> None:
    claims = WaitingClaims()
    withdrawn = claims.add(ClaimCall("mac-01", "worker-1", "lease-1", "owner-1"))
    taken = claims.take(*N1)
    assert taken is withdrawn
    assert claims.withdraw(withdrawn) is None
    assert not withdrawn.offer(queued_task()), "the enqueue must put the task back in the queue"

    declined = claims.add(ClaimCall("mac-01", "worker-2", "lease-2", "owner-1"))
    waiting = asyncio.ensure_future(declined.wait(asyncio.Event(), 5.0))
    await asyncio.sleep(0)
    declined.decline()
    assert await waiting is None
    assert claims.withdraw(declined) is None and claims.count(*N1) == 0


async def test_a_claim_woken_by_its_node_or_out_of_time_returns_none() -> None:
    claims = WaitingClaims()
    claim = claims.add(ClaimCall("mac-01", "worker-1", "lease-1", "owner-1"))
    marker = asyncio.Event()
    waiting = asyncio.ensure_future(claim.wait(marker, 5.0))
    await asyncio.sleep(0)
    marker.set()
    assert await waiting is None
    assert await claim.wait(asyncio.Event(), 0.01) is None
    claims.withdraw(claim)
    assert claims.take(*N1) is None
