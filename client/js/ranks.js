// Ranks side by side (issue #7): in the run view of a distributed run, loss, step time
// and total gradient norm of every rank overlaid (one colour per rank, legend
// "rank 0", "rank 1", ...), and the spread between ranks per step (spread.js), so a
// straggler or a diverging rank shows at a glance. Heatmaps and profile stay per rank
// (the rank selector of the run view). Series keys are "<rank>|<field>" and
// "spread|<field>"; live points arrive through the run view's frame batcher.

import { api } from "./api.js";
import { axis } from "./charts.js";
import { el } from "./dom.js";
import { panel } from "./panels.js";
import { finite, LineChart, positive } from "./series.js";
import { historySpread, SpreadTracker, spreadNote } from "./spread.js";
import { stats } from "./state.js";

// Plotly's default colour cycle: rank r gets RANK_COLORS[r % 10] on every chart.
const RANK_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const FIELDS = ["loss", "duration_s", "total_norm"];
const stepAxis = () => axis("training step", { zeroline: false });
const ms = (v) => { const n = finite(v); return n === null ? null : n * 1e3; };
const rankOf = (k) => Number(k.slice(0, k.indexOf("|")));
const byRank = (a, b) => rankOf(a) - rankOf(b);

function rankSpec(field, value, yaxis) {
  return {
    match: (k) => k.endsWith(`|${field}`) && !k.startsWith("spread|"),
    label: (k) => `rank ${rankOf(k)}`,
    value,
    order: byRank,
    trace: (k) => ({ line: { width: 1.8, color: RANK_COLORS[rankOf(k) % RANK_COLORS.length] } }),
    layout: { xaxis: stepAxis(), yaxis },
  };
}

const SPREAD_SPEC = {
  match: (k) => k.startsWith("spread|"),
  label: (k) => (k === "spread|duration_s" ? "step time max/min" : "total norm max/min"),
  value: finite,
  order: (a, b) => (a < b ? -1 : 1),
  trace: (k) => ({ line: { width: 2, color: k === "spread|duration_s" ? "#d62728" : "#1f77b4" } }),
  layout: {
    xaxis: stepAxis(),
    yaxis: axis("max / min over ranks", { rangemode: "tozero" }),
    shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { width: 1, dash: "dot", color: "#7f7f7f" } }],
  },
};

const SPREAD_CAPTION = "Per step, the largest value over the smallest across ranks (1: all ranks equal; dotted). A straggler lifts the step time line; a rank whose gradients diverge lifts the norm line.";

const PANELS = [
  ["ranks-spread", "Spread between ranks", SPREAD_CAPTION, SPREAD_SPEC],
  ["ranks-time", "Step time per rank", null, rankSpec("duration_s", ms, axis("step time (ms)", { rangemode: "tozero" }))],
  ["ranks-norm", "Total gradient norm per rank", "Each rank's norm of its own local gradients (before any all-reduce).",
    rankSpec("total_norm", positive, axis("gradient L2 norm (log)", { type: "log", exponentformat: "power" }))],
  ["ranks-loss", "Loss per rank", null, rankSpec("loss", finite, axis("loss (as passed to monitor.step)"))],
];

export class RanksView {
  /** new RanksView(runId, [0, 1]); .section goes into the page; load() fetches history. */
  constructor(runId, ranks) {
    this.runId = runId;
    this.ranks = ranks.slice().sort((a, b) => a - b);
    this.tracker = new SpreadTracker(this.ranks);
    this.charts = new Map();
    const sections = PANELS.map(([kind, title, caption, spec]) => {
      const p = panel(kind, title, caption);
      this.charts.set(kind, { view: new LineChart(p.chart, spec), panel: p });
      if (kind === "ranks-spread") this.spreadCaption = p.section.querySelector(".caption");
      return p.section;
    });
    this.section = el("div", { class: "grid", id: "ranks-grid", dataset: { ranks: this.ranks.join(",") } }, sections);
  }

  /** Each rank's scalars from REST, and their spread; charts draw when seen (lazy.js). */
  load() {
    const id = encodeURIComponent(this.runId);
    const fetched = Promise.all(this.ranks.map((rank) =>
      api(`/api/runs/${id}/steps`, { rank, max_points: 2000, fields: FIELDS.join(",") })));
    const series = fetched.then((answers) => {
      const perRank = {};
      const out = {};
      answers.forEach((a, i) => {
        perRank[this.ranks[i]] = a.fields || {};
        for (const [field, s] of Object.entries(a.fields || {})) out[`${this.ranks[i]}|${field}`] = s;
      });
      const exact = answers.every((a) => !a.downsampled);
      const { series: spread, latest, binWidth } = historySpread(perRank, this.ranks, exact);
      if (latest && !this.tracker.latest) this.showNote(latest);
      // Say so when history is binned: its points are means over bins, not steps.
      if (binWidth > 1) this.spreadCaption.textContent = `${SPREAD_CAPTION} History: bins of ${binWidth} steps (each rank's mean in a bin); live points are per step.`;
      stats.ranksAt = performance.now();
      return { ...out, ...spread };
    });
    for (const { view } of this.charts.values()) view.setHistory(series);
    return series;
  }

  /** Live items [{rank, rec}] of every rank: one push (one extendTraces) per chart. */
  push(items) {
    const points = [];
    for (const { rank, rec } of items) {
      if (rec.kind !== "step") continue;
      for (const field of FIELDS) {
        if (rec[field] !== undefined && rec[field] !== null) points.push({ key: `${rank}|${field}`, step: rec.step, value: rec[field] });
      }
      const spread = this.tracker.add(rank, rec);
      if (spread.length) {
        points.push(...spread);
        this.showNote(this.tracker.latest);
      }
    }
    if (!points.length) return;
    for (const { view } of this.charts.values()) view.push(points);
  }

  showNote(latest) {
    this.charts.get("ranks-spread").panel.note.textContent = spreadNote(latest);
  }

  /** {view, panel} of every chart, for the run view's visibility observer. */
  entries() {
    return [...this.charts.values()];
  }
}
