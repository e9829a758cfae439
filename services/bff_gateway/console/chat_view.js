// Boss web console: the chat of a project page (CHAT-2, CHAT-3, CHAT-4, CHAT-6): a single thread's,
// the master agent's or a group's. The history, a send box and, under each message, where its task
// stands (in a group: the dispatch plan it got, group_view.js), kept live by the page's EventSource
// and caught up with `GET .../messages?after=<last sequence>`, `GET /api/v1/tasks/{id}` (and a
// group's plans) on load, on every stream (re)connect and every CHAT_POLL_MS while something is
// unfinished, so a reload or a lost stream still ends in the reply, the plan card or the failure.
// Uses app.js's `state`, `api`, `el`, `timeEl` and `withTimes` and group_view.js's plan functions
// (called only after every script has loaded) and chat.js's rules.
"use strict";

const DRAFT_KEY = "boss.chat.draft.";
const CHAT_POLL_MS = 15000;
// How many of the latest user messages get their task looked up after a load or a reconnect.
const CHAT_TASK_LIMIT = 20;
const AUTHOR_NAMES = { user: "you", master: "master agent", system: "Boss" };

// Which chat a project's conversation_type has: a thread's, the master agent's or a group's.
const CHAT_KINDS = { single_device: "thread", master_agent: "master", group: "group" };

// Who answers in a chat, for its task lines: `thread` names who works on a message, `device` where
// it waits (a task that names no device: the master agent's model answers it).
function chatNames(project, kind) {
  if (kind === "master") return { thread: "the master agent", device: "the master agent" };
  if (kind === "group") return { thread: project.project_title, device: "" };
  const thread = project.active_thread_contexts[0] || {};
  return { thread: thread.title || thread.thread_id || project.project_title, device: thread.node_id || "" };
}

// The chat of `project` (a project detail of a single_device, master_agent or group project): the
// one in state.chat when it is the same project (its section, send box and focus survive a
// re-render of the page), else a new one.
function chatFor(project) {
  const kind = CHAT_KINDS[project.conversation_type] || "thread";
  const names = chatNames(project, kind);
  if (state.chat && state.chat.projectId === project.project_id) {
    state.chat.names = names;
    return state.chat;
  }
  dropChat();
  // A group's chat also keeps its dispatch plans by id, the targets the person dropped (plan id ->
  // Set of target ids), each plan's last refusal in words, the plans being decided and the gate.
  const chat = { projectId: project.project_id, kind, names, messages: [], tasks: new Map(), gates: new Map(),
    plans: new Map(), drops: new Map(), planErrors: new Map(), planBusy: new Set(), gate: null,
    syncing: null, syncAgain: false, pollTimer: null, sending: false };
  buildChatSection(chat);
  state.chat = chat;
  return chat;
}

// Forgets the chat (the page shows another view): no more polling.
function dropChat() {
  if (state.chat) clearTimeout(state.chat.pollTimer);
  state.chat = null;
}

// Forgets what the chat has loaded (the server's history was reset): the next sync loads it anew.
function forgetChatHistory(chat) {
  chat.messages = [];
  chat.tasks.clear();
  chat.gates.clear();
  chat.plans.clear();
}

// The chat shown for `projectId`, or null.
function chatOn(projectId) {
  return state.chat && projectId && state.chat.projectId === projectId ? state.chat : null;
}

// What the empty chat says, by kind: where a message goes.
function emptyChatText(chat) {
  if (chat.kind === "master") {
    return "No messages yet: ask the master agent about your threads (their budgets, what they are doing, which is close to compaction).";
  }
  if (chat.kind === "group") {
    return "No messages yet: for what you send, the master agent proposes which threads get it and why; nothing is sent before you confirm.";
  }
  return `No messages yet: what you send goes to ${chat.names.thread} on its device.`;
}

function buildChatSection(chat) {
  const text = el("textarea", { name: "text", rows: 2, maxlength: 100000, "aria-label": "message",
    placeholder: chat.kind === "master" ? "Ask the master agent" : `Message ${chat.names.thread}` });
  text.value = loadDraft(chat.projectId).text || "";
  const button = el("button", { type: "submit" }, "Send");
  const error = el("div", { class: "send-error", id: "send-error", role: "alert", hidden: true });
  // A group's gate (a plan waits, executing k of N, summarising) is said above the send box.
  const gateLine = el("div", { class: "gate", id: "gate", hidden: true });
  // The send box stays at the bottom of the screen while the history scrolls; a send's error is
  // shown inside it, where the person is looking.
  const form = el("form", { class: "composer", id: "composer" }, gateLine, error, text, button);
  text.addEventListener("input", () => {
    saveDraft(chat.projectId, text.value, "");
    showChatError(chat, "");
    if (!chat.sending) chat.button.textContent = "Send";
  });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      sendDraft(chat);
    }
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sendDraft(chat);
  });
  Object.assign(chat, {
    text, button, form, gateLine,
    list: el("ol", { class: "messages", id: "messages" }),
    empty: el("div", { class: "sub", id: "chat-empty" }, emptyChatText(chat)),
    notice: el("div", { class: "sub notice", id: "chat-notice", hidden: true }),
    error,
  });
  chat.node = el("section", { class: "chat", id: "chat", "data-project-id": chat.projectId, "data-kind": chat.kind },
    el("h2", {}, chat.kind === "master" ? "Chat with the master agent" : chat.kind === "group" ? "Group chat" : "Chat"),
    chat.list, chat.empty, chat.notice, form);
}

// --- drafts: the text being written and, once a send was tried, its client_message_id ------------

function loadDraft(projectId) {
  try {
    return JSON.parse(localStorage.getItem(DRAFT_KEY + projectId) || "{}") || {};
  } catch (_) {
    return {};
  }
}

// Stores the draft's text with `clientMessageId` (or, when empty, the stored one while the text is
// unchanged); an empty draft is removed.
function saveDraft(projectId, text, clientMessageId) {
  const previous = loadDraft(projectId);
  const id = clientMessageId || (previous.text === text ? previous.clientMessageId || "" : "");
  if (text || id) localStorage.setItem(DRAFT_KEY + projectId, JSON.stringify({ text, clientMessageId: id }));
  else localStorage.removeItem(DRAFT_KEY + projectId);
}

function newClientMessageId() {
  return clientMessageIdFrom(crypto.getRandomValues(new Uint8Array(16)));
}

// --- sending and retrying ----------------------------------------------------------------------------

async function sendDraft(chat) {
  const text = chat.text.value;
  if (chat.sending) return;
  if (!text.trim()) {
    showChatError(chat, "write a message first");
    return;
  }
  const draft = draftFor(loadDraft(chat.projectId), text, newClientMessageId);
  saveDraft(chat.projectId, draft.text, draft.clientMessageId);
  setSending(chat, true);
  let answer;
  try {
    answer = await api(`/api/v1/projects/${encodeURIComponent(chat.projectId)}/messages`,
      { text: draft.text, client_message_id: draft.clientMessageId });
  } catch (error) {
    const failure = sendFailure(error.status, error.problem);
    if (failure.newId) localStorage.setItem(DRAFT_KEY + chat.projectId, JSON.stringify({ text, clientMessageId: "" }));
    showChatError(chat, failure.text);
    setSending(chat, false, failure.resend);
    return;
  }
  setSending(chat, false, false);
  localStorage.removeItem(DRAFT_KEY + chat.projectId);
  chat.text.value = "";
  showChatError(chat, "");
  if (answer.task) storeTask(chat, answer.task, answer.collaborationGate);
  if (chat.kind === "group") storePlan(chat, answer.dispatchPlan, answer.collaborationGate);
  const merged = mergeMessages(chat.messages, [messageOf(answer.message)]);
  chat.messages = merged.messages;
  drawChat(chat, true);
  // The master agent's inline reply (masterReply) is stored as its message already, and a group
  // message no thread can take gets the master agent's message at once: fetch what follows.
  if (merged.gap || resultMissing(chat) || (chat.kind === "group" && !answer.dispatchPlan)) syncChat(chat);
  else schedulePoll(chat, false);
}

// A draft whose send got no answer but was stored (its message arrived by the stream or a catch-up)
// is sent: the send box is emptied, as after an answered send.
function settleDraft(chat) {
  const draft = loadDraft(chat.projectId);
  if (chat.sending || !draft.clientMessageId || chat.text.value !== draft.text) return;
  if (!chat.messages.some((m) => m.clientMessageId === draft.clientMessageId)) return;
  localStorage.removeItem(DRAFT_KEY + chat.projectId);
  chat.text.value = "";
  showChatError(chat, "");
  setSending(chat, false, false);
}

// The send box while a send is under way, and after: `resend` labels the button "Send again" (the
// same message, with the same client_message_id).
function setSending(chat, sending, resend) {
  chat.sending = sending;
  chat.text.readOnly = sending;
  chat.button.disabled = sending;
  chat.button.textContent = sending ? "Sending…" : resend ? "Send again" : "Send";
  if (chat.kind === "group") drawGate(chat); // a group's send waits for the plan's drafts
}

function showChatError(chat, text) {
  chat.error.textContent = text;
  chat.error.hidden = !text;
}

async function retryTask(chat, taskId, button) {
  button.disabled = true;
  button.textContent = "Retrying…";
  try {
    const answer = await api(`/api/v1/tasks/${encodeURIComponent(taskId)}/retry`, undefined, "POST");
    const task = storeTask(chat, answer.task, answer.collaborationGate);
    const old = chat.tasks.get(taskId);
    if (old && !old.retriedByTaskId) chat.tasks.set(taskId, { ...old, retriedByTaskId: task.taskId });
    showChatError(chat, "");
    drawChat(chat, false);
    schedulePoll(chat, false);
  } catch (error) {
    showChatError(chat, `could not retry: ${error.message}`);
    syncChat(chat);
  }
}

// Asks the server to cancel a task that has not started; the outcome (cancelled, or "it runs to its
// end" when Codex started it meanwhile) comes as a task.updated event or on the next poll.
async function cancelTask(chat, taskId, button) {
  button.disabled = true;
  button.textContent = "Cancelling…";
  try {
    const answer = await api(`/api/v1/tasks/${encodeURIComponent(taskId)}/cancel`, undefined, "POST");
    storeTask(chat, answer.task, answer.collaborationGate);
    showChatError(chat, "");
    schedulePoll(chat, false);
  } catch (error) {
    showChatError(chat, `could not cancel: ${error.message}`);
    syncChat(chat);
  }
}

// --- the model: messages by sequence, tasks by id -----------------------------------------------------

// Keeps a task (REST or event shape) and the collaboration gate that came with it; returns it.
function storeTask(chat, raw, gate) {
  const task = taskOf(raw);
  if (!task.taskId) return task;
  chat.tasks.set(task.taskId, newerTask(chat.tasks.get(task.taskId), task));
  const old = task.retryOfTaskId && chat.tasks.get(task.retryOfTaskId);
  if (old && !old.retriedByTaskId) chat.tasks.set(old.taskId, { ...old, retriedByTaskId: task.taskId });
  if (gate) chat.gates.set(task.taskId, gate);
  return task;
}

// Brings the chat up to date with the server (coalesced: a call while one runs makes it run once
// more), then redraws it. Never rejects: a failure is shown and retried by the poll.
function syncChat(chat) {
  if (chat.syncing) {
    chat.syncAgain = true;
    return chat.syncing;
  }
  chat.syncing = (async () => {
    let failed = false;
    try {
      do {
        chat.syncAgain = false;
        await fetchNewMessages(chat);
        await fetchOpenTasks(chat);
        if (chat.kind === "group") await fetchOpenPlans(chat);
        if (resultMissing(chat)) await fetchNewMessages(chat);
      } while (chat.syncAgain && state.chat === chat);
      chat.notice.hidden = true;
    } catch (error) {
      failed = true;
      chat.notice.textContent = `could not bring the chat up to date (${error.message}); trying again shortly`;
      chat.notice.hidden = false;
    } finally {
      chat.syncing = null;
    }
    drawChat(chat, false);
    settleDraft(chat);
    schedulePoll(chat, failed);
  })();
  return chat.syncing;
}

async function fetchNewMessages(chat) {
  for (;;) {
    const after = lastSequence(chat.messages);
    const page = await api(`/api/v1/projects/${encodeURIComponent(chat.projectId)}/messages?after=${after}`);
    const incoming = (page.messages || []).map(messageOf);
    chat.messages = mergeMessages(chat.messages, incoming).messages;
    // A group's page names the plan that waits for the person, the confirmed plans still running
    // (their progress, k of N done, for a tab that did not confirm them) and where the group stands.
    if (chat.kind === "group") {
      storePlan(chat, page.pendingDispatchPlan, page.collaborationGate);
      for (const plan of page.executingDispatchPlans || []) storePlan(chat, plan);
    }
    if (!incoming.length || !page.nextPageToken || lastSequence(chat.messages) <= after) return;
  }
}

async function fetchOpenTasks(chat) {
  const fetched = new Set();
  // A few rounds: a failed task learned in one round may name its retry, fetched in the next.
  for (let round = 0; round < 4; round += 1) {
    const ids = tasksToFetch(chat.messages, chat.tasks, CHAT_TASK_LIMIT).filter((id) => !fetched.has(id));
    if (!ids.length) return;
    for (const id of ids) fetched.add(id);
    const answers = await Promise.all(ids.map((id) => api(`/api/v1/tasks/${encodeURIComponent(id)}`)
      .catch((error) => { if (error.status === 404) return null; throw error; })));
    for (const answer of answers) if (answer && answer.task) storeTask(chat, answer.task, answer.collaborationGate);
  }
}

// True when a task has ended with a message the chat does not have yet.
function resultMissing(chat) {
  const known = new Set(chat.messages.map((m) => m.messageId));
  return [...chat.tasks.values()].some((t) => isTerminal(t.status) && t.resultMessageId && !known.has(t.resultMessageId));
}

// Polls again in CHAT_POLL_MS while a user message's task or a group's plan is unfinished (or the
// last sync failed): a backstop for a stream that stays silent.
function schedulePoll(chat, failed) {
  clearTimeout(chat.pollTimer);
  const open = groupOpen(chat) || chat.messages.some((m) => {
    const current = m.authorKind === "user" && currentTask(m, chat.tasks);
    return current && current.task && !isTerminal(current.task.status);
  });
  if ((open || failed) && state.chat === chat) chat.pollTimer = setTimeout(() => syncChat(chat), CHAT_POLL_MS);
}

// --- live events ----------------------------------------------------------------------------------------

function chatMessageCreated(data) {
  const chat = chatOn(data.project_id);
  if (!chat || !data.message) return;
  const message = messageOf(data.message);
  const merged = mergeMessages(chat.messages, [message]);
  chat.messages = merged.messages;
  drawChat(chat, true);
  settleDraft(chat);
  // Look the task up when the message is news about it: a request whose task this page has not
  // seen (sent from elsewhere, or its send's answer was lost), or an end of a task not ended here.
  const task = message.taskId && chat.tasks.get(message.taskId);
  const unknownRequest = message.authorKind === "user" && message.taskId && !task;
  const ends = message.authorKind !== "user" && task && !isTerminal(task.status);
  if (merged.gap || unknownRequest || ends) syncChat(chat);
}

function chatTaskUpdated(data) {
  const raw = data.task || {};
  const chat = chatOn(data.project_id || raw.projectId || raw.project_id);
  if (!chat) return;
  const gate = data.collaborationGate || data.collaboration_gate;
  const task = storeTask(chat, raw, gate);
  if (chat.kind === "group" && gate) chat.gate = gate;
  drawChat(chat, false);
  const retryUnknown = task.retryOfTaskId && !chat.tasks.has(task.retryOfTaskId);
  if (retryUnknown || resultMissing(chat)) syncChat(chat);
  else schedulePoll(chat, false);
}

// --- drawing ----------------------------------------------------------------------------------------------

// Redraws the history from the model; `follow` scrolls a new last message into view.
function drawChat(chat, follow) {
  const before = chat.list.childNodes.length;
  const ended = new Set(chat.messages.filter((m) => m.authorKind !== "user" && m.taskId).map((m) => m.taskId));
  chat.list.replaceChildren(...chat.messages.map((m) => messageItem(chat, m, ended)));
  chat.empty.hidden = chat.messages.length > 0;
  if (chat.kind === "group") drawGate(chat);
  if (follow && chat.messages.length > before) showLatest(chat);
}

// Scrolls the latest message into view, above the send box (as a chat opens at its end).
function showLatest(chat) {
  const last = chat.list.lastElementChild;
  if (last && last.scrollIntoView) last.scrollIntoView({ block: "nearest" });
}

// Who wrote a message, in words: a thread by its title (a group's result is named by its thread).
function authorName(chat, message) {
  if (message.authorKind !== "thread") return AUTHOR_NAMES[message.authorKind] || message.authorKind;
  return state.threadTitles.get(message.threadId) || (chat.kind === "group" ? targetTitle(chat, message) : "") ||
    (chat.kind === "thread" ? chat.names.thread : message.threadId || "a thread");
}

function messageItem(chat, message, ended) {
  const item = el("li", { class: "message", "data-author": message.authorKind, "data-message-id": message.messageId,
    "data-sequence": message.sequence, "data-task-id": message.taskId || null, "data-thread-id": message.threadId || null,
    "data-summary-of": chat.kind === "group" ? summaryOf(chat, message) : null },
  el("div", { class: "bubble" }, message.text),
  el("div", { class: "meta" }, authorName(chat, message), " · ", timeEl(message.createdAt)));
  const line = message.authorKind === "user" ? requestLine(chat, message, ended)
    : message.authorKind === "system" ? outcomeLine(chat, message) : null;
  if (line) item.append(line);
  if (chat.kind === "group" && message.authorKind === "user") item.append(...planCards(chat, message));
  return item;
}

// Under a user message: where its current task stands while unfinished, or its failure while
// the failure's system message has not arrived.
function requestLine(chat, message, ended) {
  const current = currentTask(message, chat.tasks);
  if (!current || !current.task) return null;
  const view = chatState(current.task, chat.names);
  if (view.state === "done" || (view.state === "failed" && ended.has(current.taskId))) return null;
  const gate = chat.gates.get(current.taskId);
  const detail = view.detail || (!view.terminal && gate && gate.detail) || "";
  return stateLine(chat, current.task, view, detail);
}

// Under a system message that ended a task: the failure's kind and a Retry (or that it was retried).
function outcomeLine(chat, message) {
  const task = message.taskId && chat.tasks.get(message.taskId);
  if (!task) return null;
  const view = chatState(task, chat.names);
  if (view.state !== "failed") return null;
  return stateLine(chat, task, view, task.retriedByTaskId ? "retried" : "");
}

function stateLine(chat, task, view, detail) {
  const line = el("div", { class: "task-state", "data-state": view.state, "data-status": view.status,
    "data-task-id": task.taskId }, el("span", { class: "label" }, view.label),
  detail ? el("span", { class: "detail" }, withTimes(detail)) : null);
  if (view.retryable) {
    const button = el("button", { type: "button", class: "retry", "data-task-id": task.taskId }, "Retry");
    button.addEventListener("click", () => retryTask(chat, task.taskId, button));
    line.append(button);
  }
  if (view.cancellable) {
    const button = el("button", { type: "button", class: "cancel", "data-task-id": task.taskId }, "Cancel");
    button.addEventListener("click", () => cancelTask(chat, task.taskId, button));
    line.append(button);
  }
  return line;
}
