// Parts of the run view kept apart from its data flow (run.js): the chart list with
// what an empty chart says, the heatmap panels and their scale picker, the step-time
// trend note and the header's alert count, all live.

import { el } from "./dom.js";
import { Heatmap, heatScale } from "./heatmap.js";
import { SCALES } from "./heatscale.js";
import { fmt, fmtSeconds, num } from "./num.js";
import { heatmapPanelId, panel, slope } from "./panels.js";
import { placeIn } from "./series.js";

export const CHART_INFO = [
  ["norms", "Gradient norms per layer", "L2 norm of each parameter's gradient and the total; ✕ marks steps with NaN or Inf."],
  ["gates", "Gradient norms per gate", "LSTM gates i f g o, GRU gates r z n, per weight matrix."],
  ["loss", "Loss", null],
  ["time", "Step time", "Wall time of each training step, with its rolling median."],
  ["epochs", "Epoch time", null],
  ["graph", "Autograd graph and memory", "Nodes reachable from loss.grad_fn (left) and memory (right, dotted). Growing together: a graph kept across steps."],
  ["modules", "Time per module", "Forward and backward time and calls per step (watch(..., profile=True))."],
];

// What an empty chart says: how to get its data, where this run will never send it.
export const NO_DATA = {
  gates: "This run sends no gate norms: they come for nn.LSTM, nn.GRU and nn.RNN weights (weight_ih_l*, weight_hh_l*).",
  modules: "This run records no per-module timing: start it with watch(model, ..., profile=True) to see it here.",
  epochs: "No epoch records yet: call monitor.epoch() at the end of each epoch.",
  loss: "No loss yet: pass it as monitor.step(loss=loss).",
};

const CAPTION = "Each row is one training step, each column a timestep; the dotted red line is the vanishing horizon (earliest timestep within 1e-3 of the step's peak). Colour: ";

/** The heatmap's title: the module, and which of its series ("input of layer 1"). */
export function heatTitle(module, series) {
  const layer = /^layer(\d+)$/.exec(series);
  if (series === "input") return `Gradient flow through time: ${module}`;
  if (layer) return `Gradient flow through time: ${module} · input of layer ${layer[1]}`;
  return `Gradient flow through time: ${module} · ${series}`;
}

const LAYER = "Stacked layers: the gradient reaching this layer's input from the layers above and the loss, captured on the same steps as the module's input.";

function heatCaption() {
  return CAPTION + (heatScale.current === "relative"
    ? "decades below each step's peak: yellow carries the gradient, dark purple gets almost none."
    : "log10 of the norm, on a range that fits this run.");
}

/** What a heatmap with no row says: why a module may never get one. */
function noHeatRows(module) {
  return `No per-timestep gradient has reached ${module} yet. Its rows come from captured steps, once a backward runs through its outputs: a module whose outputs need no gradient (its weights frozen and its inputs needing none) never gets one.`;
}

/**
 * A heatmap panel of one module's series: {view: Heatmap, panel, placeholder}. A
 * placeholder stands for a recurrent module with no series yet (heatmapKeys).
 */
export function heatmapPanel(module, series, placeholder = false) {
  const p = panel("heatmap", heatTitle(module, series), heatCaption(), { tall: true, id: heatmapPanelId(module, series) });
  p.nodata.textContent = noHeatRows(module);
  p.section.querySelector("p.caption").classList.add("heat-caption");
  if (/^layer\d+$/.test(series)) p.section.append(el("p", { class: "caption" }, LAYER));
  p.section.dataset.module = module;
  p.section.dataset.series = series;
  p.section.classList.add("heat");
  return { view: new Heatmap(p.chart, module, series), panel: p, placeholder };
}

/** The picker of the heatmaps' colour scale; onChange() redraws them. */
export function scalePicker(onChange) {
  return el("label", { class: "note" }, "heatmap colour ",
    el("select", { id: "heat-scale", "aria-label": "heatmap colour scale", onchange: (e) => {
      heatScale.current = e.target.value;
      for (const c of document.querySelectorAll("section.heat p.heat-caption")) c.textContent = heatCaption();
      onChange();
    } }, Object.entries(SCALES).map(([v, t]) => el("option", { value: v, selected: v === heatScale.current }, t))));
}

// The trend is the slope of the rolling median over this many recent steps: a run's
// first steps (warm-up, compilation) do not tilt it for the rest of the run.
const TREND_WINDOW = 200;
const WARMUP = 24; // the first medians of a run have too few values to mean much

/** The step-time trend note, fed (step, rolling median) as they come. */
export class TrendNote {
  constructor(node) {
    this.node = node;
    this.steps = [];
    this.values = [];
  }

  /** From history: the trend series {step, value} (its warm-up left out). */
  fromHistory(trend) {
    if (!trend) return;
    trend.step.slice(WARMUP).forEach((s, i) => this.add(s, trend.value[i + WARMUP]));
    this.render();
  }

  /** One (step, median), put at its step (history may come after the first live ones). */
  add(step, median) {
    const v = num(median);
    if (v === null || !Number.isFinite(v)) return;
    if (this.steps.length >= TREND_WINDOW && step < this.steps[0]) return; // before the window
    if (!placeIn(this.steps, this.values, step, v)) return;
    if (this.steps.length > TREND_WINDOW) {
      this.steps.shift();
      this.values.shift();
    }
  }

  render() {
    const s = slope(this.steps, this.values);
    if (s === null) return;
    const from = this.steps[0];
    const to = this.steps[this.steps.length - 1];
    this.node.textContent = `trend ${s >= 0 ? "+" : "−"}${fmtSeconds(Math.abs(s) * 100)} per 100 steps (steps ${fmt(from)}–${fmt(to)})`;
    this.node.dataset.step = String(to);
  }
}

/**
 * The header's alert count: problems opened (history and live), as the API's run
 * summary counts them. The one place that says what the header counts.
 */
export function alertCount(view) {
  return Math.max(view.problemsOpened, num(view.summary.alerts) ?? 0);
}

/** A search box over a chart's lines (parameters by name); empty: the largest ones. */
export function lineSearch(kind, view) {
  const box = el("input", { type: "search", class: "line-search", id: `search-${kind}`, placeholder: "filter by name",
    "aria-label": `${kind}: show the lines whose name contains`, oninput: (e) => view.filter(e.target.value) });
  view.searchBox = box; // a chart of many lines says in it how many there are
  return box;
}
