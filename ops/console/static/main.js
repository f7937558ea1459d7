// The entry point: token form, hash routing (#/runs, #/runs/<id>, #/projections[/<name>], #/recovery, #/limits).
import { attempt, clearBanner, getToken, setToken, showError, showNotice, TOKEN_NEXT, whenTokenRefused } from "./api.js";
import * as limits from "./limits.js";
import * as projections from "./projections.js";
import * as recovery from "./recovery.js";
import * as run from "./run.js";
import * as runs from "./runs.js";

const ROUTES = [
  [/^#\/runs\/([^/]+)$/, run, "runs"],
  [/^#\/runs$/, runs, "runs"],
  [/^#\/projections(?:\/([^/]+))?$/, projections, "projections"],
  [/^#\/recovery$/, recovery, "recovery"],
  [/^#\/limits$/, limits, "limits"],
];

let cleanup = null;
// Pages show only with a token the API accepted: none while a token is being checked or was refused.
let accepted = false;

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  const hash = location.hash;
  const found = ROUTES.find(([pattern]) => pattern.test(hash));
  if (!found) { location.replace("#/runs"); return; } // routes again on the hashchange
  const [pattern, page, nav] = found;
  const param = hash.match(pattern)[1];
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === nav);
  const root = document.getElementById("page");
  root.replaceChildren();
  root.dataset.route = nav;
  if (!accepted) {
    if (document.getElementById("token-state").dataset.state === "none") {
      showNotice("Paste an API token above (create one with `ledgerflow tokens create --scope admin`).");
      document.getElementById("token-input").focus();
    }
    return; // a refused token's message stays in the banner
  }
  clearBanner();
  cleanup = page.render(root, param ? decodeURIComponent(param) : undefined) || null;
}

function tokenState(state, text) {
  const el = document.getElementById("token-state");
  el.dataset.state = state;
  el.textContent = text;
}

// Asks the API whether `token` is live and may read (the console's least need), before the console uses
// it. Answers the ApiError it was refused with, or null.
async function check(token) {
  const answer = await attempt("GET", "/workflows", undefined, token);
  return answer instanceof Error ? answer : null;
}

function refused(err, { saved }) {
  const what = saved ? "The saved token" : "This token";
  if (err.status === 401) {
    tokenState("refused", "token refused");
    err.message = `${what} was refused: ${err.message}`;
    err.next = TOKEN_NEXT;
  } else if (err.status === 403) {
    tokenState("refused", "token lacks the read scope");
    err.message = `${what} is valid but may not read: ${err.message}`;
    err.next = "the console needs a token with the read scope (admin includes it); " + TOKEN_NEXT;
  } else {
    tokenState("unchecked", "token not checked");
    err.message = `${what} could not be checked: ${err.message}`;
  }
  showError(err);
}

async function enter(token) {
  if (!token) {
    showNotice("The token box is empty: paste a token there first.");
    return;
  }
  tokenState("checking", "checking the token…");
  const err = await check(token);
  if (err) {
    // The token in use (if any) stays in use; the one entered is not kept.
    accepted = accepted && Boolean(getToken());
    refused(err, { saved: false });
    if (accepted) tokenState("refused", "token refused; the previous one is still in use");
    return;
  }
  setToken(token);
  accepted = true;
  tokenState("accepted", "token accepted");
  route();
}

async function start() {
  const token = getToken();
  if (!token) {
    tokenState("none", "no token");
    route();
    return;
  }
  tokenState("checking", "checking the saved token…");
  const err = await check(token);
  if (err) {
    if (err.status === 401) setToken(""); // expired or revoked: it will never work again
    refused(err, { saved: true });
  } else {
    accepted = true;
    tokenState("accepted", "token accepted");
  }
  route();
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token-input");
  const token = input.value.trim();
  input.value = "";
  enter(token);
});

// The token expired or was revoked while in use: every page's next request would be refused too.
// Like a saved token refused at load, it will never work again: it is not kept.
whenTokenRefused(() => {
  accepted = false;
  setToken("");
  tokenState("refused", "token refused");
});

window.addEventListener("hashchange", route);
start();
