// Talking to the gradwatch server: REST via api(), websockets via wsUrl().
// The dashboard keeps the ?token= of its own URL and adds it to every request and
// websocket it makes (docs/API.md), so a shared read-only link just works.

const pageToken = new URLSearchParams(window.location.search).get("token");

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
  if (pageToken) url.searchParams.set("token", pageToken);
  return url;
}

/** A link inside the dashboard that keeps the page token: href("#/run/ID"). */
export function href(hash) {
  return pageToken ? `?token=${encodeURIComponent(pageToken)}${hash}` : hash;
}

/**
 * GET a JSON answer from the server. Throws ApiError with the server's detail on a
 * non-OK answer, e.g. `await api("/api/runs/abc/steps", {max_points: 2000})`.
 */
export async function api(path, query = {}) {
  const url = withQuery(new URL(path, window.location.origin), query);
  let response;
  try {
    response = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
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
 * token rides along; the server decides whether it may change anything.
 * `await send("/api/runs/abc/archived", "PUT", {archived: true})`.
 */
export async function send(path, method, body) {
  const url = withQuery(new URL(path, window.location.origin), {});
  let response;
  try {
    response = await fetch(url, { method, headers: { Accept: "application/json", "Content-Type": "application/json" },
      body: JSON.stringify(body), cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, `${path}: the server cannot be reached (${err.message})`);
  }
  return answer(path, response);
}

/** The websocket URL of a server path on this page's origin, with the token. */
export function wsUrl(path, query = {}) {
  const url = withQuery(new URL(path, window.location.origin), query);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}
