"""The scheduler end to end in one process, on SQLite and PostgreSQL: it consumes budget events over
gRPC, acts per level, streams commands to the worker until acknowledged, keeps packages through
their lifecycle, opens handoff_missing, ranks threads, and survives a restart without losing or
repeating anything."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc
import pytest
from boss.scheduler.v1 import scheduler_pb2 as pb
from grpc_status import rpc_status

from services.scheduler.domain.model import SchedulerSettings
from services.shared.errors import reason_of
from services.shared.time import utc_now
from tests.conftest import DatabaseTarget
from tests.integration.scheduler.harness import Running, budget_payload, running_scheduler


async def next_commands(
    running: Running, count: int, worker: str = "w1", node: str = "n1"
) -> list[pb.WorkerCommand]:
    """Opens the command stream, reads `count` commands, closes it."""
    call = running.stub.StreamWorkerCommands(
        pb.StreamWorkerCommandsRequest(worker_id=worker, node_id=node), metadata=running.worker(worker, node)
    )
    commands = []
    async with asyncio.timeout(10):
        async for response in call:
            commands.append(response.command)
            if len(commands) == count:
                break
    call.cancel()
    return commands


async def consume(running: Running, handoff_package_id: str) -> pb.HandoffPackage:
    """ConsumeHandoffPackage with the client's token; the package as consumed."""
    response = await running.stub.ConsumeHandoffPackage(
        pb.ConsumeHandoffPackageRequest(handoff_package_id=handoff_package_id), metadata=running.client()
    )
    return response.handoff_package


async def events_of(running: Running, *types: str) -> list[tuple[str, dict]]:
    import json

    stored = await running.app.event_log.read_after(0, types=types)
    return [(event.type, json.loads(json.dumps(event.payload))) for event in stored]


async def strategy_events_until(running: Running, summary: str) -> list[tuple[str, dict]]:
    """The `project.context_strategy.updated` events once the last one carries `summary` (published
    by the scheduler's background StrategyPublisher); fails after 5 s."""
    async with asyncio.timeout(5):
        while True:
            await running.app.event_log.refresh()
            events = await events_of(running, "project.context_strategy.updated")
            if events and events[-1][1]["master_context_strategy_summary"] == summary:
                return events
            await asyncio.sleep(0.02)


async def test_strategy_summary_is_published_in_the_background_only_when_its_text_changes(
    database_target: DatabaseTarget,
) -> None:
    settings = SchedulerSettings(redeliver_after=timedelta(hours=1), strategy_interval=timedelta(seconds=0.2))
    async with running_scheduler(database_target, settings=settings) as running:
        publisher = running.app.handlers.strategies
        await running.publish(budget_payload(1, "safe", 80))
        first = await strategy_events_until(
            running,
            "1 thread: 1 safe. Every thread has room; keep stage summaries fresh. New work goes to t1.",
        )
        assert len(first) == 1 and first[0][1]["ranked_thread_ids"] == ["t1"]

        async with asyncio.timeout(5):
            while not publisher.idle:
                await asyncio.sleep(0.02)
        runs = publisher.publications
        await running.publish(budget_payload(2, "safe", 75))
        assert publisher.pending
        async with asyncio.timeout(5):
            while publisher.publications == runs or not publisher.idle:
                await asyncio.sleep(0.02)
        await running.app.event_log.refresh()
        assert await events_of(running, "project.context_strategy.updated") == first

        await running.publish(budget_payload(3, "watch", 50))
        watch = await strategy_events_until(
            running,
            "1 thread: 1 watch. Send t1 less long context; its handoff is being prepared. "
            "New work goes to t1.",
        )
        assert len(watch) == 2 and watch[-1][1]["next_compaction_risk_thread_id"] == "t1"


async def test_two_owners_naming_one_project_get_a_strategy_summary_each(
    database_target: DatabaseTarget,
) -> None:
    """A project id is what a worker reports: another owner's device naming alice's project never
    puts its thread into alice's summary."""
    async with running_scheduler(database_target) as running:
        await running.publish({**budget_payload(1, "safe", 80), "owner_id": "alice"})
        await running.publish(
            {
                **budget_payload(1, "critical", 3, thread_id="t-mallory", must_finish_reason="MALLORY"),
                "owner_id": "mallory",
            }
        )
        async with asyncio.timeout(5):
            while True:
                await running.app.event_log.refresh()
                events = [p for _t, p in await events_of(running, "project.context_strategy.updated")]
                latest = {p["owner_id"]: p for p in events}
                if set(latest) == {"alice", "mallory"}:
                    break
                await asyncio.sleep(0.02)
        assert {p["project_id"] for p in events} == {"p1"}
        assert latest["alice"]["ranked_thread_ids"] == ["t1"]
        assert "MALLORY" not in latest["alice"]["master_context_strategy_summary"]
        assert latest["mallory"]["ranked_thread_ids"] == ["t-mallory"]


async def test_levels_commands_package_and_guarantee(database_target: DatabaseTarget) -> None:
    async with running_scheduler(database_target) as running:
        await running.publish(budget_payload(1, "safe", 80))
        await running.publish(budget_payload(2, "watch", 50))
        await running.publish(budget_payload(3, "urgent", 30))

        schedule = (
            await running.stub.GetThreadSchedule(
                pb.GetThreadScheduleRequest(thread_id="t1"), metadata=running.client()
            )
        ).thread_schedule
        assert schedule.context_budget_level == pb.BUDGET_LEVEL_URGENT
        assert schedule.no_large_context_appends and schedule.finish_current_subtask
        assert not schedule.context_growth_frozen
        assert schedule.relay_thread_id.startswith("relay-")
        package = schedule.current_package
        assert package.package_status == pb.PACKAGE_STATUS_DRAFT
        assert package.to_thread_id == schedule.relay_thread_id
        assert [item.status for item in package.checklist] == [pb.CHECKLIST_ITEM_STATUS_PENDING] * 7

        commands = await next_commands(running, 3)
        assert [c.command_type for c in commands] == [
            pb.COMMAND_TYPE_AVOID_LARGE_CONTEXT_APPEND,
            pb.COMMAND_TYPE_FINISH_CURRENT_SUBTASK,
            pb.COMMAND_TYPE_PREPARE_HANDOFF,
        ]
        prepare = commands[2]
        assert prepare.handoff_package_id == package.handoff_package_id
        assert prepare.codex_folder == "/home/dev/repo" and prepare.to_thread_id == schedule.relay_thread_id

        required = await events_of(running, "thread.handoff.required")
        assert [(t, p["reason"], p["command_id"]) for t, p in required] == [
            ("thread.handoff.required", "context_urgent", prepare.command_id)
        ]

        upload = pb.HandoffPackage(
            handoff_package_id=prepare.handoff_package_id,
            summary_text="fixing the parser",
            critical_files=["src/parser.py"],
            checklist=[
                pb.ChecklistItem(item="files_touched", status=pb.CHECKLIST_ITEM_STATUS_DONE, detail="1 file")
            ],
        )
        request = pb.UploadHandoffPackageRequest(
            worker_id="w1", node_id="n1", command_id=prepare.command_id, handoff_package=upload
        )
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await running.stub.UploadHandoffPackage(
                pb.UploadHandoffPackageRequest(worker_id="w2", node_id="n2", handoff_package=upload),
                metadata=running.worker("w2", "n2"),
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ready = (await running.stub.UploadHandoffPackage(request, metadata=running.worker())).handoff_package
        assert ready.package_status == pb.PACKAGE_STATUS_READY and list(ready.critical_files) == [
            "src/parser.py"
        ]
        assert ready.checklist[0].status == pb.CHECKLIST_ITEM_STATUS_DONE
        assert ready.checklist[1].status == pb.CHECKLIST_ITEM_STATUS_MISSING
        again = (await running.stub.UploadHandoffPackage(request, metadata=running.worker())).handoff_package
        assert again.ready_at == ready.ready_at

        await running.publish(budget_payload(4, "critical", 10))
        frozen = await next_commands(running, 4)
        assert frozen[-1].command_type == pb.COMMAND_TYPE_FREEZE_CONTEXT_GROWTH
        assert sum(c.command_type == pb.COMMAND_TYPE_PREPARE_HANDOFF for c in frozen) == 1

        await running.publish(budget_payload(5, "safe", 95, compactions=1))
        alerts = (
            await running.stub.ListHandoffAlerts(
                pb.ListHandoffAlertsRequest(thread_id="t1"), metadata=running.client()
            )
        ).alerts
        assert list(alerts) == []

        await running.publish(budget_payload(6, "safe", 80, compactions=2))
        alerts = (
            await running.stub.ListHandoffAlerts(
                pb.ListHandoffAlertsRequest(thread_id="t1"), metadata=running.client()
            )
        ).alerts
        assert [(a.alert_type, a.alert_status, a.compaction_count) for a in alerts] == [
            ("handoff_missing", "opened", 2)
        ]
        reasons = [p["reason"] for _, p in await events_of(running, "thread.handoff.required")]
        assert reasons == ["context_urgent", "handoff_missing"]

        consumed = await consume(running, ready.handoff_package_id)
        assert consumed.package_status == pb.PACKAGE_STATUS_CONSUMED
        assert consumed.consumed_by_thread_id == schedule.relay_thread_id
        with pytest.raises(grpc.aio.AioRpcError) as twice:
            await consume(running, ready.handoff_package_id)
        assert twice.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await running.stub.GetHandoffPackage(
                pb.GetHandoffPackageRequest(handoff_package_id="nope"), metadata=running.client()
            )
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert reason_of(rpc_status.from_call(unknown.value)) == "PACKAGE_NOT_FOUND"


async def test_commands_are_redelivered_until_acked_and_acks_are_checked(
    database_target: DatabaseTarget,
) -> None:
    async with running_scheduler(database_target) as running:
        await running.publish(budget_payload(1, "critical", 10))
        first = await next_commands(running, 4)
        assert [c.delivery_count for c in first] == [1, 1, 1, 1]
        again = await next_commands(running, 4)
        assert [c.command_id for c in again] == [c.command_id for c in first]
        assert [c.delivery_count for c in again] == [2, 2, 2, 2]

        with pytest.raises(grpc.aio.AioRpcError) as other:
            await running.stub.AckWorkerCommand(
                pb.AckWorkerCommandRequest(
                    worker_id="w9",
                    node_id="n9",
                    command_id=first[0].command_id,
                    outcome=pb.COMMAND_OUTCOME_DONE,
                ),
                metadata=running.worker("w9", "n9"),
            )
        assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as mismatch:
            await running.stub.AckWorkerCommand(
                pb.AckWorkerCommandRequest(
                    worker_id="w1",
                    node_id="n1",
                    command_id=first[0].command_id,
                    outcome=pb.COMMAND_OUTCOME_DONE,
                ),
                metadata=running.worker("w2", "n1"),
            )
        assert mismatch.value.code() == grpc.StatusCode.PERMISSION_DENIED
        for command in first[:3]:
            acked = (
                await running.stub.AckWorkerCommand(
                    pb.AckWorkerCommandRequest(
                        worker_id="w1",
                        node_id="n1",
                        command_id=command.command_id,
                        outcome=pb.COMMAND_OUTCOME_DONE,
                    ),
                    metadata=running.worker(),
                )
            ).command
            assert acked.command_status == pb.COMMAND_STATUS_ACKED
        remaining = await next_commands(running, 1)
        assert [c.command_id for c in remaining] == [first[3].command_id]


async def test_a_stopping_scheduler_ends_the_command_stream_and_keeps_what_was_not_acked(
    database_target: DatabaseTarget,
) -> None:
    async with running_scheduler(database_target) as running:
        await running.publish(budget_payload(1, "critical", 10))
        call = running.stub.StreamWorkerCommands(
            pb.StreamWorkerCommandsRequest(worker_id="w1", node_id="n1"), metadata=running.worker("w1", "n1")
        )
        delivered = []
        async with asyncio.timeout(10):
            while len(delivered) < 4:
                delivered.append((await call.read()).command)
            # The process begins to stop (ServiceHost's on_draining): the stream ends, with OK,
            # instead of holding the shutdown for its grace period.
            running.app.event_log.end_followers()
            assert await call.read() is grpc.aio.EOF
            assert await call.code() is grpc.StatusCode.OK
        # Nothing was acknowledged: every command waits for the next stream (another replica's).
        handlers = running.app.handlers
        async with handlers.database.read() as connection:
            waiting = await handlers.repository.due_commands(
                connection, "w1", "n1", utc_now(), include_delivered=True
            )
        assert [c.command_id for c in waiting] == [c.command_id for c in delivered]


async def test_restart_mid_stream_loses_and_repeats_nothing(database_target: DatabaseTarget) -> None:
    from tests.integration.scheduler.harness import BudgetStreamStandIn, start_upstream

    upstream = BudgetStreamStandIn()
    upstream_server, port = await start_upstream(upstream)
    try:
        async with running_scheduler(database_target, upstream, port) as running:
            await running.publish(budget_payload(1, "urgent", 30))
        await upstream.publish(budget_payload(2, "critical", 10))
        await upstream.publish(budget_payload(3, "safe", 90, compactions=1))
        async with running_scheduler(database_target, upstream, port) as running:
            await running.app.consumer.wait_for(3)
            await running.app.event_log.refresh()
            assert upstream.opened_after == [0, 1]
            commands = await next_commands(running, 5)
            types = [c.command_type for c in commands]
            assert types.count(pb.COMMAND_TYPE_PREPARE_HANDOFF) == 2
            assert len({c.command_id for c in commands}) == 5
            alerts = (
                await running.stub.ListHandoffAlerts(
                    pb.ListHandoffAlertsRequest(open_only=True), metadata=running.client()
                )
            ).alerts
            assert len(alerts) == 1
    finally:
        await upstream_server.stop(0)


async def test_ranking_choice_and_master_flags(database_target: DatabaseTarget) -> None:
    async with running_scheduler(database_target) as running:
        await running.publish(budget_payload(1, "safe", 90, thread_id="healthy"))
        await running.publish(
            budget_payload(1, "critical", 12, thread_id="low", must_finish_reason="uncommitted changes")
        )
        await running.publish(budget_payload(1, "watch", 45, thread_id="mid"))
        ranked = await running.stub.RankThreads(
            pb.RankThreadsRequest(project_id="p1"), metadata=running.client()
        )
        assert [t.thread_id for t in ranked.ranked_threads] == ["low", "mid", "healthy"]
        assert "unsolidified patch" in ranked.ranked_threads[0].reasons
        assert ranked.strategy_summary.endswith("New work goes to healthy.")

        flagged = await running.stub.SetMustFinishBeforeCompaction(
            pb.SetMustFinishBeforeCompactionRequest(
                thread_id="healthy",
                must_finish_before_compaction=True,
                reason="key decision not in project memory",
            ),
            metadata=running.client(),
        )
        assert flagged.thread_schedule.must_finish_before_compaction
        choice = await running.stub.ChooseThreadForWork(
            pb.ChooseThreadForWorkRequest(project_id="p1"), metadata=running.client()
        )
        assert choice.thread_id == "mid" and not choice.new_thread_needed

        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await running.stub.SetMustFinishBeforeCompaction(
                pb.SetMustFinishBeforeCompactionRequest(thread_id="mid", must_finish_before_compaction=True),
                metadata=running.client(),
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await running.stub.GetThreadSchedule(
                pb.GetThreadScheduleRequest(thread_id="ghost"), metadata=running.client()
            )
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert reason_of(rpc_status.from_call(unknown.value)) == "THREAD_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await running.stub.RankThreads(pb.RankThreadsRequest())
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

        current = (
            await running.stub.RankThreads(pb.RankThreadsRequest(project_id="p1"), metadata=running.client())
        ).strategy_summary
        assert current.startswith("3 threads: 1 critical, 1 watch, 1 safe.")
        assert current.endswith("New work goes to mid.")
        strategies = await strategy_events_until(running, current)
        assert strategies[-1][1]["project_id"] == "p1"
        assert strategies[-1][1]["ranked_thread_ids"] == ["low", "mid", "healthy"]
        assert strategies[-1][1]["new_work_thread_id"] == "mid"


async def schedule_of(running: Running, thread_id: str = "t1") -> pb.ThreadSchedule:
    """GetThreadSchedule of a thread."""
    response = await running.stub.GetThreadSchedule(
        pb.GetThreadScheduleRequest(thread_id=thread_id), metadata=running.client()
    )
    return response.thread_schedule


async def upload(running: Running, prepare: pb.WorkerCommand, **package: object) -> pb.HandoffPackage:
    """Uploads the package `prepare` asked for, as the thread's worker does."""
    request = pb.UploadHandoffPackageRequest(
        worker_id="w1",
        node_id="n1",
        command_id=prepare.command_id,
        handoff_package=pb.HandoffPackage(handoff_package_id=prepare.handoff_package_id, **package),  # type: ignore[arg-type]
    )
    return (await running.stub.UploadHandoffPackage(request, metadata=running.worker())).handoff_package


async def test_a_compaction_ends_the_threads_handoff_cycle_and_leaves_the_package_as_it_was(
    database_target: DatabaseTarget,
) -> None:
    """Ready package, then a compaction: the thread presents no current package any more, the
    package keeps its status and can still be read and consumed, `thread.handoff.closed` says so;
    a draft a compaction closed that becomes ready later is not the thread's package again."""
    async with running_scheduler(database_target) as running:
        await running.publish(budget_payload(1, "urgent", 30))
        prepare = (await next_commands(running, 3))[-1]
        ready = await upload(
            running,
            prepare,
            checklist=[
                pb.ChecklistItem(item="files_touched", status=pb.CHECKLIST_ITEM_STATUS_DONE, detail="1 file"),
                pb.ChecklistItem(
                    item="last_test_run", status=pb.CHECKLIST_ITEM_STATUS_MISSING, detail="no test ran"
                ),
            ],
        )
        assert (await schedule_of(running)).current_package.handoff_package_id == ready.handoff_package_id
        (_, ready_event), *_ = await events_of(running, "thread.handoff.ready")
        assert ready_event["checklist_details"] == {item.item: item.detail for item in ready.checklist}
        assert ready_event["checklist_details"]["files_touched"] == "1 file"
        assert ready_event["current_for_thread"] is True

        await running.publish(budget_payload(2, "safe", 95, compactions=1))

        after = await schedule_of(running)
        assert not after.HasField("current_package") and after.relay_thread_id == ""
        package = (
            await running.stub.GetHandoffPackage(
                pb.GetHandoffPackageRequest(handoff_package_id=ready.handoff_package_id),
                metadata=running.client(),
            )
        ).handoff_package
        assert package.package_status == pb.PACKAGE_STATUS_READY and package.ready_at == ready.ready_at
        closed = await events_of(running, "thread.handoff.closed")
        assert [
            (p["handoff_package_id"], p["package_status"], p["reason"], p["compaction_count"])
            for _, p in closed
        ] == [(ready.handoff_package_id, "ready", "compaction", 1)]
        schedules = await events_of(running, "thread.schedule.updated")
        assert schedules[-1][1]["handoff_package_id"] == "" and schedules[-1][1]["package_status"] is None
        reasons = [p["reason"] for _, p in await events_of(running, "thread.handoff.required")]
        assert reasons == ["context_urgent"]  # the ready package covered the compaction

        consumed = await consume(running, ready.handoff_package_id)
        assert consumed.package_status == pb.PACKAGE_STATUS_CONSUMED
        assert not (await schedule_of(running)).HasField("current_package")

        await running.publish(budget_payload(3, "urgent", 30, compactions=1))
        second = (await next_commands(running, 6))[-1]
        assert second.command_type == pb.COMMAND_TYPE_PREPARE_HANDOFF
        assert second.handoff_package_id != ready.handoff_package_id
        assert (await schedule_of(running)).current_package.package_status == pb.PACKAGE_STATUS_DRAFT
        await running.publish(budget_payload(4, "safe", 97, compactions=2))
        late = await upload(running, second, summary_text="written after the compaction")

        assert late.package_status == pb.PACKAGE_STATUS_READY
        assert not (await schedule_of(running)).HasField("current_package")
        ready_events = [p for _, p in await events_of(running, "thread.handoff.ready")]
        assert [(p["handoff_package_id"], p["current_for_thread"]) for p in ready_events] == [
            (ready.handoff_package_id, True),
            (second.handoff_package_id, False),
        ]
        closed = await events_of(running, "thread.handoff.closed")
        assert [(p["handoff_package_id"], p["package_status"]) for _, p in closed][-1] == (
            second.handoff_package_id,
            "draft",
        )
