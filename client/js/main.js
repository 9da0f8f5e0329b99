// The dashboard's entry point: hash routing between the views, the header, errors.
//   #/                      runs list (#/?compare=<id> preselects a run to compare)
//   #/run/<id>[/<rank>]     one run, live
//   #/compare/<a>/<b>       two runs overlaid
//   #/replay/<id>           a finished run replayed from history

import { href } from "./api.js";
import { el, replaceChildren } from "./dom.js";
import { CompareView } from "./compare.js";
import { ReplayView } from "./replay.js";
import { RunView } from "./run.js";
import { RunsView } from "./runs.js";
import { state, stats } from "./state.js";
import { initTheme } from "./theme.js";

const root = document.getElementById("view");
const crumbs = document.getElementById("crumbs");

export function parseRoute(hash) {
  const [path, query = ""] = hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (parts[0] === "run" && parts[1]) return { view: "run", ids: [parts[1]], rank: Number(parts[2] ?? 0) || 0 };
  if (parts[0] === "replay" && parts[1]) return { view: "replay", ids: [parts[1]], rank: Number(parts[2] ?? 0) || 0 };
  if (parts[0] === "compare" && parts[1] && parts[2]) return { view: "compare", ids: [parts[1], parts[2]] };
  return { view: "runs", ids: [], compare: params.get("compare") };
}

function runName(id) {
  const run = state.runs.get(id);
  return run && run.name ? String(run.name) : id;
}

function renderCrumbs(route) {
  const items = [el("a", { href: href("#/") }, "Runs")];
  if (route.view === "run" || route.view === "replay") {
    items.push("›", el("span", {}, `${route.view === "replay" ? "replay: " : ""}${runName(route.ids[0])}`));
  } else if (route.view === "compare") {
    items.push("›", el("span", {}, `compare ${runName(route.ids[0])} and ${runName(route.ids[1])}`));
  }
  replaceChildren(crumbs, items);
}

async function route() {
  if (state.view) state.view.unmount();
  state.view = null;
  stats.paintedAt = null;
  delete document.body.dataset.painted;
  const r = parseRoute(window.location.hash);
  state.route = r;
  // Which view "painted" is about: a click on a run link changes the hash, and the
  // previous view's painted flag stays up until this handler runs (tests and tools
  // wait for body[data-view='run'][data-painted='1'], never a stale one).
  document.body.dataset.view = r.view;
  replaceChildren(root, el("p", { class: "empty" }, "Loading…"));
  let view;
  if (r.view === "run") view = new RunView(root, r.ids[0], { rank: r.rank });
  else if (r.view === "replay") view = new ReplayView(root, r.ids[0], { rank: r.rank });
  else if (r.view === "compare") view = new CompareView(root, r.ids[0], r.ids[1]);
  else view = new RunsView(root, { preselect: r.compare });
  state.view = view;
  try {
    await view.mount();
    if (state.view === view) renderCrumbs(r);
  } catch (err) {
    if (state.view !== view) return;
    stats.errors.push(String(err.message || err));
    replaceChildren(root, el("div", { class: "error-box", role: "alert" },
      el("strong", {}, "Cannot show this page. "), String(err.message || err)),
    el("p", {}, el("a", { href: href("#/") }, "Back to the runs")));
  }
}

function start() {
  if (!window.Plotly) {
    replaceChildren(root, el("div", { class: "error-box", role: "alert" },
      "Plotly.js did not load from /static/vendor/plotly.min.js: is the plotly package installed on the server?"));
    return;
  }
  initTheme(document.getElementById("theme-toggle"));
  window.addEventListener("hashchange", route);
  window.addEventListener("gradwatch:remount", route);
  route();
}

start();
