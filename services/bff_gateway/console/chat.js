// Boss web console: the chat's client rules (CHAT-6). Plain functions, no DOM and no network:
// index.html loads this before app.js, and tests/unit/bff_gateway/test_console_chat.py runs it
// under Node. A chat task's `status` is the scheduler's (queued, claimed, running, completed,
// failed, timed_out, cancelled, expired); what the person sees is one of four client states.
"use strict";

const TERMINAL_STATUSES = new Set(["completed", "failed", "timed_out", "cancelled", "expired"]);

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
//   terminal, retryable }: `label` is the headline, `detail` the server's words (status_detail,
// e.g. "device node-1 last seen at 2026-03-25T08:00:00Z", or the failure in words), `retryable`
// whether a Retry makes sense (a failed, timed out or expired task not retried yet).
function chatState(task, names) {
  const device = task.deviceId || (names && names.device) || "its device";
  const thread = (names && names.thread) || task.targetThreadId || "the thread";
  const detail = task.statusDetail || "";
  const status = task.status || "";
  // POST /api/v1/tasks/{id}/retry takes a failed, timed out or expired task, once; not a cancelled one.
  const failed = (label, words) => ({
    state: "failed", status, label, detail: detail || words || "", terminal: true,
    retryable: status !== "cancelled" && !task.retriedByTaskId,
  });
  switch (status) {
    case "queued":
      return { state: "pending_task", status, label: `queued for ${device}`, detail, terminal: false, retryable: false };
    case "claimed":
      return { state: "pending_task", status, label: `queued for ${device}: picked up, starting`, detail, terminal: false, retryable: false };
    case "running":
      return { state: "awaiting_result", status, label: `${thread} is working…`, detail, terminal: false, retryable: false };
    case "completed":
      return { state: "done", status, label: "replied", detail, terminal: true, retryable: false };
    case "timed_out":
      return failed("timed out", FAILURE_WORDS[task.failureKind] || FAILURE_WORDS.timed_out);
    case "expired":
      return failed("expired", `${device} did not pick it up in time`);
    case "cancelled":
      return failed("cancelled", "");
    case "failed":
      return failed("failed", FAILURE_WORDS[task.failureKind] || "");
    default:
      return { state: "pending_task", status, label: status ? `${status} on ${device}` : "sending…", detail, terminal: false, retryable: false };
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
// thread reply is already in `messages` (it completed). A known terminal task needs no fetch; a
// failed one learned from its system message only is fetched (to learn whether it was retried).
function tasksToFetch(messages, tasks, limit) {
  const replied = new Set(messages.filter((m) => m.authorKind === "thread" && m.taskId).map((m) => m.taskId));
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
