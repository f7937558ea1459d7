// #/runs: recent runs (from the run table projection) and a form to start one.
import { get, h, poll, post, query, showError, statusBadge, when } from "./api.js";

export function render(root) {
  const filter = h("form", { id: "runs-filter", class: "row" },
    h("select", { id: "filter-status", name: "status" },
      ["", "running", "paused", "succeeded", "failed", "cancelled"].map((s) => h("option", { value: s }, s || "any status"))),
    h("select", { id: "filter-workflow", name: "workflow" }, h("option", { value: "" }, "any workflow")),
    h("input", { id: "filter-limit", name: "limit", type: "number", min: 1, max: 500, value: "30" }),
    h("button", { type: "submit" }, "Filter"));
  const table = h("table", { id: "runs-table", "data-testid": "runs-table" });
  const start = startForm();
  root.append(h("section", {}, h("h2", {}, "Runs"), filter, table),
    h("section", {}, h("h2", {}, "Start a run"), start));

  let stop = null;
  const refresh = () => {
    if (stop) stop();
    // The list comes from the run table, which trails the log by the projector's lag, and runs started
    // elsewhere appear in it: keep it fresh while it is shown.
    stop = poll(async () => {
      const f = new FormData(filter);
      const data = await get(`/runs${query({ status: f.get("status"), workflow: f.get("workflow"), limit: f.get("limit") })}`);
      const rows = data.runs;
      table.replaceChildren(head(), ...rows.map(row));
      table.dataset.count = rows.length;
    }, 2000);
  };
  filter.addEventListener("submit", (event) => { event.preventDefault(); refresh(); });

  get("/workflows").then((data) => {
    const names = data.workflows.map((w) => w.name);
    const opts = (first) => [h("option", { value: "" }, first), ...names.map((n) => h("option", { value: n }, n))];
    filter.workflow.replaceChildren(...opts("any workflow"));
    start.workflow.replaceChildren(...opts("choose a workflow"));
  }).catch(() => {});
  refresh();
  return () => stop && stop();
}

function startForm() {
  const form = h("form", { id: "start-form", class: "stack" },
    h("label", {}, "Workflow ", h("select", { id: "start-workflow", name: "workflow", required: true })),
    h("label", {}, "Input (JSON) ", h("textarea", { id: "start-input", name: "input", rows: 3, placeholder: "{}" })),
    h("label", {}, "Key (optional) ", h("input", { id: "start-key", name: "key", placeholder: "one active run per key" })),
    h("button", { id: "start-submit", type: "submit" }, "Start run"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = new FormData(form);
    let input = null;
    try {
      input = f.get("input").trim() ? JSON.parse(f.get("input")) : null;
    } catch (exc) {
      showError({ code: "invalid_input", message: `the input is not JSON: ${exc.message}` });
      return;
    }
    const body = { input };
    if (f.get("key").trim()) body.key = f.get("key").trim();
    const started = await post(`/workflows/${encodeURIComponent(f.get("workflow"))}/runs`, body).catch(() => null);
    if (started) location.hash = `#/runs/${started.run_id}`;
  });
  return form;
}

const head = () => h("tr", {}, ["", "run", "workflow", "key", "nodes", "current node", "started"].map((t) => h("th", {}, t)));

const row = (r) => h("tr", { "data-testid": "run-row", "data-run-id": r.run_id, "data-status": r.status },
  h("td", {}, statusBadge(r.status)),
  h("td", {}, h("a", { href: `#/runs/${r.run_id}`, class: "mono" }, String(r.run_id).slice(0, 8))),
  h("td", {}, r.workflow),
  h("td", {}, r.key || ""),
  h("td", {}, `${r.nodes_done}/${r.nodes_total}`),
  h("td", {}, r.current_node || ""),
  h("td", {}, when(r.created_at)));
