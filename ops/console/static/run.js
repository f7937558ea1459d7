// #/runs/<id>: one run's DAG as inline SVG, laid out in layers by topological depth, polled every second
// while the run is active (and only then); Cancel, Retry and Refresh as the run's status allows.
import { get, h, ICONS, poll, post, showError, showNotice, TERMINAL, when } from "./api.js";

const W = 220, H = 76, GAP_X = 48, GAP_Y = 18, PAD = 12;
const LABELS = { running: "Running", succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" };

export function render(root, runId) {
  const status = h("p", { id: "run-status", "data-testid": "run-status" }, "loading…");
  const svgBox = h("div", { id: "dag-box", class: "dag-box" });
  const refreshInput = h("textarea", { id: "refresh-input", rows: 2, placeholder: "the input to run with (JSON)" });
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
    try {
      run = normalize(await get(`/runs/${encodeURIComponent(runId)}`));
    } catch (err) {
      if (!run) status.textContent = "The run could not be loaded.";
      throw err;
    }
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
    if (action === "refresh") {
      try { body.input = refreshInput.value.trim() ? JSON.parse(refreshInput.value) : null; } catch (exc) {
        showError({ code: "invalid_input", message: `the input is not JSON: ${exc.message}` });
        return;
      }
    }
    let answer;
    try { answer = await post(`/runs/${encodeURIComponent(runId)}/${action}`, body); } catch { return; }
    if (action === "refresh") {
      showNotice(answer.rerun.length ? `re-running ${answer.rerun.join(", ")}` : "nothing changed; nothing to re-run");
    }
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
    status.dataset.polling = String(active); // load() returns the same, which ends or continues the polling
    buttons.cancel.hidden = !active;
    buttons.cancel.disabled = Boolean(run.cancel_requested);
    buttons.retry.hidden = !(run.status === "failed" || run.status === "cancelled");
    refreshBox.hidden = buttons.refresh.hidden = run.status !== "succeeded";
    if (!refreshBox.hidden && !refreshInput.value) refreshInput.value = JSON.stringify(run.input);
    error.hidden = !run.error;
    error.textContent = run.error || "";
    svgBox.replaceChildren(dag(run.nodes));
  }

  follow();
  return () => { stopped = true; if (stop) stop(); };
}

// The run as the API gives it (nodes in DAG order, each with its depends_on), each node with `deps` limited to
// the run's own nodes (an edge to a node since removed from the definition has nothing to point at).
export function normalize(run) {
  const names = new Set(run.nodes.map((n) => n.name));
  return { ...run, nodes: run.nodes.map((n) => ({ ...n, deps: (n.depends_on || []).filter((d) => names.has(d)) })) };
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
  const count = p ? (p.total ? `${p.current}/${p.total}` : `${p.current}`) : "";
  const note = n.error || (p && p.message !== count ? p.message : "");
  const room = Math.floor((W - 24 - count.length * 7) / 6.2); // characters of 11px text left beside the count
  return svg("g", { class: `node s-${n.status}`, transform: `translate(${x},${y})`,
    "data-testid": `node-${n.name}`, "data-node": n.name, "data-status": n.status },
    svg("title", {}, [n.name, n.status, note].filter(Boolean).join("\n")),
    svg("rect", { class: "node-box", width: W, height: H, rx: 6 }),
    svg("text", { class: "icon", x: 10, y: 21, "data-testid": "node-icon" }, ICONS[n.status] || "?"),
    svg("text", { class: "name", x: 30, y: 21 }, clip(n.name, 23)),
    svg("text", { class: "attempt", x: W - 10, y: 21, "text-anchor": "end" }, n.attempt ? `#${n.attempt}` : ""),
    svg("rect", { class: "bar", x: 10, y: 31, width: W - 20, height: 7, rx: 3 }),
    svg("rect", { class: "bar-fill", x: 10, y: 31, width: (W - 20) * frac, height: 7, rx: 3, "data-testid": "node-bar" }),
    svg("text", { class: n.error ? "note error" : "note", x: 10, y: 54 }, clip(note, room)),
    svg("text", { class: "count", x: W - 10, y: 54, "text-anchor": "end", "data-testid": "node-count" }, count),
    svg("text", { class: "status-text", x: 10, y: 69 }, n.status.replace("_", " ")));
}
