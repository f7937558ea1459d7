// Shared by every page: the API client (bearer token from localStorage), the banner, a tiny DOM builder.

const TOKEN_KEY = "ledgerflow.token";

export const getToken = () => localStorage.getItem(TOKEN_KEY) || "";
export const setToken = (token) =>
  token ? localStorage.setItem(TOKEN_KEY, token) : localStorage.removeItem(TOKEN_KEY);

// What an operator does about a refused token, in the console's terms (the API's own `next` speaks of headers).
export const TOKEN_NEXT = "paste a live token in the box above; create one with " +
  "`ledgerflow tokens create --tenant <tenant> --scope admin` (or `--server-admin` for every tenant)";

// Told when the API refuses the token in use (401): it expired or was revoked since it was checked.
let onRefused = () => {};
export const whenTokenRefused = (fn) => { onRefused = fn; };

export class ApiError extends Error {
  constructor(status, code, message, next) {
    super(message);
    Object.assign(this, { status, code, next });
  }
}

// Calls /api/v1<path>; returns the parsed JSON body (null for an empty one). A failure shows in the banner
// and is thrown as an ApiError, from the body's {"error": {"code", "message", "next"}} when it has one.
export async function api(method, path, body, extraHeaders = {}) {
  const err = await attempt(method, path, body, getToken(), extraHeaders);
  if (!(err instanceof ApiError)) return err;
  if (err.status === 401) onRefused(err);
  throw showError(err);
}

// One request with `token`: the parsed JSON body (null for an empty one) on success, or the ApiError it
// failed with (from the body's {"error": {"code", "message", "next"}} when it has one), never thrown.
export async function attempt(method, path, body, token, extraHeaders = {}) {
  const headers = { Accept: "application/json", ...extraHeaders };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(`/api/v1${path}`, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    return new ApiError(0, "unreachable", `the API did not answer: ${exc.message}`,
      "check that `ledgerflow serve` is running and reload the page");
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (response.ok) return data;
  const e = (data && data.error) || {};
  const next = response.status === 401 ? TOKEN_NEXT : e.next || "";
  return new ApiError(response.status, e.code || `http_${response.status}`, e.message || text || response.statusText, next);
}

export const get = (path) => api("GET", path);
export const post = (path, body = {}, headers = {}) => api("POST", path, body, headers);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// -- banner ------------------------------------------------------------------------------------------

function banner(kind, parts) {
  const el = document.getElementById("banner");
  el.className = `banner ${kind}`;
  el.dataset.kind = kind;
  el.replaceChildren(...parts, h("button", { class: "close", "aria-label": "dismiss", onclick: clearBanner }, "×"));
  el.hidden = false;
}

export function showError(err) {
  banner("error", [
    h("strong", { "data-testid": "error-code" }, err.code || "error"), " ",
    h("span", { "data-testid": "error-message" }, err.message),
    err.next ? h("div", { class: "next", "data-testid": "error-next" }, `Next: ${err.next}`) : "",
  ]);
  return err;
}

export const showNotice = (message) => banner("notice", [h("span", { "data-testid": "notice" }, message)]);

export function clearBanner() {
  const el = document.getElementById("banner");
  el.hidden = true;
  el.replaceChildren();
}

// -- DOM ---------------------------------------------------------------------------------------------

// h("a", {href: "#/runs", onclick: f}, "text", child...): attributes, "on*" listeners, string or node children.
export function h(tag, attrs = {}, ...children) {
  const ns = attrs.svg ? "http://www.w3.org/2000/svg" : null;
  const el = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "svg" || v == null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value" && !ns) el.value = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c != null && c !== "") el.append(c instanceof Node ? c : String(c));
  return el;
}

export const ICONS = {
  succeeded: "✓", running: "▶", pending: "○", ready: "○", failed: "✗",
  retry_scheduled: "↻", parked: "⏸", cancelled: "⊘", skipped: "–", waiting: "◷", paused: "‖",
};
export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "continued"]);

export const statusBadge = (status) =>
  h("span", { class: `status s-${status}`, "data-status": status }, `${ICONS[status] || "?"} ${status}`);

export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export const seconds = (s) => (s == null ? "" : `${Number(s).toFixed(1)} s`);

// Calls fn now and then every `ms` until it returns false or stop() is called; one call at a time, none while
// the tab is hidden. After an error (already in the banner) it tries again five times slower, unless the API
// refused the request (4xx): asking again would not change the answer. Except "too many requests" (429): the
// server was busy, not the request wrong, so polling goes on (a page that stopped there would show a run's
// state of then for ever).
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  let first = true;
  const tick = async () => {
    let again = true;
    let delay = ms;
    if (document.hidden && !first) { timer = setTimeout(tick, ms); return; }
    first = false;
    try { again = (await fn()) !== false; } catch (err) {
      again = err.status === 429 || !(err.status >= 400 && err.status < 500);
      delay = ms * 5;
    }
    if (!stopped && again) timer = setTimeout(tick, delay);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}

export const count = (n) => Number(n).toLocaleString("en-US");

// 75 -> "1 min 15 s"; 7300 -> "2 h 2 min": a time left, to the precision an operator waits by.
export function duration(s) {
  if (s == null || !Number.isFinite(s)) return "";
  const t = Math.max(0, Math.round(s));
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min ${t % 60} s`;
  return `${Math.floor(t / 3600)} h ${Math.floor((t % 3600) / 60)} min`;
}
