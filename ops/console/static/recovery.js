// #/recovery: the workflow queue (ready, running, orphaned, parked) and recent recovery sweeps.
import { get, h, poll, when } from "./api.js";

const COUNTS = ["ready", "running", "orphaned", "parked"];
const COLUMNS = ["id", "when", "worker", "trigger", "found", "reclaimed", "parked", "stuck", "failed", "ms"];

export function render(root) {
  const summary = h("div", { id: "queue-summary", class: "cards", "data-testid": "queue-summary" });
  const table = h("table", { id: "recoveries-table", "data-testid": "recoveries-table" });
  root.append(h("section", {}, h("h2", {}, "Workflow queue"), summary),
    h("section", {}, h("h2", {}, "Recent recoveries"), table));
  return poll(async () => {
    const { queue, recent } = await get("/recovery");
    summary.replaceChildren(...COUNTS.map((k) => h("div", { class: `card c-${k}`, "data-testid": `queue-${k}` },
      h("span", { class: "count" }, queue[k]), h("span", {}, k))));
    table.replaceChildren(h("tr", {}, COLUMNS.map((t) => h("th", {}, t))),
      ...recent.map((r) => h("tr", { "data-testid": "recovery-row" },
        h("td", {}, r.id), h("td", {}, when(r.started_at)), h("td", {}, r.worker), h("td", {}, r.trigger),
        h("td", {}, r.found), h("td", {}, r.reclaimed), h("td", {}, r.parked), h("td", {}, r.stuck),
        h("td", {}, r.failed), h("td", {}, r.duration_ms.toFixed(1)))));
    if (!recent.length) table.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, "no recoveries yet")));
  }, 2000);
}
