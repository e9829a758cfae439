// Boss web console: a group's chat (CHAT-4, CHAT-6) on top of chat_view.js, and the home page's
// "New group" form. A message into a group gets the master agent's dispatch plan, drawn as a card
// under it: the targets with their reasons, budgets and instructions, the members left out and
// why, a Drop (or Keep) per target, Confirm and Reject; once confirmed, each target's task and the
// plan's progress (k of N done), then the summary. Plans are kept live by dispatch_plan.updated and
// task.updated events and fetched anew (GET /api/v1/dispatch-plans/{id}) on every sync: the one
// waiting comes with the message page (pendingDispatchPlan), confirmed ones are remembered by id
// in localStorage, so a reload returns to the plan card or to the progress. Uses app.js's `api`,
// `el`, `timeEl`, `withTimes`, `showAround` and chat_view.js's chat; the rules are chat.js's.
"use strict";

const PLANS_KEY = "boss.group.plans.";
// How many of a group's latest plans a page remembers across reloads.
const REMEMBERED_PLANS = 5;

// --- the model: plans by id ---------------------------------------------------------------------------

function rememberedPlans(projectId) {
  try {
    const ids = JSON.parse(localStorage.getItem(PLANS_KEY + projectId) || "[]");
    return Array.isArray(ids) ? ids.filter((id) => typeof id === "string") : [];
  } catch (_) {
    return [];
  }
}

function savePlanIds(projectId, ids) {
  if (ids.length) localStorage.setItem(PLANS_KEY + projectId, JSON.stringify(ids));
  else localStorage.removeItem(PLANS_KEY + projectId);
}

// Keeps a plan (any DispatchPlanView shape; null or undefined: none) and, when given, the group's
// gate that came with it; returns the plan as kept (null for none).
function storePlan(chat, raw, gate) {
  if (gate) chat.gate = gate;
  if (!raw) return null;
  const plan = planOf(raw);
  if (!plan.planId) return null;
  const kept = newerPlan(chat.plans.get(plan.planId), plan);
  chat.plans.set(plan.planId, kept);
  if (kept.status !== "proposed") chat.drops.delete(plan.planId);
  savePlanIds(chat.projectId, rememberPlan(rememberedPlans(chat.projectId), plan.planId, REMEMBERED_PLANS));
  return kept;
}

// Fetches every plan that may have moved (plansToFetch); a plan the server no longer has is
// forgotten.
async function fetchOpenPlans(chat) {
  const ids = plansToFetch(chat.plans, rememberedPlans(chat.projectId));
  const answers = await Promise.all(ids.map((id) => api(`/api/v1/dispatch-plans/${encodeURIComponent(id)}`)
    .catch((error) => {
      if (error.status !== 404) throw error;
      chat.plans.delete(id);
      savePlanIds(chat.projectId, rememberedPlans(chat.projectId).filter((known) => known !== id));
      return null;
    })));
  for (const answer of answers) if (answer) storePlan(chat, answer.dispatchPlan, answer.collaborationGate);
}

// True while the group waits for the person or its threads: a plan is open, or the gate says so.
function groupOpen(chat) {
  if (chat.kind !== "group") return false;
  return [...chat.plans.values()].some(planOpen) || Boolean(chat.gate && chat.gate.state !== "open");
}

// The plans a user message got (their requestMessageId), oldest first.
function plansOf(chat, message) {
  return [...chat.plans.values()].filter((plan) => plan.requestMessageId === message.messageId)
    .sort((a, b) => Date.parse(a.createdAt) - Date.parse(b.createdAt));
}

// The plan whose summary `message` is, or null.
function summaryOf(chat, message) {
  for (const plan of chat.plans.values()) if (plan.summaryMessageId === message.messageId) return plan.planId;
  return null;
}

// A result's thread title from the plan that sent it there (a relay thread is in no project detail).
function targetTitle(chat, message) {
  for (const plan of chat.plans.values()) {
    const target = plan.targets.find((t) => (message.taskId && t.taskId === message.taskId) || t.threadId === message.threadId);
    if (target) return target.threadTitle;
  }
  return "";
}

// --- live events ----------------------------------------------------------------------------------------

function chatPlanUpdated(data) {
  const chat = chatOn(data.project_id);
  if (!chat || chat.kind !== "group") return;
  const plan = storePlan(chat, data.dispatchPlan, data.collaborationGate);
  drawChat(chat, false);
  // A plan for a message this page has not loaded (sent from elsewhere): catch up.
  if (plan && !chat.messages.some((m) => m.messageId === plan.requestMessageId)) syncChat(chat);
  else schedulePoll(chat, false);
}

// --- deciding -------------------------------------------------------------------------------------------

function toggleDrop(chat, plan, targetId) {
  const drops = new Set(chat.drops.get(plan.planId) || []);
  if (drops.has(targetId)) drops.delete(targetId);
  else drops.add(targetId);
  chat.drops.set(plan.planId, drops);
  chat.planErrors.delete(plan.planId);
  drawChat(chat, false);
}

// Confirms (`action` "confirm", with the drops) or rejects a plan; the answer, or the refusal in
// words under the card, is drawn at once; a refusal that means the plan moved fetches it anew.
async function decidePlan(chat, plan, action) {
  const request = action === "confirm" ? confirmRequest(plan, chat.drops.get(plan.planId) || new Set()) : { body: undefined, error: "" };
  if (request.error) {
    chat.planErrors.set(plan.planId, request.error);
    drawChat(chat, false);
    return;
  }
  chat.planBusy.add(plan.planId);
  chat.planErrors.delete(plan.planId);
  drawChat(chat, false);
  let refetch = false;
  try {
    const answer = await api(`/api/v1/dispatch-plans/${encodeURIComponent(plan.planId)}/${action}`, request.body, "POST");
    storePlan(chat, answer.dispatchPlan, answer.collaborationGate);
    for (const task of answer.tasks || []) storeTask(chat, task, answer.collaborationGate);
  } catch (error) {
    const failure = planFailure(action, error.status, error.problem);
    chat.planErrors.set(plan.planId, failure.text);
    refetch = !failure.again;
  } finally {
    chat.planBusy.delete(plan.planId);
  }
  drawChat(chat, false);
  if (refetch) syncChat(chat);
  else schedulePoll(chat, false);
}

// --- drawing ----------------------------------------------------------------------------------------------

// What the line above the send box says while a message into the group is being sent: the send
// answers once the master agent has chosen the threads and drafted their instructions.
const DRAFTING_WORDS = "the master agent is choosing the threads and drafting their instructions…";

// The group's gate above the send box (while a send waits for its plan: that it is drafted);
// hidden while the group is open.
function drawGate(chat) {
  const words = chat.sending ? DRAFTING_WORDS : gateWords(chat.gate);
  chat.gateLine.replaceChildren(...withTimes(words));
  chat.gateLine.hidden = !words;
  chat.gateLine.dataset.state = chat.sending ? "drafting" : chat.gate ? chat.gate.state : "open";
}

function planCards(chat, message) {
  return plansOf(chat, message).map((plan) => planCard(chat, plan));
}

function planCard(chat, plan) {
  const drops = chat.drops.get(plan.planId) || new Set();
  const view = planView(plan, chat.tasks, drops, Date.now());
  const busy = chat.planBusy.has(plan.planId);
  const error = chat.planErrors.get(plan.planId) || "";
  const drafted = plan.draftedBy === "master_model" ? "The master agent drafted each thread's instruction."
    : "Each thread gets your text as you wrote it.";
  return el("div", { class: "plan", "data-plan-id": plan.planId, "data-status": plan.status, "data-state": view.state,
    "data-done": view.total ? view.done : null, "data-total": view.total || null },
  el("div", { class: "plan-head" }, el("span", { class: "label" }, view.label),
    view.decidable && plan.expiresAt ? el("span", { class: "expires" }, " · until ", timeEl(plan.expiresAt)) : null),
  el("div", { class: "plan-detail" }, view.detail ? view.detail + " " : "", drafted),
  plan.draftingNote ? el("div", { class: "drafting-note" }, plan.draftingNote) : null,
  el("ol", { class: "targets" }, plan.targets.map((target) => targetItem(chat, plan, target, drops, view.decidable && !busy))),
  plan.leftOut.length
    ? el("div", { class: "left-out" }, el("div", { class: "sub" }, "Not proposed:"),
      el("ul", {}, plan.leftOut.map((member) => el("li", { "data-thread-id": member.threadId },
        el("span", { class: "title" }, member.threadTitle || member.threadId), ": ", withTimes(member.reason)))))
    : null,
  error ? el("div", { class: "plan-error", role: "alert" }, error) : null,
  view.decidable ? planActions(chat, plan, view, busy) : null);
}

function targetItem(chat, plan, target, drops, changeable) {
  const view = targetView(target, plan, chat.tasks, drops.has(target.targetId));
  const title = target.threadTitle || target.threadId;
  const item = el("li", { class: "target", "data-target-id": target.targetId, "data-thread-id": target.threadId,
    "data-kind": target.kind, "data-state": view.state, "data-status": target.status, "data-task-id": target.taskId || null,
    "data-task-status": view.status || null },
  el("div", { class: "target-head" }, el("span", { class: "title" }, title),
    el("span", { class: target.kind === "relay" ? "budget new-thread" : "budget" }, targetBudgetWords(target))),
  el("div", { class: "reason" }, withTimes(target.reason)),
  el("div", { class: "instruction" }, target.instruction),
  el("div", { class: "target-state" }, el("span", { class: "label" }, view.label),
    view.detail ? el("span", { class: "detail" }, withTimes(view.detail)) : null));
  if (changeable && target.status === "proposed") {
    const dropped = drops.has(target.targetId);
    const button = el("button", { type: "button", class: "drop", "data-target-id": target.targetId, "aria-pressed": String(dropped) },
      dropped ? "Keep" : "Drop");
    button.addEventListener("click", () => toggleDrop(chat, plan, target.targetId));
    item.append(button);
  }
  return item;
}

function planActions(chat, plan, view, busy) {
  const confirm = el("button", { type: "button", class: "confirm", disabled: busy || !view.kept },
    busy ? "Sending…" : `Send to ${threadsWord(view.kept)}`);
  const reject = el("button", { type: "button", class: "reject", disabled: busy }, "Reject");
  confirm.addEventListener("click", () => decidePlan(chat, plan, "confirm"));
  reject.addEventListener("click", () => decidePlan(chat, plan, "reject"));
  return el("div", { class: "plan-actions" }, confirm, reject);
}

// --- the home page's "New group" form ---------------------------------------------------------------

// The form (one per page: its name field and choices survive the home list's re-renders), offered
// the single-device conversations of `rows` (the home list page) that have a thread.
function groupForm(rows) {
  if (!state.newGroup) state.newGroup = buildGroupForm();
  const form = state.newGroup;
  const threads = rows.filter((row) => row.conversation_type === "single_device" && row.context_budget_thread_id);
  const offered = new Set(threads.map((row) => row.context_budget_thread_id));
  for (const id of [...form.selected]) if (!offered.has(id)) form.selected.delete(id);
  form.choices.replaceChildren(...threads.map((row) => {
    const threadId = row.context_budget_thread_id;
    const box = el("input", { type: "checkbox", name: "thread", value: threadId, checked: form.selected.has(threadId) });
    box.addEventListener("change", () => {
      if (box.checked) form.selected.add(threadId);
      else form.selected.delete(threadId);
      form.error.hidden = true;
    });
    const indicator = row.context_budget_indicator || {};
    return el("li", { "data-thread-id": threadId }, el("label", {}, box, " ", row.project_title,
      indicator.visible ? el("span", { class: "sub" }, ` · ${indicator.awaiting_reading_after_compaction
        ? AWAITING_READING : budgetWords(indicator.percent, indicator.level)}`) : null));
  }));
  form.node.hidden = threads.length < 2;
  return form.node;
}

function buildGroupForm() {
  const title = el("input", { name: "title", maxlength: 200, autocomplete: "off", "aria-label": "group name", placeholder: "Group name" });
  const choices = el("ul", { class: "group-choices" });
  const error = el("div", { class: "send-error", role: "alert", hidden: true });
  const button = el("button", { type: "submit" }, "Create group");
  const form = el("form", { class: "group-form" }, el("p", { class: "sub" },
    "Pick two threads or more: a message into the group goes to the threads the master agent proposes, once you confirm."),
  choices, title, error, button);
  const node = el("section", { id: "new-group" }, el("details", {}, el("summary", {}, "New group"), form));
  const model = { node, title, choices, error, button, selected: new Set() };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const request = groupRequest(title.value, [...model.selected]);
    if (request.error) {
      showGroupError(model, request.error);
      return;
    }
    button.disabled = true;
    try {
      const group = await api("/api/v1/projects", request.body);
      state.newGroup = null;
      location.hash = "#/projects/" + encodeURIComponent(group.project_id);
    } catch (error) {
      const fields = ((error.problem || {}).errors || []).map((e) => `${e.field}: ${e.detail}`);
      showGroupError(model, `not created: ${fields.join("; ") || error.message}`);
    } finally {
      button.disabled = false;
    }
  });
  return model;
}

function showGroupError(model, text) {
  model.error.textContent = text;
  model.error.hidden = false;
}
