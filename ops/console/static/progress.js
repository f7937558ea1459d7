// Where a long projection run (rebuild, verify, replay) stands: a total, a rate and the time left, from
// what /projections/<name>/runs gives (its cursors, events processed and its timestamps).
//
// A run reads the log from its start cursor up to its target cursor. The log's positions are handed out in
// order, so the share of the position range behind the run's cursor is how far it has come, and its total
// is about the number of positions in that range (fewer when rolled-back appends left gaps, or when the
// projection reads only some event types or one tenant's events). A cursor at the safe horizon
// (`<transaction>:0`, where a reader that read everything stands) names no position: it stands for the
// head of the log, `head` (see headPosition). A finished run's total is exact: the events it read.
// Times are the server's (started_at and the last heartbeat, which every batch renews): a browser's clock
// may be off.
import { count, duration, h } from "./api.js";

function position(cursor, head) {
  if (!cursor) return null;
  const [tx, pos] = cursor.split(":").map(Number);
  return pos === 0 && tx > 0 ? head : pos;
}

// About the last position in the log: the furthest any projection's cursor plus the events after it.
export function headPosition(projections) {
  const known = projections.map((p) => position(p.cursor, null)).map((pos, i) =>
    (pos == null ? null : pos + projections[i].lag_events_head)).filter((x) => x != null);
  return known.length ? Math.max(...known) : null;
}

export function progressOf(run, head) {
  const seconds = (Date.parse(run.ended_at || run.heartbeat_at) - Date.parse(run.started_at)) / 1000;
  const base = { seconds, rate: run.rate, events: run.events_processed };
  if (run.status !== "running") {
    const complete = run.status === "completed";
    return { ...base, total: complete ? run.events_processed : null, fraction: complete ? 1 : 0, left: 0 };
  }
  const start = position(run.start_cursor, head) ?? 0;
  const target = position(run.target_cursor, head);
  const total = target == null ? null : Math.max(0, target - start);
  const reached = position(run.end_cursor, head) ?? start;
  const done = total == null ? 0 : Math.min(total, Math.max(0, reached - start));
  const fraction = total ? done / total : 0;
  const perSecond = seconds > 0 ? done / seconds : 0; // positions per second, for the time left
  const left = total != null && perSecond > 0 ? (total - done) / perSecond : null;
  return { ...base, total, fraction, left };
}

// The progress of one run as a bar and a line of text; `data-*` attributes carry the figures.
export function progressView(run, head) {
  const p = progressOf(run, head);
  const pct = Math.floor(p.fraction * 100);
  const running = run.status === "running";
  const totalText = !running ? (run.status === "completed" ? `all ${count(p.events)} events` : `stopped: ${run.status}`)
    : p.total == null ? "total unknown" : `${pct}% of about ${count(p.total)} events`;
  const leftText = !running ? "done" : p.left == null ? "time left: estimating…"
    : p.left < 1 ? "under 1 s left" : `about ${duration(p.left)} left`;
  return h("div", { class: "op-progress", "data-testid": "op-progress", "data-run-id": run.id, "data-status": run.status },
    h("progress", { max: 100, value: pct, "data-testid": "op-bar" }),
    h("span", { "data-testid": "op-done" }, `${count(p.events)} events read`), " · ",
    h("span", { "data-testid": "op-total", "data-total": p.total ?? "" }, totalText), " · ",
    h("span", { "data-testid": "op-rate" }, `${count(Math.round(p.rate))} events/s`), " · ",
    h("span", { "data-testid": "op-left", "data-seconds": p.left == null ? "" : Math.round(p.left) }, leftText),
    running ? "" : h("span", { class: "muted" }, ` in ${duration(p.seconds)}`));
}
