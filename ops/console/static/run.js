// #/runs/<id>: one run's DAG as inline SVG, laid out in layers by topological depth, polled every second
// while the run is active (and only then); Cancel, Retry and Refresh as the run's status allows.
import { get, h, ICONS, poll, post, showError, TERMINAL, when } from "./api.js";

const W = 210, H = 72, GAP_X = 64, GAP_Y = 20, PAD = 12;
const LABELS = { running: "Running", succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" };

export function render(root, runId) {
  const status = h("p", { id: "run-status", "data-testid": "run-status" }, "loading…");
  const svgBox = h("div", { id: "dag-box", class: "dag-box" });
  const refreshInput = h("textarea", { id: "refresh-input", rows: 2, placeholder: "new input (JSON); empty: same input" });
  const buttons = {
    cancel: h("button", { id: "run-cancel", class: "danger", hidden: true, onclick: () => act("cancel") }, "Cancel"),
    retry: h("button", { id: "run-retry", hidden: true, onclick: () => act("retry") }, "Retry"),
    refresh: h("button", { id: "run-refresh", hidden: true, onclick: () => act("refresh") }, "Refresh"),
  };
  const refreshBox = h("div", { id: "refresh-box", class: "row", hidden: true }, refreshInput, buttons.refresh);
  const meta = h("p", { id: "run-meta", class: "muted" });
  const error = h("pre", { id: "run-error", class: "error-text", hidden: true });
  root.append(h("h2", {}, h("a", { href: "#/runs" }, "Runs"), " / ", h("span", { class: "mono" }, runId)),
    meta, svgBox, h("div", { class: "row" }, status, buttons.cancel, buttons.retry), refreshBox, error);

  let run = null;
  let stop = null;
  let stopped = false;

  async function load() {
    if (stopped) return false;
    run = normalize(await get(`/runs/${encodeURIComponent(runId)}`));
    if (stopped) return false;
    draw();
    return !TERMINAL.has(run.status);
  }

  function follow() {
    if (stop) stop();
    stop = poll(load, 1000);
  }

  async function act(action) {
    const body = {};
    if (action === "refresh" && refreshInput.value.trim()) {
      try { body.input = JSON.parse(refreshInput.value); } catch (exc) {
        showError({ code: "invalid_input", message: `the input is not JSON: ${exc.message}` });
        return;
      }
    }
    try { await post(`/runs/${encodeURIComponent(runId)}/${action}`, body); } catch { return; }
    follow();
  }

  function draw() {
    const done = run.nodes.filter((n) => n.status === "succeeded").length;
    status.dataset.status = run.status;
    status.textContent = `${LABELS[run.status] || run.status} (${done}/${run.nodes.length} nodes complete)` +
      (run.cancel_requested && !TERMINAL.has(run.status) ? " — cancel requested" : "");
    meta.textContent = [run.workflow, run.key && `key ${run.key}`, run.started_at && `started ${when(run.started_at)}`,
      run.finished_at && `finished ${when(run.finished_at)}`].filter(Boolean).join(" · ");
    const active = !TERMINAL.has(run.status);
    buttons.cancel.hidden = !active;
    buttons.cancel.disabled = Boolean(run.cancel_requested);
    buttons.retry.hidden = !(run.status === "failed" || run.status === "cancelled");
    refreshBox.hidden = buttons.refresh.hidden = run.status !== "succeeded";
    error.hidden = !run.error;
    error.textContent = run.error || "";
    svgBox.replaceChildren(dag(run.nodes));
  }

  follow();
  return () => { stopped = true; if (stop) stop(); };
}

// The run's nodes as a list of {name, status, attempt, progress: {current, total, message}, error, deps},
// whether the API gives nodes as a list or a mapping, and the edges on the nodes (depends_on) or in `dag`.
export function normalize(data) {
  const run = { ...(data.run || data) };
  let nodes = run.nodes || [];
  if (!Array.isArray(nodes)) nodes = Object.entries(nodes).map(([name, n]) => ({ name, ...n }));
  const deps = new Map(nodes.map((n) => [n.name, n.depends_on]));
  const dag = data.dag || run.dag;
  const specs = Array.isArray(dag) ? dag : dag && Array.isArray(dag.nodes) ? dag.nodes : null;
  if (specs) for (const s of specs) deps.set(s.name, s.depends_on || s.deps || []);
  else if (dag && Array.isArray(dag.edges)) {
    for (const e of dag.edges) {
      const [from, to] = Array.isArray(e) ? e : [e.from ?? e.source, e.to ?? e.target];
      deps.set(to, [...(deps.get(to) || []), from]);
      if (!deps.has(from)) deps.set(from, []);
    }
  } else if (dag && typeof dag === "object") for (const [name, d] of Object.entries(dag)) deps.set(name, d);
  const byName = new Map(nodes.map((n) => [n.name, n]));
  for (const name of deps.keys()) if (!byName.has(name)) byName.set(name, { name, status: "pending" });
  run.nodes = [...byName.values()].map((n) => ({
    ...n, status: n.status || "pending", progress: progressOf(n.progress), deps: (deps.get(n.name) || []).filter((d) => byName.has(d)),
  }));
  return run;
}

function progressOf(p) {
  if (!p) return null;
  if (Array.isArray(p)) return { current: p[0], total: p[1], message: p[2] || "" };
  return { current: p.current, total: p.total, message: p.message || "" };
}

// -- layout and drawing ------------------------------------------------------------------------------

function layers(nodes) {
  const byName = new Map(nodes.map((n) => [n.name, n]));
  const depth = new Map();
  const depthOf = (n, seen = new Set()) => {
    if (depth.has(n.name)) return depth.get(n.name);
    if (seen.has(n.name)) return 0; // a cycle cannot come from a valid workflow; draw it anyway
    seen.add(n.name);
    const d = n.deps.length ? 1 + Math.max(...n.deps.map((x) => depthOf(byName.get(x), seen))) : 0;
    depth.set(n.name, d);
    return d;
  };
  const cols = [];
  for (const n of nodes) (cols[depthOf(n)] ||= []).push(n);
  const row = new Map();
  for (const col of cols.filter(Boolean)) {
    // Order a layer by the mean row of each node's dependencies, which keeps edges short and uncrossed.
    const mean = (n) => (n.deps.length ? n.deps.reduce((s, d) => s + row.get(d), 0) / n.deps.length : 0);
    col.sort((a, b) => mean(a) - mean(b));
    col.forEach((n, i) => row.set(n.name, i));
  }
  return cols.filter(Boolean);
}

const svg = (tag, attrs, ...children) => h(tag, { svg: true, ...attrs }, ...children);
const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

export function dag(nodes) {
  const cols = layers(nodes);
  const tallest = Math.max(1, ...cols.map((c) => c.length));
  const width = PAD * 2 + cols.length * W + (cols.length - 1) * GAP_X;
  const height = PAD * 2 + tallest * H + (tallest - 1) * GAP_Y;
  const at = new Map();
  cols.forEach((col, c) => {
    const offset = ((tallest - col.length) * (H + GAP_Y)) / 2; // centre short layers
    col.forEach((n, r) => at.set(n.name, { x: PAD + c * (W + GAP_X), y: PAD + offset + r * (H + GAP_Y) }));
  });
  const edges = nodes.flatMap((n) => n.deps.map((d) => {
    const a = at.get(d), b = at.get(n.name);
    const [x1, y1, x2, y2] = [a.x + W, a.y + H / 2, b.x, b.y + H / 2];
    const done = nodes.find((m) => m.name === d).status === "succeeded";
    return svg("path", {
      class: `edge${done ? " done" : ""}`, "data-edge": `${d}->${n.name}`, "marker-end": "url(#arrow)",
      d: `M${x1},${y1} C${x1 + GAP_X / 2},${y1} ${x2 - GAP_X / 2},${y2} ${x2},${y2}`,
    });
  }));
  return svg("svg", { id: "dag", "data-testid": "dag", width, height, viewBox: `0 0 ${width} ${height}` },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
      svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }))),
    ...edges, ...nodes.map((n) => box(n, at.get(n.name))));
}

function box(n, { x, y }) {
  const p = n.progress;
  const frac = p && p.total ? Math.min(1, p.current / p.total) : n.status === "succeeded" ? 1 : 0;
  const note = n.error || (p && p.message) || "";
  const count = p ? (p.total ? `${p.current}/${p.total}` : `${p.current}`) : "";
  return svg("g", { class: `node s-${n.status}`, transform: `translate(${x},${y})`,
    "data-testid": `node-${n.name}`, "data-node": n.name, "data-status": n.status },
    svg("title", {}, [n.name, n.status, note].filter(Boolean).join("\n")),
    svg("rect", { class: "node-box", width: W, height: H, rx: 6 }),
    svg("text", { class: "icon", x: 10, y: 21, "data-testid": "node-icon" }, ICONS[n.status] || "?"),
    svg("text", { class: "name", x: 30, y: 21 }, clip(n.name, 20)),
    svg("text", { class: "attempt", x: W - 10, y: 21, "text-anchor": "end" }, n.attempt ? `#${n.attempt}` : ""),
    svg("rect", { class: "bar", x: 10, y: 31, width: W - 20, height: 7, rx: 3 }),
    svg("rect", { class: "bar-fill", x: 10, y: 31, width: (W - 20) * frac, height: 7, rx: 3, "data-testid": "node-bar" }),
    svg("text", { class: "count", x: W - 10, y: 55, "text-anchor": "end", "data-testid": "node-count" }, count),
    svg("text", { class: n.error ? "note error" : "note", x: 10, y: 55 }, clip(note, count ? 24 : 30)),
    svg("text", { class: "status-text", x: 10, y: 67 }, n.status));
}
