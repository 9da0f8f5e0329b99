// Talking to the gradwatch server: REST via api(), websockets via wsUrl().
// A shared link carries the view token as ?token= (docs/API.md). The page takes it
// out of its own address at once (history.replaceState: it stays out of the history,
// bookmarks and screenshots), keeps it for this tab (sessionStorage) and sends it as
// `Authorization: Bearer` on REST requests. Websockets cannot carry that header: they
// offer the token as a subprotocol (wsProtocols()) and carry the HttpOnly cookie the
// server set when it served the page with ?token= (a frame on another site, e.g. a
// notebook on localhost showing a dashboard on 127.0.0.1, gets no such cookie).
// No request URL holds the token, so no access log or proxy log sees it.

const TOKEN_KEY = "gradwatch.token";

function takePageToken() {
  const url = new URL(window.location.href);
  const opened = url.searchParams.get("token");
  if (opened) {
    try {
      sessionStorage.setItem(TOKEN_KEY, opened);
    } catch {
      // storage refused (a private mode): the token still lives in this page
    }
    url.searchParams.delete("token");
    window.history.replaceState(window.history.state, "", `${url.pathname}${url.search}${url.hash}`);
    return opened;
  }
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

const pageToken = takePageToken();

function headers(extra) {
  const out = { Accept: "application/json", ...extra };
  if (pageToken) out.Authorization = `Bearer ${pageToken}`;
  return out;
}

/** The error api() throws: the server's own `detail` text, with the HTTP status. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

function withQuery(url, query) {
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, String(value));
  }
  return url;
}

/** A link inside the dashboard: href("#/run/ID") (the token never goes in links). */
export function href(hash) {
  return hash;
}

/**
 * GET a JSON answer from the server. Throws ApiError with the server's detail on a
 * non-OK answer, e.g. `await api("/api/runs/abc/steps", {max_points: 2000})`.
 */
export async function api(path, query = {}) {
  const url = withQuery(new URL(path, window.location.origin), query);
  let response;
  try {
    response = await fetch(url, { headers: headers(), cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, `${path}: the server cannot be reached (${err.message})`);
  }
  return answer(path, response);
}

async function answer(path, response) {
  if (!response.ok) {
    let detail = response.statusText;
    try {
      const body = await response.json();
      if (body && body.detail !== undefined) {
        detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      }
    } catch {
      // Not JSON: keep the status text.
    }
    throw new ApiError(response.status, `${path}: ${response.status} ${detail}`);
  }
  return response.json();
}

/**
 * Send a JSON body with a method other than GET (a change: archive a run). The page
 * token rides along as a header; the server decides whether it may change anything.
 * `await send("/api/runs/abc/archived", "PUT", {archived: true})`.
 */
export async function send(path, method, body) {
  const url = withQuery(new URL(path, window.location.origin), {});
  let response;
  try {
    response = await fetch(url, { method, headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body), cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, `${path}: the server cannot be reached (${err.message})`);
  }
  return answer(path, response);
}

/**
 * The subprotocols a websocket offers: none without a token; with one, "gradwatch"
 * (the server chooses it) and "gradwatch.token.<base64url of the token>".
 */
export function wsProtocols() {
  if (!pageToken) return [];
  const bytes = new TextEncoder().encode(pageToken);
  const b64 = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
  return ["gradwatch", `gradwatch.token.${b64.replace(/=+$/, "")}`];
}

/** The websocket URL of a server path on this page's origin (wsProtocols() carries the token). */
export function wsUrl(path, query = {}) {
  const url = withQuery(new URL(path, window.location.origin), query);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}
