// Boss web console: hash-routed views over the gateway's REST API, kept live by one EventSource.
// Every percent and level shown comes from the server (CB-2); the home list, the project detail and
// the thread page render the same `percent`, `level` and `awaiting_reading_after_compaction` fields
// with the same ring (CB-16, CB-19).
// A project page carries its chat (chat_view.js): a single thread's, the master agent's, or a
// group's with its dispatch plans (group_view.js).
"use strict";

const TOKEN_KEY = "boss.token";
const state = { token: "", lastEventId: "", source: null, reconnectTimer: null, route: null, refreshTimer: null,
  rendering: 0, missedWhileRendering: [], replaying: false, threadTitles: new Map(), chat: null, newGroup: null,
  pairingCode: null };

function takeToken() {
  const params = new URLSearchParams(location.search);
  const fromUrl = params.get("token");
  if (fromUrl) {
    localStorage.setItem(TOKEN_KEY, fromUrl);
    params.delete("token");
    const query = params.toString();
    history.replaceState(null, "", location.pathname + (query ? "?" + query : "") + location.hash);
  }
  return localStorage.getItem(TOKEN_KEY) || "";
}

// A call to the gateway's REST API as the token's owner: GET, or `method` (POST when only `body`
// is given) with `body`, when given, as JSON. Resolves to the parsed answer; rejects with an
// Error carrying `status` (0 when no answer came) and `problem` (the problem+json body, or {}).
async function api(path, body, method) {
  const headers = { Authorization: "Bearer " + state.token };
  const init = { headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  if (method || body !== undefined) init.method = method || "POST";
  let response;
  try {
    response = await fetch(path, init);
  } catch (cause) {
    const error = new Error("no answer from the server");
    Object.assign(error, { status: 0, problem: {}, cause });
    throw error;
  }
  if (!response.ok) {
    let problem = {};
    try { problem = (await response.json()) || {}; } catch (_) { /* not JSON */ }
    const error = new Error(problem.detail || response.statusText);
    Object.assign(error, { status: response.status, problem });
    throw error;
  }
  return response.json();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// A compaction reported before Codex's next response: nothing is measured yet.
const AWAITING_READING = "compacted, waiting for the first reading";

// The ring: neutral grey arc proportional to the percent, the percent as text beside it. While the
// thread is "compacted, waiting for the first reading" (`awaiting`) its percent is a placeholder,
// not a measurement: the ring shows an empty track and "compacted" until the next real reading.
function ring(percent, level, visible, threadId, awaiting) {
  const radius = 9, length = 2 * Math.PI * radius;
  const svgNs = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNs, "svg");
  svg.setAttribute("viewBox", "0 0 22 22");
  for (const cls of ["track", "arc"]) {
    const circle = document.createElementNS(svgNs, "circle");
    circle.setAttribute("class", cls);
    circle.setAttribute("cx", "11"); circle.setAttribute("cy", "11"); circle.setAttribute("r", String(radius));
    circle.setAttribute("fill", "none"); circle.setAttribute("stroke-width", "3");
    svg.append(circle);
  }
  const label = el("span", { class: "percent" });
  const node = el("span", { class: "ring", "data-thread-id": threadId || "" }, svg, label);
  node.update = (p, l, v, a) => {
    const compacted = Boolean(v && a);
    node.hidden = !v;
    node.dataset.percent = compacted ? "" : String(p);
    node.dataset.level = l || "";
    node.dataset.awaiting = String(compacted);
    node.title = compacted ? AWAITING_READING : v ? `${p}% context left (${l})` : "";
    label.textContent = compacted ? "compacted" : v ? `${p}%` : "";
    svg.querySelector(".arc").setAttribute("stroke-dasharray", `${compacted ? 0 : (length * p) / 100} ${length}`);
  };
  node.update(percent, level, visible, awaiting);
  return node;
}

// A time (times.js `when`) in a <time> element whose title is the exact ISO value; "—" for none.
function timeEl(iso) {
  return iso ? el("time", { datetime: iso, title: iso }, when(iso)) : when(iso);
}

// Server-written text (e.g. the handoff reason) with every instant in it shown as timeEl shows it.
function withTimes(text) {
  return timeParts(text).map((part) => (typeof part === "string" ? part : timeEl(part.iso)));
}

// --- views ------------------------------------------------------------------------------------------

async function renderHome(view) {
  const page = await api("/api/v1/conversations?page_size=200");
  const list = el("ul", { class: "list", id: "conversations" });
  for (const row of page.conversations) {
    const indicator = row.context_budget_indicator;
    const href = "#/projects/" + encodeURIComponent(row.project_id);
    list.append(el("li", { "data-project-id": row.project_id, "data-type": row.conversation_type },
      el("a", { href },
        el("div", { class: "grow" },
          el("div", { class: "title" }, row.project_title),
          el("div", { class: "sub" }, row.conversation_type.replace("_", " "),
            row.latest_reply_at ? [" · ", timeEl(row.latest_reply_at)] : "")),
        row.manual_pinned ? el("span", { class: "pin" }, "pinned") : null,
        ring(indicator.percent, indicator.level, indicator.visible, row.context_budget_thread_id,
          indicator.awaiting_reading_after_compaction))));
  }
  // The "New group" form (group_view.js) stays in place through re-renders, as the chat's send box.
  showAround(view, groupForm(page.conversations), [el("h1", {}, "Conversations"),
    page.conversations.length ? list : emptyHome(tokenOwner(state.token))], []);
}

// The owner a client token acts for, read from the token's payload for display only (the server
// verifies the token; nothing here is trusted).
function tokenOwner(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
    return claims.owner_id || claims.sub || "";
  } catch (_) {
    return "";
  }
}

// What to do when the owner has no conversation yet: start a worker on a machine running Codex.
function emptyHome(owner) {
  return el("section", { class: "empty", id: "empty-home", "data-owner": owner },
    el("p", {}, `No conversations yet for owner ${owner || "(unknown)"} — start a worker:`),
    el("pre", {}, [
      "# on the server: a token bound to this worker and node",
      "python -m services.bff_gateway token --worker worker-1 --node node-1",
      "# on the machine where Codex runs",
      "export BOSS_WORKER_TOKEN=<that token>",
      "python -m worker run --codex-home ~/.codex --worker-id worker-1 --node-id node-1",
    ].join("\n")),
    el("p", { class: "sub" }, "Its Codex threads appear here as soon as it reports them (see the README)."));
}

// Where the thread's compaction point (Codex's auto-compact limit) comes from.
const LIMIT_SOURCES = {
  configured: "set in Codex's config.toml",
  model_default: "Codex's default for the model",
  assumed: "assumed: Codex's settings for it could not be read",
};

// The "Left" figure of a thread's budget summary.
function budgetText(c) {
  if (!c.reported) return "not reported";
  if (c.awaiting_reading_after_compaction) return AWAITING_READING;
  return `${c.percent}% (${c.level})`;
}

function threadRow(context) {
  return el("li", { "data-thread-id": context.thread_id },
    el("a", { href: "#/threads/" + encodeURIComponent(context.thread_id) },
      el("div", { class: "grow" },
        el("div", { class: "title" }, context.title || context.thread_id),
        el("div", { class: "sub" }, `${context.node_id} · ${context.level || "not reported"}`,
          context.awaiting_reading_after_compaction ? ` · ${AWAITING_READING}` : "",
          context.must_finish_before_compaction ? " · must finish before compaction" : "",
          context.handoff_status !== "none" ? ` · handoff ${context.handoff_status}` : "")),
      ring(context.percent, context.level, context.reported, context.thread_id,
        context.awaiting_reading_after_compaction)));
}

async function renderProject(view, projectId) {
  const project = await api("/api/v1/projects/" + encodeURIComponent(projectId));
  const threads = el("ul", { class: "list", id: "threads" }, project.active_thread_contexts.map(threadRow));
  state.threadTitles = new Map(project.active_thread_contexts.map((c) => [c.thread_id, c.title || c.thread_id]));
  state.shownConversationType = project.conversation_type;
  const heading = el("h1", { "data-project-id": project.project_id }, project.project_title);
  const strategy = el("section", {}, el("h2", {}, "Master agent's strategy"),
    el("div", { class: "summary", id: "strategy" }, project.master_context_strategy_summary));
  const threadList = el("section", {}, el("h2", {}, "Threads"),
    el("div", { class: "sub", id: "risk" }, riskText(project, state.threadTitles)), threads);
  if (!CHAT_KINDS[project.conversation_type]) {
    dropChat();
    view.replaceChildren(heading, strategy, threadList);
    return;
  }
  // Every project is a conversation: the chat (chat_view.js) under its threads' rows (the master
  // agent's project lists a thread only when the master agent runs in a Codex thread of its own).
  const chat = chatFor(project);
  await syncChat(chat);
  const opening = chat.node.parentNode !== view;
  const before = project.active_thread_contexts.length ? [heading, threadList] : [heading];
  showAround(view, chat.node, before, [strategy]);
  if (opening) showLatest(chat);
}

// Shows `before`, `node`, `after` in `view` in that order; `node` stays in place when it is shown
// already, so a send box being written in keeps its focus and caret through a refresh.
function showAround(view, node, before, after) {
  if (node.parentNode !== view) {
    view.replaceChildren(...before, node, ...after);
    return;
  }
  for (const child of [...view.children]) if (child !== node) child.remove();
  node.before(...before);
  node.after(...after);
}

// The project's risk line (from the project detail or a project.context_risk.updated event),
// naming threads by their title in `titles` (their id when untitled or not listed).
function riskText(project, titles) {
  const name = (threadId) => titles.get(threadId) || threadId;
  const parts = [];
  if (project.next_compaction_risk_thread_id) parts.push("next compaction risk: " + name(project.next_compaction_risk_thread_id));
  if (project.threads_requiring_handoff.length) parts.push("handoff required: " + project.threads_requiring_handoff.map(name).join(", "));
  return parts.join(" · ") || "no thread at risk";
}

async function renderThread(view, threadId) {
  const page = await api("/api/v1/threads/" + encodeURIComponent(threadId) + "/context-summary");
  const c = page.context;
  view.replaceChildren(
    el("h1", { "data-thread-id": page.thread_id }, page.title, " ", ring(c.percent, c.level, c.reported, page.thread_id, c.awaiting_reading_after_compaction)),
    el("section", {}, el("h2", {}, "Context budget"), el("dl", { id: "budget" },
      el("dt", {}, "Left"), el("dd", { id: "budget-percent" }, budgetText(c)),
      el("dt", {}, "Compaction point"), el("dd", { id: "budget-limit" }, LIMIT_SOURCES[c.compaction_limit_source] || "not reported"),
      el("dt", {}, "Node"), el("dd", {}, page.node_id),
      el("dt", {}, "Expected compaction"), el("dd", {}, timeEl(c.compaction_expected_at)),
      el("dt", {}, "Last compaction"), el("dd", {}, timeEl(c.last_compaction_at)),
      el("dt", {}, "Must finish first"), el("dd", {}, c.must_finish_before_compaction ? c.must_finish_reason || "yes" : "no"),
      el("dt", {}, "Updated"), el("dd", {}, timeEl(c.updated_at)))),
    el("section", {}, el("h2", {}, "Handoff"),
      el("div", { id: "handoff", "data-status": page.handoff_status },
        page.handoff_status === "none" ? "not required" : `${page.handoff_status} ${page.handoff_package_id}`.trim(),
        page.handoff_reason ? [" — ", ...withTimes(page.handoff_reason)] : "")),
    el("section", {}, el("h2", {}, "Wrap-up checklist"),
      page.wrap_up_checklist.length
        ? el("ul", { class: "checklist" }, page.wrap_up_checklist.map(checklistItem))
        : el("div", { class: "sub" }, "nothing to wrap up yet")),
    // The chat with a thread lives on its conversation (its single-device project, or a group).
    el("section", {}, el("h2", {}, "Chat"),
      page.project_ids.length
        ? el("ul", { id: "thread-conversations" }, page.project_ids.map((projectId) =>
            el("li", {}, el("a", { href: "#/projects/" + encodeURIComponent(projectId) }, "Open the conversation"))))
        : el("div", { class: "sub" }, "this thread is in no conversation")));
}

// One wrap-up checklist line: `status` is done | missing | pending; the mark is text, so what is
// missing is visible without relying on colour.
const CHECKLIST_MARKS = { done: "✓ done", missing: "✗ missing", pending: "○ to do" };

function checklistItem(item) {
  return el("li", { "data-key": item.key, "data-status": item.status, "data-done": String(item.status === "done") },
    el("span", { class: "mark" }, CHECKLIST_MARKS[item.status] || item.status),
    el("span", { class: "label" }, item.label),
    item.detail ? el("span", { class: "detail" }, item.detail) : null);
}

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "projects" && parts[1]) return { name: "project", id: parts[1] };
  if (parts[0] === "threads" && parts[1]) return { name: "thread", id: parts[1] };
  if (parts[0] === "devices") return { name: "devices" };
  return { name: "home" };
}

async function render() {
  const view = document.getElementById("view");
  if (!state.token) {
    const form = document.getElementById("token-form").content.cloneNode(true);
    view.replaceChildren(form);
    view.querySelector("form").addEventListener("submit", (event) => {
      event.preventDefault();
      state.token = new FormData(event.target).get("token").trim();
      localStorage.setItem(TOKEN_KEY, state.token);
      connect();
      render();
    });
    return;
  }
  state.route = parseRoute();
  if (state.route.name !== "project") dropChat();
  // Live events that arrive while the page is being fetched patch the old DOM, which the fetched
  // (possibly older) page then replaces: keep them and apply them again once the page is in place.
  state.rendering = (state.rendering || 0) + 1;
  if (state.rendering === 1) state.missedWhileRendering = [];
  try {
    if (state.route.name === "project") await renderProject(view, state.route.id);
    else if (state.route.name === "thread") await renderThread(view, state.route.id);
    else if (state.route.name === "devices") await renderDevices(view);
    else await renderHome(view);
  } catch (error) {
    if (error.status === 401) localStorage.removeItem(TOKEN_KEY);
    view.replaceChildren(el("div", { class: "error" }, `Could not load: ${error.message}`));
  } finally {
    state.rendering -= 1;
    if (state.rendering === 0) replayMissed();
  }
}

function replayMissed() {
  const missed = state.missedWhileRendering || [];
  state.missedWhileRendering = [];
  state.replaying = true;
  try {
    for (const [type, data] of missed) handlers[type](data);
  } finally {
    state.replaying = false;
  }
}

function refreshSoon() {
  if (state.replaying) return;
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(render, 150);
}

// The master agent's page states the risk of every thread it oversees: any project's risk change
// re-reads it, at most once a second however many threads report.
function refreshOverseen() {
  if (state.replaying || state.overseenTimer) return;
  state.overseenTimer = setTimeout(() => {
    state.overseenTimer = null;
    render();
  }, 1000);
}

// --- live updates -------------------------------------------------------------------------------------

function updateRings(threadId, percent, level, visible, awaiting) {
  for (const node of document.querySelectorAll(`.ring[data-thread-id="${CSS.escape(threadId)}"]`)) {
    node.update(percent, level, visible, awaiting);
  }
}

const handlers = {
  "conversation.context_indicator.updated"(data) {
    const row = document.querySelector(`li[data-project-id="${CSS.escape(data.project_id)}"] .ring`);
    const indicator = data.context_budget_indicator;
    if (row) {
      row.dataset.threadId = data.thread_id;
      row.update(indicator.percent, indicator.level, indicator.visible, indicator.awaiting_reading_after_compaction);
    }
  },
  "project.context_risk.updated"(data) {
    const c = data.thread_context;
    updateRings(c.thread_id, c.percent, c.level, c.reported, c.awaiting_reading_after_compaction);
    const route = state.route || {};
    if (route.name === "project" && (route.id === data.project_id || document.querySelector(`h1[data-project-id="${CSS.escape(data.project_id)}"]`))) {
      const strategy = document.getElementById("strategy");
      if (strategy) strategy.textContent = data.master_context_strategy_summary;
      if (c.title) state.threadTitles.set(c.thread_id, c.title);
      const risk = document.getElementById("risk");
      if (risk) risk.textContent = riskText(data, state.threadTitles);
      const old = document.querySelector(`#threads li[data-thread-id="${CSS.escape(c.thread_id)}"]`);
      if (old) old.replaceWith(threadRow(c));
    } else if (route.name === "project" && state.shownConversationType === "master_agent") {
      refreshOverseen();
    }
    if (route.name === "thread" && route.id === c.thread_id) refreshSoon();
  },
  "thread.handoff.required"(data) { if (touches(data.thread_id, data.project_ids)) refreshSoon(); },
  "thread.handoff.ready"(data) { if (touches(data.thread_id, data.project_ids)) refreshSoon(); },
  "conversation.updated"() { if ((state.route || {}).name === "home") refreshSoon(); },
  "conversation.message.created"(data) {
    if ((state.route || {}).name === "home") refreshSoon();
    chatMessageCreated(data);
  },
  "task.updated"(data) { chatTaskUpdated(data); },
  "dispatch_plan.updated"(data) { chatPlanUpdated(data); },
  "thread.registered"() { if ((state.route || {}).name === "home") refreshSoon(); },
  "stream.opened"() { refreshSoon(); },
  "stream.resync"() {
    if (state.replaying) return;
    if (state.chat) forgetChatHistory(state.chat); // its sequences may be gone with the stream's history
    refreshSoon();
  },
};

function touches(threadId, projectIds) {
  const route = state.route || {};
  return (route.name === "thread" && route.id === threadId) ||
    (route.name === "project" && (projectIds || []).includes(route.id));
}

function setLive(liveState) {
  const badge = document.getElementById("live");
  badge.dataset.state = liveState;
  badge.textContent = liveState;
}

// One EventSource; the browser reconnects by itself with Last-Event-ID after network errors. When
// the server refused the stream (the source is CLOSED), reconnect ourselves after 3 s, resuming
// from the last id with ?last_event_id= (a new EventSource cannot send the header).
function connect() {
  if (state.source) state.source.close();
  clearTimeout(state.reconnectTimer);
  const params = new URLSearchParams({ access_token: state.token });
  if (state.lastEventId) params.set("last_event_id", state.lastEventId);
  const source = new EventSource("/api/v1/events?" + params.toString());
  state.source = source;
  source.onopen = () => {
    setLive("live");
    // A fresh stream starts at the head, and the gateway may have restarted in between: the chat
    // catches up over REST on every (re)connect (chat_view.js).
    if (state.chat) syncChat(state.chat);
  };
  source.onerror = () => {
    setLive("reconnecting");
    if (source.readyState === EventSource.CLOSED) state.reconnectTimer = setTimeout(connect, 3000);
  };
  for (const [type, handle] of Object.entries(handlers)) {
    source.addEventListener(type, (event) => {
      if (event.lastEventId) state.lastEventId = event.lastEventId;
      const data = JSON.parse(event.data);
      if (state.rendering) state.missedWhileRendering.push([type, data]);
      handle(data);
    });
  }
}

window.addEventListener("hashchange", render);
state.token = takeToken();
if (state.token) connect();
render();
