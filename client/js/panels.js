// Panels of the run view: a titled card holding one chart, a caption and a
// "no data yet" note that disappears when data arrives. The chart specs say which
// series each chart draws, with axis titles and units.

import { el, slug } from "./dom.js";
import { axis } from "./charts.js";
import { finite, positive } from "./series.js";
import { num } from "./num.js";

/** panel("norms", "Gradient norms", "caption") -> {section, chart, nodata, note}. */
export function panel(kind, title, caption, { tall = false, id = null } = {}) {
  const chart = el("div", { class: `chart${tall ? " tall" : ""}`, id: `chart-${id || kind}` });
  const nodata = el("p", { class: "nodata", hidden: true }, "No data yet for this chart.");
  const note = el("span", { class: "note" });
  const section = el("section", { class: "panel", id: `panel-${id || kind}`, dataset: { kind } },
    el("header", {}, el("h2", {}, title), note), chart, nodata, caption ? el("p", { class: "caption" }, caption) : null);
  return { section, chart, nodata, note };
}

export function heatmapPanelId(module, series) {
  return `heatmap-${slug(module)}-${slug(series)}`;
}

const MiB = 1024 * 1024;
const stepAxis = () => axis("training step", { zeroline: false });
const paramName = (k) => k.slice(k.indexOf("/") + 1);
// A right-hand axis picks its own round ticks (Plotly 4 lines them up with the left
// axis' grid by default: 89 / 179 / 268 MiB).
const RIGHT = { overlaying: "y", side: "right", rangemode: "tozero", showgrid: false, tickmode: "auto", nticks: 6 };
/** The module a parameter belongs to ("enc.layer1.weight" -> "enc.layer1"): its legend group. */
export const moduleOf = (param) => (param.includes(".") ? param.slice(0, param.lastIndexOf(".")) : param);

/** The chart specs of the run view, keyed like the panels. */
export function specs() {
  return {
    norms: {
      match: (k) => k === "total_norm" || k.startsWith("param_norms/") || k === "nonfinite",
      label: (k) => (k === "total_norm" ? "total norm" : k === "nonfinite" ? "non-finite" : paramName(k)),
      value: (v, k) => (k === "nonfinite" ? 0.96 : positive(v)),
      order: (a, b) => (a === "total_norm" ? -1 : b === "total_norm" ? 1 : a < b ? -1 : 1),
      group: (k) => (k.startsWith("param_norms/") ? moduleOf(paramName(k)) : null),
      trace: (k) => (k === "total_norm" ? { line: { width: 2.8 } }
        : k === "nonfinite" ? { yaxis: "y2", mode: "markers", marker: { symbol: "x", size: 11, color: "#d62728" },
          hovertemplate: "non-finite gradient at step %{x}<extra></extra>" } : {}),
      layout: { xaxis: stepAxis(), yaxis: axis("gradient norm (log)", { type: "log", exponentformat: "power" }),
        yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true } },
    },
    gates: {
      match: (k) => k.startsWith("gate_norms/"),
      label: (k) => { const [, p, g] = /^gate_norms\/(.*)\/([^/]+)$/.exec(k) || [null, k, ""]; return `${p} [${g}]`; },
      group: (k) => { const m = /^gate_norms\/(.*)\/[^/]+$/.exec(k); return m ? m[1] : null; },
      value: positive,
      layout: { xaxis: stepAxis(), yaxis: axis("gate gradient norm (log)", { type: "log", exponentformat: "power" }) },
    },
    loss: {
      match: (k) => k === "loss",
      label: () => "loss",
      value: finite,
      layout: { xaxis: stepAxis(), yaxis: axis("loss") },
    },
    time: {
      match: (k) => k === "duration_s" || k === "trend",
      label: (k) => (k === "trend" ? "trend (rolling median)" : "step time"),
      value: (v) => { const n = finite(v); return n === null ? null : n * 1e3; },
      trace: (k) => (k === "trend" ? { line: { width: 3, color: "#d62728" } } : { line: { width: 1, color: "#7f7f7f" } }),
      layout: { xaxis: stepAxis(), yaxis: axis("step time (ms)", { rangemode: "tozero" }) },
    },
    epochs: {
      match: (k) => k === "epoch_time",
      label: () => "epoch time",
      value: finite,
      trace: () => ({ type: "bar", hovertemplate: "epoch %{x}<br>%{y:.3g} s<extra></extra>" }),
      layout: { xaxis: axis("epoch", { zeroline: false, dtick: 1 }), yaxis: axis("epoch time (s)", { rangemode: "tozero" }),
        showlegend: false },
    },
    graph: {
      match: (k) => ["graph_nodes", "rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"].includes(k),
      label: (k) => ({ graph_nodes: "autograd graph nodes", rss_bytes: "process RSS",
        cuda_allocated_bytes: "CUDA allocated", cuda_reserved_bytes: "CUDA reserved" })[k],
      value: (v, k) => { const n = finite(v); return n === null || k === "graph_nodes" ? n : n / MiB; },
      trace: (k) => (k === "graph_nodes" ? { line: { width: 2.4 } } : { yaxis: "y2", line: { width: 1.5, dash: "dot" } }),
      layout: { xaxis: stepAxis(), yaxis: axis("graph nodes (count)", { rangemode: "tozero" }),
        yaxis2: axis("memory (MiB)", RIGHT),
        margin: { l: 64, r: 64, t: 16, b: 52 } },
    },
    modules: {
      match: (k) => k.startsWith("profile/"),
      label: (k) => { const m = /^profile\/(.*)\/([^/]+)$/.exec(k); return m ? `${m[1]} ${m[2].replace("_s", "")}` : k; },
      value: (v, k) => { const n = finite(v); return n === null || k.endsWith("/calls") ? n : n * 1e3; },
      trace: (k) => (k.endsWith("/calls") ? { yaxis: "y2", line: { dash: "dot", width: 1 } } : {}),
      layout: { xaxis: stepAxis(), yaxis: axis("time (ms per step)", { rangemode: "tozero" }),
        yaxis2: axis("calls per step", RIGHT),
        margin: { l: 64, r: 64, t: 16, b: 52 } },
    },
  };
}

/** Rolling median of the last `size` values, fed one at a time (the step-time trend). */
export class RollingMedian {
  constructor(size = 25) {
    this.size = size;
    this.values = [];
    this.steps = []; // the values' steps, where given
  }

  /** The median with `v`, or null for no value or a `step` in the window already (sent twice). */
  push(v, step = null) {
    const n = num(v);
    if (n === null || !Number.isFinite(n)) return null;
    if (step !== null && this.steps.includes(step)) return null;
    this.values.push(n);
    this.steps.push(step);
    if (this.values.length > this.size) {
      this.values.shift();
      this.steps.shift();
    }
    const sorted = this.values.slice().sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
  }
}

/** Least-squares slope of y over x (seconds per step), or null with fewer than 3 points. */
export function slope(xs, ys) {
  const pts = xs.map((x, i) => [x, ys[i]]).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  if (pts.length < 3) return null;
  const mx = pts.reduce((s, p) => s + p[0], 0) / pts.length;
  const my = pts.reduce((s, p) => s + p[1], 0) / pts.length;
  let sxy = 0;
  let sxx = 0;
  for (const [x, y] of pts) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) ** 2;
  }
  return sxx > 0 ? sxy / sxx : null;
}
