"""CB-17 ranking order, its reasons and summary, and the choice of a thread for new work."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from services.scheduler.domain.model import AT_RISK_MARKER, Level, PackageStatus, ThreadState
from services.scheduler.domain.ranking import choose_thread_for_work, rank_threads, strategy_summary

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
IDLE = timedelta(minutes=2)


def thread(thread_id: str, level: Level | None, pct: float, **facts: object) -> ThreadState:
    return ThreadState(thread_id=thread_id, project_id="p1", level=level, remaining_pct=pct, **facts)  # type: ignore[arg-type]


def test_levels_then_must_finish_then_expected_compaction_then_importance() -> None:
    ranked = rank_threads(
        [
            thread("safe", Level.SAFE, 90),
            thread("watch-late", Level.WATCH, 45, compaction_expected_at=NOW + timedelta(hours=2)),
            thread("watch-soon", Level.WATCH, 50, compaction_expected_at=NOW + timedelta(minutes=20)),
            thread("watch-important", Level.WATCH, 55, task_importance=50),
            thread(
                "watch-must", Level.WATCH, 58, master_must_finish=True, master_must_finish_reason="decision"
            ),
            thread("critical", Level.CRITICAL, 10),
            thread("unknown", None, 100),
            thread("urgent", Level.URGENT, 30),
        ]
    )
    assert [item.state.thread_id for item in ranked] == [
        "critical",
        "urgent",
        "watch-must",
        "watch-soon",
        "watch-late",
        "watch-important",
        "safe",
        "unknown",
    ]
    assert [item.rank for item in ranked] == list(range(1, 9))
    assert ranked[0].reasons == ("level critical (10.0 % left)", "wrap-up and handoff first")
    assert ranked[2].reasons[1] == "must finish before compaction: decision"


def test_critical_tie_break_patch_then_tests_then_hardware() -> None:
    ranked = rank_threads(
        [
            thread("hardware", Level.CRITICAL, 20, hardware_test_in_progress=True),
            thread("tests", Level.CRITICAL, 20, unsolidified_test_results=True),
            thread("plain", Level.CRITICAL, 5),
            thread(
                "patch",
                Level.CRITICAL,
                20,
                reported_must_finish=True,
                reported_must_finish_reason="uncommitted changes in 3 files",
            ),
        ]
    )
    assert [item.state.thread_id for item in ranked] == ["patch", "tests", "hardware", "plain"]
    assert "unsolidified patch" in ranked[0].reasons


def test_summary_names_first_thread_and_new_work() -> None:
    states = [thread("a", Level.CRITICAL, 10), thread("b", Level.SAFE, 80)]
    choice = choose_thread_for_work(states, NOW, IDLE)
    text = strategy_summary(rank_threads(states), choice)
    assert text.startswith("2 threads: 1 critical, 1 safe. Wrap up and hand off a first")
    assert text.endswith("New work goes to b.")
    assert strategy_summary([]) == "No threads report a context budget yet."


def test_new_work_prefers_safe_then_idle_and_never_critical_or_must_finish() -> None:
    states = [
        thread("critical", Level.CRITICAL, 5),
        thread("must", Level.SAFE, 99, reported_must_finish=True, reported_must_finish_reason="tests"),
        thread("watch-idle", Level.WATCH, 50),
        thread("safe-busy", Level.SAFE, 95, last_activity_at=NOW - timedelta(seconds=30)),
        thread("safe-idle", Level.SAFE, 70, last_activity_at=NOW - timedelta(minutes=10)),
    ]
    assert choose_thread_for_work(states, NOW, IDLE).thread_id == "safe-idle"
    assert choose_thread_for_work(states, NOW, IDLE, frozenset({"safe-idle"})).thread_id == "safe-busy"
    only_watch = choose_thread_for_work(states, NOW, IDLE, frozenset({"safe-idle", "safe-busy"}))
    assert only_watch.thread_id == "watch-idle" and not only_watch.new_thread_needed
    none = choose_thread_for_work(states[:2], NOW, IDLE)
    assert none.new_thread_needed and none.thread_id == "" and "none of 2" in none.reason
    assert choose_thread_for_work([], NOW, IDLE).reason == "new thread needed: the project has no thread yet"


def test_new_work_never_goes_to_a_thread_wrapping_up_for_a_handoff() -> None:
    near = thread("near", Level.SAFE, 90, commands_sent=frozenset({AT_RISK_MARKER, "prepare_handoff"}))
    states = [near, thread("other", Level.WATCH, 40)]

    assert near.wrapping_up and not states[1].wrapping_up
    assert choose_thread_for_work(states, NOW, IDLE).thread_id == "other"
    alone = choose_thread_for_work([near], NOW, IDLE)
    assert alone.new_thread_needed and "handoff under way" in alone.reason
    after_compaction = replace(near, commands_sent=frozenset())  # a new epoch
    assert choose_thread_for_work([after_compaction], NOW, IDLE).thread_id == "near"
    assert strategy_summary(rank_threads([near]), alone) == (
        "1 thread: 1 safe. Compaction is near for near: wrap up and hand off before it; keep stage "
        "summaries fresh. New work needs a new thread."
    )


def test_summary_of_a_watch_thread_says_whether_its_package_is_ready() -> None:
    drafting = strategy_summary(
        rank_threads([thread("w", Level.WATCH, 45, current_package_status=PackageStatus.DRAFT)])
    )
    ready = strategy_summary(
        rank_threads([thread("w", Level.WATCH, 45, current_package_status=PackageStatus.READY)])
    )
    assert drafting == "1 thread: 1 watch. Send w less long context; its handoff is being prepared."
    assert ready == "1 thread: 1 watch. Send w less long context; its handoff package is ready."
