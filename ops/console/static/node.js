// The panel under a run's DAG: one node's status, progress, timing, error and output. The output comes
// from /runs/<id>/nodes/<name> (the polled run detail leaves outputs out), read when the node is chosen
// and again whenever the node moves on.
import { get, h, statusBadge, when } from "./api.js";
import { waitingText } from "./waiting.js";

// Characters of output shown; a larger output is cut, and the panel says where to read all of it.
const SHOWN = 100_000;

export function nodePanel(runId) {
  const el = h("section", { id: "node-panel", "data-testid": "node-panel", hidden: true });
  let name = null;
  let seen = ""; // what the shown detail was read at: a change of any of these reads it again
  let reading = 0;

  async function read() {
    const mine = ++reading;
    let node;
    try {
      node = await get(`/runs/${encodeURIComponent(runId)}/nodes/${encodeURIComponent(name)}`);
    } catch (err) {
      if (mine === reading) el.replaceChildren(header(name, null), h("p", { class: "error-text" }, err.message));
      return;
    }
    if (mine === reading && node.name === name) el.replaceChildren(...view(node));
  }

  function header(title, node) {
    return h("h3", {}, `Node ${title} `, node ? statusBadge(node.status) : "",
      h("button", { class: "close", id: "node-close", "aria-label": "close the node panel", onclick: close }, "×"));
  }

  function view(node) {
    const p = node.progress;
    const facts = [
      ["attempt", node.attempt || "not started"],
      ["waits", waitingText(node)],
      ["progress", p ? [p.total ? `${p.current} of ${p.total}` : p.current, p.message].filter((x) => x !== "").join(" · ") : ""],
      ["depends on", node.depends_on.join(", ") || "nothing (a root)"],
      ["started", when(node.started_at)],
      ["finished", when(node.finished_at)],
      ["worker", node.worker || ""],
      ["checkpoints", node.checkpoints], ["memoized steps", node.steps], ["crashes", node.crashes],
    ].filter(([, v]) => v !== "" && v != null);
    return [
      header(node.name, node),
      h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])),
      h("h4", {}, "Error"),
      node.error ? h("pre", { class: "error-text", "data-testid": "node-error" }, node.error)
        : h("p", { class: "muted", "data-testid": "node-error" }, "none"),
      h("h4", {}, "Output"),
      output(node),
    ];
  }

  function output(node) {
    if (node.status !== "succeeded") {
      const why = node.status === "failed" ? "the node failed" : `the node is ${node.status.replace("_", " ")}`;
      return h("p", { class: "muted", "data-testid": "node-output", "data-empty": "true" }, `no output yet: ${why}`);
    }
    const text = JSON.stringify(node.output, null, 2) ?? "null";
    const cut = text.length > SHOWN;
    return h("div", {},
      h("pre", { class: "output", "data-testid": "node-output" }, cut ? `${text.slice(0, SHOWN)}\n…` : text),
      cut ? h("p", { class: "muted" }, `${text.length} characters, the first ${SHOWN} shown; all of it: ` +
        `GET /api/v1/runs/${runId}/nodes/${node.name}`) : "");
  }

  function show(chosen) {
    name = chosen;
    seen = "";
    el.hidden = false;
    el.replaceChildren(header(chosen, null), h("p", { class: "muted" }, "loading…"));
  }

  function close() {
    name = null;
    reading++;
    el.hidden = true;
    el.replaceChildren();
    onClose();
  }

  let onClose = () => {};

  // Called with the run after every poll: reads the chosen node again if it moved on.
  function update(run) {
    if (!name) return;
    const node = run.nodes.find((n) => n.name === name);
    if (!node) return;
    const now = [node.status, node.attempt, node.finished_at, node.error, node.progress && node.progress.current,
      node.waiting_for, node.wake_at].join("|");
    if (now !== seen) {
      seen = now;
      read();
    }
  }

  return {
    el, show, update, close,
    get selected() { return name; },
    set onClose(fn) { onClose = fn; },
  };
}
