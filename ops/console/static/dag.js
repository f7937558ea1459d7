// A run's DAG as inline SVG, from the workflow's definition: layers by the longest path from the roots,
// top to bottom; the nodes of one layer side by side (a fan-out spreads across); one edge per dependency.
import { h, ICONS } from "./api.js";

const W = 210, H = 76, GAP_X = 28, GAP_Y = 46, PAD = 14;

// Layer of a node: 0 for a root, else 1 + the deepest layer among its dependencies (the longest path), so
// every edge points down. Within a layer, nodes sit in the mean order of their dependencies, which keeps
// edges short and mostly uncrossed.
export function layers(nodes) {
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
  const rows = [];
  for (const n of nodes) (rows[depthOf(n)] ||= []).push(n);
  const order = new Map();
  for (const row of rows.filter(Boolean)) {
    const mean = (n) => (n.deps.length ? n.deps.reduce((s, d) => s + order.get(d), 0) / n.deps.length : 0);
    row.sort((a, b) => mean(a) - mean(b)); // stable: ties keep the definition's order
    row.forEach((n, i) => order.set(n.name, i));
  }
  return rows.filter(Boolean);
}

const svg = (tag, attrs, ...children) => h(tag, { svg: true, ...attrs }, ...children);
const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

// nodes: the run's nodes, each with `deps` (its dependencies among the run's nodes); `selected`: the node
// whose panel is open; `onSelect(name)`: called on a click (or Enter) on a node.
export function dag(nodes, { selected, onSelect }) {
  const rows = layers(nodes);
  const widest = Math.max(1, ...rows.map((r) => r.length));
  const width = PAD * 2 + widest * W + (widest - 1) * GAP_X;
  const height = PAD * 2 + rows.length * H + (rows.length - 1) * GAP_Y;
  const at = new Map();
  rows.forEach((row, r) => {
    const offset = ((widest - row.length) * (W + GAP_X)) / 2; // centre narrow layers
    row.forEach((n, c) => at.set(n.name, { x: PAD + offset + c * (W + GAP_X), y: PAD + r * (H + GAP_Y) }));
  });
  const status = new Map(nodes.map((n) => [n.name, n.status]));
  const edges = nodes.flatMap((n) => n.deps.map((d) => {
    const a = at.get(d), b = at.get(n.name);
    const [x1, y1, x2, y2] = [a.x + W / 2, a.y + H, b.x + W / 2, b.y];
    const bend = Math.max(GAP_Y / 2, (y2 - y1) / 3);
    return svg("path", {
      class: `edge${status.get(d) === "succeeded" ? " done" : ""}`, "data-edge": `${d}->${n.name}`,
      "data-testid": "edge", "marker-end": "url(#arrow)",
      d: `M${x1},${y1} C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}`,
    });
  }));
  return svg("svg", { id: "dag", "data-testid": "dag", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-layers": rows.length },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
      svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }))),
    ...edges, ...rows.flatMap((row, r) => row.map((n) => box(n, at.get(n.name), r, n.name === selected, onSelect))));
}

function box(n, { x, y }, layer, chosen, onSelect) {
  const p = n.progress;
  const frac = p && p.total ? Math.min(1, p.current / p.total) : n.status === "succeeded" ? 1 : 0;
  const count = p ? (p.total ? `${p.current}/${p.total}` : `${p.current}`) : "";
  const note = n.error || (p && p.message !== count ? p.message : "");
  const room = Math.floor((W - 24 - count.length * 7) / 6.2); // characters of 11px text left beside the count
  const open = () => onSelect(n.name);
  return svg("g", { class: `node s-${n.status}${chosen ? " selected" : ""}`, transform: `translate(${x},${y})`,
    "data-testid": `node-${n.name}`, "data-node": n.name, "data-status": n.status, "data-layer": layer,
    tabindex: 0, role: "button", "aria-label": `${n.name}: ${n.status}; show its output and error`,
    onclick: open, onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } } },
    svg("title", {}, [`${n.name} (${n.status})`, note, "click: output and error"].filter(Boolean).join("\n")),
    svg("rect", { class: "node-box", width: W, height: H, rx: 6 }),
    svg("text", { class: "icon", x: 10, y: 21, "data-testid": "node-icon" }, ICONS[n.status] || "?"),
    svg("text", { class: "name", x: 30, y: 21 }, clip(n.name, 21)),
    svg("text", { class: "attempt", x: W - 10, y: 21, "text-anchor": "end" }, n.attempt ? `#${n.attempt}` : ""),
    svg("rect", { class: "bar", x: 10, y: 31, width: W - 20, height: 7, rx: 3 }),
    svg("rect", { class: "bar-fill", x: 10, y: 31, width: (W - 20) * frac, height: 7, rx: 3, "data-testid": "node-bar" }),
    svg("text", { class: n.error ? "note error" : "note", x: 10, y: 54 }, clip(note, room)),
    svg("text", { class: "count", x: W - 10, y: 54, "text-anchor": "end", "data-testid": "node-count" }, count),
    svg("text", { class: "status-text", x: 10, y: 69 }, n.status.replace("_", " ")));
}
