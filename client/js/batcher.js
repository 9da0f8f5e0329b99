// Live points are buffered and drawn once per animation frame. Calling
// Plotly.extendTraces once per incoming message costs a redraw each time (27.8 s for
// 2,000 points, measured in the design); once per frame with everything pending, 0.79 s.
// Drawing also keeps to a duty cycle: after a draw that took d ms the next one waits
// d·(1/duty − 1) ms, at least minGap and at most maxWait, so that a page left open costs
// little (issue #15: one run view at 2.5 steps/s kept Chromium's main thread 39 % busy
// when every record was drawn as it came); more records then share one draw. Two paces
// (run.js): NUMBERS for text (stats, header, alerts, the runs list: cheap, on screen
// within half a second to a second) and CHARTS for Plotly redraws (a heatmap of a
// thousand rows costs tens of ms: 5 % of the main thread, one to four seconds apart).
// A draw's own time undercounts it (style, layout and paint follow outside the script,
// and a loaded machine stretches it): the duties are set for what bench/dashboard.py
// measures from Chromium's metrics (BENCHMARKS.md, "Dashboard").

import { stats } from "./state.js";

export const NUMBERS = { duty: 0.1, minGap: 500, maxWait: 1000 };
export const CHARTS = { duty: 0.05, minGap: 1000, maxWait: 4000 };

/**
 * new FrameBatcher(items => draw(items), pace); batcher.push(item) many times; `draw`
 * runs at most once per frame (and per the pace's gap) with every item pushed since the
 * last draw.
 */
export class FrameBatcher {
  constructor(flush, pace = NUMBERS) {
    this.flushFn = flush;
    this.pace = pace;
    this.pending = [];
    this.frame = 0;
    this.timer = 0;
    this.readyAt = 0;
    this.closed = false;
  }

  push(item) {
    if (this.closed) return;
    if (window.gradwatch && window.gradwatch.unbatched) {
      // bench/dashboard.py's comparison: draw every message at once, no batching.
      this.pending.push(item);
      this.flush();
      return;
    }
    this.pending.push(item);
    this.schedule();
  }

  schedule() {
    if (this.frame || this.timer) return;
    const wait = this.readyAt - performance.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = 0;
        this.schedule();
      }, wait);
      return;
    }
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.flush();
    });
  }

  flush() {
    if (this.closed || this.pending.length === 0) return;
    const items = this.pending;
    this.pending = [];
    stats.flushes += 1;
    stats.flushedItems += items.length;
    const start = performance.now();
    this.flushFn(items);
    const took = performance.now() - start;
    const { duty, minGap, maxWait } = this.pace;
    this.readyAt = performance.now() + Math.min(maxWait, Math.max(minGap, took * (1 / duty - 1)));
  }

  close() {
    this.closed = true;
    if (this.frame) cancelAnimationFrame(this.frame);
    clearTimeout(this.timer);
    this.pending = [];
  }
}
