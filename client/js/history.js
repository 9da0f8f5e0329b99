// History answers from REST shaped for the run view's charts: the heatmap keys of a
// run summary, and the scalar series with the series derived from them (step-time
// trend, non-finite markers, epoch times).

import { isNonFinite } from "./num.js";
import { RollingMedian } from "./panels.js";

/**
 * Where a series' heatmap goes among its module's: the input, then the stacked layers'
 * inputs bottom up (layer1, layer2, …, layer10: by number, not by name), then the
 * hidden and cell states, then anything else by name.
 */
export function seriesRank(series) {
  if (series === "input") return [0, 0, ""];
  const layer = /^layer(\d+)$/.exec(series);
  if (layer) return [1, Number(layer[1]), ""];
  if (series === "hidden") return [2, 0, ""];
  if (series === "cell") return [3, 0, ""];
  return [4, 0, String(series)];
}

/** Compare two series names of one module by seriesRank. */
export function bySeries(a, b) {
  const [x, y] = [seriesRank(a), seriesRank(b)];
  return x[0] - y[0] || x[1] - y[1] || (x[2] < y[2] ? -1 : x[2] > y[2] ? 1 : 0);
}

/**
 * Heatmap series of a run: [{module, series, placeholder}] from the summary. Every
 * recurrent module the hello named has a panel: one with no series yet gets a
 * placeholder ("input"), which says no gradient has reached it, and which the first
 * series seen live for that module replaces (a cell's are "hidden" and "cell").
 */
export function heatmapKeys(summary) {
  const keys = [];
  const series = summary.series && typeof summary.series === "object" ? summary.series : {};
  const recurrent = Array.isArray(summary.recurrent) ? summary.recurrent : [];
  // The model's order first (as the hello lists them), then any other module with series.
  const modules = [...recurrent, ...Object.keys(series).filter((m) => !recurrent.includes(m))];
  for (const module of new Set(modules)) {
    const known = Object.hasOwn(series, module) && Array.isArray(series[module]) && series[module].length > 0;
    const names = known ? series[module].slice().sort(bySeries) : ["input"];
    for (const s of names) keys.push({ module, series: s, placeholder: !known });
  }
  return keys;
}

/** History as series {key: {step, value}}, plus derived series (trend, non-finite, epochs). */
export function historySeries(steps, epochs) {
  const fields = { ...(steps.fields || {}) };
  const dur = fields.duration_s;
  if (dur && dur.step.length) {
    const rm = new RollingMedian();
    fields.trend = { step: dur.step.slice(), value: dur.value.map((v) => rm.push(v)) };
  }
  // One marker a step, however many of its fields are non-finite (as live: nonFiniteNote).
  const nf = new Set();
  for (const name of ["total_norm", "loss"]) {
    const s = fields[name];
    if (!s) continue;
    s.value.forEach((v, i) => { if (isNonFinite(v)) nf.add(s.step[i]); });
  }
  if (nf.size) {
    const steps = [...nf].sort((a, b) => a - b);
    fields.nonfinite = { step: steps, value: steps.map(() => 1) };
  }
  if (epochs.length) fields.epoch_time = { step: epochs.map((e) => e.epoch), value: epochs.map((e) => e.duration_s) };
  return fields;
}

// The fields of the stats row (runheader.js) that history has.
export const STAT_FIELDS = ["loss", "total_norm", "duration_s", "graph_nodes", "rss_bytes", "overhead"];

/**
 * The stats row's record of the last step in `fields` (null when none): that step's
 * own values, a field it has none of left out. Give it an answer at full resolution
 * (a range of the last steps): in a min/max-downsampled one the last point of a field
 * is its bucket's min or max, often of another step.
 */
export function latestFromHistory(fields, lastEpoch) {
  let step = -1;
  for (const name of STAT_FIELDS) {
    const s = fields[name];
    if (s && s.step.length) step = Math.max(step, s.step[s.step.length - 1]);
  }
  if (step < 0) return null;
  const rec = { step, epoch: lastEpoch };
  for (const name of STAT_FIELDS) {
    const s = fields[name];
    if (s && s.step[s.step.length - 1] === step) rec[name] = s.value[s.value.length - 1];
  }
  return rec;
}
