"""WorkerAgent's decisions with plain values: what is sent at once, what waits for the heartbeat,
idle threads, and git changes around an unchanged reading (follower, reporter, git and clocks faked)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from boss.context_budget.v1 import context_budget_pb2 as pb

from services.shared.time import from_timestamp
from worker.agent import GitStateCache, WorkerAgent
from worker.codex_sessions.follower import FileUpdate
from worker.codex_sessions.git_state import ChangedFile, DiffStat, GitState
from worker.codex_sessions.tracker import LastActivity, ThreadBudgetReading
from worker.settings import WorkerSettings

NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
FOLDER = "/home/dev/billing-api"


def reading(thread: str, percent: float, sequence: int, *, age: timedelta = timedelta(seconds=5)):
    return ThreadBudgetReading(
        codex_thread_id=thread,
        cwd=FOLDER,
        model="gpt-5.3-codex",
        last_total_tokens=100_000,
        model_context_window=258_400,
        context_window=272_000,
        auto_compact_token_limit=244_800,
        codex_context_left_pct=64,
        context_budget_remaining_pct=percent,
        compaction_count=0,
        last_compaction_at=None,
        estimated_remaining_turns=None,
        estimated_remaining_large_messages=None,
        compaction_expected_at=None,
        captured_at=NOW - age + timedelta(seconds=sequence),
        reading_sequence=sequence,
    )


def update(*readings: ThreadBudgetReading, thread: str = "t1") -> FileUpdate:
    return FileUpdate(
        path=Path(f"/codex/sessions/rollout-{thread}.jsonl"),
        codex_thread_id=thread,
        readings=tuple(readings),
        new_compactions=0,
        last_activity=LastActivity(),
        restarted=False,
    )


class FakeFollower:
    def __init__(self) -> None:
        self.pending: list[FileUpdate] = []

    def poll(self) -> list[FileUpdate]:
        updates, self.pending = self.pending, []
        return updates


class FakeReporter:
    def __init__(self) -> None:
        self.sent: list[pb.ThreadContextSnapshot] = []
        self.acks: dict[str, pb.ThreadContextAck] = {}

    def submit(self, snapshots: Iterable[pb.ThreadContextSnapshot]) -> int:
        snapshots = list(snapshots)
        self.sent.extend(snapshots)
        return len(snapshots)

    def last_ack(self, thread_id: str) -> pb.ThreadContextAck | None:
        return self.acks.get(thread_id)

    async def flush(self, timeout: float) -> bool:
        return True

    @property
    def rejected_count(self) -> int:
        return 0

    def take(self) -> list[pb.ThreadContextSnapshot]:
        sent, self.sent = self.sent, []
        return sent


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def git(*paths: str) -> GitState:
    return GitState(
        folder=Path(FOLDER),
        branch="main",
        head_commit="abc",
        changed_files=tuple(ChangedFile(path, " M") for path in paths),
        has_uncommitted_changes=bool(paths),
        diff_stat=DiffStat(len(paths), 1, 0),
    )


def make_agent(git_states: dict[str, GitState | None] | None = None, wall_clock=lambda: NOW):
    settings = WorkerSettings(
        codex_home=Path("/codex"),
        worker_id="w",
        node_id="n",
        context_budget_address="127.0.0.1:1",
        token="t",
        git_refresh_s=10.0,
        idle_after_s=3600.0,
    )
    follower, reporter, clock = FakeFollower(), FakeReporter(), Clock()
    states = git_states if git_states is not None else {}
    cache = GitStateCache(reader=lambda folder: states.get(str(folder)), refresh_s=10.0, clock=clock)
    agent = WorkerAgent(
        settings,
        follower,
        reporter,
        git_cache=cache,
        clock=clock,
        wall_clock=wall_clock,
    )
    return agent, follower, reporter, clock


async def test_first_poll_reports_the_latest_reading_of_each_thread() -> None:
    agent, follower, reporter, _ = make_agent()
    follower.pending = [
        update(reading("t1", 80.0, 1), reading("t1", 75.0, 2)),
        update(reading("t2", 50.0, 4), thread="t2"),
    ]

    await agent.step()

    sent = {snapshot.thread_id: snapshot for snapshot in reporter.take()}
    assert sent["t1"].snapshot_version == 2 and sent["t1"].context_budget_remaining_pct == 75.0
    assert sent["t2"].snapshot_version == 4


async def test_small_moves_wait_for_the_interval_of_the_last_ack() -> None:
    agent, follower, reporter, clock = make_agent()
    follower.pending = [update(reading("t1", 80.0, 1))]
    await agent.step()
    reporter.take()
    reporter.acks["t1"] = pb.ThreadContextAck(
        accepted=True,
        thread_id="t1",
        context_budget_level=pb.CONTEXT_BUDGET_LEVEL_SAFE,
        next_required_report_in_seconds=5,
    )

    follower.pending = [update(reading("t1", 79.0, 2))]
    clock.now += 4.9
    await agent.step()
    assert reporter.take() == []

    clock.now += 0.1
    await agent.step()
    (heartbeat,) = reporter.take()
    assert (heartbeat.snapshot_version, heartbeat.context_budget_remaining_pct) == (2, 79.0)


async def test_a_significant_move_is_sent_at_once() -> None:
    agent, follower, reporter, clock = make_agent()
    follower.pending = [update(reading("t1", 80.0, 1))]
    await agent.step()
    reporter.take()

    follower.pending = [update(reading("t1", 78.0, 2))]
    clock.now += 0.5
    await agent.step()

    assert [snapshot.snapshot_version for snapshot in reporter.take()] == [2]


async def test_heartbeat_resends_the_same_snapshot_of_an_active_thread_only() -> None:
    agent, follower, reporter, clock = make_agent()
    follower.pending = [
        update(reading("active", 80.0, 1)),
        update(reading("idle", 80.0, 1, age=timedelta(hours=2)), thread="idle"),
    ]
    await agent.step()
    first = {snapshot.thread_id: snapshot.snapshot_id for snapshot in reporter.take()}
    assert set(first) == {"active", "idle"}

    clock.now += 29.0
    await agent.step()
    assert reporter.take() == []

    clock.now += 1.0
    await agent.step()
    assert [(s.thread_id, s.snapshot_id) for s in reporter.take()] == [("active", first["active"])]


async def test_a_git_change_restamps_the_unchanged_reading_and_is_sent_at_once() -> None:
    states: dict[str, GitState | None] = {FOLDER: git("src/invoices.py")}
    agent, follower, reporter, clock = make_agent(states)
    follower.pending = [update(reading("t1", 80.0, 3))]
    await agent.step()
    (dirty,) = reporter.take()
    assert dirty.must_finish_before_compaction is True

    states[FOLDER] = git()
    clock.now += 9.0
    await agent.step()
    assert reporter.take() == []

    clock.now += 1.0
    await agent.step()
    (clean,) = reporter.take()
    assert clean.must_finish_before_compaction is False
    assert clean.snapshot_version == dirty.snapshot_version
    assert from_timestamp(clean.captured_at) - from_timestamp(dirty.captured_at) == timedelta(microseconds=1)
    assert clean.snapshot_id != dirty.snapshot_id


async def test_a_prediction_that_passed_on_an_idle_thread_is_dropped_and_reported_at_once() -> None:
    wall = [NOW]
    agent, follower, reporter, clock = make_agent(wall_clock=lambda: wall[0])
    predicted = replace(reading("t1", 30.0, 1), compaction_expected_at=NOW + timedelta(seconds=20))
    follower.pending = [update(predicted)]
    await agent.step()
    (first,) = reporter.take()
    assert first.HasField("compaction_expected_at")

    # The thread goes quiet; its predicted compaction time passes with no new reading.
    wall[0] = NOW + timedelta(seconds=21)
    clock.now += 21.0
    await agent.step()
    (again,) = reporter.take()
    assert not again.HasField("compaction_expected_at")
    assert again.snapshot_version == first.snapshot_version
    assert again.snapshot_id != first.snapshot_id  # other content, another id
    clock.now += 1.0
    await agent.step()
    assert reporter.take() == []  # dropped once, not on every poll


async def test_a_new_worker_reporting_a_passed_prediction_uses_another_id_than_the_reading_with_it() -> None:
    predicted = replace(reading("t1", 30.0, 1), compaction_expected_at=NOW + timedelta(seconds=20))
    before, follower_before, reporter_before, _ = make_agent()
    follower_before.pending = [update(predicted)]
    await before.step()
    (with_prediction,) = reporter_before.take()

    # A restart after the predicted instant: the same reading from the file, its prediction past.
    later, follower, reporter, _ = make_agent(wall_clock=lambda: NOW + timedelta(minutes=5))
    follower.pending = [update(predicted)]
    await later.step()
    (without,) = reporter.take()
    assert not without.HasField("compaction_expected_at")
    assert without.snapshot_id != with_prediction.snapshot_id
