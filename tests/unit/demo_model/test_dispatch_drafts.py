"""The demo model's dispatch-plan answers, read back by Boss's own validation: its drafts are a
valid plan for exactly the targets asked, the malformed-plan marker gives a wrong plan Boss refuses,
`[[demo:nonsense]]` is not JSON, and its summary names every failed thread."""

from __future__ import annotations

import json

from demo_model.chat_completions import plan_chat_completion
from demo_model.dispatch_drafts import MALFORMED_PLAN_MARKER
from services.conversations.groups.drafting import draft_request, read_drafts
from services.conversations.groups.plans import DRAFTED_BY_MODEL, DRAFTED_BY_USER_TEXT
from services.conversations.groups.summary import SUMMARY_SYSTEM
from services.conversations.master.model import ChatMessage

TARGETS = [
    {"target_id": "t1", "thread_title": "north-line", "codex_folder_ref": "/d/north"},
    {"target_id": "t2", "thread_title": "south-line", "codex_folder_ref": "/d/south"},
]


def answer_to(messages: list[ChatMessage], json_answer: bool = True) -> str:
    body: dict[str, object] = {
        "model": "boss-demo-model",
        "messages": [{"role": m.role, "content": m.content} for m in messages],
    }
    if json_answer:
        body["response_format"] = {"type": "json_object"}
    plan = plan_chat_completion(body)
    assert plan.status == 200 and isinstance(plan.body, dict)
    return str(plan.body["choices"][0]["message"]["content"])


def test_its_drafts_are_a_valid_plan_for_every_target() -> None:
    text = answer_to(draft_request("run the tests", TARGETS))

    drafts = read_drafts(text, ["t1", "t2"])

    assert drafts.drafted_by == DRAFTED_BY_MODEL
    assert drafts.instructions["t1"] == (
        "run the tests\n\n(Demo model (not a real model) drafted this for north-line.)"
    )
    assert drafts.instructions["t2"].endswith("drafted this for south-line.)")


def test_the_malformed_plan_marker_gives_a_plan_boss_refuses() -> None:
    text = answer_to(draft_request(f"run the tests {MALFORMED_PLAN_MARKER}", TARGETS))

    drafts = read_drafts(text, ["t1", "t2"])

    assert json.loads(text)["instructions"][0]["target_id"] == "t999"
    assert drafts.drafted_by == DRAFTED_BY_USER_TEXT
    assert "it names a target the plan does not have ('t999')" in drafts.note


def test_nonsense_is_not_json() -> None:
    text = answer_to(draft_request("run the tests [[demo:nonsense]]", TARGETS))

    assert read_drafts(text, ["t1", "t2"]).note.startswith(
        "the master model's draft was not used (its answer is not JSON)"
    )


def test_its_summary_names_every_failed_thread() -> None:
    facts = {
        "message": "run the tests",
        "results": [
            {
                "thread_title": "north-line",
                "status": "completed",
                "failure_kind": "",
                "answer": "42 passed\nmore",
            },
            {
                "thread_title": "south-line",
                "status": "failed",
                "failure_kind": "model_error",
                "answer": "...",
            },
        ],
    }
    text = answer_to([ChatMessage("system", SUMMARY_SYSTEM), ChatMessage("user", json.dumps(facts))], False)

    assert text == (
        "Demo model (not a real model), summarising: 1 of 2 threads answered.\n"
        "north-line: 42 passed\n"
        "Failed: south-line (model_error)."
    )
