// Where a long projection run (rebuild, verify, replay) stands: a total, a rate and the time left, as
// /projections/<name>/runs gives them: `events_total` (counted when the run started; appends made meanwhile
// take it a little past), `events_processed`, `rate` and `seconds_left` (at the rate so far). A finished
// run's count is exact: the events it read.
import { count, duration, h } from "./api.js";

export function progressOf(run) {
  const seconds = (Date.parse(run.ended_at || run.heartbeat_at) - Date.parse(run.started_at)) / 1000;
  const base = { seconds, rate: run.rate, events: run.events_processed };
  if (run.status !== "running") {
    const complete = run.status === "completed";
    return { ...base, total: complete ? run.events_processed : null, fraction: complete ? 1 : 0, left: 0 };
  }
  const total = run.events_total ?? null;
  const fraction = total ? Math.min(1, run.events_processed / total) : 0;
  return { ...base, total, fraction, left: run.seconds_left ?? null };
}

// The progress of one run as a bar and a line of text; `data-*` attributes carry the figures.
export function progressView(run) {
  const p = progressOf(run);
  const pct = Math.floor(p.fraction * 100);
  const running = run.status === "running";
  const totalText = !running ? (run.status === "completed" ? `all ${count(p.events)} events` : `stopped: ${run.status}`)
    : p.total == null ? "total not counted" : `${pct}% of ${count(p.total)} events`;
  const leftText = !running ? "done" : p.left == null ? "time left: once events are read"
    : p.left < 1 ? "under 1 s left" : `about ${duration(p.left)} left`;
  return h("div", { class: "op-progress", "data-testid": "op-progress", "data-run-id": run.id, "data-status": run.status },
    h("progress", { max: 100, value: pct, "data-testid": "op-bar" }),
    h("span", { "data-testid": "op-done" }, `${count(p.events)} events read`), " · ",
    h("span", { "data-testid": "op-total", "data-total": p.total ?? "" }, totalText), " · ",
    h("span", { "data-testid": "op-rate" }, `${count(Math.round(p.rate))} events/s`), " · ",
    h("span", { "data-testid": "op-left", "data-seconds": p.left == null ? "" : Math.round(p.left) }, leftText),
    running ? "" : h("span", { class: "muted" }, ` in ${duration(p.seconds)}`));
}
