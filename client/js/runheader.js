// The numbers at the top of the run view: the header line (status, host, ranks, last
// step, problems opened) and the stats row (step, loss, norms, time, memory and
// gradwatch's own overhead), rewritten in place as records arrive.

import { el, replaceChildren, visible } from "./dom.js";
import { fmt, fmtBytes, fmtSeconds } from "./num.js";
import { overheadText, unseenLeftOut } from "./overhead.js";
import { alertCount } from "./runparts.js";

export function renderHeader(run) {
  const s = run.summary;
  const status = String(s.status ?? "unknown");
  run.statusNode.className = `badge ${status}`;
  run.statusNode.textContent = run.replay ? `replay · ${status}` : status;
  const sub = visible([`run ${s.id}`, s.host ? `on ${s.host}` : null,
    `ranks ${(s.ranks || [0]).join(", ")}`, `last step ${fmt(s.last_step)}`, `${alertCount(run)} alerts`]
    .filter(Boolean).join(" · "));
  if (run.subNode.textContent !== sub) run.subNode.textContent = sub;
}

export function renderStats(run, rec) {
  if (!rec) return;
  run.statsStep = rec.step;
  const items = [["step", fmt(rec.step)], ["epoch", fmt(rec.epoch ?? run.epoch ?? run.summary.last_epoch)], ["loss", fmt(rec.loss)],
    ["total norm", fmt(rec.total_norm)], ["step time", fmtSeconds(rec.duration_s)],
    ["graph nodes", fmt(rec.graph_nodes)], ["memory", fmtBytes(rec.rss_bytes)],
    ["gradwatch overhead", overheadText(run.overhead.share(), rec, unseenLeftOut(run.summary, run.rank))]];
  // Built once, then only the values that changed are rewritten (this runs per draw).
  if (!run.statValues || !run.statValues.size || !run.statsNode.contains(run.statValues.values().next().value)) {
    run.statValues = new Map(items.map(([k]) => [k, el("span", { class: "v", dataset: { stat: k } })]));
    replaceChildren(run.statsNode, items.map(([k]) => el("div", { class: "stat" }, el("span", { class: "k" }, k), run.statValues.get(k))));
  }
  for (const [k, v] of items) {
    const node = run.statValues.get(k);
    const [text, title] = Array.isArray(v) ? v : [v, ""];
    if (node.textContent !== text) node.textContent = text;
    if (node.title !== title) node.title = title;
  }
}
