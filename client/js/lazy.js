// Charts that draw when they first scroll into view, and whose live updates wait while
// they are off screen. A run view has ten or more charts; drawing only the few one can
// see makes the first paint fast and keeps live updates cheap. Subclasses provide
// draw(history) (a Promise) and append(items) (draw new items now).

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

  /** Told by an IntersectionObserver (or a view that shows everything); resolves when drawn. */
  setVisible(visible) {
    this.visible = visible;
    if (!visible) return Promise.resolve();
    if (!this.drawn) {
      if (!this.drawing) {
        // History may still be on its way (a Promise); the view reports a failed fetch.
        this.drawing = Promise.resolve(this.history)
          .then((h) => this.draw(h), () => this.draw(undefined))
          .then(() => this.catchUp());
      }
      return this.drawing;
    }
    this.catchUp();
    return Promise.resolve();
  }

  catchUp() {
    if (!this.visible || !this.backlog.length) return;
    const items = this.backlog;
    this.backlog = [];
    this.append(items);
  }

  /** Which live items this chart keeps (all, unless a subclass says otherwise). */
  wants() {
    return true;
  }

  /** New live items: drawn now when on screen, else kept for later (bounded). */
  push(items) {
    if (this.drawn && this.visible) {
      this.append(items);
      return;
    }
    for (const item of items) if (this.wants(item)) this.backlog.push(item);
    if (this.backlog.length > this.maxBacklog) this.backlog = this.backlog.slice(-Math.floor(this.maxBacklog / 2));
  }
}
