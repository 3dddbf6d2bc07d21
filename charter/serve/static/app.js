// The Charter fabric page: no framework, no build step. Every piece of journal text is
// put in the page with textContent (never innerHTML), after escaping control and
// bidirectional characters so a worker's terminal escapes show as text.
"use strict";

const AXES = ["tokens", "wall_ms", "cpu_ms", "mem_bytes", "egress_bytes"];
const COLOURS = ["#58a6ff", "#3fb950", "#d29922", "#bc8cff", "#f85149"];
const state = { live: true, head: 0, position: -1, latest: null, source: null, timer: 0 };

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

function renderTree(data) {
  const body = document.querySelector("#tree tbody");
  const ledgers = new Map(data.budgets.ledgers.map((l) => [l.lineage, l]));
  const rows = [];
  for (const node of data.tree.nodes) {
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
    rows.push(row);
  }
  body.replaceChildren(...rows);
  document.getElementById("tree-count").textContent = "(" + rows.length + " lineages)";
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

function renderEvents(data) {
  const list = document.getElementById("events");
  list.replaceChildren(...data.events.map((event) => {
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
  }));
}

function render(data) {
  const started = performance.now();
  state.position = data.position;
  document.getElementById("position").textContent = safe(data.position);
  document.getElementById("journal").textContent = safe(data.journal);
  renderTree(data);
  renderSlots(data);
  renderCells(data);
  renderBudgets(data);
  renderEvents(data);
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  document.body.dataset.position = data.position;
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
  if (state.latest) { render(state.latest); setHead(state.latest.head); }
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

function connect() {
  const source = new EventSource(state.position >= 0 ? "/api/stream?after=" + state.position : "/api/stream");
  state.source = source;
  source.addEventListener("fabric", (message) => {
    const data = JSON.parse(message.data);
    state.latest = data;
    setHead(data.head);
    if (state.live) { render(data); setMode("live"); }
  });
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
