// #/runs: runs from the run table projection, filtered (status, workflow, tags, start time, parent run), a page
// at a time by the API's keyset cursor (Next / First page), a bulk action over every run the filter keeps
// (bulk.js), and a form to start one (with tags).
import { get, h, poll, post, query, showError, statusBadge, when } from "./api.js";
import { bulkPanel } from "./bulk.js";

export function render(root) {
  const filter = h("form", { id: "runs-filter", class: "row" },
    h("select", { id: "filter-status", name: "status" },
      ["", "running", "paused", "succeeded", "failed", "cancelled", "continued"].map((s) => h("option", { value: s }, s || "any status"))),
    h("select", { id: "filter-workflow", name: "workflow" }, h("option", { value: "" }, "any workflow")),
    h("input", { id: "filter-tags", name: "tags", placeholder: "tags: team=red env=prod", size: 24 }),
    h("label", {}, "started since ", h("input", { id: "filter-since", name: "since", type: "datetime-local" })),
    h("input", { id: "filter-parent", name: "parent", placeholder: "parent run id", size: 12 }),
    h("input", { id: "filter-limit", name: "limit", type: "number", min: 1, max: 500, value: "30" }),
    h("button", { type: "submit" }, "Filter"));
  const table = h("table", { id: "runs-table", "data-testid": "runs-table" });
  const first = h("button", { id: "runs-first", class: "secondary", type: "button", disabled: true }, "First page");
  const next = h("button", { id: "runs-next", class: "secondary", type: "button", disabled: true }, "Next page");
  const start = startForm();
  const bulk = bulkPanel(() => bulkFilter(new FormData(filter)));
  root.append(h("section", {}, h("h2", {}, "Runs"), filter, table, h("div", { class: "pager" }, first, next), bulk.el),
    h("section", {}, h("h2", {}, "Start a run"), start));

  let stop = null;
  let after = null; // the cursor of the page shown (null: the first page)
  let following = null; // the `next` of the page shown
  const refresh = () => {
    if (stop) stop();
    // The list comes from the run table, which trails the log by the projector's lag, and runs started
    // elsewhere appear in it: keep it fresh while it is shown.
    stop = poll(async () => {
      const data = await get(`/runs${searchQuery(new FormData(filter), after)}`);
      const rows = data.runs;
      table.replaceChildren(head(), ...rows.map(row));
      table.dataset.count = rows.length;
      following = data.next;
      next.disabled = !following;
      first.disabled = after === null;
    }, 2000);
  };
  filter.addEventListener("submit", (event) => { event.preventDefault(); after = null; refresh(); });
  next.addEventListener("click", () => { if (following) { after = following; refresh(); } });
  first.addEventListener("click", () => { after = null; refresh(); });

  get("/workflows").then((data) => {
    const names = data.workflows.map((w) => w.name);
    const opts = (first) => [h("option", { value: "" }, first), ...names.map((n) => h("option", { value: n }, n))];
    filter.workflow.replaceChildren(...opts("any workflow"));
    start.workflow.replaceChildren(...opts("choose a workflow"));
  }).catch(() => {});
  refresh();
  return () => { if (stop) stop(); bulk.stop(); };
}

// The filter form as a bulk action's filter (the body of POST /runs/bulk/{kind}).
function bulkFilter(f) {
  const body = { tag: f.get("tags").split(/[\s,]+/).filter(Boolean) };
  if (f.get("status")) body.status = [f.get("status")];
  if (f.get("workflow")) body.workflow = f.get("workflow");
  if (f.get("parent").trim()) body.parent = f.get("parent").trim();
  if (f.get("since")) body.started_after = new Date(f.get("since")).toISOString();
  return body;
}

// The API's query for the filter form: tags as repeated `tag=KEY=VALUE`, the start time in UTC.
function searchQuery(f, after) {
  const q = new URLSearchParams(query({ status: f.get("status"), workflow: f.get("workflow"),
    parent: f.get("parent").trim(), limit: f.get("limit"), after }).slice(1));
  for (const tag of f.get("tags").split(/[\s,]+/).filter(Boolean)) q.append("tag", tag);
  if (f.get("since")) q.set("started_after", new Date(f.get("since")).toISOString());
  const s = q.toString();
  return s ? `?${s}` : "";
}

function startForm() {
  const form = h("form", { id: "start-form", class: "stack" },
    h("label", {}, "Workflow ", h("select", { id: "start-workflow", name: "workflow", required: true })),
    h("label", {}, "Input (JSON) ", h("textarea", { id: "start-input", name: "input", rows: 3, placeholder: "{}" })),
    h("label", {}, "Key (optional) ", h("input", { id: "start-key", name: "key", placeholder: "one active run per key" })),
    h("label", {}, "Tags (optional) ", h("input", { id: "start-tags", name: "tags", placeholder: "team=red env=prod" })),
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
    const tags = f.get("tags").split(/[\s,]+/).filter(Boolean);
    if (tags.length) {
      body.tags = {};
      for (const t of tags) {
        const at = t.indexOf("=");
        if (at < 1) { showError({ code: "invalid_input", message: `tag ${t} must read KEY=VALUE` }); return; }
        body.tags[t.slice(0, at)] = t.slice(at + 1);
      }
    }
    const started = await post(`/workflows/${encodeURIComponent(f.get("workflow"))}/runs`, body).catch(() => null);
    if (started) location.hash = `#/runs/${started.run_id}`;
  });
  return form;
}

const head = () => h("tr", {}, ["", "run", "workflow", "key", "nodes", "current node", "started", "tags"].map((t) => h("th", {}, t)));

const row = (r) => h("tr", { "data-testid": "run-row", "data-run-id": r.run_id, "data-status": r.status },
  h("td", {}, statusBadge(r.status)),
  h("td", {}, h("a", { href: `#/runs/${r.run_id}`, class: "mono" }, String(r.run_id).slice(0, 8))),
  h("td", {}, r.workflow),
  h("td", {}, r.key || ""),
  h("td", {}, `${r.nodes_done}/${r.nodes_total}`),
  h("td", {}, r.current_node || ""),
  h("td", {}, when(r.created_at)),
  h("td", { class: "mono", "data-testid": "run-tags" }, Object.entries(r.tags || {}).map(([k, v]) => `${k}=${v}`).join(" ")));
