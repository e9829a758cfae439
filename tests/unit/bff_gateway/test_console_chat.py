"""The web console's chat (services/bff_gateway/console/chat.js and chat_view.js), run under Node:
the client states of CHAT-6 for every task status the scheduler has, the merge of messages by
sequence with gap detection, which tasks a reload or reconnect must look up, the idempotent draft,
the words of a refused send; and, with canned REST answers and a minimal stand-in for the DOM, a
chat loaded mid-wait or after a failure shows where each message stands.

Skipped, with the reason, when `node` is not installed. The real browser is exercised by
tests/e2e/test_console_chat_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from boss.scheduler.v1 import scheduler_pb2

from services.bff_gateway.routers.conversations import CONSOLE_DIR

NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (`apt-get install -y nodejs`)")

# The console's scripts in the order index.html loads them.
SCRIPTS = ["times.js", "chat.js", "chat_view.js", "group_view.js", "devices.js", "app.js"]

# Loads the scripts named in argv[3] (JSON) into one context with a minimal DOM and a fetch that
# answers from `routes` (path -> JSON answer; `calls` records each method and path, `bodies` each
# request's JSON body or null), then prints the JSON value of the JavaScript in argv[4].
HARNESS = r"""
const fs = require("fs");
const path = require("path");
const vm = require("vm");

class FakeNode {
  constructor(tag) {
    this.tagName = tag; this.attributes = {}; this.childNodes = []; this.dataset = {};
    this.hidden = false; this.value = ""; this.listeners = {};
  }
  setAttribute(key, value) { this.attributes[key] = value; if (key === "hidden") this.hidden = true; }
  append(...nodes) { this.childNodes.push(...nodes); }
  replaceChildren(...nodes) { this.childNodes = nodes; }
  addEventListener(type, listener) { this.listeners[type] = listener; }
  get lastElementChild() { return this.childNodes.filter((c) => typeof c !== "string").at(-1) || null; }
  querySelector() { return new FakeNode("stub"); }
  cloneNode() { return new FakeNode("fragment"); }
  get content() { return new FakeNode("template"); }
  get textContent() {
    return this.childNodes.map((c) => (typeof c === "string" ? c : c.textContent)).join("");
  }
  set textContent(value) { this.childNodes = [String(value)]; }
}

// Every element under `node` whose class attribute includes `cls`, in document order.
function byClass(node, cls, found = []) {
  if (typeof node === "string") return found;
  if ((node.attributes.class || "").split(" ").includes(cls)) found.push(node);
  for (const child of node.childNodes) byClass(child, cls, found);
  return found;
}

const storage = new Map();
const calls = [];
const bodies = [];
const routes = {};
const context = {
  console, URLSearchParams, setTimeout, clearTimeout, FakeNode, byClass, calls, bodies, routes, storage,
  Node: FakeNode,
  CSS: { escape: (value) => value },
  crypto: require("crypto").webcrypto,
  document: {
    createElement: (tag) => new FakeNode(tag),
    createElementNS: (_ns, tag) => new FakeNode(tag),
    getElementById: () => new FakeNode("stub"),
    querySelector: () => null,
    querySelectorAll: () => [],
  },
  location: { search: "", pathname: "/console/", hash: "" },
  history: { replaceState() {} },
  localStorage: {
    getItem: (key) => (storage.has(key) ? storage.get(key) : null),
    setItem: (key, value) => storage.set(key, String(value)),
    removeItem: (key) => storage.delete(key),
  },
  window: { addEventListener() {} },
  fetch: async (url, init) => {
    calls.push([(init && init.method) || "GET", url]);
    bodies.push(init && init.body ? JSON.parse(init.body) : null);
    if (!(url in routes)) {
      const problem = { detail: "no route " + url };
      return { ok: false, status: 404, statusText: "Not Found", json: async () => problem };
    }
    const answer = routes[url];
    // `{ refusal: status, problem }`: the gateway refuses with that status and problem+json body.
    if (answer && answer.refusal) {
      return { ok: false, status: answer.refusal, statusText: "Refused", json: async () => answer.problem };
    }
    return { ok: true, status: 200, json: async () => answer };
  },
};
vm.createContext(context);
for (const file of JSON.parse(process.argv[3])) {
  vm.runInContext(fs.readFileSync(path.join(process.argv[2], file), "utf8"), context, { filename: file });
}
vm.runInContext(`(async () => (${process.argv[4]}))()`, context).then(
  (result) => console.log(JSON.stringify(result)),
  (error) => { console.error(error); process.exit(1); },
);
"""


def run_console(tmp_path: Path, expression: str, scripts: list[str] | None = None) -> Any:
    """The JSON value of `expression`, evaluated in the console's scripts under Node in UTC."""
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    assert NODE is not None
    completed = subprocess.run(
        [NODE, str(harness), str(CONSOLE_DIR), json.dumps(scripts or ["times.js", "chat.js"]), expression],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "TZ": "UTC", "LC_ALL": "en_US.UTF-8"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def task(task_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """A ChatTaskView as the gateway answers it (camelCase, the REST contract's fields)."""
    return {
        "taskId": task_id,
        "taskType": "conversation_reply",
        "status": status,
        "projectId": "proj-1",
        "targetProjectId": "proj-1",
        "targetThreadId": "th-1",
        "deviceId": "node-a",
        "codexFolderRef": "/src/north",
        "codexThreadRef": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "requestMessageId": "m-1",
        "resultMessageId": "",
        "failureKind": "",
        "statusDetail": "",
        "deviceLastSeenAt": None,
        "retryOfTaskId": "",
        "retriedByTaskId": "",
        "createdAt": "2026-03-25T08:00:00Z",
        "updatedAt": "2026-03-25T08:00:00Z",
        **fields,
    }


def message(sequence: int, author: str, text: str, task_id: str = "", **fields: Any) -> dict[str, Any]:
    """A MessageView as the gateway answers it."""
    return {
        "messageId": f"m-{sequence}",
        "projectId": "proj-1",
        "authorKind": author,
        "threadId": "th-1" if author == "thread" else "",
        "text": text,
        "createdAt": f"2026-03-25T08:00:{sequence:02d}Z",
        "sequence": sequence,
        "clientMessageId": f"c-{sequence}" if author == "user" else "",
        "taskId": task_id,
        **fields,
    }


def test_every_task_status_maps_to_one_client_state(tmp_path: Path) -> None:
    statuses = {
        value.name.removeprefix("TASK_STATUS_").lower()
        for value in scheduler_pb2.TaskStatus.DESCRIPTOR.values
        if value.number != 0
    }
    tasks = {status: task("t-1", status) for status in statuses}
    tasks["queued_offline"] = task(
        "t-1", "queued", statusDetail="device node-a last seen at 2026-03-25T07:50:00Z"
    )
    tasks["failed_kind_only"] = task("t-1", "failed", failureKind="session_not_found")
    tasks["failed_in_words"] = task(
        "t-1", "failed", failureKind="model_error", statusDetail="model error: 500"
    )
    tasks["failed_retried"] = task("t-1", "failed", retriedByTaskId="t-2")
    tasks["no_device"] = task("t-1", "queued", deviceId="")
    result = run_console(
        tmp_path,
        f"""(() => {{
          const tasks = {json.dumps(tasks)};
          const names = {{ thread: "North line", device: "node-from-project" }};
          return Object.fromEntries(Object.entries(tasks).map(([k, t]) => [k, chatState(taskOf(t), names)]));
        }})()""",
    )

    assert statuses == {
        "queued",
        "claimed",
        "running",
        "completed",
        "failed",
        "timed_out",
        "cancelled",
        "expired",
    }
    states = {status: result[status]["state"] for status in statuses}
    assert states == {
        "queued": "pending_task",
        "claimed": "pending_task",
        "running": "awaiting_result",
        "completed": "done",
        "failed": "failed",
        "timed_out": "failed",
        "cancelled": "failed",
        "expired": "failed",
    }
    assert result["queued"]["label"] == "queued for node-a"
    assert result["claimed"]["label"].startswith("queued for node-a")
    assert result["queued_offline"]["detail"] == "device node-a last seen at 2026-03-25T07:50:00Z"
    assert result["no_device"]["label"] == "queued for node-from-project"
    assert result["running"]["label"] == "North line is working…"
    assert result["timed_out"]["label"] == "timed out"
    assert result["expired"]["label"] == "expired"
    assert result["failed_kind_only"]["detail"] == "the thread's Codex session was not found on this machine"
    assert result["failed_in_words"]["detail"] == "model error: 500"
    retryable = {name for name, view in result.items() if view["retryable"]}
    # What POST /api/v1/tasks/{id}/retry accepts: failed, timed out, cancelled or expired, not
    # retried yet; and /cancel: queued or claimed.
    assert retryable == {"failed", "timed_out", "cancelled", "expired", "failed_kind_only", "failed_in_words"}
    cancellable = {name for name, view in result.items() if view["cancellable"]}
    assert cancellable == {"queued", "claimed", "queued_offline", "no_device"}
    assert [
        name for name, view in result.items() if view["terminal"] != (view["state"] in {"done", "failed"})
    ] == []


def test_every_failure_kind_has_words(tmp_path: Path) -> None:
    kinds = {
        value.name.removeprefix("FAILURE_KIND_").lower()
        for value in scheduler_pb2.FailureKind.DESCRIPTOR.values
        if value.number != 0
    }
    words = run_console(tmp_path, "FAILURE_WORDS")
    assert set(words) == kinds
    assert all(words.values())


def test_messages_merge_by_sequence_and_a_skipped_sequence_is_a_gap(tmp_path: Path) -> None:
    one, two, three = (
        message(1, "user", "hi", "t-1"),
        message(2, "thread", "hello", "t-1"),
        message(3, "user", "next"),
    )
    snake_two = {
        "message_id": "m-2",
        "project_id": "proj-1",
        "author_kind": "thread",
        "text": "hello",
        "sequence": 2,
        "task_id": "t-1",
        "created_at": "2026-03-25T08:00:02Z",
    }
    result = run_console(
        tmp_path,
        f"""(() => {{
          const [one, two, three] = [{json.dumps(one)}, {json.dumps(two)}, {json.dumps(three)}]
            .map(messageOf);
          const ids = (r) => ({{ ids: r.messages.map((m) => m.messageId), gap: r.gap }});
          const live = messageOf({json.dumps(snake_two)});
          return {{
            inOrder: ids(mergeMessages([one], [three, two])),
            duplicate: ids(mergeMessages([one, two], [two])),
            skipped: ids(mergeMessages([one], [three])),
            unsequenced: ids(mergeMessages([one], [messageOf({{ message_id: "m-x" }})])),
            live: {{ id: live.messageId, author: live.authorKind, task: live.taskId,
              sequence: live.sequence }},
            last: [lastSequence([]), lastSequence([one, three, two])],
          }};
        }})()""",
    )

    assert result["inOrder"] == {"ids": ["m-1", "m-2", "m-3"], "gap": False}
    assert result["duplicate"] == {"ids": ["m-1", "m-2"], "gap": False}
    assert result["skipped"] == {"ids": ["m-1", "m-3"], "gap": True}
    assert result["unsequenced"] == {"ids": ["m-1"], "gap": True}
    assert result["live"] == {"id": "m-2", "author": "thread", "task": "t-1", "sequence": 2}
    assert result["last"] == [0, 3]


def test_a_reload_looks_up_only_the_tasks_whose_outcome_is_unknown(tmp_path: Path) -> None:
    history = [
        message(1, "user", "first", "t-1"),
        message(2, "thread", "done", "t-1"),
        message(3, "user", "second", "t-2"),
        message(4, "system", "failed", "t-2"),
        message(5, "user", "third", "t-3"),
        message(6, "user", "no task"),
    ]
    result = run_console(
        tmp_path,
        f"""(() => {{
          const messages = {json.dumps(history)}.map(messageOf);
          const known = (...list) => new Map(list.map((t) => [t.taskId, taskOf(t)]));
          return {{
            afterReload: tasksToFetch(messages, new Map(), 20),
            lastOne: tasksToFetch(messages, new Map(), 1),
            retried: tasksToFetch(messages, known({json.dumps(task("t-2", "failed", retriedByTaskId="t-4"))},
              {json.dumps(task("t-3", "running"))}), 20),
            settled: tasksToFetch(messages, known({json.dumps(task("t-2", "failed"))},
              {json.dumps(task("t-3", "completed"))}), 20),
            current: currentTask(messages[2],
              known({json.dumps(task("t-2", "failed", retriedByTaskId="t-4"))},
              {json.dumps(task("t-4", "queued"))})).taskId,
            none: currentTask(messages[5], new Map()),
          }};
        }})()""",
    )

    assert result["afterReload"] == ["t-2", "t-3"]  # t-1 has its reply; t-2 may have been retried
    assert result["lastOne"] == ["t-3"]
    assert result["retried"] == ["t-4", "t-3"]  # a known running task is looked up again
    assert result["settled"] == []
    assert result["current"] == "t-4"
    assert result["none"] is None


def test_a_stale_answer_never_moves_a_task_back(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        f"""(() => {{
          const [queued, running, completed, retried] = [
            {json.dumps(task("t-1", "queued", updatedAt="2026-03-25T08:00:01Z"))},
            {json.dumps(task("t-1", "running", updatedAt="2026-03-25T08:00:02Z"))},
            {json.dumps(task("t-1", "completed", updatedAt="2026-03-25T08:00:03Z"))},
            {json.dumps(task("t-1", "failed", updatedAt="2026-03-25T08:00:04Z", retriedByTaskId="t-2"))},
          ].map(taskOf);
          return {{
            first: newerTask(undefined, queued).status,
            forward: newerTask(queued, running).status,
            older: newerTask(running, queued).status,
            afterEnd: newerTask(completed, {{ ...running, updatedAt: "2026-03-25T08:00:09Z" }}).status,
            link: newerTask(retried, {{ ...retried, retriedByTaskId: "" }}).retriedByTaskId,
          }};
        }})()""",
    )

    assert result == {
        "first": "queued",
        "forward": "running",
        "older": "running",
        "afterEnd": "completed",
        "link": "t-2",
    }


def test_a_resent_draft_keeps_its_client_message_id_until_its_text_changes(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        """(() => {
          let n = 0;
          const makeId = () => `id-${++n}`;
          const first = draftFor(null, "hello", makeId);
          const resent = draftFor(first, "hello", makeId);
          const edited = draftFor(resent, "hello!", makeId);
          const fromStorage = draftFor({ text: "hello", clientMessageId: "" }, "hello", makeId);
          return {
            ids: [first, resent, edited, fromStorage].map((draft) => draft.clientMessageId),
            generated: clientMessageIdFrom(new Uint8Array(
              [0, 1, 171, 255, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192])),
            random: clientMessageIdFrom(crypto.getRandomValues(new Uint8Array(16))),
          };
        })()""",
    )

    assert result["ids"] == ["id-1", "id-1", "id-2", "id-3"]
    assert result["generated"] == "c-0001abff102030405060708090a0b0c0"
    # PostMessage's rule for client_message_id: 1-200 characters of [A-Za-z0-9._:-].
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", result["random"])
    assert result["random"] != result["generated"]


def test_a_refused_send_says_why_and_whether_to_send_again(tmp_path: Path) -> None:
    problems = {
        "offline": [0, None],
        "metadata": [
            409,
            {"reason": "THREAD_METADATA_INCOMPLETE", "missing_fields": ["codex_thread_ref", "node_id"]},
        ],
        "archived": [409, {"reason": "THREAD_ARCHIVED", "detail": "thread th-1 is archived"}],
        "text": [422, {"detail": "invalid", "errors": [{"field": "text", "detail": "must not be empty"}]}],
        "unavailable": [503, {"detail": "conversations is unavailable"}],
        "reused": [409, {"reason": "CLIENT_MESSAGE_ID_REUSED", "detail": "used for another message"}],
    }
    result = run_console(
        tmp_path,
        f"""Object.fromEntries(Object.entries({json.dumps(problems)}).map(
          ([name, [status, problem]]) => [name, sendFailure(status, problem)]))""",
    )

    assert result["offline"]["resend"] is True and "no answer" in result["offline"]["text"]
    assert result["metadata"] == {
        "text": "cannot send: the thread's metadata is incomplete (missing codex_thread_ref, node_id)",
        "resend": False,
    }
    assert result["archived"] == {"text": "cannot send: thread th-1 is archived", "resend": False}
    assert result["text"] == {"text": "cannot send: text: must not be empty", "resend": False}
    assert result["reused"]["newId"] is True and "newId" not in result["metadata"]
    assert result["unavailable"]["resend"] is True
    assert result["unavailable"]["text"].startswith("not sent: conversations is unavailable.")


PROJECT = {
    "project_id": "proj-1",
    "project_title": "North line",
    "conversation_type": "single_device",
    "active_thread_contexts": [{"thread_id": "th-1", "title": "North line", "node_id": "node-a"}],
}


def chat_lines(tmp_path: Path, routes: dict[str, Any], setup: str = "") -> Any:
    """Loads the chat of PROJECT with `routes` as the REST answers (after running `setup`) and
    returns, for each message drawn, its author, text and the task-state line under it."""
    return run_console(
        tmp_path,
        f"""(async () => {{
          Object.assign(routes, {json.dumps(routes)});
          state.token = "token";
          const chat = chatFor({json.dumps(PROJECT)});
          {setup}
          await syncChat(chat);
          clearTimeout(chat.pollTimer);
          return {{
            calls,
            local: when("2026-03-25T08:08:30Z"),
            items: chat.list.childNodes.map((item) => {{
              const line = byClass(item, "task-state")[0];
              return {{
                author: item.attributes["data-author"],
                text: byClass(item, "bubble")[0].textContent,
                state: line ? line.attributes["data-state"] : null,
                line: line ? [...byClass(line, "label"), ...byClass(line, "detail")]
                  .map((n) => n.textContent).join(" | ") : null,
                retry: byClass(item, "retry").map((b) => b.attributes["data-task-id"]),
              }};
            }}),
          }};
        }})()""",
        SCRIPTS,
    )


MESSAGES_URL = "/api/v1/projects/proj-1/messages?after="


def test_a_chat_loaded_mid_wait_shows_the_running_task_and_the_queued_one(tmp_path: Path) -> None:
    routes = {
        f"{MESSAGES_URL}0": {
            "messages": [message(1, "user", "run the tests", "t-1"), message(2, "user", "then lint", "t-2")],
            "nextPageToken": "",
        },
        "/api/v1/tasks/t-1": {"task": task("t-1", "running"), "collaborationGate": {"state": "open"}},
        "/api/v1/tasks/t-2": {
            "task": task(
                "t-2",
                "queued",
                requestMessageId="m-2",
                statusDetail="device node-a last seen at 2026-03-25T08:08:30Z",
            ),
            "collaborationGate": {"state": "open", "detail": "thread busy: 1 task ahead of this one"},
        },
    }
    result = chat_lines(tmp_path, routes)
    local = result["local"]

    assert "8:08:30" in local and "T" not in local
    assert result["calls"] == [
        ["GET", f"{MESSAGES_URL}0"],
        ["GET", "/api/v1/tasks/t-1"],
        ["GET", "/api/v1/tasks/t-2"],
    ]
    assert result["items"] == [
        {
            "author": "user",
            "text": "run the tests",
            "state": "awaiting_result",
            "line": "North line is working…",
            "retry": [],
        },
        {
            "author": "user",
            "text": "then lint",
            "state": "pending_task",
            "line": f"queued for node-a | device node-a last seen at {local}",
            "retry": [],
        },
    ]


def test_a_failure_shows_its_system_message_with_retry_and_a_retry_shows_where_it_stands(
    tmp_path: Path,
) -> None:
    history = [
        message(1, "user", "fix it [[demo:http500]]", "t-1"),
        message(2, "system", "Codex failed: the model answered with an error (HTTP 500).", "t-1"),
    ]
    failed = task("t-1", "failed", failureKind="model_error", resultMessageId="m-2")
    first = chat_lines(
        tmp_path,
        {
            f"{MESSAGES_URL}0": {"messages": history, "nextPageToken": ""},
            "/api/v1/tasks/t-1": {"task": failed, "collaborationGate": {"state": "open"}},
        },
    )
    assert [(i["author"], i["state"], i["line"], i["retry"]) for i in first["items"]] == [
        ("user", None, None, []),
        ("system", "failed", "failed", ["t-1"]),
    ]

    retried = chat_lines(
        tmp_path,
        {
            f"{MESSAGES_URL}0": {"messages": history, "nextPageToken": ""},
            "/api/v1/tasks/t-1": {"task": {**failed, "retriedByTaskId": "t-2"}},
            "/api/v1/tasks/t-2": {"task": task("t-2", "claimed", retryOfTaskId="t-1")},
        },
    )
    assert retried["calls"] == [
        ["GET", f"{MESSAGES_URL}0"],
        ["GET", "/api/v1/tasks/t-1"],
        ["GET", "/api/v1/tasks/t-2"],
    ]
    assert [(i["author"], i["state"], i["line"], i["retry"]) for i in retried["items"]] == [
        ("user", "pending_task", "queued for node-a: picked up, starting", []),
        ("system", "failed", "failed | retried", []),
    ]


def test_a_reconnect_fetches_only_what_came_after_the_last_sequence(tmp_path: Path) -> None:
    routes = {
        f"{MESSAGES_URL}0": {"messages": [message(1, "user", "hi", "t-1")], "nextPageToken": ""},
        "/api/v1/tasks/t-1": {"task": task("t-1", "running")},
        f"{MESSAGES_URL}1": {"messages": [message(2, "thread", "hello", "t-1")], "nextPageToken": ""},
    }
    # The first sync sees the task running; the reply and the task's end arrive while the stream is
    # down; the reconnect's sync asks for messages after 1 and the task again.
    setup = """
          await syncChat(chat);
          routes["/api/v1/tasks/t-1"] = { task: { ...routes["/api/v1/tasks/t-1"].task, status: "completed",
            resultMessageId: "m-2", updatedAt: "2026-03-25T08:01:00Z" } };
          calls.length = 0;
    """
    result = chat_lines(tmp_path, routes, setup)

    assert result["calls"] == [["GET", f"{MESSAGES_URL}1"], ["GET", "/api/v1/tasks/t-1"]]
    assert [(i["author"], i["text"], i["state"]) for i in result["items"]] == [
        ("user", "hi", None),
        ("thread", "hello", None),
    ]


def test_the_page_loads_the_scripts_in_the_order_these_tests_do() -> None:
    page = (CONSOLE_DIR / "index.html").read_text()
    assert re.findall(r'<script src="([^"]+)"></script>', page) == SCRIPTS


MASTER = {
    "project_id": "master-1",
    "project_title": "Master agent",
    "conversation_type": "master_agent",
    "active_thread_contexts": [],
}
MASTER_MESSAGES_URL = "/api/v1/projects/master-1/messages?after="


def master_lines(tmp_path: Path, routes: dict[str, Any], then: str = "") -> Any:
    """Loads the master agent's chat with `routes` as the REST answers (`then` runs after the load)
    and returns the REST calls and, per message drawn, its author's name and its task line."""
    return run_console(
        tmp_path,
        f"""(async () => {{
          Object.assign(routes, {json.dumps(routes)});
          state.token = "token";
          const chat = chatFor({json.dumps(MASTER)});
          await syncChat(chat);
          {then}
          clearTimeout(chat.pollTimer);
          return {{
            calls,
            placeholder: chat.text.attributes.placeholder,
            items: chat.list.childNodes.map((item) => {{
              const line = byClass(item, "task-state")[0];
              return [
                byClass(item, "meta")[0].textContent.split(" · ")[0],
                byClass(item, "bubble")[0].textContent,
                line ? byClass(line, "label")[0].textContent : null,
              ];
            }}),
          }};
        }})()""",
        SCRIPTS,
    )


def model_task(task_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """A task the master agent's model answers: no device, no thread."""
    return task(
        task_id,
        status,
        projectId="master-1",
        targetProjectId="master-1",
        targetThreadId="",
        deviceId="",
        codexFolderRef="",
        codexThreadRef="",
        **fields,
    )


def test_the_master_agents_chat_names_its_replies_and_its_waiting_tasks(tmp_path: Path) -> None:
    history = [
        message(1, "user", "which thread is close to compaction?", "t-1"),
        message(2, "master", "parser, with 12 % left (critical)", "t-1"),
        message(3, "user", "and the slow one? [[demo:slow=6]]", "t-2"),
        message(4, "user", "anything else?", "t-3"),
    ]
    routes = {
        f"{MASTER_MESSAGES_URL}0": {"messages": history, "nextPageToken": None},
        "/api/v1/tasks/t-2": {"task": model_task("t-2", "running"), "collaborationGate": {"state": "open"}},
        "/api/v1/tasks/t-3": {"task": model_task("t-3", "queued"), "collaborationGate": {"state": "open"}},
    }
    result = master_lines(tmp_path, routes)

    # The master agent's reply ends its task's wait: only the unanswered ones are looked up.
    assert result["calls"] == [
        ["GET", f"{MASTER_MESSAGES_URL}0"],
        ["GET", "/api/v1/tasks/t-2"],
        ["GET", "/api/v1/tasks/t-3"],
    ]
    assert result["placeholder"] == "Ask the master agent"
    assert result["items"] == [
        ["you", "which thread is close to compaction?", None],
        ["master agent", "parser, with 12 % left (critical)", None],
        ["you", "and the slow one? [[demo:slow=6]]", "the master agent is working…"],
        ["you", "anything else?", "queued for the master agent"],
    ]


def test_an_inline_master_reply_is_fetched_at_once_and_ends_the_wait(tmp_path: Path) -> None:
    question = message(1, "user", "which thread is close to compaction?", "t-1")
    reply = message(2, "master", "parser, with 12 % left (critical)", "t-1")
    routes = {
        f"{MASTER_MESSAGES_URL}0": {"messages": [], "nextPageToken": None},
        "/api/v1/projects/master-1/messages": {
            "message": question,
            "masterReply": reply["text"],
            "dispatchPlan": None,
            "task": model_task("t-1", "completed", resultMessageId="m-2"),
            "collaborationGate": {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""},
        },
        f"{MASTER_MESSAGES_URL}1": {"messages": [reply], "nextPageToken": None},
    }
    then = """
      chat.text.value = "which thread is close to compaction?";
      calls.length = 0;
      await sendDraft(chat);
      await chat.syncing;
    """
    result = master_lines(tmp_path, routes, then)

    assert result["calls"] == [
        ["POST", "/api/v1/projects/master-1/messages"],
        ["GET", f"{MASTER_MESSAGES_URL}1"],
    ]
    assert result["items"] == [
        ["you", "which thread is close to compaction?", None],
        ["master agent", "parser, with 12 % left (critical)", None],
    ]
