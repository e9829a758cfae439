"""The master model's part in a dispatch plan: its drafted instructions are kept only when exactly
right (anything else falls back to the user's text and says why), and the summary names every
failure, the model's or the plain one; dispatch results are named by their thread."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from services.conversations.chat.domain import ChatTask, StatusReport
from services.conversations.domain.model import ThreadBudget
from services.conversations.groups.choice import ChosenTarget, MemberThread
from services.conversations.groups.drafting import DRAFTS_TAG, draft_request, read_drafts
from services.conversations.groups.plans import (
    DRAFTED_BY_MODEL,
    DRAFTED_BY_USER_TEXT,
    DispatchPlan,
    Drafts,
    confirm,
    new_plan,
)
from services.conversations.groups.summary import (
    SUMMARY_TAG,
    TargetResult,
    dispatch_result_message,
    plain_summary,
    read_summary,
    summary_request,
)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
TTL = timedelta(minutes=30)
IDS = ["t1", "t2"]


def good_answer(**overrides: object) -> str:
    value: dict[str, object] = {
        "instructions": [
            {"target_id": "t1", "instruction": "Run the north-line tests"},
            {"target_id": "t2", "instruction": "Run the south-line tests"},
        ],
        **overrides,
    }
    return json.dumps(value)


def test_a_valid_answer_becomes_each_targets_instruction() -> None:
    drafts = read_drafts(good_answer(), IDS)

    assert drafts == Drafts(
        {"t1": "Run the north-line tests", "t2": "Run the south-line tests"}, DRAFTED_BY_MODEL
    )


def test_a_json_object_in_a_markdown_fence_is_accepted() -> None:
    drafts = read_drafts(f"```json\n{good_answer()}\n```", IDS)

    assert drafts.drafted_by == DRAFTED_BY_MODEL and drafts.instructions["t2"] == "Run the south-line tests"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("", "it answered nothing"),
        ("Sure! Here is the plan: run the tests.", "its answer is not JSON"),
        ("[1, 2]", 'its answer is not an object with an "instructions" list'),
        (
            json.dumps({"instructions": {"t1": "x"}}),
            'its answer is not an object with an "instructions" list',
        ),
        (json.dumps({"instructions": ["t1"]}), "an entry of its instructions is not an object"),
        (
            json.dumps({"instructions": [{"target_id": "t7", "instruction": "x"}]}),
            "it names a target the plan does not have ('t7')",
        ),
        (
            json.dumps(
                {
                    "instructions": [
                        {"target_id": "t1", "instruction": "a"},
                        {"target_id": "t1", "instruction": "b"},
                    ]
                }
            ),
            "it gives target t1 two instructions",
        ),
        (
            json.dumps({"instructions": [{"target_id": "t1", "instruction": "  "}]}),
            "its instruction for t1 is empty",
        ),
        (
            json.dumps({"instructions": [{"target_id": "t1", "instruction": 3}]}),
            "its instruction for t1 is empty",
        ),
        (
            json.dumps({"instructions": [{"target_id": "t1", "instruction": "x" * 100_001}]}),
            "its instruction for t1 is over 100,000 characters",
        ),
        (
            json.dumps({"instructions": [{"target_id": "t1", "instruction": "a\x00b"}]}),
            "its instruction for t1 holds a NUL character",
        ),
        (
            json.dumps({"instructions": [{"target_id": "t1", "instruction": "only one"}]}),
            "it gives no instruction for t2",
        ),
    ],
)
def test_an_unusable_answer_falls_back_to_the_users_text_and_says_why(answer: str, problem: str) -> None:
    drafts = read_drafts(answer, IDS)

    assert drafts.drafted_by == DRAFTED_BY_USER_TEXT and dict(drafts.instructions) == {}
    assert drafts.note == (
        f"the master model's draft was not used ({problem}); each thread gets your message as you wrote it"
    )


def test_the_drafting_request_is_tagged_and_carries_the_message_and_targets() -> None:
    messages = draft_request("run the tests", [{"target_id": "t1", "thread_title": "north"}])

    assert messages[0].role == "system" and messages[0].content.startswith(DRAFTS_TAG + "\n")
    assert json.loads(messages[1].content) == {
        "message": "run the tests",
        "targets": [{"target_id": "t1", "thread_title": "north"}],
    }


# --- results and the summary ------------------------------------------------------------------------


def confirmed_plan() -> DispatchPlan:
    thread_ids = ("th-north", "th-south")
    chosen = [
        ChosenTarget(
            "member", tid, tid.removeprefix("th-"), "mac-01", f"/d/{tid}", f"0199-{tid}", "safe", 80.0, "safe"
        )
        for tid in thread_ids
    ]
    proposed = new_plan(
        "plan-1", "local", "group-1", "msg-1", "run the tests", chosen, [], Drafts({}, "user_text"), T0, TTL
    )
    budget = ThreadBudget(80.0, "safe", "mac-01", T0, T0)
    members = {
        tid: MemberThread(tid, tid.removeprefix("th-"), "mac-01", f"/d/{tid}", f"0199-{tid}", budget=budget)
        for tid in thread_ids
    }
    return confirm(proposed, [], members, iter(["task-1", "task-2"]), T0)


def results() -> list[TargetResult]:
    plan = confirmed_plan()
    north, south = plan.dispatched
    return [
        TargetResult(north, "completed", "", "All 42 tests pass.\n\n42 passed in 0.41s"),
        TargetResult(
            south, "failed", "model_error", "south: The model answered Codex on mac-01 with an error."
        ),
    ]


def test_the_plain_summary_lists_every_thread_and_names_the_failures() -> None:
    plan = confirmed_plan()

    text = plain_summary(plan, results())

    assert text == (
        "Summary of the dispatch plan plan-1: 1 of 2 threads answered.\n"
        "- north: All 42 tests pass. 42 passed in 0.41s\n"
        "- south: failed (model_error)\n"
        "Failed: south (south: The model answered Codex on mac-01 with an error.)."
    )


def test_a_models_summary_is_kept_and_a_failure_it_does_not_name_is_added() -> None:
    named = read_summary("north passes; south failed with a model error.", results())
    unnamed = read_summary("Everything went fine.", results())

    assert named == "north passes; south failed with a model error."
    assert unnamed == (
        "Everything went fine.\nFailed: south (south: The model answered Codex on mac-01 with an error.)."
    )
    assert read_summary("   ", results()) is None
    assert read_summary("bad\x00text", results()) is None


def test_the_summary_request_is_tagged_and_carries_each_result() -> None:
    plan = confirmed_plan()

    messages = summary_request(plan, results())

    assert messages[0].content.startswith(SUMMARY_TAG + "\n")
    facts = json.loads(messages[1].content)
    assert facts["message"] == "run the tests"
    assert [(r["thread_title"], r["status"], r["failure_kind"]) for r in facts["results"]] == [
        ("north", "completed", ""),
        ("south", "failed", "model_error"),
    ]


def task(**fields: object) -> ChatTask:
    values: dict[str, object] = {
        "task_id": "task-1",
        "owner_id": "local",
        "task_type": "dispatch_execution",
        "status": "failed",
        "project_id": "group-1",
        "target_project_id": "group-1",
        "target_thread_id": "th-south",
        "device_id": "mac-01",
        "codex_folder_ref": "/d/south",
        "codex_thread_ref": "0199-south",
        "request_message_id": "msg-1",
        "created_at": T0,
        "updated_at": T0,
        **fields,
    }
    return ChatTask(**values)  # type: ignore[arg-type]


def test_a_dispatch_result_is_named_by_its_thread() -> None:
    reply = dispatch_result_message(
        task(status="completed"), StatusReport("task-1", "local", "completed", reply_text="done"), "south"
    )
    failed = dispatch_result_message(
        task(), StatusReport("task-1", "local", "failed", failure_kind="session_not_found"), "south"
    )

    assert (reply.author_kind, reply.thread_id, reply.text) == ("thread", "th-south", "done")
    assert (failed.author_kind, failed.thread_id) == ("system", "th-south")
    assert failed.text.startswith("south: Codex on mac-01 could not find this thread's session")
