// A run's history on its page: the timeline of its events (time, node, attempt, worker, summary) and a Gantt
// of its node attempts (run, wait, back-off before a retry, queued after a hand-back or a crash), drawn in SVG
// from the events of the run's own stream (GET /runs/<id>/history), read page after page by stream version.
// While the run is active each update reads only the events after the last one shown.
import { get, h, query, when } from "./api.js";

const SVG = "http://www.w3.org/2000/svg";
const MOST = 5000; // events held at most; the CLI's `workflows history` shows every one
const ENDS = { NodeSucceeded: "succeeded", NodeFailed: "failed", NodeRetryScheduled: "retry", NodeReclaimed: "crashed",
  NodeReleased: "handed back", NodeParked: "parked", NodeCancelled: "cancelled", NodeWaiting: "waiting" };
const AFTER = { NodeWaiting: "wait", NodeRetryScheduled: "backoff", NodeReclaimed: "queued", NodeReleased: "queued" };
const RUN_ENDS = new Set(["RunCompleted", "RunFailed", "RunCancelled"]);

export function historyPanel(runId) {
  const gantt = h("div", { id: "gantt-box", class: "gantt-box", "data-testid": "gantt" });
  const table = h("table", { id: "timeline", "data-testid": "timeline" });
  const note = h("p", { id: "history-note", class: "muted hint" });
  const el = h("section", { id: "history", "data-testid": "history" },
    h("h3", {}, "Node attempts"), gantt, h("h3", {}, "Timeline"), note, table);
  const events = [];
  const claims = {}; // each node's last claim seen, for the events of later pages that name none
  let after = 0;
  let loading = false;

  async function update(active) {
    if (loading) return;
    loading = true;
    try {
      let more = true;
      while (more && events.length < MOST) {
        const page = await get(`/runs/${encodeURIComponent(runId)}/history${query({ after, limit: 500 })}`);
        for (const e of page.events.slice(0, MOST - events.length)) events.push(carry(e, claims));
        if (page.events.length) after = page.events[page.events.length - 1].version;
        more = page.next !== null;
      }
    } finally {
      loading = false;
    }
    note.textContent = events.length >= MOST
      ? `The first ${MOST} events; \`ledgerflow workflows history ${runId}\` shows every one.`
      : `${events.length} events, oldest first.`;
    table.replaceChildren(head(), ...events.map(row));
    table.dataset.count = events.length;
    gantt.replaceChildren(draw(spans(events, active)));
  }

  return { el, update };
}

// The page gives an event's attempt and worker from its node's last claim on the same page: a claim on an
// earlier page is carried here.
function carry(e, claims) {
  if (e.type === "NodeClaimed" && e.node) claims[e.node] = { attempt: e.attempt, worker: e.worker };
  else if (e.node && claims[e.node] && !e.worker && (e.attempt == null || e.attempt === claims[e.node].attempt)) {
    return { ...e, attempt: claims[e.node].attempt, worker: claims[e.node].worker };
  }
  return e;
}

const head = () => h("tr", {}, ["time", "event", "node", "attempt", "worker", "summary"].map((t) => h("th", {}, t)));

const row = (e) => h("tr", { "data-testid": "timeline-row", "data-type": e.type, "data-version": e.version },
  h("td", { class: "mono nowrap" }, when(e.at)),
  h("td", {}, e.type),
  h("td", {}, e.node || ""),
  h("td", {}, e.attempt == null ? "" : String(e.attempt)),
  h("td", { class: "mono" }, e.worker || ""),
  h("td", {}, e.summary + (e.actor ? ` (by ${e.actor})` : "")));

// The spans of each node, in the order the nodes first appear: an attempt from its claim to its end, and
// what came between attempts (a wait, a retry's back-off, the queue after a crash or a hand-back). A span
// still open ends at the run's end, or at the last event (now, while the run is active).
export function spans(events, active) {
  const found = [];
  const open = {};
  const order = [];
  const close = (node, at, outcome) => {
    const s = open[node];
    if (s) { s.end = at; s.outcome = s.outcome || outcome; delete open[node]; }
  };
  for (const e of events) {
    const at = Date.parse(e.at);
    if (e.node && !order.includes(e.node)) order.push(e.node);
    if (e.type === "NodeClaimed") {
      close(e.node, at);
      open[e.node] = { node: e.node, kind: "attempt", attempt: e.attempt, worker: e.worker, start: at };
      found.push(open[e.node]);
    } else if (e.node && ENDS[e.type] && open[e.node]) {
      const kind = open[e.node].kind;
      close(e.node, at, kind === "attempt" ? ENDS[e.type] : undefined);
      if (AFTER[e.type]) {
        open[e.node] = { node: e.node, kind: AFTER[e.type], attempt: e.attempt, start: at, outcome: e.summary };
        found.push(open[e.node]);
      }
    } else if (RUN_ENDS.has(e.type)) {
      for (const node of Object.keys(open)) close(node, at, "run ended");
    }
  }
  const last = events.length ? Date.parse(events[events.length - 1].at) : 0;
  const end = active ? Math.max(Date.now(), last) : last;
  for (const s of found) if (s.end === undefined) { s.end = end; s.open = true; }
  return { spans: found, order, start: events.length ? Date.parse(events[0].at) : 0, end };
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  for (const c of children) el.append(c);
  return el;
}

const ms = (n) => (n >= 10000 ? `${(n / 1000).toFixed(1)} s` : `${Math.round(n)} ms`);

function draw({ spans: found, order, start, end }) {
  const label = 140;
  const width = 900;
  const rowHeight = 22;
  const span = Math.max(end - start, 1);
  const x = (t) => label + ((t - start) / span) * (width - label - 10);
  const height = order.length * rowHeight + 26;
  const root = svg("svg", { id: "gantt", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "node attempts over time" });
  order.forEach((node, i) => {
    const y = i * rowHeight + 4;
    root.append(svg("text", { x: 4, y: y + 14, class: "gantt-label" }, node));
    root.append(svg("line", { x1: label, x2: width - 10, y1: y + rowHeight - 2, y2: y + rowHeight - 2, class: "gantt-grid" }));
  });
  for (const s of found) {
    const y = order.indexOf(s.node) * rowHeight + 6;
    const left = x(s.start);
    const bar = svg("rect", {
      x: left, y, width: Math.max(x(s.end) - left, 2), height: rowHeight - 8, rx: 2,
      class: `gantt-bar k-${s.kind} o-${String(s.outcome || "open").replace(/\s+/g, "-")}`,
      "data-testid": "gantt-bar", "data-node": s.node, "data-kind": s.kind, "data-attempt": s.attempt ?? "",
    });
    const what = s.kind === "attempt"
      ? `${s.node} attempt ${s.attempt} on ${s.worker}: ${s.outcome || "running"}`
      : `${s.node}: ${s.kind}${s.outcome ? ` (${s.outcome})` : ""}`;
    bar.append(svg("title", {}, `${what}, ${ms(s.end - s.start)}${s.open ? " so far" : ""}`));
    root.append(bar);
  }
  const axis = order.length * rowHeight + 18;
  root.append(svg("text", { x: label, y: axis, class: "gantt-axis" }, "0"));
  root.append(svg("text", { x: width - 10, y: axis, class: "gantt-axis", "text-anchor": "end" }, ms(span)));
  return root;
}
