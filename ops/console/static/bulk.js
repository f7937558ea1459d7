// The runs page's bulk action: cancel, retry, pause or resume every run the filter form keeps, as one
// recorded action (POST /runs/bulk/{kind}). A dry run counts the runs first and the confirmation names that
// count; once asked, the action's progress is followed (GET /runs/bulk/{id}) until it ends.
import { count, get, h, poll, post, showError, showNotice } from "./api.js";
import { confirmAction } from "./confirm.js";

const KINDS = {
  cancel: { verb: "Cancel", what: "Nodes still waiting never start; running nodes stop at their next call to their context." },
  retry: { verb: "Retry", what: "Failed and cancelled runs start again from the nodes that did not complete; others are skipped." },
  pause: { verb: "Pause", what: "No node of these runs starts until they are resumed; running nodes finish." },
  resume: { verb: "Resume", what: "Paused runs go on where they stopped; runs that are not paused are left as they are." },
};

// `filterBody()` gives the action's filter (the fields of GET /runs) from the filter form.
export function bulkPanel(filterBody) {
  const kind = h("select", { id: "bulk-kind", name: "kind" },
    Object.entries(KINDS).map(([k, v]) => h("option", { value: k }, v.verb)));
  const progress = h("span", { id: "bulk-progress", "data-testid": "bulk-progress" });
  const go = h("button", { id: "bulk-submit", class: "danger", type: "submit" }, "Act on every matching run");
  const form = h("form", { id: "bulk-form", class: "row" }, kind, go, progress);
  let stop = null;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const chosen = kind.value;
    const { verb, what } = KINDS[chosen];
    const filter = filterBody();
    const plan = await post(`/runs/bulk/${chosen}`, { ...filter, dry_run: true }).catch(() => null);
    if (!plan) return;
    if (plan.over_limit) {
      showError({ code: "bulk_limit", message: `more than ${count(plan.limit)} runs match; one bulk action takes at most ${count(plan.limit)}`,
        next: "narrow the filter (e.g. by start time) and act in parts" });
      return;
    }
    if (plan.matched === 0) { showNotice(`no run matches the filter: nothing to ${chosen}`); return; }
    const runs = `${count(plan.matched)} run${plan.matched === 1 ? "" : "s"}`;
    const yes = await confirmAction({
      title: `${verb} ${runs}?`,
      body: [`${verb} the ${runs} the filter keeps now (runs started later are not touched).`, what,
        "The action is recorded and taken up again if its server stops; each run is acted on once."],
      confirm: `${verb} ${runs}`, keep: "Do nothing",
    });
    if (!yes) return;
    const action = await post(`/runs/bulk/${chosen}`, filter).catch(() => null);
    if (!action) return;
    showNotice(`bulk action ${action.id}: ${chosen} of ${runs}`);
    if (stop) stop();
    stop = poll(async () => {
      const a = await get(`/runs/bulk/${action.id}`);
      progress.dataset.state = a.state;
      progress.dataset.done = a.done;
      progress.textContent = `${chosen}: ${count(a.done + a.failed + a.skipped)}/${count(a.matched)} ` +
        `(${count(a.done)} done, ${count(a.failed)} failed, ${count(a.skipped)} skipped) — ${a.state}`;
      if (a.state !== "running" && stop) stop();
    }, 1000);
  });
  return { el: form, stop: () => stop && stop() };
}
