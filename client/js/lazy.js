// Charts that draw when they first scroll into view, and whose live updates wait while
// they are off screen. A run view has ten or more charts; drawing the few one can see
// first makes the first paint fast and keeps live updates cheap. The others are drawn
// soon after in idle time, and at once for printing (drawAll): a printed or saved page
// has every chart. A backlog that outgrows its bound is drawn, never dropped, so a chart
// off screen for long shows every point with no gap between history and live.
// Subclasses provide draw(history) (a Promise) and append(items) (draw new items now).

export class OnScreen {
  constructor(maxBacklog) {
    this.visible = false;
    this.drawn = false;
    this.drawing = null;
    this.history = undefined;
    this.backlog = [];
    this.maxBacklog = maxBacklog;
  }

  /** What to draw first (history from REST, or a Promise of it), when first seen. */
  setHistory(history) {
    this.history = history;
  }

  /** Draw the history once (resolves when drawn), on screen or not. */
  ensureDrawn() {
    if (!this.drawing) {
      // History may still be on its way (a Promise); the view reports a failed fetch.
      this.drawing = Promise.resolve(this.history).then((h) => this.draw(h), () => this.draw(undefined));
    }
    return this.drawing;
  }

  /** Told by an IntersectionObserver (or a view that shows everything); resolves when drawn. */
  setVisible(visible) {
    this.visible = visible;
    if (!visible) return Promise.resolve();
    return this.ensureDrawn().then(() => this.catchUp());
  }

  /** Draw now whatever is pending, on screen or not (printing, a full backlog, idle time). */
  force() {
    return this.ensureDrawn().then(() => this.takeBacklog());
  }

  catchUp() {
    if (this.visible) this.takeBacklog();
  }

  takeBacklog() {
    if (!this.drawn || !this.backlog.length) return;
    const items = this.backlog;
    this.backlog = [];
    this.append(items);
  }

  /** Which live items this chart keeps (all, unless a subclass says otherwise). */
  wants() {
    return true;
  }

  /** New live items, kept until the next catchUp() (the view's chart pace), or drawn when too many. */
  hold(items) {
    for (const item of items) if (this.wants(item)) this.backlog.push(item);
    if (this.backlog.length > this.maxBacklog) this.force();
  }

  /** New live items: drawn now when on screen, else kept for later (drawn when too many). */
  push(items) {
    if (this.drawn && this.visible) {
      this.append(items);
      return;
    }
    for (const item of items) if (this.wants(item)) this.backlog.push(item);
    if (this.backlog.length > this.maxBacklog) this.force();
  }
}

/**
 * Draw every chart of `views` one after another in idle time, or all at once with
 * `now` (printing). Returns {cancel()} for idle drawing, a Promise for `now`.
 */
export function drawAll(views, { now = false } = {}) {
  if (now) return Promise.all(views.map((v) => v.force()));
  let cancelled = false;
  const idle = window.requestIdleCallback || ((fn) => setTimeout(fn, 50));
  const queue = views.slice();
  const next = () => {
    if (cancelled || !queue.length) return;
    queue.shift().force().finally(() => idle(next));
  };
  idle(next);
  return { cancel() { cancelled = true; } };
}
