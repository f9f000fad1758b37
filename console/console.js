// agentd's web console: plain JS, no framework, same-origin calls only (docs/console.md).
// It speaks the public surface: A2A 1.0 JSON-RPC at "/", the command extension's ops, and
// the events feed (agentd.events/SubscribeToEvents) when the card declares it; otherwise it
// polls ListTasks. Every string from the daemon goes into the page as text, never as HTML.
"use strict";

const EXT = {
  command: "https://agentd.dev/a2a/ext/command",
  events: "https://agentd.dev/a2a/ext/events",
  notes: "https://agentd.dev/a2a/ext/task-annotations",
};
const TOKEN_KEY = "agentd.console.token";
const POLL_MS = 2000;
const GATE = "TASK_STATE_INPUT_REQUIRED";
const FINAL = ["TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"];

const $ = (id) => document.getElementById(id);
const S = {
  card: null, declared: new Set(), ops: new Set(), token: null, live: false,
  tasks: new Map(), runs: new Map(), steps: new Map(), subagents: new Map(),
  conversations: new Map(), lifecycle: {}, seq: 0, feed: null, poll: null,
};

// ---- the wire --------------------------------------------------------------------------

/** The extensions of `wanted` the card declares, for the A2A-Extensions header. */
function activate(wanted) {
  return wanted.map((k) => EXT[k]).filter((u) => S.declared.has(u)).join(", ");
}

function headers(exts) {
  const h = {"content-type": "application/json", "A2A-Version": "1.0"};
  if (S.token) h.authorization = "Bearer " + S.token;
  const a = activate(exts);
  if (a) h["A2A-Extensions"] = a;
  return h;
}

let nextId = 1;
function call(method, params) {
  return {jsonrpc: "2.0", id: nextId++, method, params: params || {}};
}

/** One JSON-RPC call; resolves to its result, rejects with an Error saying why. */
async function rpc(method, params, exts) {
  const r = await fetch("/", {method: "POST", headers: headers(exts || ["notes"]),
    body: JSON.stringify(call(method, params)), cache: "no-store"});
  if (r.status === 401) throw Object.assign(new Error("the daemon refused the credential (401)"), {auth: true});
  const doc = await r.json().catch(() => null);
  if (!doc) throw new Error("HTTP " + r.status);
  if (doc.error) throw new Error(doc.error.message + " (" + doc.error.code + ")");
  return doc.result;
}

/** A command op: a marked, activated data part. Resolves to the message's data or the task. */
async function command(op, args) {
  const message = {role: "ROLE_USER", messageId: "console-" + Date.now() + "-" + nextId,
    extensions: [EXT.command], parts: [{data: {agentd: Object.assign({op}, args || {})}}]};
  const res = await rpc("SendMessage", {message, configuration: {returnImmediately: true}},
    ["command", "notes"]);
  if (res.message) return res.message.parts[0].data;
  if (res.task) noteTask(res.task);
  return res.task;
}

// ---- sign-in ---------------------------------------------------------------------------

async function loadCard() {
  const r = await fetch("/.well-known/agent-card.json", {cache: "no-store"});
  S.card = await r.json();
  S.declared = new Set(((S.card.capabilities || {}).extensions || []).map((e) => e.uri));
  $("instance").textContent = S.card.name || "";
  const flow = deviceFlow();
  if (flow) {
    $("device").hidden = false;
    const sel = $("device-scope");
    sel.replaceChildren(...Object.keys(flow.scopes || {user: ""}).map((s) => opt(s, s)));
  }
}

function deviceFlow() {
  const s = (S.card.securitySchemes || {}).device_code;
  return s && s.oauth2SecurityScheme && s.oauth2SecurityScheme.flows.deviceCode;
}

/** Same-origin path of a URL the card names (the page may only call its own origin). */
const pathOf = (u) => new URL(u, location.href).pathname;

async function form(url, fields) {
  const r = await fetch(pathOf(url), {method: "POST", cache: "no-store",
    headers: {"content-type": "application/x-www-form-urlencoded"},
    body: new URLSearchParams(fields).toString()});
  return {status: r.status, body: await r.json().catch(() => ({}))};
}

async function deviceSignIn() {
  const flow = deviceFlow();
  const client_id = "agentd-console";
  const a = await form(flow.deviceAuthorizationUrl, {client_id, scope: $("device-scope").value});
  if (a.status !== 200) return signinError("device authorization refused: " + (a.body.error || a.status));
  $("device-code").hidden = false;
  $("user-code").textContent = a.body.user_code;
  $("verify-uri").textContent = a.body.verification_uri;
  if (/^https?:\/\//.test(a.body.verification_uri)) $("verify-uri").href = a.body.verification_uri;
  let wait = (a.body.interval || 5) * 1000;
  const until = Date.now() + (a.body.expires_in || 600) * 1000;
  while (Date.now() < until) {
    await sleep(wait);
    const t = await form(flow.tokenUrl, {grant_type: "urn:ietf:params:oauth:grant-type:device_code",
      device_code: a.body.device_code, client_id});
    if (t.status === 200 && t.body.access_token) {
      $("device-code").hidden = true;
      return signIn(t.body.access_token);
    }
    const e = t.body.error;
    if (e === "slow_down") wait += 5000;
    else if (e !== "authorization_pending") {
      $("device-code").hidden = true;
      return signinError("device sign-in ended: " + (e || "HTTP " + t.status));
    }
  }
  signinError("the device code expired");
}

function signinError(text) { $("signin-error").textContent = text; }

async function signIn(token) {
  S.token = token;
  try {
    // The extended card says what this caller may run; a refused token ends here.
    const ext = S.card.capabilities && S.card.capabilities.extendedAgentCard
      ? await rpc("GetExtendedAgentCard", {}, []) : S.card;
    const cmd = ((ext.capabilities || {}).extensions || []).find((e) => e.uri === EXT.command);
    S.ops = new Set(((cmd && cmd.params.ops) || []).map((o) => o.op));
  } catch (e) {
    S.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    return signinError(e.message);
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  signinError("");
  $("signin").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  $("operator").hidden = !["admin.pause", "admin.resume", "admin.drain"].some((o) => S.ops.has(o));
  for (const b of $("operator").querySelectorAll("button")) b.hidden = !S.ops.has(b.dataset.op);
  $("status-refresh").hidden = !S.ops.has("status");
  S.live = true;
  await bootstrap();
  if (S.declared.has(EXT.events)) follow();
  else startPolling();
}

function signOut() {
  S.live = false;
  sessionStorage.removeItem(TOKEN_KEY);
  if (S.feed) S.feed.abort();
  clearInterval(S.poll);
  location.reload();
}

// ---- the instance's state --------------------------------------------------------------

/** Reads the whole state again: at sign-in, on resync, and each poll without the feed. */
async function bootstrap() {
  try {
    const seen = new Map();
    let pageToken = "";
    do {
      const r = await rpc("ListTasks", pageToken ? {pageToken} : {});
      for (const t of r.tasks || []) seen.set(t.id, t);
      pageToken = r.nextPageToken || "";
    } while (pageToken && seen.size < 1000);
    S.tasks = seen;
    if (S.ops.has("status")) await refreshStatus(true);
    render();
  } catch (e) {
    failed(e);
  }
}

/** The `status` op: the status view, and the runs and conversations it lists (all of
 *  them at a bootstrap; otherwise merged, newer documents winning over the feed's). */
async function refreshStatus(replace) {
  const st = await command("status");
  S.lifecycle = {draining: st.draining, paused: st.paused};
  if (replace) {
    S.runs = new Map();
    S.conversations = new Map();
  }
  for (const r of st.runs || []) {
    const had = S.runs.get(r.id);
    if (!had || (had.updated || 0) <= (r.updated || 0)) S.runs.set(r.id, r);
  }
  for (const c of st.conversations || []) {
    const had = S.conversations.get(c.id);
    if (!had || (had.version || 0) <= (c.version || 0)) S.conversations.set(c.id, c);
  }
  $("status").textContent = JSON.stringify({
    instance: st.instance, version: st.version, uptime_s: Math.round(st.uptime_ms / 1000),
    draining: st.draining, paused: st.paused, store: st.store, counts: st.counts,
    workflows: st.workflows, model: st.model || undefined}, null, 2);
}

/** The status view again, at most once a second while the feed is busy. */
let statusTimer = null;
function statusSoon() {
  if (statusTimer || !S.ops.has("status")) return;
  statusTimer = setTimeout(() => {
    statusTimer = null;
    refreshStatus().then(render, (e) => log("status: " + e.message, true));
  }, 1000);
}

/** Keeps the newest document of a task: an RPC's answer can arrive after the feed already
 *  told of a later state, and a task that reached a final state never leaves it. */
function noteTask(t) {
  const had = S.tasks.get(t.id);
  if (had) {
    if (FINAL.includes(had.status.state) && !FINAL.includes(t.status.state)) return;
    if (String(t.status.timestamp || "") < String(had.status.timestamp || "")) return;
  }
  S.tasks.set(t.id, t);
}

function apply(ev) {
  const d = ev.data || {};
  switch (ev.kind) {
    case "task": noteTask(d.task); break;
    case "task.removed": S.tasks.delete(d.id); break;
    case "run": S.runs.set(d.id, d); break;
    case "run.removed": S.runs.delete(d.id); S.steps.delete(d.id); break;
    case "step": {
      const list = S.steps.get(d.run) || [];
      let s = list.find((x) => x.step === d.step);
      if (!s) list.push(s = {step: d.step});
      Object.assign(s, d.phase === "start" ? {state: "running", kind: d.kind} : {state: d.status || "done", err: d.err});
      S.steps.set(d.run, list);
      break;
    }
    case "subagent": S.subagents.set(d.handle, d); break;
    case "subagent.removed": S.subagents.delete(d.id); break;
    case "conversation": S.conversations.set(d.id, d); break;
    case "conversation.removed": S.conversations.delete(d.id); break;
    case "lifecycle": Object.assign(S.lifecycle, d); break;
    default: return;
  }
}

// ---- the events feed, or polling -------------------------------------------------------

/** Follows the feed for as long as signed in: resumes from the last seq after a drop, and
 *  reads everything again when the daemon says events were missed (resync). */
async function follow() {
  let backoff = 500;
  while (S.live) {
    const ctl = new AbortController();
    S.feed = ctl;
    try {
      const r = await fetch("/", {method: "POST", signal: ctl.signal, cache: "no-store",
        headers: headers(["events", "notes"]),
        body: JSON.stringify(call("agentd.events/SubscribeToEvents", {fromSeq: S.seq}))});
      if (r.status === 401) return failed(Object.assign(new Error("credential refused"), {auth: true}));
      const ct = r.headers.get("content-type") || "";
      if (!ct.startsWith("text/event-stream")) {
        const doc = await r.json().catch(() => ({}));
        throw new Error(doc.error ? doc.error.message : "HTTP " + r.status);
      }
      setConn("live", "live");
      backoff = 500;
      await readStream(r.body.getReader());
    } catch (e) {
      if (!S.live) return;
      log("feed: " + e.message);
    }
    setConn("reconnecting", "reconnecting");
    await sleep(backoff);
    backoff = Math.min(backoff * 2, 10000);
  }
}

async function readStream(reader) {
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buf += dec.decode(value, {stream: true}).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data) await onFrame(JSON.parse(data));
    }
  }
}

async function onFrame(doc) {
  if (doc.error) throw new Error(doc.error.message);
  const r = doc.result || {};
  if (r.hello) {
    if (r.hello.resync) {
      log("feed: events were missed; reading the state again");
      S.steps.clear();
      S.subagents.clear();
      await bootstrap();
    }
    if (r.hello.resync) S.seq = r.hello.resume || 0;
  } else if (r.event) {
    S.seq = Math.max(S.seq, r.event.seq);
    apply(r.event);
    if (["run", "run.removed", "lifecycle", "conversation", "task.removed"].includes(r.event.kind)) statusSoon();
    render();
  } else if (r.goodbye) {
    S.seq = Math.max(S.seq, r.goodbye.seq || 0);
    log("feed: goodbye (" + r.goodbye.reason + ")");
  }
}

function startPolling() {
  setConn("polling", "polling (no events feed)");
  S.poll = setInterval(bootstrap, POLL_MS);
}

// ---- actions ---------------------------------------------------------------------------

async function act(what, fn) {
  try {
    await fn();
    log(what + ": done");
  } catch (e) {
    failed(e, what);
  }
}

function failed(e, what) {
  log((what ? what + ": " : "") + e.message, true);
  if (e.auth) {
    S.live = false;
    sessionStorage.removeItem(TOKEN_KEY);
    setConn("off", "signed out");
  }
}

function operatorOp(op) {
  const reason = $("op-reason").value.trim();
  const args = reason && op !== "admin.resume" ? {reason} : {};
  act(op, async () => {
    await command(op, args);
    if (S.ops.has("status")) await refreshStatus();
    render();
  });
}

/** Drain asks twice: the first click arms it for five seconds. */
function drainClicked() {
  const b = $("op-drain");
  if (b.dataset.armed) { delete b.dataset.armed; b.textContent = "Drain…"; return operatorOp("admin.drain"); }
  b.dataset.armed = "1";
  b.textContent = "Really drain?";
  setTimeout(() => { delete b.dataset.armed; b.textContent = "Drain…"; }, 5000);
}

function cancelTask(id) {
  act("cancel " + id, async () => noteTask(await rpc("CancelTask", {id})));
}

async function answerGate(task, value, out) {
  out.textContent = "sending…";
  try {
    const message = {role: "ROLE_USER", messageId: "console-" + Date.now() + "-" + nextId,
      taskId: task.id, parts: [{data: value}]};
    const res = await rpc("SendMessage", {message, configuration: {returnImmediately: true}});
    if (res.task) noteTask(res.task);
    out.textContent = "answered";
    log("answered the gate of " + task.id);
    render();
  } catch (e) {
    out.textContent = e.message;
    failed(e, "answer");
  }
}

// ---- the page --------------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}

const opt = (value, label) => el("option", {value}, label);
const notes = (t) => (t.metadata || {})[EXT.notes] || {};
const short = (s) => String(s || "").replace(/^TASK_STATE_/, "").toLowerCase().replace(/_/g, "-");
const text = (m) => ((m && m.parts) || []).map((p) => p.text || (p.data ? JSON.stringify(p.data) : "")).join(" ");
const when = (ts) => ts ? new Date(ts).toLocaleTimeString() : "";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let pending = false;
function render() {
  if (pending) return;
  pending = true;
  setTimeout(() => { pending = false; draw(); }, 30);
}

function draw() {
  drawLifecycle();
  drawGates();
  drawRuns();
  drawTasks();
  drawAgents();
}

function drawLifecycle() {
  const l = S.lifecycle;
  $("lifecycle").textContent = "· " + (l.draining ? "draining" : l.paused ? "paused" : "running");
  $("lifecycle").dataset.state = l.draining ? "draining" : l.paused ? "paused" : "running";
}

function byNewest(a, b) {
  return String(b.status.timestamp || "").localeCompare(String(a.status.timestamp || ""));
}

/** Gates keep their form while open, so a re-render never loses what is being typed. */
function drawGates() {
  const box = $("gates");
  const open = [...S.tasks.values()].filter((t) => t.status.state === GATE).sort(byNewest);
  const keep = new Set(open.map((t) => t.id + "@" + t.status.timestamp));
  for (const g of [...box.querySelectorAll("[data-gate]")]) if (!keep.has(g.dataset.key)) g.remove();
  box.querySelector(".empty")?.remove();
  for (const t of open) {
    const key = t.id + "@" + t.status.timestamp;
    if (box.querySelector(`[data-key="${CSS.escape(key)}"]`)) continue;
    box.append(gateCard(t, key));
  }
  if (!open.length) box.replaceChildren(el("p", {class: "empty"}, "No gate is open."));
}

function gateCard(t, key) {
  const n = notes(t);
  const out = el("span", {class: "result"});
  const schema = n.askSchema || {type: "string"};
  const fields = fieldsOf(schema);
  const f = el("form", {class: "gate-form"}, ...fields.map((x) => x.row),
    el("button", {type: "submit"}, "Answer"), out);
  f.addEventListener("submit", (e) => {
    e.preventDefault();
    let value;
    try { value = valueOf(schema, fields); } catch (err) { out.textContent = err.message; return; }
    answerGate(t, value, out);
  });
  const link = n.link ? `${n.link.kind} ${n.link.id}` : "";
  return el("article", {class: "gate", "data-gate": t.id, "data-key": key},
    el("h3", {}, text(t.status.message) || "Input required"),
    el("p", {class: "meta"}, `task ${t.id} ${link}`, n.askChannel ? ` · channel ${n.askChannel}` : ""),
    f);
}

/** One input per property of an object schema (or one for the whole value). */
function fieldsOf(schema) {
  if (schema.type === "object" && schema.properties) {
    const req = new Set(schema.required || []);
    return Object.entries(schema.properties).map(([name, s]) => field(name, s, req.has(name)));
  }
  return [field("", schema, true)];
}

function field(name, s, required) {
  const id = "f-" + Math.random().toString(36).slice(2);
  let input;
  let kind = s.enum ? "enum" : s.type;
  if (Array.isArray(kind)) kind = kind.find((k) => k !== "null") || "string";
  if (kind === "enum") {
    input = el("select", {id, name, required}, opt("", required ? "choose…" : "—"),
      ...s.enum.map((v, i) => opt(String(i), JSON.stringify(v))));
  } else if (kind === "boolean") {
    input = el("input", {id, name, type: "checkbox"});
  } else if (kind === "number" || kind === "integer") {
    input = el("input", {id, name, type: "number", step: kind === "integer" ? "1" : "any", required});
  } else if (kind === "string") {
    input = el("input", {id, name, type: "text", required});
  } else {
    input = el("textarea", {id, name, rows: "3", placeholder: "JSON", required});
  }
  const label = (name || "answer") + (required ? " *" : "");
  const row = el("div", {class: "field"}, el("label", {for: id}, label), input,
    s.description ? el("small", {}, s.description) : null);
  return {name, s, kind, input, required, row};
}

function valueOf(schema, fields) {
  const one = (x) => {
    const v = x.input;
    switch (x.kind) {
      case "enum":
        if (v.value === "" && x.required) throw new Error(x.name + ": choose a value");
        return v.value === "" ? undefined : x.s.enum[Number(v.value)];
      case "boolean": return v.checked;
      case "number": case "integer":
        return v.value === "" ? undefined : Number(v.value);
      case "string": return v.value === "" && !x.required ? undefined : v.value;
      default:
        if (v.value.trim() === "") return undefined;
        try { return JSON.parse(v.value); } catch (e) { throw new Error((x.name || "answer") + ": not JSON"); }
    }
  };
  if (fields.length === 1 && fields[0].name === "") return one(fields[0]);
  const out = {};
  for (const x of fields) {
    const v = one(x);
    if (v !== undefined) out[x.name] = v;
  }
  return out;
}

function drawRuns() {
  const box = $("runs");
  const runs = [...S.runs.values()].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  if (!runs.length) return box.replaceChildren(el("p", {class: "empty"}, "No run."));
  box.replaceChildren(...runs.map((r) => {
    const t = S.tasks.get(r.task);
    const cancel = t && !FINAL.includes(t.status.state)
      ? el("button", {type: "button", onclick: () => cancelTask(r.task)}, "Cancel") : null;
    return el("article", {class: "run", "data-run": r.id, "data-status": r.status},
      el("h3", {}, r.workflow, " ", el("span", {class: "badge s-" + r.status}, r.status), " ", cancel),
      el("p", {class: "meta"}, `${r.id} · task ${r.task || "—"} · by ${r.principal || "—"} · ${when(r.updated)}`),
      el("ol", {class: "timeline"}, ...timeline(r).map((s) =>
        el("li", {class: "step s-" + s.state, "data-step": s.step, "data-state": s.state, title: s.err || ""},
          el("b", {}, s.step), " ", s.kind || "", " ", el("i", {}, s.state)))),
      r.error ? el("p", {class: "error"}, r.error) : null,
      r.output !== null && r.output !== undefined ? el("pre", {class: "output"}, JSON.stringify(r.output, null, 1)) : null);
  }));
}

/** The steps in the order the feed saw them, then those the run lists but has not reached. */
function timeline(r) {
  const seen = (S.steps.get(r.id) || []).map((s) => Object.assign({}, s));
  for (const [step, n] of Object.entries(r.steps || {})) {
    if (!seen.find((s) => s.step === step)) seen.push({step, state: n > 0 ? "done" : "pending"});
  }
  const open = seen.filter((s) => s.state === "running");
  if (r.status === "waiting" && open.length) open[open.length - 1].state = "waiting";
  // A run that ended (cancelled, failed) stopped the steps it was in.
  if (!["running", "waiting", "paused"].includes(r.status)) {
    for (const s of open) s.state = "stopped";
  }
  return seen;
}

function drawTasks() {
  const body = $("tasks").tBodies[0];
  const tasks = [...S.tasks.values()].sort(byNewest).slice(0, 200);
  body.replaceChildren(...tasks.map((t) => {
    const n = notes(t);
    const live = !FINAL.includes(t.status.state);
    return el("tr", {"data-task": t.id, "data-state": t.status.state},
      el("td", {class: "id"}, t.id),
      el("td", {}, el("span", {class: "badge t-" + short(t.status.state)}, short(t.status.state))),
      el("td", {}, n.link ? `${n.link.kind} ${n.link.id}` : n.command || ""),
      el("td", {}, when(t.status.timestamp)),
      el("td", {}, live ? el("button", {type: "button", onclick: () => cancelTask(t.id)}, "Cancel") : null));
  }));
}

function drawAgents() {
  const items = [
    ...[...S.conversations.values()].map((c) => el("li", {"data-conversation": c.id},
      el("b", {}, "conversation "), c.contextId || c.id, ` · ${c.kind || ""} · ${c.turns || 0} turns · ${c.messages || 0} messages`)),
    ...[...S.subagents.values()].map((s) => el("li", {"data-subagent": s.handle},
      el("b", {}, "subagent "), s.handle, " ", el("span", {class: "badge s-" + s.status}, s.status),
      s.error ? " " + s.error : "")),
  ];
  $("agents").replaceChildren(items.length ? el("ul", {}, ...items) : el("p", {class: "empty"}, "No conversation or subagent."));
}

function setConn(mode, label) {
  $("conn").dataset.mode = mode;
  $("conn").textContent = label;
}

function log(line, bad) {
  const li = el("li", {class: bad ? "error" : ""}, new Date().toLocaleTimeString() + " " + line);
  $("log").prepend(li);
  while ($("log").children.length > 50) $("log").lastChild.remove();
}

// ---- start -----------------------------------------------------------------------------

async function main() {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    signIn($("token").value.trim());
  });
  $("device-start").addEventListener("click", () => {
    $("device-start").disabled = true;
    deviceSignIn().catch((e) => signinError(e.message)).finally(() => { $("device-start").disabled = false; });
  });
  $("signout").addEventListener("click", signOut);
  $("op-pause").addEventListener("click", () => operatorOp("admin.pause"));
  $("op-resume").addEventListener("click", () => operatorOp("admin.resume"));
  $("op-drain").addEventListener("click", drainClicked);
  $("status-refresh").addEventListener("click", () => act("status", async () => { await refreshStatus(); render(); }));
  try {
    await loadCard();
  } catch (e) {
    return signinError("could not read the agent card: " + e.message);
  }
  if (!Object.keys(S.card.securitySchemes || {}).length) {
    // No credential declared: only the implicit loopback operator, which a browser never is.
    $("token-form").hidden = true;
    return signinError("This listener declares no credential, and a browser is never its " +
      "implicit operator: configure a2a.bearer (or a rule, or the device grant) to use the console.");
  }
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved);
}

main();
