// #/projections[/<name>]: every projection's health and the safe horizon; for the chosen projection its
// runs history with the progress of long runs, open failures (retry / skip) and a replay form. Refreshed
// every 2 s while shown. Every lever asks for confirmation first, saying what it will do.
import { attempt, count, get, getToken, h, poll, post, seconds, showNotice, when } from "./api.js";
import { confirmAction } from "./confirm.js";
import { progressView } from "./progress.js";

export function render(root, selected) {
  const table = h("table", { id: "projections-table", "data-testid": "projections-table" });
  const horizon = h("div", { id: "horizon", "data-testid": "horizon" });
  root.append(h("section", {}, h("h2", {}, "Projections"), table), h("section", {}, h("h3", {}, "Safe horizon"), horizon));
  const detail = selected ? details(selected) : null;
  if (detail) root.append(detail.el);

  const stop = poll(async () => {
    const data = await get("/projections");
    const rows = data.projections;
    table.replaceChildren(head(), ...rows.map((p) => row(p, p.name === selected)));
    horizon.replaceChildren(horizonView(data.horizon));
    if (detail) await detail.load();
  }, 2000);
  return stop;
}

const head = () => h("tr", {},
  ["projection", "state", "cursor", "lag (events)", "lag (s)", "owner", "open failures", "last run", ""].map((t) => h("th", {}, t)));

function row(p, chosen) {
  const name = encodeURIComponent(p.name);
  return h("tr", { "data-testid": "projection-row", "data-name": p.name, "data-state": p.state, class: chosen ? "chosen" : "" },
    h("td", {}, h("a", { href: `#/projections/${name}` }, p.name)),
    h("td", {}, h("span", { class: `status s-${p.state}` }, p.state)),
    h("td", { class: "mono" }, p.cursor),
    h("td", {}, `${p.lag_events} (${p.lag_events_head} to head)`),
    h("td", {}, seconds(p.lag_seconds)),
    h("td", {}, p.owner || "–"),
    h("td", { "data-testid": "open-failures" }, p.open_failures),
    h("td", {}, p.last_run || "–"),
    h("td", { class: "actions" },
      h("button", { "data-testid": `rebuild-${p.name}`, onclick: () => request(p.name, "rebuild") }, "Rebuild"),
      h("button", { "data-testid": `verify-${p.name}`, onclick: () => request(p.name, "verify") }, "Verify")));
}

// What the last rebuild or verify of `name` went through: the best guide to what the next one will read.
async function lastTotal(name) {
  const answer = await attempt("GET", `/projections/${encodeURIComponent(name)}/runs?limit=50`, undefined, getToken());
  if (answer instanceof Error) return null;
  return answer.runs.find((r) => ["rebuild", "verify"].includes(r.kind) && r.events_total != null) || null;
}

function leverConsequences(name, action, body, last) {
  const events = last ? ` (the last ${last.kind}, #${last.id}, went through ${count(last.events_total)} events; ` +
    "more if events were appended since)" : " (every event in it: the count shows once it starts)";
  if (action === "rebuild") {
    return {
      title: `Rebuild ${name}?`,
      body: [`Rebuild ${name}: its tables are rebuilt from the whole log${events} in a shadow schema and swapped ` +
        "in at the end, in one transaction. The live tables keep answering until the swap.",
      "Its runs history below shows how far the rebuild has come and the time left."],
      confirm: "Rebuild",
    };
  }
  if (action === "verify") {
    return {
      title: `Verify ${name}?`,
      body: [`Verify ${name}: a copy is rebuilt from the whole log${events} in a scratch schema and compared ` +
        "with the live tables. It costs as much as a rebuild; the live tables are not changed."],
      confirm: "Verify",
    };
  }
  return {
    title: `Replay ${name} after ${body.after}?`,
    body: [`Replay ${name}: the events after cursor ${body.after} are applied again. A projection that cannot ` +
      `be replayed in place is rebuilt from the whole log${events} instead, and swapped in at the end.`],
    confirm: "Replay",
  };
}

async function request(name, action, body = {}) {
  const last = await lastTotal(name);
  if (!(await confirmAction(leverConsequences(name, action, body, last)))) return;
  let answer;
  try { answer = await post(`/projections/${encodeURIComponent(name)}/${action}`, body); } catch { return; }
  const target = `#/projections/${encodeURIComponent(name)}`;
  if (location.hash !== target) { // show its details first (navigating clears the banner)
    await new Promise((done) => { window.addEventListener("hashchange", done, { once: true }); location.hash = target; });
  }
  const runs = answer.kind && answer.kind !== action ? ` as a ${answer.kind}` : "";
  const note = answer.note ? ` (${answer.note})` : "";
  showNotice(`${action} of ${name} requested: run ${answer.run_id}${runs}${note}; follow it in the runs history`);
}

function horizonView(hz) {
  const holders = hz.holders;
  return h("div", {},
    h("p", {}, `age ${seconds(hz.age_seconds)} · ${hz.waiting_events} events waiting`,
      holders.length ? "" : " · nothing holds it back"),
    holders.length ? h("table", { id: "horizon-holders" },
      h("tr", {}, ["pid", "application", "state", "age"].map((t) => h("th", {}, t))),
      holders.map((x) => h("tr", {}, h("td", {}, x.pid), h("td", {}, x.application || "–"), h("td", {}, x.state || ""),
        h("td", {}, seconds(x.age_seconds))))) : "");
}

function details(name) {
  const runs = h("table", { id: "projection-runs", "data-testid": "projection-runs" });
  const failures = h("table", { id: "projection-failures", "data-testid": "projection-failures" });
  const after = h("input", { id: "replay-after", placeholder: "<transaction_id>:<position>", class: "mono", required: true,
    pattern: "[0-9]+:[0-9]+", title: "a cursor: <transaction_id>:<position>" });
  const replay = h("form", { id: "replay-form", class: "row" }, h("label", { for: "replay-after" }, "Replay after cursor"), after,
    h("button", { id: "replay-submit", type: "submit" }, "Replay"));
  replay.addEventListener("submit", (event) => {
    event.preventDefault();
    request(name, "replay", { after: after.value.trim() });
  });
  const ongoing = h("div", { id: "ongoing", class: "ongoing", "data-testid": "ongoing", hidden: true });
  const el = h("section", { id: "projection-detail", "data-name": name },
    h("h3", {}, name), ongoing, replay, h("h4", {}, "Runs"), runs, h("h4", {}, "Open failures"), failures);

  async function load() {
    const runRows = (await get(`/projections/${encodeURIComponent(name)}/runs`)).runs;
    const long = (x) => ["rebuild", "verify", "replay"].includes(x.kind);
    const active = runRows.filter((x) => x.status === "running" && long(x));
    ongoing.hidden = !active.length;
    ongoing.replaceChildren(...active.map((x) => h("div", { "data-testid": "ongoing-run", "data-kind": x.kind },
      h("strong", {}, `${x.kind} #${x.id} running `), progressView(x))));
    runs.replaceChildren(h("tr", {}, ["id", "kind", "status", "trigger", "actor", "progress", "started", "ended", "error"]
      .map((t) => h("th", {}, t))),
      ...runRows.map((x) => h("tr", { "data-testid": "projection-run", "data-kind": x.kind, "data-status": x.status, "data-run-id": x.id },
        h("td", {}, x.id), h("td", {}, x.kind), h("td", {}, h("span", { class: `status s-${x.status}` }, x.status)),
        h("td", {}, x.trigger), h("td", {}, x.actor),
        h("td", {}, long(x) ? progressView(x) : `${count(x.events_processed)} events · ${count(Math.round(x.rate))}/s`),
        h("td", {}, when(x.started_at)), h("td", {}, when(x.ended_at)), h("td", { class: "error-text" }, x.error || ""))));
    // Failures need the admin scope (a tenant's admin sees its tenant's); without it the rest still refreshes.
    const failRows = await get(`/failures?projection=${encodeURIComponent(name)}`).then((f) => f.failures, (err) => err);
    if (!Array.isArray(failRows)) {
      failures.replaceChildren(h("tr", {}, h("td", { class: "muted" }, `not shown: ${failRows.message}`)));
      return;
    }
    failures.replaceChildren(h("tr", {}, ["id", "position", "stream", "type", "attempts", "error", ""].map((t) => h("th", {}, t))),
      ...failRows.map((x) => h("tr", { "data-testid": "failure-row", "data-id": x.id },
        h("td", {}, x.id), h("td", {}, x.event_position), h("td", {}, x.stream_id), h("td", {}, x.event_type),
        h("td", {}, x.attempts), h("td", { class: "error-text" }, `${x.error_class || ""}: ${x.error_message || ""}`),
        h("td", { class: "actions" },
          h("button", { "data-testid": `failure-retry-${x.id}`, onclick: () => resolve(name, x, "retry") }, "Retry"),
          h("button", { "data-testid": `failure-skip-${x.id}`, onclick: () => resolve(name, x, "skip") }, "Skip")))));
    if (!failRows.length) failures.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "none")));
  }
  return { el, load };
}

function failureConsequences(name, f, action) {
  const event = `the ${f.event_type} event at position ${f.event_position} (stream ${f.stream_id})`;
  if (action === "skip") {
    return {
      title: `Skip failure #${f.id} of ${name}?`,
      body: [`Skip: ${event} is never applied to ${name}, and ${name} moves on past it. Its tables will not ` +
        "reflect that event, and rebuilds skip it too."],
      confirm: "Skip the event",
    };
  }
  return {
    title: `Retry failure #${f.id} of ${name}?`,
    body: [`Retry: the projector applies ${event} again on its next step. If the handler fails again, the ` +
      "failure is recorded again and stays open."],
    confirm: "Retry the event",
  };
}

async function resolve(name, failure, action) {
  if (!(await confirmAction(failureConsequences(name, failure, action)))) return;
  try { await post(`/failures/${failure.id}/${action}`); } catch { return; }
  showNotice(`${action} of failure ${failure.id} requested; the projector carries it out on its next step`);
}
