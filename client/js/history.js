// History answers from REST shaped for the run view's charts: the heatmap keys of a
// run summary, and the scalar series with the series derived from them (step-time
// trend, non-finite markers, epoch times).

import { isNonFinite } from "./num.js";
import { RollingMedian } from "./panels.js";

/** Heatmap series of a run: {module: [series]} from the summary (falls back to "input"). */
export function heatmapKeys(summary) {
  const keys = [];
  const series = summary.series && typeof summary.series === "object" ? summary.series : {};
  const recurrent = Array.isArray(summary.recurrent) ? summary.recurrent : [];
  // The model's order first (as the hello lists them), then any other module with series.
  const modules = Object.keys(series).length
    ? [...recurrent.filter((m) => Object.hasOwn(series, m)), ...Object.keys(series).filter((m) => !recurrent.includes(m))]
    : recurrent;
  for (const module of modules) {
    const names = Object.hasOwn(series, module) && Array.isArray(series[module]) ? series[module] : ["input"];
    for (const s of names) keys.push({ module, series: s });
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
  const nf = { step: [], value: [] };
  for (const name of ["total_norm", "loss"]) {
    const s = fields[name];
    if (!s) continue;
    s.value.forEach((v, i) => { if (isNonFinite(v)) { nf.step.push(s.step[i]); nf.value.push(1); } });
  }
  if (nf.step.length) {
    const order = nf.step.map((s, i) => [s, i]).sort((a, b) => a[0] - b[0]);
    fields.nonfinite = { step: order.map(([s]) => s), value: order.map(() => 1) };
  }
  if (epochs.length) fields.epoch_time = { step: epochs.map((e) => e.epoch), value: epochs.map((e) => e.duration_s) };
  return fields;
}

/** The latest value of each stat from history, as a step record (null when none). */
export function latestFromHistory(fields, lastEpoch) {
  const rec = {};
  let step = -1;
  for (const name of ["loss", "total_norm", "duration_s", "graph_nodes", "rss_bytes", "overhead"]) {
    const s = fields[name];
    if (!s || !s.step.length) continue;
    rec[name] = s.value[s.value.length - 1];
    step = Math.max(step, s.step[s.step.length - 1]);
  }
  if (step < 0) return null;
  rec.step = step;
  rec.epoch = lastEpoch;
  return rec;
}
