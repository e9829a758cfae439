"""The local agent's pure decisions: lease length and heartbeat interval from the scheduler's answer,
retry and backoff, outage logging, how a turn's outcome becomes the FinishTask request, and how a
Codex run and the worker's settings map onto the loop's outcome and the runner's settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2

from services.shared.time import to_timestamp
from worker.local_agent.codex_exec import CodexTurnResult
from worker.local_agent.codex_outcome import FailureKind
from worker.local_agent.codex_turns import codex_run_settings, outcome_of
from worker.local_agent.leases import (
    DEFAULT_LEASE_S,
    CallVerdict,
    LeaseClock,
    Reachability,
    heartbeat_interval,
    lease_seconds,
    retry_delay,
    verdict_of,
)
from worker.local_agent.outcomes import (
    TurnOutcome,
    bounded,
    failure_kind_value,
    finish_request,
    outcome_after_stop,
)
from worker.settings import LocalAgentSettings

DB_NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def task_with(**stamps: datetime) -> scheduler_pb2.Task:
    task = scheduler_pb2.Task(task_id="task-1", target_thread_id="thread-1")
    for name, value in stamps.items():
        getattr(task, name).CopyFrom(to_timestamp(value))
    return task


def test_lease_length_of_a_claim_answer_is_expiry_minus_claim_time() -> None:
    task = task_with(claimed_at=DB_NOW, updated_at=DB_NOW, lease_expires_at=DB_NOW + timedelta(seconds=30))

    assert lease_seconds(task, now=DB_NOW + timedelta(hours=3)) == 30.0


def test_lease_length_of_a_heartbeat_answer_counts_from_the_heartbeat() -> None:
    task = task_with(
        claimed_at=DB_NOW,
        started_at=DB_NOW + timedelta(seconds=1),
        heartbeat_at=DB_NOW + timedelta(seconds=21),
        lease_expires_at=DB_NOW + timedelta(seconds=66),
    )

    assert lease_seconds(task, now=DB_NOW - timedelta(days=2)) == 45.0


def test_lease_length_without_a_renewal_stamp_counts_from_this_devices_clock() -> None:
    task = task_with(lease_expires_at=DB_NOW + timedelta(seconds=30))

    assert lease_seconds(task, now=DB_NOW + timedelta(seconds=12)) == 18.0


def test_no_lease_or_a_lease_already_over_assumes_the_default() -> None:
    assert lease_seconds(task_with(claimed_at=DB_NOW), now=DB_NOW) == DEFAULT_LEASE_S
    over = task_with(lease_expires_at=DB_NOW)
    assert lease_seconds(over, now=DB_NOW + timedelta(seconds=5)) == DEFAULT_LEASE_S


def test_heartbeats_come_every_third_of_the_lease_never_closer_than_a_tenth_of_a_second() -> None:
    assert heartbeat_interval(30.0) == 10.0
    assert heartbeat_interval(1.5) == 0.5
    assert heartbeat_interval(0.09) == 0.1


def test_the_local_lease_deadline_counts_from_when_the_renewal_was_sent() -> None:
    lease = LeaseClock.granted(sent_at=100.0, lease_s=30.0)

    assert lease.deadline == 130.0
    assert lease.heartbeat_interval == 10.0
    assert lease.may_be_valid(129.9)
    assert not lease.may_be_valid(130.0)


def test_a_retry_is_worth_it_only_when_it_goes_out_before_the_lease_ends() -> None:
    lease = LeaseClock.granted(sent_at=0.0, lease_s=10.0)

    assert lease.worth_retrying(now=9.0, delay=0.8)
    assert not lease.worth_retrying(now=9.5, delay=0.8)


def test_retry_delays_double_from_a_fifth_of_a_second_up_to_five_seconds() -> None:
    assert [retry_delay(n) for n in range(1, 9)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (grpc.StatusCode.UNAVAILABLE, CallVerdict.TRANSIENT),
        (grpc.StatusCode.DEADLINE_EXCEEDED, CallVerdict.TRANSIENT),
        (grpc.StatusCode.CANCELLED, CallVerdict.TRANSIENT),  # a stopping server cancels unhandled calls
        (grpc.StatusCode.FAILED_PRECONDITION, CallVerdict.LEASE_LOST),
        (grpc.StatusCode.NOT_FOUND, CallVerdict.LEASE_LOST),
        (grpc.StatusCode.PERMISSION_DENIED, CallVerdict.LEASE_LOST),
        (grpc.StatusCode.INVALID_ARGUMENT, CallVerdict.REJECTED),
        (grpc.StatusCode.UNIMPLEMENTED, CallVerdict.REJECTED),
    ],
)
def test_call_failures_are_retried_treated_as_a_lost_lease_or_rejected(
    code: grpc.StatusCode, verdict: CallVerdict
) -> None:
    assert verdict_of(code) is verdict


def test_an_outage_is_reported_once_when_it_starts_and_once_when_it_ends() -> None:
    now = [50.0]
    reachability = Reachability(clock=lambda: now[0])

    assert reachability.answered() is None
    assert reachability.failed() is True
    now[0] = 52.0
    assert reachability.failed() is False
    assert reachability.failed() is False
    now[0] = 57.5
    assert reachability.answered() == 7.5
    assert reachability.answered() is None
    assert reachability.failed() is True


def finish(outcome: TurnOutcome) -> scheduler_pb2.FinishTaskRequest:
    return finish_request(
        scheduler_pb2.Task(task_id="task-7"), "lease-7", outcome, worker_id="worker-a", node_id="node-a"
    )


def test_a_reply_finishes_the_task_as_completed_with_the_reply_and_session() -> None:
    request = finish(TurnOutcome.replied("Done: tests pass.", "0199-session"))

    assert request == scheduler_pb2.FinishTaskRequest(
        worker_id="worker-a",
        node_id="node-a",
        task_id="task-7",
        lease_id="lease-7",
        status=scheduler_pb2.TASK_STATUS_COMPLETED,
        reply_text="Done: tests pass.",
        codex_session_id="0199-session",
    )


@pytest.mark.parametrize(
    ("kind", "status", "failure_kind"),
    [
        ("stalled", scheduler_pb2.TASK_STATUS_TIMED_OUT, scheduler_pb2.FAILURE_KIND_STALLED),
        ("timed_out", scheduler_pb2.TASK_STATUS_TIMED_OUT, scheduler_pb2.FAILURE_KIND_TIMED_OUT),
        ("model_error", scheduler_pb2.TASK_STATUS_FAILED, scheduler_pb2.FAILURE_KIND_MODEL_ERROR),
        ("session_not_found", scheduler_pb2.TASK_STATUS_FAILED, scheduler_pb2.FAILURE_KIND_SESSION_NOT_FOUND),
        ("interrupted", scheduler_pb2.TASK_STATUS_FAILED, scheduler_pb2.FAILURE_KIND_INTERRUPTED),
        ("something_new", scheduler_pb2.TASK_STATUS_FAILED, scheduler_pb2.FAILURE_KIND_OTHER),
        ("unspecified", scheduler_pb2.TASK_STATUS_FAILED, scheduler_pb2.FAILURE_KIND_OTHER),
    ],
)
def test_a_failure_finishes_as_failed_or_timed_out_with_its_kind_and_detail(
    kind: str, status: scheduler_pb2.TaskStatus, failure_kind: scheduler_pb2.FailureKind
) -> None:
    request = finish(TurnOutcome.failed(kind, "Codex said: boom", "0199-session"))

    assert (request.status, request.failure_kind) == (status, failure_kind)
    assert (request.status_detail, request.reply_text, request.codex_session_id) == (
        "Codex said: boom",
        "",
        "0199-session",
    )


def test_a_failure_kind_name_maps_to_its_enum_value() -> None:
    assert failure_kind_value("thread_busy") == scheduler_pb2.FAILURE_KIND_THREAD_BUSY
    assert failure_kind_value("") == scheduler_pb2.FAILURE_KIND_OTHER


def test_a_turn_with_neither_reply_nor_failure_finishes_as_no_reply() -> None:
    for outcome in (TurnOutcome(), TurnOutcome.replied("   \n")):
        request = finish(outcome)

        assert (request.status, request.failure_kind, request.status_detail) == (
            scheduler_pb2.TASK_STATUS_FAILED,
            scheduler_pb2.FAILURE_KIND_NO_REPLY,
            "Codex finished without a reply",
        )


def test_a_failure_without_words_still_says_what_failed() -> None:
    assert finish(TurnOutcome.failed("model_error", " ")).status_detail == "the run failed (model_error)"


def test_nul_in_a_reply_or_detail_becomes_the_replacement_character_so_the_reply_is_kept() -> None:
    assert finish(TurnOutcome.replied("before\x00after")).reply_text == "before\ufffdafter"
    assert finish(TurnOutcome.failed("other", "bad\x00byte")).status_detail == "bad\ufffdbyte"


def test_reply_and_detail_are_cut_to_the_finish_limits_saying_so() -> None:
    reply = finish(TurnOutcome.replied("r" * 150_000)).reply_text
    detail = finish(TurnOutcome.failed("other", "d" * 5_000)).status_detail

    assert len(reply) == 100_000 and reply.endswith("\n[cut: 150,000 characters in all]")
    assert len(detail) == 2_000 and detail.endswith("\n[cut: 5,000 characters in all]")
    assert bounded("short", 10) == "short"


def test_a_turn_the_workers_stop_cancelled_is_interrupted_unless_it_replied() -> None:
    cancelled = outcome_after_stop(TurnOutcome.failed("other", "killed", "0199-s"), "mac-01")
    replied = outcome_after_stop(TurnOutcome.replied("made it", "0199-s"), "mac-01")

    assert cancelled == TurnOutcome.failed(
        "interrupted", "the worker on mac-01 was stopped while running this message", "0199-s"
    )
    assert replied == TurnOutcome.replied("made it", "0199-s")
    assert (cancelled.outcome_name, replied.outcome_name, TurnOutcome().outcome_name) == (
        "interrupted",
        "completed",
        "no_reply",
    )


def codex_result(reply: str, kind: FailureKind | None, detail: str = "") -> CodexTurnResult:
    return CodexTurnResult(
        reply_text=reply,
        failure_kind=kind,
        failure_detail=detail,
        codex_session_id="0199-session",
        exit_code=0 if kind is None else 1,
        duration_s=0.4,
    )


def test_a_codex_run_becomes_the_loops_outcome() -> None:
    replied = outcome_of(codex_result("All green.", None))
    busy = outcome_of(codex_result("", FailureKind.THREAD_BUSY, "another Codex process runs this thread"))

    assert replied == TurnOutcome.replied("All green.", "0199-session")
    assert busy == TurnOutcome.failed("thread_busy", "another Codex process runs this thread", "0199-session")


def test_the_workers_settings_become_the_codex_run_settings(tmp_path: Path) -> None:
    settings = LocalAgentSettings(
        scheduler_address="127.0.0.1:50052",
        codex_bin=tmp_path / "codex",
        codex_sandbox="read-only",
        stall_timeout_s=20.0,
        turn_cap_s=90.0,
    )

    run = codex_run_settings(tmp_path / "codex-home", settings)

    assert (run.codex_bin, run.codex_home, run.sandbox, run.approval_policy) == (
        tmp_path / "codex",
        tmp_path / "codex-home",
        "read-only",
        "never",
    )
    assert (run.stall_timeout_s, run.turn_timeout_s) == (20.0, 90.0)
