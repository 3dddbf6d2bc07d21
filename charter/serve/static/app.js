// The Charter fabric page: no framework, no build step. Every piece of journal text is
// put in the page with textContent (never innerHTML), after escaping control and
// bidirectional characters so a worker's terminal escapes show as text.
//
// The stream (docs/serve.md, "The stream") sends one snapshot, then deltas: applyDelta
// below follows the rules of charter/serve/_delta.py, and only the rows, panels and
// list items a delta names are drawn again.
"use strict";

const AXES = ["tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes"];
const COLOURS = ["#58a6ff", "#3fb950", "#d29922", "#bc8cff", "#f85149"];
const state = {
  live: true, head: 0, position: -1, latest: null, source: null, timer: 0,
  shown: null, // the document the panels show (the live one, or one as of a position)
  rows: new Map(), order: [], // the tree's rows by lineage, and the lineages in order
  items: new Map(), events: [], // the events' list items by position, the positions in order
  snapshots: 0, deltas: 0, gaps: 0,
};
// keyed path -> the field each item is named by (charter/serve/_delta.py KEYED)
const KEYED = {
  "tree.nodes": "lineage", "budgets.ledgers": "lineage", "slots.cells": "cell",
  "events": "position", "burndown": "position",
};
const DESCENDING = new Set(["events"]);

function safe(value) {
  const text = value === null || value === undefined ? "" : String(value);
  // C0, DEL, C1, and the bidirectional overrides and isolates
  return text.replace(/[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g, (c) =>
    "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = safe(text);
  if (cls) node.className = cls;
  return node;
}

function statusCell(status) {
  return el("td", status || "–", status ? "s-" + String(status).replace(/[^a-z_-]/g, "") : "");
}

function bar(fraction) {
  const outer = el("span", null, "bar");
  const inner = el("span");
  inner.style.width = Math.max(0, Math.min(1, fraction)) * 100 + "%";
  outer.appendChild(inner);
  return outer;
}

function burnOf(line) {
  // the largest share of any axis of its allocation that its subtree has spent
  let worst = 0;
  let axis = "";
  for (const name of AXES) {
    const alloc = line.allocation[name];
    if (alloc > 0) {
      const share = line.subtree_spent[name] / alloc;
      if (share > worst) { worst = share; axis = name; }
    }
  }
  return { share: worst, axis: axis };
}

function treeRow(data, ledgers, node) {
  const row = el("tr");
  row.dataset.lineage = node.lineage;
  row.dataset.status = node.worker || node.status;
  const name = el("td", node.lineage.split("/").pop());
  name.title = safe(node.lineage);
  name.style.paddingLeft = Math.min(node.depth, 40) * 1.2 + "em";
  row.appendChild(name);
  row.appendChild(el("td", node.kind));
  row.appendChild(statusCell(node.status));
  row.appendChild(statusCell(node.worker));
  const verdict = data.verdicts[node.lineage];
  row.appendChild(el("td", verdict || "–", verdict ? "s-verdict" : ""));
  if (verdict) row.dataset.verdict = verdict;
  row.appendChild(el("td", node.tokens_spent === null ? "–" : node.tokens_spent));
  const burn = el("td");
  const line = ledgers.get(node.lineage);
  if (line) {
    const b = burnOf(line);
    burn.appendChild(bar(b.share));
    burn.appendChild(el("span", (b.share * 100).toFixed(1) + "% " + b.axis));
  }
  if (node.burn !== undefined) burn.title = safe(JSON.stringify(node.burn));
  row.appendChild(burn);
  return row;
}

function ledgersOf(data) {
  return new Map(data.budgets.ledgers.map((l) => [l.lineage, l]));
}

function treeCount() {
  document.getElementById("tree-count").textContent = "(" + state.order.length + " lineages)";
}

function renderTree(data) {
  const ledgers = ledgersOf(data);
  state.rows = new Map();
  state.order = [];
  for (const node of data.tree.nodes) {
    state.rows.set(node.lineage, treeRow(data, ledgers, node));
    state.order.push(node.lineage);
  }
  document.querySelector("#tree tbody").replaceChildren(...state.rows.values());
  treeCount();
}

function compare(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

// where key goes in keys (sorted by cmp): its index
function placeOf(keys, key, cmp) {
  let low = 0;
  let high = keys.length;
  while (low < high) {
    const mid = (low + high) >> 1;
    if (cmp(keys[mid], key) < 0) low = mid + 1; else high = mid;
  }
  return low;
}

// Puts element under parent as key's, in the order of keys (sorted by cmp), replacing
// the one it had; elements: key -> element, kept up to date.
function place(parent, elements, keys, key, element, cmp) {
  const had = elements.get(key);
  if (had) { had.replaceWith(element); elements.set(key, element); return; }
  const at = placeOf(keys, key, cmp);
  keys.splice(at, 0, key);
  elements.set(key, element);
  const next = at + 1 < keys.length ? elements.get(keys[at + 1]) : null;
  parent.insertBefore(element, next || null);
}

function unplace(elements, keys, key, cmp) {
  const had = elements.get(key);
  if (!had) return;
  had.remove();
  elements.delete(key);
  const at = placeOf(keys, key, cmp);
  if (keys[at] === key) keys.splice(at, 1);
}

// The rows a delta changed: its nodes, and the nodes whose ledger or verdict it changed.
function updateTree(data, delta) {
  const body = document.querySelector("#tree tbody");
  for (const lineage of delta.drop["tree.nodes"] || []) {
    unplace(state.rows, state.order, lineage, compare);
  }
  const touched = new Set();
  for (const node of delta.upsert["tree.nodes"] || []) touched.add(node.lineage);
  for (const line of delta.upsert["budgets.ledgers"] || []) touched.add(line.lineage);
  for (const lineage of delta.drop["budgets.ledgers"] || []) touched.add(lineage);
  for (const lineage of Object.keys(delta.upsert.verdicts || {})) touched.add(lineage);
  for (const lineage of delta.drop.verdicts || []) touched.add(lineage);
  if (!touched.size) return;
  const nodes = new Map(data.tree.nodes.map((n) => [n.lineage, n]));
  const ledgers = ledgersOf(data);
  for (const lineage of touched) {
    const node = nodes.get(lineage);
    if (node) place(body, state.rows, state.order, lineage, treeRow(data, ledgers, node), compare);
  }
  treeCount();
}

function renderSlots(data) {
  const box = document.getElementById("slots");
  const parts = [];
  for (const cell of data.slots.cells) {
    parts.push(el("div", cell.cell + " (" + cell.state + ")", "cell-title"));
    for (const [klass, slot] of Object.entries(cell.slots)) {
      const row = el("div", null, "slot-row");
      row.dataset.cell = cell.cell;
      row.dataset.class = klass;
      row.appendChild(el("span", klass, "name"));
      row.appendChild(bar(slot.cap ? slot.occupancy / slot.cap : 0));
      row.appendChild(el("span", slot.occupancy + " / " + (slot.cap === null ? "–" : slot.cap)));
      if (slot.queued.length) row.appendChild(el("span", slot.queued.length + " queued", "muted"));
      parts.push(row);
    }
  }
  box.replaceChildren(...parts);
}

function when(ms) {
  return ms === null || ms === undefined ? "–" : new Date(ms).toISOString().replace(".000", "");
}

function renderCells(data) {
  const body = document.querySelector("#cells tbody");
  body.replaceChildren(...data.slots.cells.map((cell) => {
    const row = el("tr");
    row.dataset.cell = cell.cell;
    row.appendChild(el("td", cell.cell));
    row.appendChild(statusCell(cell.state));
    row.appendChild(el("td", cell.incarnation));
    row.appendChild(el("td", when(cell.claim_until_ms)));
    row.appendChild(el("td", cell.cores + (cell.failover_reserve ? " (" + cell.failover_reserve + " reserved)" : "")));
    return row;
  }));
}

const SVG = "http://www.w3.org/2000/svg";

function renderBudgets(data) {
  const box = document.getElementById("budgets");
  const points = data.burndown;
  const last = points.length ? points[points.length - 1] : null;
  const parts = [];
  if (!last) { box.replaceChildren(el("p", "no budgets yet", "muted")); return; }
  const first = points[0].position;
  const span = Math.max(1, last.position - first);
  for (const [root, now] of Object.entries(last.roots)) {
    parts.push(el("div", root, "cell-title"));
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "burn");
    svg.setAttribute("viewBox", "0 0 300 100");
    svg.setAttribute("preserveAspectRatio", "none");
    AXES.forEach((axis, i) => {
      const coords = [];
      for (const p of points) {
        const r = p.roots[root];
        if (!r || !r.allocation[axis]) continue;
        const x = ((p.position - first) / span) * 300;
        const y = 100 - (r.remaining[axis] / r.allocation[axis]) * 100;
        coords.push(x.toFixed(1) + "," + y.toFixed(1));
      }
      if (!coords.length) return;
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", coords.join(" "));
      line.setAttribute("stroke", COLOURS[i]);
      svg.appendChild(line);
    });
    parts.push(svg);
    const legend = el("div", null, "legend");
    AXES.forEach((axis, i) => {
      const a = now.allocation[axis];
      if (!a) return;
      const item = el("span", axis + " " + now.remaining[axis] + " / " + a);
      item.style.color = COLOURS[i];
      legend.appendChild(item);
    });
    parts.push(legend);
  }
  box.replaceChildren(...parts);
}

function eventItem(event) {
  const item = el("li");
  item.dataset.position = event.position;
  item.appendChild(el("span", "#" + event.position, "muted"));
  item.appendChild(document.createTextNode(" "));
  item.appendChild(el("span", event.type, "type"));
  const fields = Object.entries(event)
    .filter(([k]) => !["position", "type", "at"].includes(k))
    .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v)));
  item.appendChild(el("span", fields.join("  "), "fields"));
  return item;
}

const newestFirst = (a, b) => b - a;

function renderEvents(data) {
  state.items = new Map(data.events.map((event) => [event.position, eventItem(event)]));
  state.events = data.events.map((event) => event.position);
  document.getElementById("events").replaceChildren(...state.items.values());
}

function updateEvents(delta) {
  const list = document.getElementById("events");
  for (const position of delta.drop.events || []) {
    unplace(state.items, state.events, position, newestFirst);
  }
  for (const event of delta.upsert.events || []) {
    place(list, state.items, state.events, event.position, eventItem(event), newestFirst);
  }
}

function renderHeader(data) {
  state.position = data.position;
  document.getElementById("position").textContent = safe(data.position);
  document.getElementById("journal").textContent = safe(data.journal);
  document.body.dataset.position = data.position;
}

// Every panel drawn afresh from data (a snapshot, or the live state when going live).
function render(data) {
  const started = performance.now();
  state.shown = data;
  renderTree(data);
  renderSlots(data);
  renderCells(data);
  renderBudgets(data);
  renderEvents(data);
  renderHeader(data);
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
}

// Only what delta changed drawn again: data is the live state it was applied to.
function renderDelta(data, delta) {
  const started = performance.now();
  const changed = (path) => path in delta.upsert || path in delta.drop;
  updateTree(data, delta);
  if (changed("slots.cells")) { renderSlots(data); renderCells(data); }
  if (changed("burndown")) renderBudgets(data);
  if (changed("events")) updateEvents(delta);
  renderHeader(data);
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
}

// The delta rules of charter/serve/_delta.py: set, then drop, then upsert, then each
// keyed path in the order of its key. doc is changed in place.
function applyDelta(doc, delta) {
  const at = (path) => {
    const [outer, inner] = path.split(".");
    return inner === undefined ? [doc, outer] : [doc[outer], inner];
  };
  for (const [path, value] of Object.entries(delta.set)) {
    const [holder, name] = at(path);
    holder[name] = value;
  }
  const paths = new Set([...Object.keys(delta.drop), ...Object.keys(delta.upsert)]);
  for (const path of paths) {
    const [holder, name] = at(path);
    const gone = delta.drop[path] || [];
    if (!(path in KEYED)) { // a mapped path: its own keys are the keys
      for (const key of gone) delete holder[name][key];
      Object.assign(holder[name], delta.upsert[path] || {});
      continue;
    }
    const key = KEYED[path];
    const items = new Map(holder[name].map((item) => [item[key], item]));
    for (const k of gone) items.delete(k);
    for (const item of delta.upsert[path] || []) items.set(item[key], item);
    const cmp = DESCENDING.has(path) ? (a, b) => compare(b[key], a[key]) : (a, b) => compare(a[key], b[key]);
    holder[name] = [...items.values()].sort(cmp);
  }
}

// The live position the page holds (shown or not), for whoever watches it.
function setLatest(data) {
  state.latest = data;
  document.body.dataset.latest = data.position;
}

function setHead(head) {
  state.head = Math.max(state.head, head);
  document.getElementById("head").textContent = safe(state.head);
  const slider = document.getElementById("asof");
  slider.max = state.head;
  if (state.live) slider.value = state.head;
  document.getElementById("asof-value").textContent = safe(slider.value);
}

function setMode(mode) {
  const badge = document.getElementById("mode");
  badge.textContent = mode;
  badge.className = "badge " + mode;
  document.body.dataset.mode = mode;
}

function goLive() {
  state.live = true;
  setMode("live");
  if (state.latest) {
    if (state.shown !== state.latest) render(state.latest);
    setHead(state.latest.head);
  }
}

async function showAsOf(position) {
  const answer = await fetch("/api/fabric?as_of=" + encodeURIComponent(position),
    { credentials: "same-origin" });
  if (!answer.ok) { setMode("down"); return; }
  const data = await answer.json();
  if (state.live) return; // the operator went back to live meanwhile
  render(data);
  setHead(data.head);
}

function onSnapshot(message) {
  const data = JSON.parse(message.data);
  state.snapshots += 1;
  document.body.dataset.snapshots = state.snapshots;
  setLatest(data);
  setHead(data.head);
  if (state.live) { render(data); setMode("live"); }
}

function onDelta(message) {
  const delta = JSON.parse(message.data);
  const live = state.latest;
  if (!live || delta.base !== live.position) {
    // a gap: this delta is not from the state we hold; start again from a snapshot
    state.gaps += 1;
    document.body.dataset.gaps = state.gaps;
    connect();
    return;
  }
  applyDelta(live, delta);
  setLatest(live);
  state.deltas += 1;
  document.body.dataset.deltas = state.deltas;
  document.body.dataset.updateBytes = message.data.length;
  setHead(live.head);
  if (state.live) {
    if (state.shown === live) renderDelta(live, delta); else render(live);
    setMode("live");
  }
}

// A stream from nothing: its first event is a snapshot. (The browser's own reconnection
// sends Last-Event-ID, and the server answers with the deltas since, or a snapshot.)
function connect() {
  if (state.source) state.source.close();
  const source = new EventSource("/api/stream");
  state.source = source;
  source.addEventListener("snapshot", onSnapshot);
  source.addEventListener("delta", onDelta);
  source.addEventListener("error", () => { if (source.readyState !== 1) setMode("down"); });
}

document.addEventListener("DOMContentLoaded", () => {
  const slider = document.getElementById("asof");
  slider.addEventListener("input", () => {
    document.getElementById("asof-value").textContent = safe(slider.value);
    const value = Number(slider.value);
    if (value >= state.head) { goLive(); return; }
    state.live = false;
    setMode("past");
    clearTimeout(state.timer);
    state.timer = setTimeout(() => showAsOf(value), 60);
  });
  document.getElementById("live").addEventListener("click", goLive);
  connect();
});
