// #/limits: limits per key shared by every worker: slots in use against each bound, nodes waiting.
import { get, h, poll, when } from "./api.js";

const COLUMNS = ["limit", "in use", "waiting", "starts in the last minute", "declared by"];

// "3 / 4": what is used of a bound; a bare count where there is none.
const of = (used, bound) => (bound == null ? `${used}` : `${used} / ${bound}`);

export function render(root) {
  const table = h("table", { id: "limits-table", "data-testid": "limits-table" });
  root.append(h("section", {}, h("h2", {}, "Limits"),
    h("p", { class: "muted" }, "Nodes that need a slot wait, ready, while their limit is full."), table));
  return poll(async () => {
    const { limits } = await get("/limits");
    table.replaceChildren(h("tr", {}, COLUMNS.map((t) => h("th", {}, t))),
      ...limits.map((l) => h("tr", { "data-testid": "limit-row", "data-limit": l.name,
        class: l.concurrency != null && l.in_use >= l.concurrency ? "limit-full" : "" },
        h("td", {}, l.name),
        h("td", { "data-testid": "limit-in-use" }, of(l.in_use, l.concurrency)),
        h("td", { "data-testid": "limit-waiting" }, l.waiting),
        h("td", {}, of(l.started_last_minute, l.per_minute)),
        h("td", { title: when(l.declared_at) }, l.declared_by))));
    if (!limits.length) table.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "muted" }, "no limits declared")));
  }, 2000);
}
