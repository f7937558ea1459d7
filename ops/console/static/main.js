// The entry point: token form, hash routing (#/runs, #/runs/<id>, #/projections[/<name>], #/recovery).
import { clearBanner, getToken, setToken, showNotice } from "./api.js";
import * as projections from "./projections.js";
import * as recovery from "./recovery.js";
import * as run from "./run.js";
import * as runs from "./runs.js";

const ROUTES = [
  [/^#\/runs\/([^/]+)$/, run, "runs"],
  [/^#\/runs$/, runs, "runs"],
  [/^#\/projections(?:\/([^/]+))?$/, projections, "projections"],
  [/^#\/recovery$/, recovery, "recovery"],
];

let cleanup = null;

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  clearBanner();
  const hash = location.hash;
  const found = ROUTES.find(([pattern]) => pattern.test(hash));
  if (!found) { location.replace("#/runs"); return; } // routes again on the hashchange
  const [pattern, page, nav] = found;
  const param = hash.match(pattern)[1];
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === nav);
  const root = document.getElementById("page");
  root.replaceChildren();
  root.dataset.route = nav;
  if (!getToken()) {
    showNotice("Paste an API token above (create one with `ledgerflow tokens create --scope admin`).");
    document.getElementById("token-input").focus();
    return;
  }
  cleanup = page.render(root, param ? decodeURIComponent(param) : undefined) || null;
}

function showTokenState() {
  document.getElementById("token-state").textContent = getToken() ? "token set" : "no token";
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token-input");
  setToken(input.value.trim());
  input.value = "";
  showTokenState();
  route();
});

window.addEventListener("hashchange", route);
showTokenState();
route();
