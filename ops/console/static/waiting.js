// Nodes that wait: what each waits for, in words, and, for a node waiting for a signal, the operator's
// Approve and Reject. Either sends {"approved": true|false, ...payload} (the payload: an optional JSON object
// typed beside the buttons) to the run's signal endpoint, after a confirmation like every other lever.
// Tokens without the operate scope (the run detail's may_operate) see what waits, and no buttons.
import { h, post, showError, showNotice, when } from "./api.js";
import { confirmAction } from "./confirm.js";

// "waiting for signal approve until …", "sleeping until …"; "" for a node that does not wait.
export function waitingText(node) {
  if (node.status !== "waiting") return "";
  const until = node.wake_at ? ` until ${when(node.wake_at)}` : "";
  return node.waiting_for == null ? `sleeping${until}` : `waiting for signal ${node.waiting_for}${until}`;
}

// The section under a run's DAG listing its waiting nodes; update(run) after every poll. `onSent()` is
// called once a signal was recorded (the run page follows the run again).
export function waitingPanel(runId, onSent) {
  const el = h("section", { id: "waiting", "data-testid": "waiting", hidden: true });
  let drawn = ""; // what the section shows: drawn again only when that changes, so a payload being typed stays
  // An Idempotency-Key per node, kept until a send of it is answered: pressing again after an answer that
  // never came (the network) cannot record the decision twice, where a second signal could feed a later wait.
  const keys = new Map();

  function update(run) {
    const waiting = run.nodes.filter((n) => n.status === "waiting");
    const now = JSON.stringify([run.may_operate, waiting.map((n) => [n.name, n.waiting_for, n.wake_at])]);
    if (now === drawn) return;
    drawn = now;
    el.hidden = waiting.length === 0;
    el.replaceChildren(...(waiting.length ? [h("h3", {}, "Waiting"), ...waiting.map((n) => row(run, n))] : []));
  }

  function row(run, node) {
    const what = h("p", { "data-testid": `waiting-${node.name}` }, h("strong", {}, node.name), " is ", waitingText(node));
    if (node.waiting_for == null || !run.may_operate) return h("div", { class: "waiting-node" }, what);
    const payload = h("textarea", {
      rows: 2, "data-testid": `signal-payload-${node.name}`, "aria-label": `payload for signal ${node.waiting_for}`,
      placeholder: 'optional payload, a JSON object, e.g. {"note": "looks right"}',
    });
    const buttons = [true, false].map((approved) => h("button", {
      class: approved ? "" : "danger", "data-testid": `signal-${approved ? "approve" : "reject"}-${node.name}`,
      onclick: () => send(run, node, approved, payload, buttons),
    }, approved ? "Approve" : "Reject"));
    return h("div", { class: "waiting-node" }, what, h("div", { class: "row" }, payload, ...buttons));
  }

  async function send(run, node, approved, box, buttons) {
    const body = decision(approved, box.value);
    if (!body) return;
    const name = node.waiting_for;
    const ok = await confirmAction({
      title: `${approved ? "Approve" : "Reject"} ${run.workflow} run ${run.run_id.slice(0, 8)}?`,
      body: [
        `Sends signal ${name} with ${JSON.stringify(body)}.`,
        `Node ${node.name}, which waits for it, goes on with that payload. A signal cannot be taken back.`,
      ],
      confirm: approved ? "Approve" : "Reject",
    });
    if (!ok) return;
    for (const b of buttons) b.disabled = true; // one decision per click, whatever the network does
    if (!keys.has(node.name)) keys.set(node.name, freshKey());
    let answer;
    try {
      answer = await post(`/runs/${encodeURIComponent(run.run_id)}/signals/${encodeURIComponent(name)}`, body,
        { "Idempotency-Key": keys.get(node.name) });
    } catch {
      for (const b of buttons) b.disabled = false; // the banner says why
      return;
    }
    keys.delete(node.name); // answered: the node's next wait gets a decision of its own
    const what = answer.duplicate ? "was already recorded" : "sent";
    showNotice(`signal ${name} ${what} for node ${node.name}: ${approved ? "approved" : "rejected"}`);
    onSent();
  }

  return { el, update };
}

// The body for the button pressed, with the typed payload's fields beside `approved`; null (and the reason
// in the banner) when the payload is not a JSON object or tries to say approved itself.
function decision(approved, text) {
  let extra = {};
  if (text.trim()) {
    try { extra = JSON.parse(text); } catch (exc) {
      showError({ code: "invalid_input", message: `the payload is not JSON: ${exc.message}` });
      return null;
    }
  }
  if (extra === null || typeof extra !== "object" || Array.isArray(extra)) {
    showError({ code: "invalid_input", message: "the payload must be a JSON object: its fields are sent beside approved" });
    return null;
  }
  if ("approved" in extra) {
    showError({ code: "invalid_input", message: "leave approved out of the payload: the button you press sets it" });
    return null;
  }
  return { approved, ...extra };
}

// 32 random hex digits (crypto.randomUUID needs a secure context; a console over plain http has none).
const freshKey = () =>
  `console-${Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("")}`;
