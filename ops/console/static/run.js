// #/runs/<id>: one run's DAG (dag.js), polled every second while the run is active (and only then); a click
// on a node opens its output and error (node.js); Pause, Resume, Cancel, Retry and Refresh as the run's status
// allows, each confirmed first (confirm.js); what waiting nodes wait for, with Approve and Reject for a signal
// (waiting.js); the run's history: a timeline of its events and a Gantt of its node attempts (history.js).
import { get, h, poll, post, showError, showNotice, TERMINAL, when } from "./api.js";
import { confirmAction } from "./confirm.js";
import { dag } from "./dag.js";
import { historyPanel } from "./history.js";
import { nodePanel } from "./node.js";
import { waitingPanel } from "./waiting.js";

const LABELS = { running: "Running", paused: "Paused", succeeded: "Succeeded", failed: "Failed", cancelled: "Cancelled" };

export function render(root, runId) {
  const status = h("p", { id: "run-status", "data-testid": "run-status" }, "loading…");
  const svgBox = h("div", { id: "dag-box", class: "dag-box" });
  const unknown = h("p", { id: "definition-unknown", class: "warning", "data-testid": "definition-unknown", hidden: true });
  const refreshInput = h("textarea", { id: "refresh-input", rows: 2, placeholder: "the input to run with (JSON)" });
  const buttons = {
    cancel: h("button", { id: "run-cancel", class: "danger", hidden: true, onclick: () => act("cancel") }, "Cancel run"),
    pause: h("button", { id: "run-pause", hidden: true, onclick: () => act("pause") }, "Pause"),
    resume: h("button", { id: "run-resume", hidden: true, onclick: () => act("resume") }, "Resume"),
    retry: h("button", { id: "run-retry", hidden: true, onclick: () => act("retry") }, "Retry"),
    refresh: h("button", { id: "run-refresh", hidden: true, onclick: () => act("refresh") }, "Refresh"),
  };
  const refreshBox = h("div", { id: "refresh-box", class: "row", hidden: true }, refreshInput, buttons.refresh);
  const meta = h("p", { id: "run-meta", class: "muted" });
  // The runs a continue_as_new chain links this one to, each a link to its page.
  const chain = h("p", { id: "run-chain", class: "muted", hidden: true });
  const error = h("pre", { id: "run-error", class: "error-text", hidden: true });
  const panel = nodePanel(runId);
  panel.onClose = () => run && draw();
  const waiting = waitingPanel(runId, () => follow());
  const history = historyPanel(runId);
  root.append(h("h2", {}, h("a", { href: "#/runs" }, "Runs"), " / ", h("span", { class: "mono" }, runId)),
    meta, chain, unknown, svgBox, h("p", { class: "muted hint" }, "Click a node to see its output and error."),
    waiting.el, panel.el, h("div", { class: "row" }, status, buttons.pause, buttons.resume, buttons.cancel, buttons.retry),
    refreshBox, error, history.el);

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
    panel.update(run);
    // The history reads only the events after those it shows; its errors show in the banner on their own.
    history.update(!TERMINAL.has(run.status)).catch(() => {});
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
    if (!(await confirmAction(consequences(action, run, body)))) return;
    let answer;
    try { answer = await post(`/runs/${encodeURIComponent(runId)}/${action}`, body); } catch { return; }
    if (action === "refresh") {
      showNotice(answer.rerun.length ? `re-running ${answer.rerun.join(", ")}` : "nothing changed; nothing to re-run");
    }
    follow();
  }

  function select(name) {
    panel.show(name);
    draw();
    panel.update(run);
  }

  function draw() {
    const done = run.nodes.filter((n) => n.status === "succeeded").length;
    status.dataset.status = run.status;
    status.textContent = `${LABELS[run.status] || run.status} (${done}/${run.nodes.length} nodes complete)` +
      (run.cancel_requested && !TERMINAL.has(run.status) ? " — cancel requested" : "") +
      // Retention released it from the run lists; its stream still holds it (`ledgerflow workflows restore`).
      (run.released ? ` — released by retention ${when(run.released.at)}; restore: ledgerflow workflows restore ${run.run_id}` : "");
    // The definition's version the run started with: only a worker that has it goes on with the run.
    meta.textContent = [run.workflow, run.workflow_version && `version ${run.workflow_version}`,
      run.key && `key ${run.key}`, run.started_at && `started ${when(run.started_at)}`,
      run.finished_at && `finished ${when(run.finished_at)}`].filter(Boolean).join(" · ");
    const links = [["continued from", run.continued_from], ["continued as", run.continued_as]]
      .filter(([, id]) => id)
      .flatMap(([label, id], i) => [i ? " · " : "", `${label} `, h("a", { href: `#/runs/${id}`, class: "mono" }, id)]);
    chain.replaceChildren(...links);
    chain.hidden = links.length === 0;
    unknown.hidden = run.definition_known !== false;
    unknown.textContent = `This server does not have version ${run.workflow_version} of workflow ` +
      `${run.workflow}, so it cannot ` +
      "draw the dependencies: the nodes are shown side by side in the order the run recorded. Start " +
      "`ledgerflow serve` with the workflow's module in LEDGERFLOW_WORKFLOWS to see the DAG.";
    const active = !TERMINAL.has(run.status);
    status.dataset.polling = String(active); // load() returns the same, which ends or continues the polling
    const operates = run.may_operate !== false; // a token without the operate scope gets no levers
    buttons.cancel.hidden = !active || !operates;
    buttons.cancel.disabled = Boolean(run.cancel_requested);
    buttons.pause.hidden = !active || !operates || run.status === "paused" || Boolean(run.cancel_requested);
    buttons.resume.hidden = !operates || run.status !== "paused";
    buttons.retry.hidden = !operates || Boolean(run.released) || !(run.status === "failed" || run.status === "cancelled");
    refreshBox.hidden = buttons.refresh.hidden = !operates || run.status !== "succeeded";
    if (!refreshBox.hidden && !refreshInput.value) refreshInput.value = JSON.stringify(run.input);
    error.hidden = !run.error;
    error.textContent = run.error || "";
    svgBox.replaceChildren(dag(run.nodes, { selected: panel.selected, onSelect: select }));
    waiting.update(run);
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

const list = (names) => names.join(", ");

// What pressing the button will do to this run, in words, for the confirmation.
function consequences(action, run, body) {
  const title = `${run.workflow} run ${run.run_id.slice(0, 8)}`;
  const done = run.nodes.filter((n) => n.status === "succeeded").map((n) => n.name);
  const running = run.nodes.filter((n) => n.status === "running").map((n) => n.name);
  const kept = done.length ? `The ${done.length} completed node(s) (${list(done)}) keep their output.` : "";
  if (action === "cancel") {
    return {
      title: `Cancel ${title}?`,
      body: [
        "Nodes still waiting never start" +
          (running.length ? `; the running node(s) ${list(running)} stop at their next call to their context.` : "."),
        kept, "Retry can run it again later from where it stopped.",
      ].filter(Boolean),
      confirm: "Cancel the run", keep: "Keep it running",
    };
  }
  if (action === "pause") {
    return {
      title: `Pause ${title}?`,
      body: [
        "No node of the run starts until it is resumed" +
          (running.length ? `; the running node(s) ${list(running)} finish.` : "."),
        kept, "Resume goes on where it stopped.",
      ].filter(Boolean),
      confirm: "Pause the run", keep: "Keep it running",
    };
  }
  if (action === "resume") {
    return {
      title: `Resume ${title}?`,
      body: ["Its ready nodes start again where they were; completed nodes and recorded steps are not run again."],
      confirm: "Resume the run",
    };
  }
  if (action === "retry") {
    const again = run.nodes.filter((n) => ["failed", "cancelled", "parked"].includes(n.status)).map((n) => n.name);
    return {
      title: `Retry ${title}?`,
      body: [
        `The run starts again from ${again.length ? `its ${list(again)} node(s)` : "the nodes that did not complete"}` +
          ", as a new attempt, and goes on to the nodes below them.",
        kept,
      ].filter(Boolean),
      confirm: "Retry the run",
    };
  }
  return {
    title: `Refresh ${title} with new input?`,
    body: [
      `Input: ${JSON.stringify(body.input)}.`,
      "Nodes whose input or code changed run again, and every node below them; their previous output is " +
        "replaced. Nodes that did not change keep theirs. Nothing runs if nothing changed.",
    ],
    confirm: "Refresh the run",
  };
}
