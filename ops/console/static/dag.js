// A run's DAG as inline SVG, from the workflow's definition: layers by the longest path from the roots,
// top to bottom; the nodes of one layer side by side (a fan-out spreads across); one edge per dependency.
import { h, ICONS } from "./api.js";
import { waitingText } from "./waiting.js";

const W = 210, H = 76, GAP_X = 28, GAP_Y = 46, PAD = 14;
const WAYPOINT = 12; // the room an edge passing through a layer takes there

// Layer of a node: 0 for a root, else 1 + the deepest layer among its dependencies (the longest path), so
// every edge points down.
export function layerOf(nodes) {
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
  for (const n of nodes) depthOf(n);
  return depth;
}

// Where every node and every bend of an edge goes. An edge that spans several layers passes through a
// narrow waypoint in each layer between, which takes its place in that layer's order, so it runs between
// the nodes there instead of through them. Within a layer, nodes (and waypoints) sit in the mean order of
// what they hang from, and as near as they fit to the mean position of it: a fan-out spreads side by side
// under its source, a chain stays straight, and edges stay short and mostly uncrossed.
export function layout(nodes) {
  const depth = layerOf(nodes);
  const rows = [];
  const place = (item) => (rows[item.layer] ||= []).push(item);
  const items = new Map();
  for (const n of nodes) {
    const item = { id: n.name, node: n, layer: depth.get(n.name), width: W, parents: [] };
    items.set(n.name, item);
    place(item);
  }
  const routes = [];
  for (const n of nodes) {
    const target = items.get(n.name);
    for (const d of n.deps) {
      let above = items.get(d);
      const route = [above];
      for (let layer = above.layer + 1; layer < target.layer; layer++) {
        const waypoint = { id: `${d}->${n.name}@${layer}`, layer, width: WAYPOINT, parents: [above] };
        place(waypoint);
        route.push(waypoint);
        above = waypoint;
      }
      target.parents.push(above);
      route.push(target);
      routes.push({ from: d, to: n.name, route });
    }
  }
  rows.forEach((row, r) => {
    const mean = (f) => (item) => (item.parents.length ? item.parents.reduce((s, p) => s + f(p), 0) / item.parents.length : null);
    if (r > 0) {
      const rank = mean((p) => p.rank);
      row.sort((a, b) => (rank(a) ?? 0) - (rank(b) ?? 0)); // stable: ties keep the definition's order
    }
    row.forEach((item, i) => { item.rank = i; });
    // Each where it would like to be (under its parents; roots side by side), then pushed apart to fit,
    // then the layer moved back so that on average it sits where it wanted.
    const centre = mean((p) => p.x);
    const wanted = row.map((item, i) => centre(item) ?? i * (W + GAP_X));
    row.forEach((item, i) => {
      const prev = row[i - 1];
      item.x = prev ? Math.max(wanted[i], prev.x + (prev.width + item.width) / 2 + GAP_X) : wanted[i];
    });
    const drift = row.reduce((s, item, i) => s + wanted[i] - item.x, 0) / row.length;
    for (const item of row) item.x += drift;
  });
  const all = rows.flat();
  const left = Math.min(...all.map((item) => item.x - item.width / 2));
  for (const item of all) {
    item.x += PAD - left; // x is the centre
    item.y = PAD + item.layer * (H + GAP_Y); // y is the top
  }
  const width = Math.max(...all.map((item) => item.x + item.width / 2)) + PAD;
  return { rows, items, routes, width, height: PAD * 2 + rows.length * H + (rows.length - 1) * GAP_Y };
}

const svg = (tag, attrs, ...children) => h(tag, { svg: true, ...attrs }, ...children);
const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

// A smooth path from the bottom of the dependency, through the waypoints, to the top of the node.
function edgePath(route) {
  const points = route.map((item, i) => {
    if (i === 0) return [item.x, item.y + H];
    if (i === route.length - 1) return [item.x, item.y];
    return [item.x, item.y + H / 2];
  });
  let d = `M${points[0][0]},${points[0][1]}`;
  for (let i = 1; i < points.length; i++) {
    const [[x1, y1], [x2, y2]] = [points[i - 1], points[i]];
    const bend = (y2 - y1) / 2;
    d += ` C${x1},${y1 + bend} ${x2},${y2 - bend} ${x2},${y2}`;
  }
  return d;
}

// nodes: the run's nodes, each with `deps` (its dependencies among the run's nodes); `selected`: the node
// whose panel is open; `onSelect(name)`: called on a click (or Enter) on a node.
export function dag(nodes, { selected, onSelect }) {
  const { rows, items, routes, width, height } = layout(nodes);
  const status = new Map(nodes.map((n) => [n.name, n.status]));
  const edges = routes.map(({ from, to, route }) => svg("path", {
    class: `edge${status.get(from) === "succeeded" ? " done" : ""}`, "data-edge": `${from}->${to}`,
    "data-testid": "edge", "marker-end": "url(#arrow)", d: edgePath(route),
  }));
  return svg("svg", { id: "dag", "data-testid": "dag", width, height, viewBox: `0 0 ${width} ${height}`,
    "data-layers": rows.length },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
      svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }))),
    ...edges, ...nodes.map((n) => {
      const item = items.get(n.name);
      return box(n, { x: item.x - W / 2, y: item.y }, item.layer, n.name === selected, onSelect);
    }));
}

function box(n, { x, y }, layer, chosen, onSelect) {
  const p = n.progress;
  const frac = p && p.total ? Math.min(1, p.current / p.total) : n.status === "succeeded" ? 1 : 0;
  const count = p ? (p.total ? `${p.current}/${p.total}` : `${p.current}`) : "";
  const note = n.error || waitingText(n) || (p && p.message !== count ? p.message : "");
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
