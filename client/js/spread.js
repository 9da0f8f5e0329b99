// The spread between the ranks of a distributed run, per step: max/min across ranks of
// step time and total gradient norm. 1 means every rank agrees; a straggler (one
// rank's step time) or a diverging rank (its gradients) pushes the ratio up. Pure
// arithmetic, no DOM: the same code serves history (REST, per rank) and live records.

import { num } from "./num.js";

/** The fields whose spread is drawn, with the word for the rank that has the max. */
export const SPREAD_FIELDS = { duration_s: "slowest", total_norm: "largest" };

// Live steps that wait for their other ranks; beyond this many the oldest are dropped
// (a rank that stopped reporting must not make the page grow without bound).
const MAX_PENDING_STEPS = 2000;

function positiveFinite(v) {
  const n = num(v);
  return n !== null && Number.isFinite(n) && n > 0 ? n : null;
}

/**
 * spreadOf(Map(rank -> value)) -> {ratio, max, min, maxRank, minRank} or null when a
 * value is missing, zero or non-finite (a gap: the norm chart marks non-finite steps).
 * Example: spreadOf(new Map([[0, 0.1], [1, 0.3]])).ratio === 3 (rank 1 is 3x rank 0).
 */
export function spreadOf(byRank) {
  let max = null;
  let min = null;
  for (const [rank, v] of byRank) {
    const n = positiveFinite(v);
    if (n === null) return null;
    if (max === null || n > max.value) max = { rank, value: n };
    if (min === null || n < min.value) min = { rank, value: n };
  }
  if (max === null || byRank.size < 2) return null;
  return { ratio: max.value / min.value, max: max.value, min: min.value, maxRank: max.rank, minRank: min.rank };
}

// Bins of a downsampled history: about this many along the step axis.
const HISTORY_BINS = 1000;

/**
 * Spread series from per-rank history: {rank: {field: {step, value}}} ->
 * {series: {"spread|<field>": {step, value}}, latest}. With `exact` (no rank's answer
 * was downsampled) the spread is per step, over the steps every rank has. A
 * downsampled answer keeps each bucket's min and max point, at steps that differ from
 * rank to rank, so then the steps are put in common bins (about 1,000; x is a bin's
 * first step) and each rank's value in a bin is the mean of its points there.
 */
export function historySpread(perRank, ranks, exact = true) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const rank of ranks) {
    for (const field of Object.keys(SPREAD_FIELDS)) {
      const s = perRank[rank] && perRank[rank][field];
      if (s && s.step.length) {
        lo = Math.min(lo, s.step[0]);
        hi = Math.max(hi, s.step[s.step.length - 1]);
      }
    }
  }
  const width = exact || hi < lo ? 1 : Math.max(1, Math.ceil((hi - lo + 1) / HISTORY_BINS));
  const binOf = (step) => (width === 1 ? step : lo + Math.floor((step - lo) / width) * width);
  const out = {};
  const last = {}; // field -> {step, sp}: the latest step with a spread
  for (const field of Object.keys(SPREAD_FIELDS)) {
    const byBin = new Map(); // bin -> Map(rank -> [sum, count]); NaN sum: non-finite
    for (const rank of ranks) {
      const s = perRank[rank] && perRank[rank][field];
      if (!s) continue;
      s.step.forEach((step, i) => {
        const bin = binOf(step);
        if (!byBin.has(bin)) byBin.set(bin, new Map());
        const m = byBin.get(bin);
        const acc = m.get(rank) || [0, 0];
        const n = positiveFinite(s.value[i]);
        m.set(rank, [n === null ? NaN : acc[0] + n, acc[1] + 1]);
      });
    }
    const series = { step: [], value: [] };
    for (const bin of [...byBin.keys()].sort((a, b) => a - b)) {
      const m = byBin.get(bin);
      if (m.size !== ranks.length) continue;
      const sp = spreadOf(new Map([...m].map(([rank, [sum, count]]) => [rank, sum / count])));
      series.step.push(bin);
      series.value.push(sp ? sp.ratio : null);
      if (sp) last[field] = { step: bin, sp };
    }
    out[`spread|${field}`] = series;
  }
  const steps = Object.values(last).map((l) => l.step);
  if (!steps.length) return { series: out, latest: null };
  const latest = { step: Math.max(...steps) };
  for (const [field, l] of Object.entries(last)) if (l.step === latest.step) latest[field] = l.sp;
  return { series: out, latest, binWidth: width };
}

/** Live records of every rank in, spread points out once all ranks have a step. */
export class SpreadTracker {
  constructor(ranks) {
    this.ranks = new Set(ranks);
    this.pending = new Map(); // step -> Map(rank -> record)
  }

  /** add(rank, stepRecord) -> [{key, step, value}] (empty until the step is complete). */
  add(rank, rec) {
    this.ranks.add(rank);
    if (!this.pending.has(rec.step)) this.pending.set(rec.step, new Map());
    const m = this.pending.get(rec.step);
    m.set(rank, rec);
    if (m.size < this.ranks.size) {
      if (this.pending.size > MAX_PENDING_STEPS) this.pending.delete(this.pending.keys().next().value);
      return [];
    }
    this.pending.delete(rec.step);
    this.latest = { step: rec.step };
    const points = [];
    for (const field of Object.keys(SPREAD_FIELDS)) {
      const values = new Map([...m].map(([r, record]) => [r, record[field]]));
      const sp = spreadOf(values);
      this.latest[field] = sp;
      points.push({ key: `spread|${field}`, step: rec.step, value: sp ? sp.ratio : null });
    }
    return points;
  }
}

/** The one-line verdict for the spread panel: which rank is the straggler, how much. */
export function spreadNote(latest) {
  if (!latest) return "";
  const parts = [];
  for (const [field, word] of Object.entries(SPREAD_FIELDS)) {
    const sp = latest[field];
    if (!sp) continue;
    const what = field === "duration_s" ? "step time" : "total norm";
    parts.push(sp.ratio < 1.005 ? `${what} equal on all ranks` : `${what} ${sp.ratio.toFixed(2)}× (rank ${sp.maxRank} ${word})`);
  }
  return parts.length ? `step ${latest.step}: ${parts.join(" · ")}` : "";
}
