// Where a long projection run (rebuild, verify, replay) stands: a total, a rate and the time left, from
// what /projections/<name>/runs gives (its cursors, events processed and its timestamps).
//
// A run reads the log from its start cursor up to its target cursor. The log's positions are handed out in
// order, so the share of the position range behind the run's cursor is how far it has come, and its total
// is about the number of positions in that range (fewer when rolled-back appends left gaps, or when the
// projection reads only some event types or one tenant's events). Times are the server's (started_at and
// the last heartbeat, which every batch renews): a browser's clock may be off.
import { count, duration, h } from "./api.js";

const position = (cursor) => (cursor ? Number(cursor.split(":")[1]) : null);

export function progressOf(run) {
  const start = position(run.start_cursor) ?? 0;
  const target = position(run.target_cursor);
  const reached = position(run.end_cursor) ?? start;
  const total = target == null ? null : Math.max(0, target - start);
  const done = total == null ? null : Math.min(total, Math.max(0, reached - start));
  const seconds = (Date.parse(run.ended_at || run.heartbeat_at) - Date.parse(run.started_at)) / 1000;
  const fraction = run.status === "completed" ? 1 : total ? done / total : 0;
  const perSecond = seconds > 0 ? done / seconds : 0; // positions per second, for the time left
  const left = run.status !== "running" ? 0 : perSecond > 0 ? (total - done) / perSecond : null;
  return { total, fraction, seconds, left, rate: run.rate, events: run.events_processed };
}

// The progress of one run as a bar and a line of text; `data-*` attributes carry the figures.
export function progressView(run) {
  const p = progressOf(run);
  const pct = Math.floor(p.fraction * 100);
  const running = run.status === "running";
  const leftText = !running ? "done" : p.left == null ? "time left: estimating…"
    : p.left < 1 ? "under 1 s left" : `about ${duration(p.left)} left`;
  return h("div", { class: "op-progress", "data-testid": "op-progress", "data-run-id": run.id, "data-status": run.status },
    h("progress", { max: 100, value: pct, "data-testid": "op-bar" }),
    h("span", { "data-testid": "op-done" }, `${count(p.events)} events read`), " · ",
    h("span", { "data-testid": "op-total", "data-total": p.total ?? "" },
      p.total == null ? "total unknown" : `${pct}% of about ${count(p.total)} events`), " · ",
    h("span", { "data-testid": "op-rate" }, `${count(Math.round(p.rate))} events/s`), " · ",
    h("span", { "data-testid": "op-left", "data-seconds": p.left == null ? "" : Math.round(p.left) }, leftText),
    running ? "" : h("span", { class: "muted" }, ` in ${duration(p.seconds)}`));
}
