"""The demo model's Chat Completions answers: the master agent's true answers from Boss's state (also
through Codex), the failure markers, the registry of chat tasks, and the conventions it shares with
Boss's prompt."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from demo_model import chat_tasks, master_answers
from demo_model.chat_completions import MALFORMED_BODY, NONSENSE_TEXT, plan_chat_completion, tokens
from demo_model.chat_tasks import ChatRequest, chat_task, handler_for
from demo_model.responses import plan_response
from demo_model.usage import UsageModel
from services.conversations.domain.model import ThreadBudget, ThreadView
from services.conversations.master import prompt
from services.conversations.master.state import LastMessage, OpenTask, SystemState, ThreadState

NOW = datetime(2026, 3, 25, 10, 4, 5, tzinfo=UTC)


def state() -> SystemState:
    def thread(thread_id: str, title: str, pct: float, level: str, **extra: Any) -> ThreadState:
        view = ThreadView(thread_id, title, "node-a", "w", ThreadBudget(pct, level, "node-a", NOW, NOW))
        return ThreadState(view=view, **extra)

    return SystemState(
        NOW,
        (
            thread("th-billing", "billing-api", 72.0, "safe"),
            thread(
                "th-parser",
                "parser",
                18.4,
                "critical",
                open_tasks=(OpenTask("task-1", "conversation_reply", "running", "fix the flaky test", NOW),),
                last_message=LastMessage("user", "please [[demo:http500]] fail", NOW),
            ),
            thread("th-ios", "ios-sync-client", 45.0, "watch"),
        ),
    )


def body(question: str, **fields: Any) -> dict[str, Any]:
    messages = prompt.chat_messages(state(), [], question)
    return {
        "model": "boss-demo-model",
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        **fields,
    }


def text_of(plan_body: Any) -> str:
    return str(plan_body["choices"][0]["message"]["content"])


def test_the_master_names_the_thread_closest_to_compaction() -> None:
    plan = plan_chat_completion(body("Which thread is close to compaction?"))
    assert plan.status == 200 and plan.request is not None and plan.request.tag == "master_chat"
    assert text_of(plan.body) == (
        "Demo model (not a real model), answering from Boss's state at 10:04:05 UTC: The thread closest to "
        'compaction is "parser" (th-parser) with 18 % of its context budget left (critical). Also at risk: '
        '"ios-sync-client" (th-ios) at 45 % (watch).'
    )


def test_the_master_says_what_a_named_thread_is_doing() -> None:
    answer = text_of(plan_chat_completion(body("what is parser doing?")).body)
    assert '"parser" (th-parser) on node-a has 18 % of its context budget left (critical)' in answer
    assert 'It has 1 open task(s): running "fix the flaky test".' in answer
    assert 'Its conversation last said (user, 10:04:05 UTC): "please [[demo:http500]] fail"' in answer


def test_anything_else_gets_an_overview() -> None:
    answer = text_of(plan_chat_completion(body("hello")).body)
    assert "You have 3 thread(s): 1 critical, 1 watch, 1 safe." in answer
    assert 'Ask me "which thread is close to compaction?" or "what is parser doing?".' in answer


def test_usage_counts_four_characters_a_token() -> None:
    request = body("hello")
    plan = plan_chat_completion(request)
    characters = [len(m["content"]) for m in request["messages"]]
    usage = plan.body["usage"]  # type: ignore[index]
    assert usage["prompt_tokens"] == sum(-(-count // 4) for count in characters)
    assert usage["completion_tokens"] == tokens(text_of(plan.body)) and tokens("abcde") == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize(
    ("marker", "status", "failure"),
    [
        ("http500", 500, "http500"),
        ("http429", 429, "http429"),
        ("http401", 401, "http401"),
        ("http400", 400, "http400"),
    ],
)
def test_error_markers_answer_that_status_with_an_openai_error_body(
    marker: str, status: int, failure: str
) -> None:
    plan = plan_chat_completion(body(f"hi [[demo:{marker}]]"))
    assert (plan.status, plan.failure) == (status, failure)
    assert "on purpose" in plan.body["error"]["message"]  # type: ignore[index]


def test_the_other_markers() -> None:
    assert plan_chat_completion(body("hi [[demo:slow=2.5]]")).delay_seconds == 2.5
    assert plan_chat_completion(body("hi [[demo:stall]]")).stall
    assert text_of(plan_chat_completion(body("hi [[demo:no_reply]]")).body) == ""
    assert plan_chat_completion(body("hi [[demo:malformed]]")).body == MALFORMED_BODY
    assert text_of(plan_chat_completion(body("hi [[demo:nonsense]]")).body) == NONSENSE_TEXT


def test_a_marker_in_the_state_does_not_count_only_the_question_does() -> None:
    assert plan_chat_completion(body("what is parser doing?")).status == 200


def test_bad_requests_are_refused() -> None:
    assert plan_chat_completion([]).status == 400
    assert plan_chat_completion({"model": "m"}).status == 400
    streaming = plan_chat_completion(body("hi", stream=True))
    assert streaming.status == 400 and "streaming is not served" in streaming.body["error"]["message"]  # type: ignore[index]


def test_untagged_requests_are_echoed_and_tags_pick_registered_handlers() -> None:
    plain = plan_chat_completion({"model": "m", "messages": [{"role": "user", "content": "fix it"}]})
    assert text_of(plain.body) == "Demo model (not a real model): you said: fix it"
    assert handler_for(ChatRequest("[boss:nobody_has_this]\nx", (), "q")) is None
    assert chat_tasks.handlers()["master_chat"] is master_answers.answer_master_chat

    @chat_task("unit_test_task")
    def answer(request: ChatRequest) -> str:
        return json.dumps({"asked": request.user_text, "json": request.json_answer})

    tagged = plan_chat_completion(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "[boss:unit_test_task]\nDraft."},
                {"role": "user", "content": "q"},
            ],
            "response_format": {"type": "json_object"},
        }
    )
    assert json.loads(text_of(tagged.body)) == {"asked": "q", "json": True}
    with pytest.raises(ValueError, match="handled already"):
        chat_task("unit_test_task")(lambda request: "")
    with pytest.raises(ValueError, match="lower-case"):
        chat_task("Bad Tag")


def test_through_codex_a_master_prompt_is_answered_from_its_state() -> None:
    instruction = prompt.codex_instruction(state(), "which thread is close to compaction? [[demo:slow=0.5]]")
    codex_body = {
        "model": "m",
        "stream": True,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": instruction}]}
        ],
    }
    plan = plan_response(codex_body, UsageModel())
    assert (
        plan.delay_seconds == 0.5 and plan.http_error is None
    )  # the state's http500 marker is not the question's
    done = [event for event in plan.events if event["type"] == "response.output_item.done"]
    reply = done[0]["item"]["content"][0]["text"]
    assert reply.startswith(
        "Demo model (not a real model), answering from Boss's state at 10:04:05 UTC: The thread closest"
    )


def test_the_demo_reads_the_conventions_of_boss_prompt() -> None:
    assert (master_answers.STATE_OPEN, master_answers.STATE_CLOSE) == (prompt.STATE_OPEN, prompt.STATE_CLOSE)
    assert (master_answers.QUESTION_OPEN, master_answers.QUESTION_CLOSE) == (
        prompt.QUESTION_OPEN,
        prompt.QUESTION_CLOSE,
    )
    assert f"[boss:{master_answers.MASTER_CHAT_TAG}]" == prompt.MASTER_CHAT_TAG
    assert master_answers.master_reply("hi", None).startswith(
        "Demo model (not a real model): the master prompt carried no state"
    )
