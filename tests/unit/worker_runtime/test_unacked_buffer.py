"""The reporter's bounded unacked buffer and its reconnect backoff."""

from __future__ import annotations

import pytest
from boss.context_budget.v1 import context_budget_pb2

from worker.reporter import (
    MAX_POISON_STRIKES,
    UnackedBuffer,
    backoff_delay,
)
from worker.snapshots import CRITICAL, SAFE, URGENT, WATCH, Level


def snap(
    snapshot_id: str, thread: str = "t1", *, level: Level = SAFE, compactions: int = 0
) -> context_budget_pb2.ThreadContextSnapshot:
    return context_budget_pb2.ThreadContextSnapshot(
        snapshot_id=snapshot_id, thread_id=thread, context_budget_level=level, compaction_count=compactions
    )


def ids(snapshots: list[context_budget_pb2.ThreadContextSnapshot]) -> list[str]:
    return [snapshot.snapshot_id for snapshot in snapshots]


def test_snapshots_leave_in_submission_order_in_batches() -> None:
    buffer = UnackedBuffer()
    for index in range(5):
        buffer.add(snap(f"s{index}", thread=f"t{index}"))

    assert ids(buffer.take(2)) == ["s0", "s1"]
    assert ids(buffer.take(10)) == ["s2", "s3", "s4"]
    assert buffer.take(10) == []
    assert len(buffer) == 5


def test_resubmitting_an_unacked_snapshot_is_a_no_op() -> None:
    buffer = UnackedBuffer()

    assert buffer.add(snap("s1")) is True
    assert buffer.add(snap("s1")) is False
    assert len(buffer) == 1


def test_a_newer_snapshot_replaces_a_waiting_older_one_of_the_thread() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("old"))
    buffer.add(snap("other", thread="t2"))
    buffer.add(snap("new"))

    assert ids(buffer.take(10)) == ["other", "new"]
    assert buffer.counters.superseded == 1


def test_milestones_are_kept_when_newer_snapshots_arrive() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("safe-1", level=SAFE))
    buffer.add(snap("watch-1", level=WATCH))
    buffer.add(snap("watch-2", level=WATCH))
    buffer.add(snap("compacted", level=WATCH, compactions=1))
    buffer.add(snap("compacted-2", level=WATCH, compactions=1))

    assert ids(buffer.take(10)) == ["watch-1", "compacted", "compacted-2"]


def test_milestones_per_thread_are_capped_oldest_first() -> None:
    buffer = UnackedBuffer(max_milestones_per_thread=2)
    levels = [SAFE, WATCH, URGENT, CRITICAL, URGENT]
    for index, level in enumerate(levels):
        buffer.add(snap(f"s{index}", level=level))

    assert ids(buffer.take(10)) == ["s3", "s4"]
    assert buffer.counters.milestones_dropped == 2


def test_a_failed_batch_is_requeued_ahead_of_newer_snapshots() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("a", thread="t1"))
    buffer.add(snap("b", thread="t2"))
    in_flight = ids(buffer.take(10))
    buffer.add(snap("c", thread="t3"))

    assert buffer.release(in_flight, poison_strike=False) == 2
    assert ids(buffer.take(10)) == ["a", "b", "c"]


def test_an_in_flight_snapshot_superseded_meanwhile_is_not_resent() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("old"))
    in_flight = ids(buffer.take(10))
    buffer.add(snap("new"))

    assert buffer.release(in_flight, poison_strike=False) == 0
    assert ids(buffer.take(10)) == ["new"]
    assert "old" not in buffer


def test_an_in_flight_snapshot_that_gets_acked_is_forgotten() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("a"))
    buffer.take(10)

    assert buffer.resolve("a") is not None
    assert len(buffer) == 0
    assert buffer.resolve("a") is None


def test_poison_strikes_drop_a_snapshot_after_the_limit() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("poison"))
    for _ in range(MAX_POISON_STRIKES - 1):
        assert buffer.release(ids(buffer.take(10)), poison_strike=True) == 1
        assert buffer.suspect is True

    assert buffer.release(ids(buffer.take(10)), poison_strike=True) == 0
    assert len(buffer) == 0
    assert buffer.counters.poisoned == 1


def test_transient_failures_never_drop_anything() -> None:
    buffer = UnackedBuffer()
    buffer.add(snap("a"))
    for _ in range(MAX_POISON_STRIKES * 3):
        buffer.release(ids(buffer.take(10)), poison_strike=False)

    assert ids(buffer.take(10)) == ["a"]
    assert buffer.suspect is False


def test_snapshot_without_id_is_refused() -> None:
    with pytest.raises(ValueError, match="snapshot_id"):
        UnackedBuffer().add(snap(""))


@pytest.mark.parametrize(
    ("attempt", "base"),
    [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4), (7, 10.0), (50, 10.0)],
)
def test_backoff_doubles_from_0_2_to_10_seconds_with_20_percent_jitter(attempt: int, base: float) -> None:
    assert backoff_delay(attempt, lambda: 0.5) == pytest.approx(base)
    assert backoff_delay(attempt, lambda: 0.0) == pytest.approx(base * 0.8)
    assert backoff_delay(attempt, lambda: 0.999999) == pytest.approx(base * 1.2, rel=1e-5)
