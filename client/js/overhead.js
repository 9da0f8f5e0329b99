// gradwatch's share of training time over the run's recent steps, weighted by step
// time: sum(overhead x duration) / sum(duration). A step record's `overhead` is that
// step's own share: under the default budget light steps cost a few per cent and the
// rare heavy step about as much as the step itself, so the last step's value alone
// flips between the two. The weighted share over a window is what the run pays, the
// figure bench/overhead.py holds against an A/B without gradwatch.

import { fmt, num } from "./num.js";
import { placeIn } from "./series.js";

// Enough steps to hold several heavy steps at the default budget's usual intervals.
export const OVERHEAD_WINDOW = 500;

export class OverheadShare {
  constructor(size = OVERHEAD_WINDOW) {
    this.size = size;
    this.steps = []; // rising
    this.costs = []; // [overhead, duration_s] of each step
  }

  /**
   * One step record's fields, put at its step: records may come out of step order
   * (history's tail after the first live ones, a late live record). A step there
   * already counts once; one older than the window's steps counts not at all.
   */
  push(step, overhead, duration) {
    const o = num(overhead);
    const d = num(duration);
    if (!Number.isFinite(o) || !Number.isFinite(d) || d <= 0 || !Number.isFinite(step)) return;
    const n = this.steps.length;
    if (n >= this.size && step < this.steps[n - this.size]) return;
    if (!placeIn(this.steps, this.costs, step, [o, d])) return;
    if (this.steps.length > this.size * 2) {
      this.steps = this.steps.slice(-this.size);
      this.costs = this.costs.slice(-this.size);
    }
  }

  /** The last points of the history's `overhead` and `duration_s`, matched by step. */
  fromHistory(fields) {
    const o = fields.overhead;
    const d = fields.duration_s;
    if (!o || !d) return;
    const durations = new Map();
    for (let i = 0; i < d.step.length; i++) durations.set(d.step[i], d.value[i]);
    for (let i = Math.max(0, o.step.length - this.size); i < o.step.length; i++) {
      if (durations.has(o.step[i])) this.push(o.step[i], o.value[i], durations.get(o.step[i]));
    }
  }

  /** {share, steps}: the weighted share over the last `size` steps, or null. */
  share() {
    const steps = this.steps.slice(-this.size);
    if (!steps.length) return null;
    let cost = 0;
    let time = 0;
    for (const [o, d] of this.costs.slice(-this.size)) {
      cost += o * d;
      time += d;
    }
    return { share: cost / time, steps: steps.length, first: steps[0], last: steps[steps.length - 1] };
  }
}

/**
 * Whether the trainer's `overhead` leaves out what capture slows down unseen (inside
 * autograd): that is measured against light steps, which every=1 or 2 without a
 * budget does not have (docs/CAPTURE.md, "The `overhead` field").
 */
export function unseenLeftOut(summary, rank) {
  const hellos = (summary && summary.hello) || {};
  const hello = hellos[String(rank)] || Object.values(hellos)[0] || {};
  const config = hello.config || {};
  const every = num(config.every);
  return config.overhead == null && Number.isFinite(every) && every <= 2;
}

/** The stat's text (the time-weighted share of recent steps) and its explanation. */
export function overheadText(weighted, rec, lowerBound = false) {
  const atLeast = lowerBound ? "≥ " : "";
  const why = lowerBound
    ? "; at least: with every=1 or 2 and no budget there is no light step to measure against what capture slows down inside autograd"
    : "";
  if (!weighted) {
    return rec.overhead === undefined ? "–" : [`${atLeast}${(num(rec.overhead) * 100).toFixed(1)} %`, `this step's share${why}`];
  }
  const last = rec.overhead === undefined ? "" : `; step ${fmt(rec.step)} alone: ${(num(rec.overhead) * 100).toFixed(1)} %`;
  return [`${atLeast}${(weighted.share * 100).toFixed(1)} %`,
    `gradwatch's share of the time of steps ${fmt(weighted.first)}-${fmt(weighted.last)}, weighted by step time${last}${why}`];
}
