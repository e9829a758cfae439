"""The web console's group chat (services/bff_gateway/console/chat.js and group_view.js), run under
Node: where a dispatch plan stands for every plan status (CHAT-4, CHAT-6: pending_dispatch_plan,
pending_task, awaiting_result, failed, done) and what each target's line says, the budget in words,
which plan is newer, the confirm body with dropped targets, the words of a refused decision and of
the collaboration gate, the plans a reload looks up, the new group's request; and, with canned REST
answers and the minimal DOM of test_console_chat.py, a group loaded while its plan waits shows the
plan card (targets, reasons, budgets, drop, confirm, reject), a dropped target is left out of the
confirmation, and a group loaded while its tasks run shows the progress k of N.

Skipped, with the reason, when `node` is not installed. The real browser is exercised by
tests/e2e/test_console_group_browser.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.unit.bff_gateway.test_console_chat import SCRIPTS, message, run_console, task

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")

GROUP_ID = "group-1"
# 2026-03-25T08:00:00Z in milliseconds since the epoch: "now" of the pure tests.
NOW_MS = 1774425600000
FUTURE = "2999-01-01T00:00:00Z"


def target(target_id: str, title: str, pct: float | None, level: str | None, **fields: Any) -> dict[str, Any]:
    """A DispatchTargetView as the gateway answers it."""
    return {
        "targetId": target_id,
        "position": int(target_id[1:]),
        "kind": "member",
        "threadId": f"th-{title}",
        "threadTitle": title,
        "deviceId": "node-a",
        "codexFolderRef": f"/src/{title}",
        "codexThreadRef": f"0199-th-{title}",
        "instruction": f"Run the tests ({title})",
        "reason": f"{level} ({pct} % left), idle",
        "remainingPct": pct,
        "level": level,
        "relayOfThreadId": None,
        "status": "proposed",
        "statusDetail": None,
        "taskId": None,
        "taskStatus": None,
        **fields,
    }


def plan(
    status: str = "proposed", targets: list[dict[str, Any]] | None = None, **fields: Any
) -> dict[str, Any]:
    """A DispatchPlanView as the gateway answers it: north (safe) and south (watch) proposed, east
    (critical) left out."""
    return {
        "planId": "plan-1",
        "projectId": GROUP_ID,
        "requestMessageId": "m-1",
        "status": status,
        "targets": targets
        if targets is not None
        else [target("t1", "north", 82.4, "safe"), target("t2", "south", 44.0, "watch")],
        "leftOut": [
            {
                "threadId": "th-east",
                "threadTitle": "east",
                "reason": "critical (3.0 % left): it wraps up and hands off first and takes no new work",
            }
        ],
        "draftedBy": "master_model",
        "draftingNote": None,
        "createdAt": "2026-03-25T07:59:00Z",
        "expiresAt": "2026-03-25T08:29:00Z",
        "decidedAt": None,
        "updatedAt": "2026-03-25T07:59:00Z",
        "supersededByPlanId": None,
        "summaryStatus": None,
        "summaryMessageId": None,
        **fields,
    }


def dispatched(target_id: str, title: str, pct: float, level: str, task_status: str) -> dict[str, Any]:
    return target(
        target_id, title, pct, level, status="dispatched", taskId=f"task-{title}", taskStatus=task_status
    )


def plan_views(tmp_path: Path, plans: dict[str, Any], drops: list[str] | None = None) -> Any:
    """planView of each plan at NOW_MS, with `drops` dropped and no task known beyond the plan."""
    return run_console(
        tmp_path,
        f"""(() => {{
          const plans = {json.dumps(plans)};
          const drops = new Set({json.dumps(drops or [])});
          return Object.fromEntries(Object.entries(plans).map(([name, p]) =>
            [name, planView(planOf(p), new Map(), drops, {NOW_MS})]));
        }})()""",
    )


def test_a_proposed_plan_waits_for_confirmation_and_counts_the_kept_targets(tmp_path: Path) -> None:
    views = plan_views(tmp_path, {"proposed": plan()})
    dropped = plan_views(tmp_path, {"one": plan()}, drops=["t2"])
    every = plan_views(tmp_path, {"none": plan()}, drops=["t1", "t2"])

    assert views["proposed"] == {
        "state": "pending_dispatch_plan",
        "label": "waiting for your confirmation",
        "detail": "Confirm sends your message to 2 threads.",
        "decidable": True,
        "kept": 2,
        "total": 2,
        "done": 0,
        "failed": 0,
    }
    assert (dropped["one"]["kept"], dropped["one"]["detail"]) == (
        1,
        "Confirm sends your message to 1 thread.",
    )
    assert (every["none"]["kept"], every["none"]["detail"]) == (0, "Keep at least one thread to send it.")


def test_every_plan_status_ends_in_a_client_state(tmp_path: Path) -> None:
    two = [
        dispatched("t1", "north", 82.4, "safe", "queued"),
        dispatched("t2", "south", 44.0, "watch", "queued"),
    ]
    views = plan_views(
        tmp_path,
        {
            "past_expiry": plan(expiresAt="2026-03-25T07:59:30Z"),
            "expired": plan("expired"),
            "rejected": plan("rejected"),
            "superseded": plan("superseded", supersededByPlanId="plan-2"),
            "queued": plan("confirmed", two),
            "claimed": plan("confirmed", [two[0], {**two[1], "taskStatus": "claimed"}]),
            "running": plan("confirmed", [{**two[0], "taskStatus": "running"}, two[1]]),
            "one_done": plan(
                "confirmed", [{**two[0], "taskStatus": "completed"}, {**two[1], "taskStatus": "running"}]
            ),
            "summarising": plan(
                "confirmed",
                [{**two[0], "taskStatus": "completed"}, {**two[1], "taskStatus": "failed"}],
                summaryStatus="pending",
            ),
            "posted": plan(
                "confirmed",
                [{**two[0], "taskStatus": "completed"}, {**two[1], "taskStatus": "timed_out"}],
                summaryStatus="posted",
            ),
            "all_answered": plan(
                "confirmed",
                [{**two[0], "taskStatus": "completed"}, {**two[1], "taskStatus": "completed"}],
                summaryStatus="posted",
            ),
            "all_failed": plan(
                "confirmed",
                [{**two[0], "taskStatus": "failed"}, {**two[1], "taskStatus": "expired"}],
                summaryStatus="posted",
            ),
            "dropped_one": plan(
                "confirmed", [two[0], target("t2", "south", 44.0, "watch", status="dropped")]
            ),
        },
    )
    shown = {name: (view["state"], view["label"]) for name, view in views.items()}

    assert shown == {
        "past_expiry": ("failed", "expired: nothing was sent"),
        "expired": ("failed", "expired: nothing was sent"),
        "rejected": ("done", "rejected: nothing was sent"),
        "superseded": ("done", "replaced by a newer message's plan: nothing was sent"),
        "queued": ("pending_task", "sent to 2 threads: 0 of 2 done"),
        "claimed": ("pending_task", "sent to 2 threads: 0 of 2 done"),
        "running": ("awaiting_result", "sent to 2 threads: 0 of 2 done"),
        "one_done": ("awaiting_result", "sent to 2 threads: 1 of 2 done"),
        "summarising": ("awaiting_result", "2 of 2 done; the master agent is summarising…"),
        "posted": ("done", "done: 1 of 2 threads answered"),
        "all_answered": ("done", "done: 2 of 2 threads answered"),
        "all_failed": ("failed", "done: 0 of 2 threads answered"),
        "dropped_one": ("pending_task", "sent to 1 thread: 0 of 1 done"),
    }
    assert (
        views["expired"]["detail"] == "It was not confirmed in time; send the message again for a new plan."
    )
    assert views["posted"]["detail"] == "1 failed: the summary names it."
    assert views["all_answered"]["detail"] == ""
    assert (views["one_done"]["done"], views["one_done"]["total"]) == (1, 2)
    assert (views["posted"]["failed"], views["summarising"]["failed"]) == (1, 1)
    assert [name for name, view in views.items() if view["decidable"]] == []


def test_each_target_says_whether_it_is_sent_and_where_its_task_stands(tmp_path: Path) -> None:
    proposed = plan()
    confirmed = plan(
        "confirmed",
        [
            dispatched("t1", "north", 82.4, "safe", "queued"),
            target("t2", "south", 44.0, "watch", status="dropped", statusDetail="dropped by you"),
            target("t3", "west", 60.0, "safe", status="skipped", statusDetail="archived since the proposal"),
            dispatched("t4", "lake", 70.0, "safe", "completed"),
            dispatched("t5", "hill", 71.0, "safe", "running"),
        ],
    )
    # The chat knows north's task running (a task.updated event) and lake's still running (its
    # event is behind the plan, which knows it completed); hill's task failed with a kind.
    tasks = {
        "task-north": task("task-north", "running", taskType="dispatch_execution", targetThreadId="th-north"),
        "task-lake": task("task-lake", "running", taskType="dispatch_execution"),
        "task-hill": task("task-hill", "failed", taskType="dispatch_execution", failureKind="thread_busy"),
    }
    result = run_console(
        tmp_path,
        f"""(() => {{
          const tasks = new Map(Object.entries({json.dumps(tasks)}).map(([id, t]) => [id, taskOf(t)]));
          const proposed = planOf({json.dumps(proposed)});
          const confirmed = planOf({json.dumps(confirmed)});
          const rejected = planOf({json.dumps(plan("rejected"))});
          const line = (v) => [v.state, v.label, v.detail];
          return {{
            proposed: proposed.targets.map((t) => line(targetView(t, proposed, tasks, t.targetId === "t2"))),
            confirmed: confirmed.targets.map((t) => line(targetView(t, confirmed, tasks, false))),
            rejected: rejected.targets.map((t) => line(targetView(t, rejected, tasks, false))),
            statuses: confirmed.targets.map((t) => targetView(t, confirmed, tasks, false).status),
          }};
        }})()""",
    )

    assert result["proposed"] == [
        ["proposed", "will be sent", ""],
        ["dropped", "dropped: it will not be sent", ""],
    ]
    assert result["confirmed"] == [
        ["awaiting_result", "north is working…", ""],
        ["dropped", "dropped by you: not sent", ""],
        ["skipped", "skipped: not sent", "archived since the proposal"],
        ["done", "answered", ""],
        ["failed", "failed", "the thread is busy in another Codex process"],
    ]
    assert result["statuses"] == ["running", "", "", "completed", "failed"]
    assert result["rejected"] == [["not_sent", "not sent", ""], ["not_sent", "not sent", ""]]


def test_a_dispatch_task_is_never_offered_retry_or_cancel(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        f"""(() => [
          chatState(taskOf({json.dumps(task("t-1", "failed", taskType="dispatch_execution"))}), {{}}),
          chatState(taskOf({json.dumps(task("t-2", "queued", taskType="dispatch_execution"))}), {{}}),
          chatState(taskOf({json.dumps(task("t-3", "failed"))}), {{}}),
        ].map((v) => [v.state, v.retryable, v.cancellable]))()""",
    )

    assert result == [["failed", False, False], ["pending_task", False, False], ["failed", True, False]]


def test_budgets_read_as_their_rings_do(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        """[budgetWords(82.7, "safe"), budgetWords(0, "critical"), budgetWords(44, null),
            budgetWords(null, null), budgetWords(undefined, "safe")]""",
    )

    assert result == [
        "82% left · safe",
        "0% left · critical",
        "44% left",
        "budget not reported",
        "budget not reported",
    ]


def test_a_relay_target_reads_as_a_new_thread_not_as_its_hosts_budget(tmp_path: Path) -> None:
    relay = target("t1", "tight (relay)", None, "", kind="relay", relayOfThreadId="th-tight")
    host_budget = target("t1", "tight (relay)", 14.0, "urgent", kind="relay")
    member = target("t2", "north", 82.4, "safe")

    result = run_console(
        tmp_path,
        f"""[{json.dumps(relay)}, {json.dumps(host_budget)}, {json.dumps(member)}]
            .map((t) => targetBudgetWords(t))""",
    )

    assert result == ["new thread", "new thread", "82% left · safe"]


def test_a_plan_never_moves_back(tmp_path: Path) -> None:
    confirmed = plan("confirmed", updatedAt="2026-03-25T08:00:00Z")
    pending = plan("confirmed", summaryStatus="pending", updatedAt="2026-03-25T08:01:00Z")
    posted = plan("confirmed", summaryStatus="posted", updatedAt="2026-03-25T08:02:00Z")
    later = plan("confirmed", updatedAt="2026-03-25T08:00:30Z")
    result = run_console(
        tmp_path,
        f"""(() => {{
          const [proposed, confirmed, pending, posted, later] = [{json.dumps(plan())},
            {json.dumps(confirmed)}, {json.dumps(pending)}, {json.dumps(posted)}, {json.dumps(later)}]
            .map(planOf);
          const kept = (known, incoming) => {{
            const p = newerPlan(known, incoming);
            return [p.status, p.summaryStatus, p.updatedAt];
          }};
          return {{
            first: kept(undefined, proposed),
            staleProposal: kept(confirmed, proposed),
            confirmation: kept(proposed, confirmed),
            stalePending: kept(posted, pending),
            staleConfirmed: kept(later, confirmed),
            laterConfirmed: kept(confirmed, later),
            open: [proposed, confirmed, pending, posted].map(planOpen),
          }};
        }})()""",
    )

    assert result["first"][0] == "proposed"
    assert result["staleProposal"] == ["confirmed", None, "2026-03-25T08:00:00Z"]
    assert result["confirmation"][0] == "confirmed"
    assert result["stalePending"] == ["confirmed", "posted", "2026-03-25T08:02:00Z"]
    assert result["staleConfirmed"][2] == "2026-03-25T08:00:30Z"
    assert result["laterConfirmed"][2] == "2026-03-25T08:00:30Z"
    assert result["open"] == [True, True, True, False]


def test_the_confirmation_names_the_dropped_targets_and_keeps_one_at_least(tmp_path: Path) -> None:
    three = plan(
        targets=[
            target("t1", "north", 82.4, "safe"),
            target("t2", "south", 44.0, "watch"),
            target("t3", "lake", 60.0, "safe"),
        ]
    )
    result = run_console(
        tmp_path,
        f"""(() => {{
          const p = planOf({json.dumps(three)});
          return [new Set(), new Set(["t3", "t1"]), new Set(["t1", "t2", "t3"]), new Set(["t9"])]
            .map((drops) => confirmRequest(p, drops));
        }})()""",
    )

    assert result == [
        {"body": {"dropped_target_ids": []}, "error": ""},
        {"body": {"dropped_target_ids": ["t1", "t3"]}, "error": ""},
        {
            "body": {"dropped_target_ids": ["t1", "t2", "t3"]},
            "error": "keep at least one thread: a plan is sent to one thread or more",
        },
        {"body": {"dropped_target_ids": []}, "error": ""},
    ]


def test_a_refused_decision_says_why_and_whether_to_try_again(tmp_path: Path) -> None:
    cases = {
        "offline": ["confirm", 0, None],
        "expired": ["confirm", 409, {"reason": "DISPATCH_PLAN_EXPIRED"}],
        "superseded": ["confirm", 409, {"reason": "DISPATCH_PLAN_SUPERSEDED"}],
        "rejected": ["confirm", 409, {"reason": "DISPATCH_PLAN_REJECTED"}],
        "confirmed": ["reject", 409, {"reason": "DISPATCH_PLAN_CONFIRMED"}],
        "unavailable": [
            "confirm",
            409,
            {
                "reason": "DISPATCH_PLAN_TARGETS_UNAVAILABLE",
                "detail": "none of its kept targets can take work now (south: archived)",
            },
        ],
        "foreign": ["confirm", 404, {"reason": "DISPATCH_PLAN_NOT_FOUND"}],
        "field": ["confirm", 422, {"errors": [{"field": "dropped_target_ids", "detail": "names no target"}]}],
        "down": ["reject", 503, {"detail": "conversations is unavailable"}],
    }
    result = run_console(
        tmp_path,
        f"""Object.fromEntries(Object.entries({json.dumps(cases)}).map(
          ([name, [action, status, problem]]) => [name, planFailure(action, status, problem)]))""",
    )

    assert result["offline"] == {
        "text": "not confirmed: no answer from the server. Try again.",
        "again": True,
    }
    assert result["expired"]["text"].startswith("the plan expired before it was confirmed: nothing was sent.")
    assert result["superseded"]["text"] == "a newer message replaced this plan: nothing was sent."
    assert result["rejected"]["text"] == "the plan was rejected: nothing was sent."
    assert result["confirmed"]["text"] == "the plan was confirmed already: its threads are at work."
    assert result["unavailable"]["text"] == (
        "not sent: none of its kept targets can take work now (south: archived)"
    )
    assert result["foreign"]["text"].startswith("this plan is not there any more")
    assert result["field"] == {"text": "not confirmed: dropped_target_ids: names no target", "again": False}
    assert result["down"] == {"text": "not rejected: conversations is unavailable. Try again.", "again": True}
    assert [name for name, failure in result.items() if failure["again"]] == ["offline", "down"]


def test_the_gate_says_where_the_group_stands(tmp_path: Path) -> None:
    gates = [
        None,
        {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""},
        {
            "state": "awaiting_confirmation",
            "tasksTotal": 2,
            "tasksDone": 0,
            "detail": "a dispatch plan for 2 threads waits for your confirmation until 2026-03-25T08:29:00Z",
        },
        {"state": "executing", "tasksTotal": 2, "tasksDone": 1, "detail": "1 of 2 done"},
        {"state": "summarising", "tasksTotal": 2, "tasksDone": 2, "detail": ""},
    ]
    result = run_console(tmp_path, f"{json.dumps(gates)}.map(gateWords)")

    assert result == [
        "",
        "",
        "a dispatch plan for 2 threads waits for your confirmation until 2026-03-25T08:29:00Z",
        "executing: 1 of 2 done",
        "summarising: every thread has ended; the master agent sums up",
    ]


def test_a_reload_looks_up_the_remembered_and_the_open_plans(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        f"""(() => {{
          const remembered = ["plan-1", "plan-2", "plan-3"].reduce((ids, id) => rememberPlan(ids, id, 3), []);
          const again = rememberPlan(remembered, "plan-1", 3);
          const capped = rememberPlan(again, "plan-4", 3);
          const plans = new Map([
            ["plan-3", planOf({json.dumps(plan("confirmed", planId="plan-3", summaryStatus="posted"))})],
            ["plan-4", planOf({json.dumps(plan("confirmed", planId="plan-4"))})],
            ["plan-5", planOf({json.dumps(plan(planId="plan-5"))})],
          ]);
          const fetch = plansToFetch(plans, capped);
          return {{ remembered, again, capped, fetch, none: plansToFetch(new Map(), null) }};
        }})()""",
    )

    assert result["remembered"] == ["plan-1", "plan-2", "plan-3"]
    assert result["again"] == ["plan-2", "plan-3", "plan-1"]
    assert result["capped"] == ["plan-3", "plan-1", "plan-4"]
    # plan-3 is known and ended; plan-1 is remembered but unknown; plan-4 and plan-5 may still move.
    assert result["fetch"] == ["plan-1", "plan-4", "plan-5"]
    assert result["none"] == []


def test_a_new_group_needs_a_name_and_two_threads(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        """[groupRequest("  Release  ", ["th-a", "th-b"]), groupRequest(" ", ["th-a", "th-b"]),
            groupRequest("Release", ["th-a"]), groupRequest("x".repeat(201), ["th-a", "th-b"])]""",
    )

    assert result[0] == {"body": {"project_title": "Release", "thread_ids": ["th-a", "th-b"]}, "error": ""}
    assert [r["error"] for r in result[1:]] == [
        "name the group",
        "pick at least two threads",
        "the name is 201 characters; at most 200",
    ]


# --- the group's page, with canned REST answers ------------------------------------------------------

GROUP = {
    "project_id": GROUP_ID,
    "project_title": "Release",
    "conversation_type": "group",
    "active_thread_contexts": [],
}
PAGE_URL = f"/api/v1/projects/{GROUP_ID}/messages?after=0"
WAITING_GATE = {
    "state": "awaiting_confirmation",
    "tasksTotal": 2,
    "tasksDone": 0,
    "detail": "a dispatch plan for 2 threads waits for your confirmation until 2026-03-25T08:29:00Z",
}


def group_message(sequence: int, author: str, text: str, **fields: Any) -> dict[str, Any]:
    return {**message(sequence, author, text, **fields), "projectId": GROUP_ID}


def group_page(tmp_path: Path, routes: dict[str, Any], setup: str = "", then: str = "") -> Any:
    """Loads GROUP's chat with `routes` as the REST answers (after `setup`; `then` runs after the
    load), and returns the REST calls, the gate line and, per message, its author, its meta line
    and its plan cards: state, label, targets (state, label, budget, reason, drop button), left-out
    members and action buttons."""
    return run_console(
        tmp_path,
        f"""(async () => {{
          Object.assign(routes, {json.dumps(routes)});
          state.token = "token";
          state.threadTitles = new Map([["th-north", "north"]]);
          {setup}
          const chat = chatFor({json.dumps(GROUP)});
          await syncChat(chat);
          {then}
          clearTimeout(chat.pollTimer);
          const text = (node, cls) => byClass(node, cls).map((n) => n.textContent);
          return {{
            calls,
            bodies,
            local: when("2026-03-25T08:08:30Z"),
            gate: chat.gateLine.hidden ? null : [chat.gateLine.dataset.state, chat.gateLine.textContent],
            remembered: storage.get("boss.group.plans.{GROUP_ID}") || null,
            items: chat.list.childNodes.map((item) => ({{
              author: item.attributes["data-author"],
              meta: text(item, "meta")[0],
              summaryOf: item.attributes["data-summary-of"] || null,
              plans: byClass(item, "plan").map((card) => ({{
                state: card.attributes["data-state"],
                status: card.attributes["data-status"],
                label: text(byClass(card, "plan-head")[0], "label")[0],
                targets: byClass(card, "target").map((row) => ({{
                  id: row.attributes["data-target-id"],
                  state: row.attributes["data-state"],
                  title: text(row, "title")[0],
                  budget: text(row, "budget")[0],
                  reason: text(row, "reason")[0],
                  line: text(row, "target-state")[0],
                  drop: text(row, "drop")[0] || null,
                }})),
                leftOut: text(card, "left-out"),
                error: text(card, "plan-error")[0] || null,
                actions: byClass(card, "plan-actions").flatMap((a) => a.childNodes.map((b) =>
                  [b.textContent, "disabled" in b.attributes])),
              }})),
            }})),
          }};
        }})()""",
        SCRIPTS,
    )


def test_a_group_loaded_while_its_plan_waits_shows_the_plan_card(tmp_path: Path) -> None:
    busy = "watch, 44.0 % left, busy: its context grew at 2026-03-25T08:08:30Z"
    waiting = plan(
        targets=[target("t1", "north", 82.4, "safe"), target("t2", "south", 44.0, "watch", reason=busy)],
        expiresAt=FUTURE,
    )
    routes = {
        PAGE_URL: {
            "messages": [group_message(1, "user", "Run the integration tests")],
            "nextPageToken": None,
            "pendingDispatchPlan": waiting,
            "collaborationGate": WAITING_GATE,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": waiting, "collaborationGate": WAITING_GATE},
    }
    result = group_page(tmp_path, routes)

    # The message page names the waiting plan; it is fetched once more as an open plan.
    assert result["calls"] == [["GET", PAGE_URL], ["GET", "/api/v1/dispatch-plans/plan-1"]]
    assert result["gate"][0] == "awaiting_confirmation"
    assert result["gate"][1].startswith("a dispatch plan for 2 threads waits for your confirmation until ")
    assert json.loads(result["remembered"]) == ["plan-1"]
    [item] = result["items"]
    [card] = item["plans"]
    assert (card["state"], card["status"], card["label"]) == (
        "pending_dispatch_plan",
        "proposed",
        "waiting for your confirmation",
    )
    assert card["targets"] == [
        {
            "id": "t1",
            "state": "proposed",
            "title": "north",
            "budget": "82% left · safe",
            "reason": "safe (82.4 % left), idle",
            "line": "will be sent",
            "drop": "Drop",
        },
        {
            "id": "t2",
            "state": "proposed",
            "title": "south",
            "budget": "44% left · watch",
            "reason": f"watch, 44.0 % left, busy: its context grew at {result['local']}",
            "line": "will be sent",
            "drop": "Drop",
        },
    ]
    # Instants in the server's words read in the browser's local time, as everywhere in the console.
    assert "8:08:30" in result["local"] and "T" not in result["local"]
    assert card["leftOut"] == [
        "Not proposed:east: critical (3.0 % left): it wraps up and hands off first and takes no new work"
    ]
    assert card["actions"] == [["Send to 2 threads", False], ["Reject", False]]


def test_a_dropped_target_is_left_out_of_the_confirmation(tmp_path: Path) -> None:
    waiting = plan(expiresAt=FUTURE)
    confirmed = plan(
        "confirmed",
        [
            dispatched("t1", "north", 82.4, "safe", "queued"),
            target("t2", "south", 44.0, "watch", status="dropped", statusDetail="dropped by you"),
        ],
        expiresAt=FUTURE,
        updatedAt="2026-03-25T08:00:00Z",
    )
    executing = {"state": "executing", "tasksTotal": 1, "tasksDone": 0, "detail": "0 of 1 done"}
    routes = {
        PAGE_URL: {
            "messages": [group_message(1, "user", "Run the integration tests")],
            "nextPageToken": None,
            "pendingDispatchPlan": waiting,
            "collaborationGate": WAITING_GATE,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": waiting, "collaborationGate": WAITING_GATE},
        "/api/v1/dispatch-plans/plan-1/confirm": {
            "dispatchPlan": confirmed,
            "tasks": [task("task-north", "queued", taskType="dispatch_execution", targetThreadId="th-north")],
            "collaborationGate": executing,
        },
    }
    # Drop south, then confirm: the buttons are the card's, found in the drawn history.
    then = """
      const card = () => byClass(chat.list, "plan")[0];
      const button = (cls) => byClass(card(), cls)[0];
      byClass(card(), "drop")[1].listeners.click();
      const afterDrop = [byClass(card(), "target").map((t) => t.attributes["data-state"]),
        button("confirm").textContent];
      button("confirm").listeners.click();
      await new Promise((resolve) => setTimeout(resolve, 20));
      calls.push(["dropped", afterDrop]);
    """
    result = group_page(tmp_path, routes, then=then)

    confirm_call = result["calls"].index(["POST", "/api/v1/dispatch-plans/plan-1/confirm"])
    assert result["bodies"][confirm_call] == {"dropped_target_ids": ["t2"]}
    assert result["calls"][-1] == ["dropped", [["proposed", "dropped"], "Send to 1 thread"]]
    [card] = result["items"][0]["plans"]
    assert (card["state"], card["label"]) == ("pending_task", "sent to 1 thread: 0 of 1 done")
    assert [(t["id"], t["state"], t["line"], t["drop"]) for t in card["targets"]] == [
        ("t1", "pending_task", "queued for node-a", None),
        ("t2", "dropped", "dropped by you: not sent", None),
    ]
    assert card["actions"] == []
    assert result["gate"] == ["executing", "executing: 0 of 1 done"]


def test_a_refused_confirmation_is_said_on_the_card_and_the_plan_is_fetched_anew(tmp_path: Path) -> None:
    waiting = plan(expiresAt=FUTURE)
    expired = plan("expired", expiresAt="2026-03-25T08:29:00Z", updatedAt="2026-03-25T08:30:00Z")
    open_gate = {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""}
    routes = {
        PAGE_URL: {
            "messages": [group_message(1, "user", "Run the integration tests")],
            "nextPageToken": None,
            "pendingDispatchPlan": waiting,
            "collaborationGate": WAITING_GATE,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": waiting, "collaborationGate": WAITING_GATE},
        "/api/v1/dispatch-plans/plan-1/confirm": {
            "refusal": 409,
            "problem": {"reason": "DISPATCH_PLAN_EXPIRED"},
        },
    }
    then = f"""
      routes["/api/v1/dispatch-plans/plan-1"] = {{ dispatchPlan: {json.dumps(expired)},
        collaborationGate: {json.dumps(open_gate)} }};
      routes["/api/v1/projects/group-1/messages?after=1"] = {{ messages: [], nextPageToken: null,
        pendingDispatchPlan: null, collaborationGate: {json.dumps(open_gate)} }};
      byClass(byClass(chat.list, "plan")[0], "confirm")[0].listeners.click();
      await new Promise((resolve) => setTimeout(resolve, 50));
      await chat.syncing;
    """
    result = group_page(tmp_path, routes, then=then)

    [card] = result["items"][0]["plans"]
    assert (card["state"], card["label"]) == ("failed", "expired: nothing was sent")
    assert card["error"].startswith("the plan expired before it was confirmed: nothing was sent.")
    assert card["actions"] == []
    assert result["calls"][-1] == ["GET", "/api/v1/dispatch-plans/plan-1"]
    assert result["gate"] is None


def test_a_group_loaded_while_its_tasks_run_shows_the_progress(tmp_path: Path) -> None:
    running = plan(
        "confirmed",
        [
            dispatched("t1", "north", 82.4, "safe", "completed"),
            dispatched("t2", "south", 44.0, "watch", "running"),
        ],
        updatedAt="2026-03-25T08:01:00Z",
    )
    executing = {"state": "executing", "tasksTotal": 2, "tasksDone": 1, "detail": "1 of 2 done"}
    routes = {
        PAGE_URL: {
            "messages": [
                group_message(1, "user", "Run the integration tests"),
                group_message(2, "master", "Sent to 2 threads: north, south."),
                group_message(3, "thread", "north: 42 passed", taskId="task-north", threadId="th-north"),
            ],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": executing,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": running, "collaborationGate": executing},
    }
    # The page remembers the plan it confirmed before the reload.
    setup = 'localStorage.setItem("boss.group.plans.group-1", JSON.stringify(["plan-1"]));'
    result = group_page(tmp_path, routes, setup=setup)

    assert result["calls"] == [["GET", PAGE_URL], ["GET", "/api/v1/dispatch-plans/plan-1"]]
    assert result["gate"] == ["executing", "executing: 1 of 2 done"]
    user, master, north = result["items"]
    [card] = user["plans"]
    assert (card["state"], card["label"]) == ("awaiting_result", "sent to 2 threads: 1 of 2 done")
    assert [(t["title"], t["state"], t["line"]) for t in card["targets"]] == [
        ("north", "done", "answered"),
        ("south", "awaiting_result", "south is working…"),
    ]
    assert master["meta"].startswith("master agent · ")
    # The raw result is named by its thread.
    assert (north["author"], north["meta"].split(" · ")[0]) == ("thread", "north")


def test_a_tab_that_did_not_confirm_shows_the_progress_from_the_message_page(tmp_path: Path) -> None:
    running = plan(
        "confirmed",
        [
            dispatched("t1", "north", 82.4, "safe", "completed"),
            dispatched("t2", "south", 44.0, "watch", "running"),
        ],
        updatedAt="2026-03-25T08:01:00Z",
    )
    executing = {"state": "executing", "tasksTotal": 2, "tasksDone": 1, "detail": "1 of 2 done"}
    routes = {
        PAGE_URL: {
            "messages": [
                group_message(1, "user", "Run the integration tests"),
                group_message(2, "master", "Sent to 2 threads: north, south."),
            ],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": executing,
            "executingDispatchPlans": [running],
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": running, "collaborationGate": executing},
    }
    # Nothing remembered: another tab (or another device) confirmed the plan.
    result = group_page(tmp_path, routes)

    assert result["calls"][0] == ["GET", PAGE_URL]
    assert json.loads(result["remembered"]) == ["plan-1"]
    user, _master = result["items"]
    [card] = user["plans"]
    assert (card["state"], card["label"]) == ("awaiting_result", "sent to 2 threads: 1 of 2 done")
    assert [(t["title"], t["state"]) for t in card["targets"]] == [
        ("north", "done"),
        ("south", "awaiting_result"),
    ]


def test_a_relay_target_card_shows_a_new_thread_without_its_hosts_budget(tmp_path: Path) -> None:
    relay = target(
        "t1",
        "tight (relay)",
        None,
        "",
        kind="relay",
        threadId="relay-1-t1",
        codexThreadRef=None,
        relayOfThreadId="th-tight",
        reason="new Codex thread in /src/tight on node-a, the folder of tight: no member can take new work "
        "(1 critical, 1 urgent)",
    )
    waiting = plan(targets=[relay], expiresAt=FUTURE)
    routes = {
        PAGE_URL: {
            "messages": [group_message(1, "user", "Write the release notes")],
            "nextPageToken": None,
            "pendingDispatchPlan": waiting,
            "collaborationGate": WAITING_GATE,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": waiting, "collaborationGate": WAITING_GATE},
    }
    result = group_page(tmp_path, routes)

    [item] = result["items"]
    [card] = item["plans"]
    [shown] = card["targets"]
    assert (shown["title"], shown["budget"]) == ("tight (relay)", "new thread")
    assert shown["reason"].startswith("new Codex thread in /src/tight on node-a")


def test_a_result_from_a_thread_the_page_does_not_list_is_named_by_the_plans_target(tmp_path: Path) -> None:
    done = plan(
        "confirmed",
        [
            dispatched("t1", "north", 82.4, "safe", "completed"),
            dispatched("t2", "south", 44.0, "watch", "completed"),
        ],
        summaryStatus="posted",
        summaryMessageId="m-4",
    )
    open_gate = {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""}
    routes = {
        PAGE_URL: {
            "messages": [
                group_message(1, "user", "Run the integration tests"),
                group_message(2, "thread", "south: 12 passed", taskId="task-south", threadId="th-south"),
                group_message(3, "thread", "north: 42 passed", taskId="task-north", threadId="th-north"),
                group_message(4, "master", "2 of 2 threads answered."),
            ],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": open_gate,
        },
        "/api/v1/dispatch-plans/plan-1": {"dispatchPlan": done, "collaborationGate": open_gate},
    }
    setup = 'localStorage.setItem("boss.group.plans.group-1", JSON.stringify(["plan-1"]));'
    result = group_page(tmp_path, routes, setup=setup)

    _user, south, north, summary = result["items"]
    assert [south["meta"].split(" · ")[0], north["meta"].split(" · ")[0]] == ["south", "north"]
    assert summary["summaryOf"] == "plan-1"
    assert result["items"][0]["plans"][0]["label"] == "done: 2 of 2 threads answered"
    assert result["gate"] is None


def test_a_send_says_the_plan_is_being_drafted_and_ends_at_the_plan_card(tmp_path: Path) -> None:
    waiting = plan(expiresAt=FUTURE)
    routes = {
        PAGE_URL: {
            "messages": [],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": None,
        },
        f"/api/v1/projects/{GROUP_ID}/messages": {
            "message": group_message(1, "user", "Run the integration tests"),
            "masterReply": None,
            "dispatchPlan": waiting,
            "task": None,
            "collaborationGate": WAITING_GATE,
        },
    }
    then = """
      chat.text.value = "Run the integration tests";
      calls.length = 0;
      const sending = sendDraft(chat);
      const during = [chat.gateLine.dataset.state, chat.gateLine.textContent, chat.button.textContent];
      await sending;
      calls.push(["during", during]);
    """
    result = group_page(tmp_path, routes, then=then)

    assert result["calls"] == [
        ["POST", f"/api/v1/projects/{GROUP_ID}/messages"],
        [
            "during",
            [
                "drafting",
                "the master agent is choosing the threads and drafting their instructions…",
                "Sending…",
            ],
        ],
    ]
    [item] = result["items"]
    [card] = item["plans"]
    assert (card["state"], [t["title"] for t in card["targets"]]) == (
        "pending_dispatch_plan",
        ["north", "south"],
    )
    assert result["gate"][0] == "awaiting_confirmation"


def test_a_message_no_thread_can_take_ends_in_the_master_agents_words(tmp_path: Path) -> None:
    nothing = group_message(2, "master", "Nothing was sent: every member is critical or must finish first.")
    open_gate = {"state": "open", "tasksTotal": 0, "tasksDone": 0, "detail": ""}
    routes = {
        PAGE_URL: {
            "messages": [],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": None,
        },
        f"/api/v1/projects/{GROUP_ID}/messages": {
            "message": group_message(1, "user", "Run the integration tests"),
            "masterReply": None,
            "dispatchPlan": None,
            "task": None,
            "collaborationGate": open_gate,
        },
        f"/api/v1/projects/{GROUP_ID}/messages?after=1": {
            "messages": [nothing],
            "nextPageToken": None,
            "pendingDispatchPlan": None,
            "collaborationGate": open_gate,
        },
    }
    then = """
      chat.text.value = "Run the integration tests";
      calls.length = 0;
      await sendDraft(chat);
      await chat.syncing;
    """
    result = group_page(tmp_path, routes, then=then)

    assert result["calls"] == [
        ["POST", f"/api/v1/projects/{GROUP_ID}/messages"],
        ["GET", f"/api/v1/projects/{GROUP_ID}/messages?after=1"],
    ]
    assert [(i["author"], i["plans"]) for i in result["items"]] == [("user", []), ("master", [])]
    assert result["gate"] is None
