"""The master agent's pure parts: the state it is told (JSON and words), its prompt for both
backends, its settings, what its model's answers become, and its ring under openai_api."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.chat.domain import ChatTask, StatusReport
from services.conversations.chat.wording import result_message
from services.conversations.domain.model import (
    MAX_MESSAGE_LENGTH,
    ThreadBudget,
    ThreadView,
    master_project_id,
)
from services.conversations.master.answers import (
    TRUNCATED_NOTE,
    conversation_ring,
    level_of,
    outcome_of_answer,
    outcome_of_failure,
    outcome_of_loss,
    ring_follows_main_thread,
)
from services.conversations.master.model import ModelAnswer
from services.conversations.master.prompt import (
    MASTER_CHAT_TAG,
    MAX_HISTORY_MESSAGES,
    QUESTION_CLOSE,
    QUESTION_OPEN,
    STATE_CLOSE,
    STATE_OPEN,
    HistoryMessage,
    chat_messages,
    codex_instruction,
    system_prompt,
    thread_line,
)
from services.conversations.master.settings import MasterSettings, MasterSettingsError
from services.conversations.master.state import (
    MAX_THREADS,
    LastMessage,
    OpenTask,
    ProjectState,
    SystemState,
    ThreadState,
    preview,
    state_payload,
)

NOW = datetime(2026, 3, 25, 10, 4, 5, tzinfo=UTC)


def thread(
    thread_id: str,
    title: str,
    pct: float | None,
    level: str = "safe",
    *,
    handoff: str = "none",
    **budget: object,
) -> ThreadState:
    reading = None
    if pct is not None:
        reading = ThreadBudget(pct, level, "node-a", NOW, NOW, **budget)  # type: ignore[arg-type]
    return ThreadState(view=ThreadView(thread_id, title, "node-a", "worker-a", reading, handoff))


def payload_of(text: str) -> dict[str, object]:
    start = text.index(STATE_OPEN) + len(STATE_OPEN)
    return dict(json.loads(text[start : text.index(STATE_CLOSE)]))


def test_the_state_lists_threads_most_at_risk_first_with_their_true_figures() -> None:
    state = SystemState(
        NOW,
        (
            thread("th-safe", "billing-api", 72.0, compaction_expected_at=NOW + timedelta(minutes=25)),
            thread("th-soon", "docs-site", 64.0, compaction_expected_at=NOW + timedelta(minutes=4)),
            thread("th-quiet", "docs", None),
            thread(
                "th-crit", "parser", 18.4, "critical", must_finish_before_compaction=True, compaction_count=2
            ),
            thread("th-watch", "ios-sync-client", 45.9, "watch", handoff="required"),
        ),
        (ProjectState("proj-1", "parser", "single_device", ("th-crit",)),),
    )

    payload = state_payload(state)

    assert [t["thread_id"] for t in payload["threads"]] == [
        "th-crit",
        "th-watch",
        "th-soon",
        "th-safe",
        "th-quiet",
    ]
    # A safe thread is close to compaction only when its estimate is within the 10-minute horizon.
    assert payload["closest_to_compaction"] == ["th-crit", "th-watch", "th-soon"]
    assert payload["next_compaction_risk_thread_id"] == "th-crit"
    assert payload["threads_requiring_handoff"] == ["th-crit", "th-watch"]
    critical = payload["threads"][0]
    assert critical["budget"] == {
        "reported": True,
        "percent": 18,
        "remaining_pct": 18.4,
        "level": "critical",
        "must_finish_before_compaction": True,
        "must_finish_reason": "",
        "compaction_expected_at": None,
        "estimated_remaining_turns": None,
        "compaction_count": 2,
        "last_compaction_at": None,
        "updated_at": "2026-03-25T10:04:05Z",
    }
    assert payload["threads"][1]["budget"]["percent"] == 45  # rounded down, as on every ring
    assert payload["threads"][4]["budget"] == {"reported": False}
    assert payload["projects"] == [
        {
            "project_id": "proj-1",
            "title": "parser",
            "type": "single_device",
            "thread_ids": ["th-crit"],
            "strategy_summary": "",
        }
    ]
    assert payload["schema"] == "boss.master_state.v1" and payload["captured_at"] == "2026-03-25T10:04:05Z"


def test_a_thread_line_says_what_it_is_doing() -> None:
    busy = ThreadState(
        view=ThreadView(
            "th-1",
            "parser",
            "node-a",
            "w",
            ThreadBudget(
                22.0,
                "critical",
                "node-a",
                NOW,
                NOW,
                must_finish_before_compaction=True,
                must_finish_reason="uncommitted patch",
                compaction_count=1,
                last_compaction_at=NOW - timedelta(hours=1),
                estimated_remaining_turns=3,
            ),
            "required",
        ),
        handoff_reason="its budget is critical (22 % left)",
        open_tasks=(OpenTask("task-1", "conversation_reply", "running", "fix the flaky parser test", NOW),),
    )

    assert thread_line(busy) == (
        '- "parser" (th-1) on node-a: 22 % left, critical; must finish before compaction (uncommitted '
        "patch); about 3 turns left; 1 compaction(s) so far, the last at 09:04:05 UTC; handoff required "
        '(its budget is critical (22 % left)); open tasks: running "fix the flaky parser test"'
    )
    assert thread_line(thread("th-2", "docs", None)) == (
        '- "docs" (th-2) on node-a: no context budget reported yet; no open task'
    )


def test_quoted_texts_are_cut_and_the_thread_list_is_bounded() -> None:
    long = "word " * 200
    assert preview(long) == ("word " * 40).strip() + "…" and len(preview(long)) <= 201
    many = SystemState(NOW, tuple(thread(f"th-{i:03}", f"t{i}", 80.0) for i in range(MAX_THREADS + 5)))
    payload = state_payload(many)
    assert (payload["threads_total"], payload["threads_described"]) == (MAX_THREADS + 5, MAX_THREADS)
    last = ThreadState(
        view=thread("th-1", "t", 80.0).view, last_message=LastMessage("thread", "done: " + long, NOW)
    )
    assert state_payload(SystemState(NOW, (last,)))["threads"][0]["last_message"]["text"].endswith("…")


def test_the_openai_prompt_is_system_then_history_then_the_question() -> None:
    state = SystemState(NOW, (thread("th-1", "parser", 30.0, "urgent"),))
    history = [HistoryMessage("system", "The master agent could not answer: ...")] + [
        HistoryMessage("user" if i % 2 == 0 else "master", f"message {i}") for i in range(30)
    ]

    messages = chat_messages(state, history, "which thread is close to compaction?")

    assert messages[0].role == "system" and messages[0].content.startswith(MASTER_CHAT_TAG + "\n")
    assert payload_of(messages[0].content)["threads"][0]["thread_id"] == "th-1"
    assert '- "parser" (th-1) on node-a: 30 % left, urgent; no open task' in messages[0].content
    assert "captured at 10:04:05 UTC" in messages[0].content
    middle = messages[1:-1]
    assert len(middle) == MAX_HISTORY_MESSAGES
    assert [(m.role, m.content) for m in middle[:2]] == [("user", "message 10"), ("assistant", "message 11")]
    assert (messages[-1].role, messages[-1].content) == ("user", "which thread is close to compaction?")


def test_the_codex_instruction_carries_the_state_and_the_question() -> None:
    state = SystemState(NOW, (thread("th-1", "parser", 30.0, "urgent"),))
    instruction = codex_instruction(state, "what is parser doing?")
    assert instruction.startswith(system_prompt(state))
    assert instruction.endswith(f"{QUESTION_OPEN}\nwhat is parser doing?\n{QUESTION_CLOSE}")


def test_settings_read_the_environment_and_name_the_bad_variable() -> None:
    settings = MasterSettings.from_environment(
        {
            "BOSS_MASTER_BACKEND": "openai_api",
            "BOSS_MASTER_OPENAI_BASE_URL": "http://127.0.0.1:8123/v1/",
            "BOSS_MASTER_OPENAI_API_KEY": "sk-secret-value",
            "BOSS_MASTER_MODEL": "gpt-5.5",
            "BOSS_MASTER_INLINE_WAIT_SECONDS": "2.5",
            "BOSS_MASTER_CONTEXT_WINDOW_TOKENS": "400000",
        }
    )
    assert (settings.base_url, settings.model, settings.inline_wait_seconds) == (
        "http://127.0.0.1:8123/v1",
        "gpt-5.5",
        2.5,
    )
    assert settings.context_window_tokens == 400_000 and settings.timeout_seconds == 60.0
    assert "sk-secret-value" not in repr(settings)
    assert MasterSettings.from_environment({}).backend == "none"
    for environment, variable in (
        ({"BOSS_MASTER_BACKEND": "gpt"}, "BOSS_MASTER_BACKEND"),
        ({"BOSS_MASTER_BACKEND": "openai_api", "BOSS_MASTER_MODEL": "m"}, "BOSS_MASTER_OPENAI_BASE_URL"),
        (
            {"BOSS_MASTER_BACKEND": "openai_api", "BOSS_MASTER_OPENAI_BASE_URL": "http://x/v1"},
            "BOSS_MASTER_MODEL",
        ),
        ({"BOSS_MASTER_INLINE_WAIT_SECONDS": "soon"}, "BOSS_MASTER_INLINE_WAIT_SECONDS"),
        ({"BOSS_MASTER_TIMEOUT_SECONDS": "0"}, "BOSS_MASTER_TIMEOUT_SECONDS"),
        ({"BOSS_MASTER_CONTEXT_WINDOW_TOKENS": "-5"}, "BOSS_MASTER_CONTEXT_WINDOW_TOKENS"),
    ):
        with pytest.raises(MasterSettingsError, match=variable):
            MasterSettings.from_environment(environment)


def test_an_answer_becomes_the_masters_message_or_says_why_not() -> None:
    replied = outcome_of_answer(ModelAnswer("  parser is closest  ", "m", 10, 5, 15))
    assert (replied.author_kind, replied.text, replied.status) == ("master", "parser is closest", "completed")
    empty = outcome_of_answer(ModelAnswer(" \n", "boss-demo-model"))
    assert (empty.author_kind, empty.status, empty.failure_kind) == ("system", "failed", "no_reply")
    assert "(boss-demo-model) answered with no text" in empty.text
    huge = outcome_of_answer(ModelAnswer("x\x00" * MAX_MESSAGE_LENGTH, "m"))
    assert (
        len(huge.text) == MAX_MESSAGE_LENGTH
        and huge.text.endswith(TRUNCATED_NOTE)
        and "\x00" not in huge.text
    )
    failed = outcome_of_failure("The model at http://m/v1 answered HTTP 500 (after one retry): it failed.")
    assert failed.text == (
        "The master agent could not answer: The model at http://m/v1 answered HTTP 500 (after one retry): it "
        "failed. Your message is kept; retry it when the model answers again."
    )
    lost = outcome_of_loss(NOW - timedelta(seconds=90), NOW)
    assert (lost.failure_kind, lost.status) == (
        "interrupted",
        "failed",
    ) and "started at 10:02:35 UTC" in lost.text


def test_the_openai_ring_is_the_share_of_the_window_the_last_answer_left() -> None:
    ring = conversation_ring(12_001, 32_000, NOW)
    assert ring is not None and (ring.visible, ring.percent, ring.level, ring.thread_id) == (
        True,
        62,
        "safe",
        "",
    )
    assert conversation_ring(32_000 - 7_999, 32_000, NOW).percent == 24  # type: ignore[union-attr]
    assert conversation_ring(40_000, 32_000, NOW).percent == 0  # type: ignore[union-attr]
    assert conversation_ring(1_000, None, NOW) is None and conversation_ring(0, 32_000, NOW) is None
    assert [level_of(p) for p in (60, 59.9, 40, 39.9, 25, 24.9)] == [
        "safe",
        "watch",
        "watch",
        "urgent",
        "urgent",
        "critical",
    ]
    assert ring_follows_main_thread("master_codex_node") and ring_follows_main_thread("none")
    assert not ring_follows_main_thread("openai_api")


def test_a_reply_from_the_masters_codex_thread_is_the_masters_message() -> None:
    master = master_project_id("local")
    task = ChatTask(
        "task-1",
        "local",
        "conversation_reply",
        "running",
        master,
        master,
        "th-m",
        "node-a",
        "/w",
        "ref",
        "msg-1",
        NOW,
        NOW,
    )
    report = StatusReport("task-1", "local", "completed", reply_text="parser is closest")
    assert (result_message(task, report).author_kind, result_message(task, report).thread_id) == (
        "master",
        "th-m",
    )
    thread_task = ChatTask(
        "task-2",
        "local",
        "conversation_reply",
        "running",
        "proj-1",
        "proj-1",
        "th-1",
        "node-a",
        "/w",
        "ref",
        "m",
        NOW,
        NOW,
    )
    assert result_message(thread_task, report).author_kind == "thread"
