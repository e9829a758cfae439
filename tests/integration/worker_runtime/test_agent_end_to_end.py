"""A demo Codex home followed end to end: worker agent -> StreamThreadContext -> the real
context_budget service on SQLite -> GetThreadContext."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path

from boss.context_budget.v1 import context_budget_pb2 as pb

from services.shared.time import from_timestamp, utc_now
from tests.integration.worker_runtime.support import (
    NODE_ID,
    WORKER_ID,
    ContextBudgetHarness,
    eventually,
    running_agent,
    worker_settings,
)
from worker.demo_sessions import DEMO_AUTO_COMPACT_LIMIT, DemoSessionPlayer, DemoThread, write_demo_codex_home


def d1_percent(total_tokens: int, limit: int = DEMO_AUTO_COMPACT_LIMIT) -> float:
    """SPEC D-1: 100 * max(0, L - T) / (L - 12,000), one decimal, halves up."""
    share = Fraction(100 * max(0, limit - total_tokens), limit - 12_000)
    return float(
        (Decimal(share.numerator) / Decimal(share.denominator)).quantize(Decimal("0.1"), ROUND_HALF_UP)
    )


def cb7_level(percent: float) -> int:
    if percent >= 60:
        return pb.CONTEXT_BUDGET_LEVEL_SAFE
    if percent >= 40:
        return pb.CONTEXT_BUDGET_LEVEL_WATCH
    if percent >= 25:
        return pb.CONTEXT_BUDGET_LEVEL_URGENT
    return pb.CONTEXT_BUDGET_LEVEL_CRITICAL


async def server_matches(harness: ContextBudgetHarness, threads: list[DemoThread]) -> bool:
    """True when the server's current percent of every demo thread is the D-1 value of its last T."""
    for thread in threads:
        context = await harness.thread_context(thread.codex_thread_id)
        if context is None:
            return False
        if context.snapshot.context_budget_remaining_pct != d1_percent(thread.last_total_tokens):
            return False
    return True


async def test_demo_threads_are_reported_acked_and_followed(
    context_budget: ContextBudgetHarness, tmp_path: Path
) -> None:
    codex_home = tmp_path / "codex"
    threads = write_demo_codex_home(codex_home, utc_now(), threads=3)
    by_name = {thread.plan.name: thread for thread in threads}

    async with running_agent(worker_settings(codex_home, context_budget)) as running:
        await eventually(lambda: server_matches(context_budget, threads), what="the first reports")
        await eventually(lambda: running.reporter.unacked_count == 0, what="acks")

        for thread in threads:
            context = await context_budget.thread_context(thread.codex_thread_id)
            assert context is not None
            snapshot = context.snapshot
            assert (snapshot.worker_id, snapshot.node_id) == (WORKER_ID, NODE_ID)
            assert snapshot.source_kind == pb.SOURCE_KIND_WORKER_ESTIMATOR
            assert snapshot.last_total_tokens == thread.last_total_tokens
            assert snapshot.model_context_window == 258_400
            assert snapshot.auto_compact_token_limit == 244_800
            assert snapshot.codex_folder == str(thread.cwd)
            assert context.context_budget_level == cb7_level(snapshot.context_budget_remaining_pct)
            ack = running.reporter.last_ack(thread.codex_thread_id)
            assert ack is not None and ack.context_budget_level == context.context_budget_level
        flasher = await context_budget.thread_context(by_name["firmware-flasher"].codex_thread_id)
        assert flasher is not None and flasher.snapshot.compaction_count == 1
        assert flasher.snapshot.HasField("last_compaction_at")
        sync = await context_budget.thread_context(by_name["ios-sync-client"].codex_thread_id)
        assert sync is not None and sync.snapshot.must_finish_before_compaction is True
        assert sync.snapshot.must_finish_reason == "uncommitted changes in 1 file: src/sync_queue.py"
        billing = await context_budget.thread_context(by_name["billing-api"].codex_thread_id)
        assert billing is not None and billing.snapshot.must_finish_before_compaction is False
        first_versions = {
            thread.codex_thread_id: await _version(context_budget, thread) for thread in threads
        }

        advanced = DemoSessionPlayer(threads).advance(utc_now())
        await eventually(lambda: server_matches(context_budget, advanced), what="the new turn's readings")
        for thread in advanced:
            assert await _version(context_budget, thread) > first_versions[thread.codex_thread_id]

        sync_id = by_name["ios-sync-client"].codex_thread_id
        before_commit = await context_budget.thread_context(sync_id)
        assert before_commit is not None and before_commit.snapshot.must_finish_before_compaction is True
        workspace = by_name["ios-sync-client"].cwd
        _git(workspace, "add", "--all")
        _git(workspace, "-c", "commit.gpgsign=false", "commit", "--quiet", "-m", "Count sync queue items")

        async def cleared() -> bool:
            context = await context_budget.thread_context(sync_id)
            return context is not None and not context.snapshot.must_finish_before_compaction

        await eventually(cleared, what="must_finish cleared after the commit")
        context = await context_budget.thread_context(sync_id)
        assert context is not None
        # No new reading: the same reading re-stamped 1 microsecond later, so the server applies it.
        assert context.snapshot.must_finish_reason == ""
        assert context.snapshot.snapshot_version == before_commit.snapshot.snapshot_version
        assert context.snapshot.last_total_tokens == before_commit.snapshot.last_total_tokens
        restamped = from_timestamp(context.snapshot.captured_at) - from_timestamp(
            before_commit.snapshot.captured_at
        )
        assert restamped == timedelta(microseconds=1)
        assert running.reporter.rejected_count == 0


async def _version(harness: ContextBudgetHarness, thread: DemoThread) -> int:
    context = await harness.thread_context(thread.codex_thread_id)
    assert context is not None
    return context.snapshot.snapshot_version


def _git(workspace: Path, *arguments: str) -> None:
    subprocess.run(
        ["git", "-C", str(workspace), *arguments],
        check=True,
        capture_output=True,
        env={
            "GIT_AUTHOR_NAME": "Test",
            "GIT_AUTHOR_EMAIL": "test@boss.invalid",
            "GIT_COMMITTER_NAME": "Test",
            "GIT_COMMITTER_EMAIL": "test@boss.invalid",
            "PATH": "/usr/bin:/bin:/usr/local/bin",
        },
    )
