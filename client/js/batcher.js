// Live points are buffered and drawn once per animation frame. Calling
// Plotly.extendTraces once per incoming message costs a redraw each time (27.8 s for
// 2,000 points, measured in the design); once per frame with everything pending, 0.79 s.

import { stats } from "./state.js";

/**
 * new FrameBatcher(items => draw(items)); batcher.push(item) many times; `draw` runs at
 * most once per frame with every item pushed since the last frame.
 */
export class FrameBatcher {
  constructor(flush) {
    this.flushFn = flush;
    this.pending = [];
    this.scheduled = 0;
    this.closed = false;
  }

  push(item) {
    if (this.closed) return;
    if (window.gradwatch && window.gradwatch.unbatched) {
      // bench/dashboard.py's comparison: draw every message at once, no batching.
      stats.flushes += 1;
      stats.flushedItems += 1;
      this.flushFn([item]);
      return;
    }
    this.pending.push(item);
    if (!this.scheduled) this.scheduled = requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.scheduled = 0;
    if (this.closed || this.pending.length === 0) return;
    const items = this.pending;
    this.pending = [];
    stats.flushes += 1;
    stats.flushedItems += items.length;
    this.flushFn(items);
  }

  close() {
    this.closed = true;
    if (this.scheduled) cancelAnimationFrame(this.scheduled);
    this.pending = [];
  }
}
