// The latest per-timestep profile of every recurrent module (log y), with the
// vanishing horizon marked and a band where norms explode. Small data, replaced on
// each frame with Plotly.react (the history charts are never redrawn).

import { plotText } from "./dom.js";
import { axis, layout, plot } from "./charts.js";
import { num } from "./num.js";

// The horizon: the earliest timestep whose norm is within HORIZON_FACTOR of the
// largest (the definition the `vanishing` diagnosis uses, docs/DIAGNOSES.md).
export const HORIZON_FACTOR = 1e-3;
// Norms above this per timestep are drawn inside the "exploding" band.
export const EXPLODING_NORM = 1e2;
// Zero norms cannot sit on a log axis: draw them at the floor of the heatmap scale.
const FLOOR = 1e-30;

/** horizon([1e-20, 1e-9, 0.3, 0.5]) -> 2: gradient reaches back to t = 2 only. */
export function horizon(values, factor = HORIZON_FACTOR) {
  const v = values.map(num);
  let largest = 0;
  for (const x of v) if (x !== null && Number.isFinite(x) && x > largest) largest = x;
  if (largest <= 0) return null;
  for (let t = 0; t < v.length; t += 1) {
    if (v[t] !== null && Number.isFinite(v[t]) && v[t] >= largest * factor) return t;
  }
  return null;
}

/** What a series' norm is, for the heatmap's colour bar and the hovers: ‖∂L/∂x_t‖ and friends. */
export function seriesSymbol(series) {
  if (series === "hidden") return "‖∂L/∂h_t‖";
  if (series === "cell") return "‖∂L/∂c_t‖";
  const layer = /^layer(\d+)$/.exec(series);
  if (layer) return `‖∂L/∂x_t‖ (layer ${layer[1]})`;
  return "‖∂L/∂x_t‖";
}

/**
 * Traces for profiles = [{label, values, series?}] (the HTML report draws the same,
 * server/report_charts.py). Each dashed line is the horizon of the values it is drawn
 * over, never a figure from elsewhere (an alert's horizon is that of an older step).
 */
export function profileTraces(profiles, colorsErr) {
  const traces = [];
  let top = EXPLODING_NORM * 10;
  let bottom = 1;
  let width = 1;
  for (const p of profiles) {
    const ys = p.values.map((x) => {
      const n = num(x);
      if (n === null || Number.isNaN(n)) return null;
      if (n === Infinity) return null;
      return Math.max(n, FLOOR);
    });
    for (const y of ys) {
      if (y !== null) {
        top = Math.max(top, y * 3);
        bottom = Math.min(bottom, y);
      }
    }
    width = Math.max(width, ys.length);
    traces.push({
      type: "scatter", mode: "lines+markers", name: plotText(p.label), x: ys.map((_, t) => t), y: ys,
      marker: { size: 4 }, line: { width: 2 }, customdata: p.values.map((x) => String(x)),
      hovertemplate: `${plotText(p.label)}<br>t = %{x}<br>${p.series === undefined ? "norm" : seriesSymbol(p.series)} %{customdata}<extra></extra>`,
    });
  }
  // The exploding band and the horizon lines are traces, not shapes: shapes on log
  // axes take log10 coordinates, traces take data values, which is harder to get wrong.
  traces.push({
    type: "scatter", mode: "lines", name: `exploding (> ${EXPLODING_NORM.toExponential(0)})`,
    x: [0, width - 1, width - 1, 0, 0], y: [EXPLODING_NORM, EXPLODING_NORM, top, top, EXPLODING_NORM],
    fill: "toself", fillcolor: "rgba(220, 50, 50, 0.12)", line: { width: 0, color: colorsErr },
    hoverinfo: "skip",
  });
  for (const p of profiles) {
    const h = horizon(p.values);
    if (h === null || h <= 0) continue;
    traces.push({
      type: "scatter", mode: "lines", name: plotText(`horizon ${p.label}: t = ${h}`),
      x: [h, h], y: [Math.min(bottom, 1e-12), top], line: { dash: "dash", width: 1.5, color: colorsErr },
      hovertemplate: `${plotText(p.label)}: gradient reaches back to t = ${h}<extra></extra>`,
    });
  }
  return traces;
}

export function profileLayout() {
  return layout({
    xaxis: axis("timestep t", { zeroline: false }),
    // one chart for inputs, hidden and cell states (‖∂L/∂x_t‖, ‖∂L/∂h_t‖, ‖∂L/∂c_t‖: the hovers say which)
    yaxis: axis("gradient norm (log)", { type: "log", exponentformat: "power" }),
  });
}

export class Profile {
  constructor(div) {
    this.div = div;
    this.latest = new Map(); // "module · series" -> {step, values}
    this.drawn = false;
    this.visible = true; // until an observer says otherwise (the view tells, run.js)
    this.stale = false; // new profiles arrived while off screen
  }

  /** On screen or not: off screen it is not redrawn, and catches up when it shows. */
  setVisible(visible) {
    this.visible = visible;
    if (visible && this.stale) this.redraw();
  }

  set(module, series, step, values) {
    const label = series === "input" ? module : `${module} · ${series}`;
    const prev = this.latest.get(label);
    if (prev && prev.step > step) return;
    this.latest.set(label, { module, series, step, values });
  }

  profiles() {
    return [...this.latest].map(([label, p]) => ({ label, values: p.values, series: p.series }));
  }

  async draw() {
    await plot(this.div, profileTraces(this.profiles(), "rgb(200, 40, 40)"), profileLayout());
    this.drawn = true;
  }

  redraw() {
    if (!this.drawn) return;
    this.stale = !this.visible;
    if (this.stale) return;
    window.Plotly.react(this.div, profileTraces(this.profiles(), "rgb(200, 40, 40)"), this.div.layout);
  }

  get hasData() {
    return this.latest.size > 0;
  }
}
