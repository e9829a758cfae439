// Boss web console: the chat's client rules (CHAT-6) for a thread's chat, the master agent's chat
// and a group's dispatch plans (CHAT-4). Plain functions, no DOM and no network: index.html loads
// this before app.js, and tests/unit/bff_gateway/test_console_chat.py and test_console_group.py run
// it under Node. A chat task's `status` is the scheduler's (queued, claimed, running, completed,
// failed, timed_out, cancelled, expired); what the person sees is one of four client states
// (pending_task, pending_dispatch_plan, awaiting_result, failed) until it is done.
"use strict";

const TERMINAL_STATUSES = new Set(["completed", "failed", "timed_out", "cancelled", "expired"]);
// Who writes the reply that completes a chat task: a thread (thread chat, a group's results) or
// the master agent (its own chat).
const REPLY_AUTHORS = new Set(["thread", "master"]);

// The local agent's failure kinds (scheduler.proto FailureKind) in words, for a failed task whose
// status_detail is empty.
const FAILURE_WORDS = {
  session_not_found: "the thread's Codex session was not found on this machine",
  thread_busy: "the thread is busy in another Codex process",
  not_logged_in: "Codex is not logged in on this machine",
  model_error: "the model answered with an error",
  stalled: "Codex stalled (no output for too long)",
  timed_out: "the run took longer than the turn cap",
  could_not_start: "Codex could not be started",
  no_reply: "Codex finished without a reply",
  device_lost: "the device stopped answering",
  interrupted: "the device's local agent was stopped during the run",
  other: "the run failed",
};

// `{ foo_bar: 1 }` -> `{ fooBar: 1 }` (one level): messages and tasks arrive camelCase from REST
// and may carry proto field names in live events; both read the same after this.
function camelKeys(raw) {
  const out = {};
  for (const [key, value] of Object.entries(raw || {})) {
    out[key.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase())] = value;
  }
  return out;
}

// A message as the chat keeps it: camelCase keys, `sequence` a number (NaN when missing).
function messageOf(raw) {
  const message = camelKeys(raw);
  message.sequence = Number(message.sequence);
  return message;
}

// A task as the chat keeps it: camelCase keys, every id and text field a string.
function taskOf(raw) {
  const task = camelKeys(raw);
  for (const key of ["taskId", "status", "deviceId", "targetThreadId", "requestMessageId",
    "resultMessageId", "failureKind", "statusDetail", "retryOfTaskId", "retriedByTaskId"]) {
    task[key] = task[key] ? String(task[key]) : "";
  }
  return task;
}

function isTerminal(status) {
  return TERMINAL_STATUSES.has(status);
}

// The task to keep when `incoming` (a GET answer or a live event) meets `known` (undefined when
// none): a terminal status never goes back to a live one, otherwise the later `updatedAt` wins
// (the incoming one on a tie or when either has none). A retry's link is kept from either.
function newerTask(known, incoming) {
  if (!known) return incoming;
  const stale = (isTerminal(known.status) && !isTerminal(incoming.status)) ||
    Date.parse(incoming.updatedAt) < Date.parse(known.updatedAt);
  const kept = stale ? known : incoming;
  return { ...kept, retriedByTaskId: incoming.retriedByTaskId || known.retriedByTaskId };
}

// What the person sees for a task (CHAT-6). `names` gives `thread` (the thread's title) and
// `device` (the node's name) when the task does not say. Returns
// { state: "pending_task" | "awaiting_result" | "failed" | "done", status, label, detail,
//   terminal, retryable, cancellable }: `label` is the headline, `detail` the server's words
// (status_detail, e.g. "device node-1 last seen at 2026-03-25T08:00:00Z", or the failure in words),
// `retryable` whether a Retry makes sense (a failed, timed out, cancelled or expired task not retried
// yet; never a group's dispatch_execution task, which the server retries only as a new plan),
// `cancellable` whether a Cancel can still stop it (queued or claimed: Codex has not started; not
// offered for a dispatch_execution task: its plan's card follows it).
function chatState(task, names) {
  const view = taskState(task, names);
  if (task.taskType === "dispatch_execution") return { ...view, retryable: false, cancellable: false };
  return view;
}

function taskState(task, names) {
  const device = task.deviceId || (names && names.device) || "its device";
  const thread = (names && names.thread) || task.targetThreadId || "the thread";
  const detail = task.statusDetail || "";
  const status = task.status || "";
  // POST /api/v1/tasks/{id}/retry takes a failed, timed out, cancelled or expired task, once;
  // POST /api/v1/tasks/{id}/cancel a queued or claimed one.
  const failed = (label, words) => ({
    state: "failed", status, label, detail: detail || words || "", terminal: true,
    retryable: !task.retriedByTaskId, cancellable: false,
  });
  const pending = (label) => ({ state: "pending_task", status, label, detail, terminal: false, retryable: false, cancellable: true });
  switch (status) {
    case "queued":
      return pending(`queued for ${device}`);
    case "claimed":
      return pending(`queued for ${device}: picked up, starting`);
    case "running":
      return { state: "awaiting_result", status, label: `${thread} is working…`, detail, terminal: false, retryable: false, cancellable: false };
    case "completed":
      return { state: "done", status, label: "replied", detail, terminal: true, retryable: false, cancellable: false };
    case "timed_out":
      return failed("timed out", FAILURE_WORDS[task.failureKind] || FAILURE_WORDS.timed_out);
    case "expired":
      return failed("expired", `${device} did not pick it up in time`);
    case "cancelled":
      return failed("cancelled", "");
    case "failed":
      return failed("failed", FAILURE_WORDS[task.failureKind] || "");
    default:
      return { state: "pending_task", status, label: status ? `${status} on ${device}` : "sending…", detail, terminal: false, retryable: false, cancellable: false };
  }
}

// `known` plus `incoming` (both from messageOf), one per messageId, in sequence order. `gap` is
// true when the result skips a sequence after the first known one (an event was missed: fetch
// `?after=`), or an incoming message has no sequence.
function mergeMessages(known, incoming) {
  const byId = new Map(known.map((m) => [m.messageId, m]));
  let unsequenced = false;
  for (const message of incoming) {
    if (!Number.isFinite(message.sequence)) unsequenced = true;
    byId.set(message.messageId, message);
  }
  const messages = [...byId.values()].filter((m) => Number.isFinite(m.sequence))
    .sort((a, b) => a.sequence - b.sequence);
  let gap = unsequenced;
  for (let i = 1; i < messages.length; i += 1) {
    if (messages[i].sequence !== messages[i - 1].sequence + 1) gap = true;
  }
  return { messages, gap };
}

// The highest sequence in `messages` (0 for none): what `GET .../messages?after=` takes.
function lastSequence(messages) {
  return messages.reduce((last, m) => (Number.isFinite(m.sequence) && m.sequence > last ? m.sequence : last), 0);
}

// The task that answers the user message now: its own task, or the latest retry of it (following
// retriedByTaskId through `tasks`, a Map taskId -> task). Returns { taskId, task } (task undefined
// while unknown), or null for a message that requested no task.
function currentTask(message, tasks) {
  if (!message.taskId) return null;
  let taskId = message.taskId;
  const seen = new Set();
  while (!seen.has(taskId)) {
    seen.add(taskId);
    const task = tasks.get(taskId);
    if (!task || !task.retriedByTaskId) return { taskId, task };
    taskId = task.retriedByTaskId;
  }
  return { taskId, task: tasks.get(taskId) };
}

// The task ids to fetch (`GET /api/v1/tasks/{id}`) so the chat shows where each of the last
// `limit` user messages stands: every current task not known to be terminal, except one whose
// reply (the thread's, or the master agent's) is already in `messages` (it completed). A known
// terminal task needs no fetch; a failed one learned from its system message only is fetched (to
// learn whether it was retried).
function tasksToFetch(messages, tasks, limit) {
  const replied = new Set(messages.filter((m) => REPLY_AUTHORS.has(m.authorKind) && m.taskId).map((m) => m.taskId));
  const requests = messages.filter((m) => m.authorKind === "user" && m.taskId).slice(-limit);
  const ids = [];
  for (const message of requests) {
    const { taskId, task } = currentTask(message, tasks);
    if (task ? isTerminal(task.status) : replied.has(taskId)) continue;
    if (!ids.includes(taskId)) ids.push(taskId);
  }
  return ids;
}

// The draft to send: the previous one (same client_message_id, so a resend after a network error
// is idempotent) while its text is unchanged, otherwise a new one with `makeId()`.
function draftFor(previous, text, makeId) {
  if (previous && previous.text === text && previous.clientMessageId) return previous;
  return { text, clientMessageId: makeId() };
}

// A client_message_id ("c-" and 32 hex digits) from 16 random bytes (crypto.getRandomValues,
// which works on plain http too, unlike crypto.randomUUID).
function clientMessageIdFrom(bytes) {
  return "c-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// Why a send failed, in words, from the HTTP status (0: no answer at all) and the problem+json
// body. `resend` is true when sending again may succeed and must reuse the draft's id (no answer,
// or the server was unavailable: the message may have been stored); `newId` when the draft's id
// belongs to another message already (the next send needs a new one).
function sendFailure(status, problem) {
  const body = problem || {};
  if (status === 409 && body.reason === "CLIENT_MESSAGE_ID_REUSED") {
    return { text: "not sent: this draft's id was used for another message. Send again to send it as new.", resend: false, newId: true };
  }
  if (!status) return { text: "not sent: no answer from the server. Send again to retry (it is sent once).", resend: true };
  if (status === 409 && body.reason === "THREAD_METADATA_INCOMPLETE") {
    const fields = body.missing_fields || (body.errors || []).map((e) => e.field);
    return { text: `cannot send: the thread's metadata is incomplete (missing ${fields.join(", ") || "fields"})`, resend: false };
  }
  if (status >= 500 || status === 429) {
    return { text: `not sent: ${body.detail || "the server is unavailable"}. Send again to retry (it is sent once).`, resend: true };
  }
  const fields = (body.errors || []).map((e) => `${e.field}: ${e.detail}`);
  return { text: `cannot send: ${fields.join("; ") || body.detail || "refused (" + status + ")"}`, resend: false };
}

// --- group chat: dispatch plans (CHAT-4) ----------------------------------------------------------

// A dispatch plan (DispatchPlanView, from a send's answer, GET /api/v1/dispatch-plans/{id}, the
// message page's pendingDispatchPlan or a dispatch_plan.updated event) as the chat keeps it:
// camelCase keys, its targets' and left-out members' too.
function planOf(raw) {
  const plan = camelKeys(raw);
  plan.targets = (plan.targets || []).map(camelKeys);
  plan.leftOut = (plan.leftOut || []).map(camelKeys);
  return plan;
}

// How far a plan has come: 0 proposed, 1 confirmed, 2 confirmed with its summary pending, 3 at an
// end (summary posted, rejected, expired, superseded). A plan never moves back.
function planProgress(plan) {
  if (plan.status === "proposed") return 0;
  if (plan.status !== "confirmed") return 3;
  return { pending: 2, posted: 3 }[plan.summaryStatus] || 1;
}

// The plan to keep when `incoming` meets `known` (undefined when none): the one further along,
// else the later `updatedAt` (the incoming one on a tie or when either has none).
function newerPlan(known, incoming) {
  if (!known) return incoming;
  const ahead = planProgress(incoming) - planProgress(known);
  if (ahead) return ahead > 0 ? incoming : known;
  return Date.parse(incoming.updatedAt) < Date.parse(known.updatedAt) ? known : incoming;
}

// True while the server may still change the plan: proposed (it waits for the person, or is about
// to expire), or confirmed without its summary posted.
function planOpen(plan) {
  return planProgress(plan) < 3;
}

// "1 thread", "2 threads".
function threadsWord(count) {
  return count === 1 ? "1 thread" : `${count} threads`;
}

// A target's budget at the proposal in words, as its ring shows it: "82% left · safe" (the
// percent rounded down, as every ring), or "budget not reported".
function budgetWords(remainingPct, level) {
  const percent = remainingPct === null || remainingPct === undefined || remainingPct === "" ? NaN : Number(remainingPct);
  if (!Number.isFinite(percent)) return "budget not reported";
  return `${Math.floor(percent)}% left` + (level ? ` · ${level}` : "");
}

// What a plan card shows in a target's budget place: a relay is a new Codex thread (its host's
// budget is not its own), a member its budget as proposed.
function targetBudgetWords(target) {
  if (target.kind === "relay") return "new thread";
  return budgetWords(target.remainingPct, target.level);
}

// The dispatch_execution task of a dispatched target: as the chat knows it (`tasks`, a Map
// taskId -> task from taskOf) or, when unknown, as the plan says (`taskStatus`, queued when not
// said); a plan that knows the task ended wins over a task update that has not arrived yet.
function targetTask(target, tasks) {
  const fromPlan = taskOf({ taskId: target.taskId, taskType: "dispatch_execution", status: target.taskStatus || "queued",
    deviceId: target.deviceId, targetThreadId: target.threadId });
  const known = target.taskId ? tasks.get(target.taskId) : undefined;
  if (!known) return fromPlan;
  if (isTerminal(fromPlan.status) && !isTerminal(known.status)) return { ...known, status: fromPlan.status };
  return known;
}

// One target of `plan` as its card shows it; `dropped`: the person dropped it (before confirming).
// Returns { state, status, label, detail }: state "proposed" (sent on confirm), "dropped",
// "skipped" (it could no longer take work at the confirmation: `detail` says why), "not_sent" (the
// plan ended unconfirmed) or, once dispatched, its task's client state (chatState: pending_task,
// awaiting_result, done, failed; `status` the task's).
function targetView(target, plan, tasks, dropped) {
  const line = (state, label, detail) => ({ state, status: "", label, detail: detail || "" });
  if (target.status === "dispatched") {
    const view = chatState(targetTask(target, tasks), { thread: target.threadTitle || target.threadId, device: target.deviceId });
    return { state: view.state, status: view.status, label: view.state === "done" ? "answered" : view.label, detail: view.detail };
  }
  if (target.status === "dropped") return line("dropped", "dropped by you: not sent");
  if (target.status === "skipped") return line("skipped", "skipped: not sent", target.statusDetail);
  if (plan.status !== "proposed") return line("not_sent", "not sent");
  if (dropped) return line("dropped", "dropped: it will not be sent");
  return line("proposed", "will be sent");
}

// Where a plan stands (CHAT-6 in a group), for its card: { state, label, detail, decidable, kept,
// total, done, failed }. `drops`: a Set of the target ids the person dropped; `now`: milliseconds
// since the epoch (a plan past its expiresAt reads as expired before the server says so).
// - proposed: pending_dispatch_plan, decidable (confirm or reject), `kept` targets to send to;
// - confirmed: pending_task while every task is still queued, awaiting_result while one runs or
//   the master agent summarises ("k of N done", `done` of `total`), then done; failed when every
//   thread failed (`failed` counts those that ended without an answer);
// - rejected and superseded: done, nothing sent; expired: failed, nothing sent.
function planView(plan, tasks, drops, now) {
  const dropped = drops || new Set();
  const base = { decidable: false, kept: 0, total: 0, done: 0, failed: 0, detail: "" };
  if (plan.status === "proposed" && !(Date.parse(plan.expiresAt) <= now)) {
    const kept = plan.targets.filter((t) => t.status === "proposed" && !dropped.has(t.targetId)).length;
    return { ...base, state: "pending_dispatch_plan", label: "waiting for your confirmation", decidable: true, kept,
      total: plan.targets.length, detail: kept ? `Confirm sends your message to ${threadsWord(kept)}.` : "Keep at least one thread to send it." };
  }
  if (plan.status === "proposed" || plan.status === "expired") {
    return { ...base, state: "failed", label: "expired: nothing was sent", detail: "It was not confirmed in time; send the message again for a new plan." };
  }
  if (plan.status === "rejected") return { ...base, state: "done", label: "rejected: nothing was sent" };
  if (plan.status === "superseded") return { ...base, state: "done", label: "replaced by a newer message's plan: nothing was sent" };
  const sent = plan.targets.filter((t) => t.status === "dispatched").map((t) => targetTask(t, tasks));
  const total = sent.length;
  const done = sent.filter((t) => isTerminal(t.status)).length;
  const failed = sent.filter((t) => isTerminal(t.status) && t.status !== "completed").length;
  const counts = { ...base, total, done, failed };
  if (plan.summaryStatus === "posted") {
    return { ...counts, state: failed === total ? "failed" : "done", label: `done: ${total - failed} of ${threadsWord(total)} answered`,
      detail: failed ? `${failed} failed: the summary names ${failed === 1 ? "it" : "them"}.` : "" };
  }
  if (done === total) return { ...counts, state: "awaiting_result", label: `${done} of ${total} done; the master agent is summarising…` };
  const started = sent.some((t) => t.status !== "queued" && t.status !== "claimed");
  return { ...counts, state: started ? "awaiting_result" : "pending_task", label: `sent to ${threadsWord(total)}: ${done} of ${total} done` };
}

// The body of POST /api/v1/dispatch-plans/{planId}/confirm: the proposed targets the person
// dropped (`drops`, a Set of targetIds), in plan order; `error` says why it cannot be sent ("" when
// it can: at least one target is kept).
function confirmRequest(plan, drops) {
  const proposed = plan.targets.filter((t) => t.status === "proposed");
  const ids = proposed.filter((t) => drops.has(t.targetId)).map((t) => t.targetId);
  return { body: { dropped_target_ids: ids }, error: ids.length < proposed.length ? "" : "keep at least one thread: a plan is sent to one thread or more" };
}

// The server's refusals of a plan decision that mean the plan has moved on.
const PLAN_CLOSED_WORDS = {
  DISPATCH_PLAN_EXPIRED: "the plan expired before it was confirmed: nothing was sent. Send the message again for a new plan.",
  DISPATCH_PLAN_SUPERSEDED: "a newer message replaced this plan: nothing was sent.",
  DISPATCH_PLAN_REJECTED: "the plan was rejected: nothing was sent.",
  DISPATCH_PLAN_CONFIRMED: "the plan was confirmed already: its threads are at work.",
};

// Why confirming or rejecting a plan failed (`action`: "confirm" | "reject"), from the HTTP status
// (0: no answer at all) and the problem+json body: { text, again }, `again` true when the same
// request may succeed if tried again (no answer, or the server was unavailable); otherwise the
// plan is fetched anew (it changed on the server, or the request itself was refused).
function planFailure(action, status, problem) {
  const body = problem || {};
  const done = action === "reject" ? "rejected" : "confirmed";
  if (!status) return { text: `not ${done}: no answer from the server. Try again.`, again: true };
  if (PLAN_CLOSED_WORDS[body.reason]) return { text: PLAN_CLOSED_WORDS[body.reason], again: false };
  if (body.reason === "DISPATCH_PLAN_TARGETS_UNAVAILABLE") {
    return { text: `not sent: ${body.detail || "none of the kept threads can take work now"}`, again: false };
  }
  if (status === 404) return { text: "this plan is not there any more (it may belong to another owner)", again: false };
  if (status >= 500 || status === 429) {
    return { text: `not ${done}: ${body.detail || "the server is unavailable"}. Try again.`, again: true };
  }
  const fields = (body.errors || []).map((e) => `${e.field}: ${e.detail}`);
  return { text: `not ${done}: ${fields.join("; ") || body.detail || "refused (" + status + ")"}`, again: false };
}

// A group's collaboration gate (CollaborationGateView) in words: "" when open (send freely), the
// server's words while a plan waits (they carry its deadline), "executing: k of N done" while its
// tasks run, then that the master agent sums up.
function gateWords(gate) {
  if (!gate) return "";
  switch (gate.state) {
    case "awaiting_confirmation":
      return gate.detail || "a dispatch plan waits for your confirmation";
    case "executing":
      return `executing: ${gate.tasksDone} of ${gate.tasksTotal} done`;
    case "summarising":
      return "summarising: every thread has ended; the master agent sums up";
    default:
      return "";
  }
}

// The plan ids a group's page remembers (in localStorage), most recent last: `planId` once, at most
// `limit`. A reload finds the group's confirmed plans through them: the server names only the plan
// that waits (pendingDispatchPlan).
function rememberPlan(ids, planId, limit) {
  const kept = (ids || []).filter((id) => id !== planId);
  kept.push(planId);
  return kept.slice(-limit);
}

// The plan ids to fetch (GET /api/v1/dispatch-plans/{id}) after a load or a reconnect: every
// remembered one not known yet, and every known one still open (`plans`, a Map planId -> plan).
function plansToFetch(plans, remembered) {
  const ids = (remembered || []).filter((id) => !plans.has(id));
  for (const plan of plans.values()) if (planOpen(plan) && !ids.includes(plan.planId)) ids.push(plan.planId);
  return ids;
}

// The body of POST /api/v1/projects for a new group and `error` ("" when it can be sent): a name
// of 1-200 characters (trimmed) and at least two threads (their thread ids).
function groupRequest(title, threadIds) {
  const name = String(title || "").trim();
  if (!name) return { body: null, error: "name the group" };
  if (name.length > 200) return { body: null, error: `the name is ${name.length} characters; at most 200` };
  if (threadIds.length < 2) return { body: null, error: "pick at least two threads" };
  return { body: { project_title: name, thread_ids: [...threadIds] }, error: "" };
}
