// Replay a finished run from history (#/replay/<id>): the run view, fed from the REST
// history in step order instead of the live socket, so it unfolds the way it did live.

import { api } from "./api.js";
import { el, replaceChildren } from "./dom.js";
import { setServerUp } from "./live.js";
import { num } from "./num.js";
import { OVERHEAD_WINDOW } from "./overhead.js";
import { SCALARS } from "./series.js";
import { RunView } from "./run.js";

const KIND_ORDER = { step: 0, epoch: 1, alert: 2, end: 3 };

/** Put the scalar series `fields` (REST names) into the records of `rec(step)`, of the steps `keep` takes. */
function addScalars(rec, fields, keep) {
  for (const [name, s] of Object.entries(fields || {})) {
    s.step.forEach((step, i) => {
      if (!keep(step)) return;
      const r = rec(step);
      const v = s.value[i];
      if (SCALARS.includes(name)) r[name] = v;
      else if (name.startsWith("param_norms/")) (r.param_norms ||= {})[name.slice(12)] = v;
      else if (name.startsWith("gate_norms/")) {
        const m = /^gate_norms\/(.*)\/([^/]+)$/.exec(name);
        if (m) ((r.gate_norms ||= {})[m[1]] ||= {})[m[2]] = v;
      } else if (name.startsWith("profile/")) {
        const m = /^profile\/(.*)\/([^/]+)$/.exec(name);
        if (m) ((r.profile ||= {})[m[1]] ||= {})[m[2]] = v;
      }
    });
  }
}

/**
 * History answers -> [{rank, rec, partial}] in step order, records shaped like the
 * wire's. The scalars of the steps from `history.tail.from` on come from `tail` (the
 * last steps one by one), the others from `history.steps`. A record whose scalars come
 * from a min/max-downsampled answer is `partial`: it holds only the fields whose
 * bucket min or max fell on its step.
 */
export function historyRecords(history, heatmapKeys, rank = 0) {
  const steps = new Map();
  const rec = (step) => {
    if (!steps.has(step)) steps.set(step, { kind: "step", step });
    return steps.get(step);
  };
  const tail = history.tail && Number.isFinite(history.tail.from) ? history.tail : null;
  const cut = tail ? tail.from : Infinity;
  addScalars(rec, history.steps && history.steps.fields, (step) => step < cut);
  if (tail) addScalars(rec, tail.fields, (step) => step >= cut);
  const partial = (step) => Boolean(step < cut ? history.steps && history.steps.downsampled : tail.downsampled);
  history.matrices.forEach((m, i) => {
    if (!m || !Array.isArray(m.steps)) return;
    const { module, series } = heatmapKeys[i];
    m.steps.forEach((step, j) => { ((rec(step).timesteps ||= {})[module] ||= {})[series] = m.values[j]; });
  });
  // Depth (depth.js): each stack's rows, and the ratios already summed up per block.
  for (const m of history.depth || []) {
    if (m && Array.isArray(m.steps)) m.steps.forEach((step, j) => { (rec(step).depth ||= {})[m.stack] = m.values[j]; });
  }
  const ratios = history.ratios || { steps: [], blocks: [] };
  for (const b of ratios.blocks || []) {
    b.values.forEach((v, j) => { if (v !== null) (rec(ratios.steps[j]).update_ratio_blocks ||= {})[b.name] = v; });
  }
  // Step rows carry no epoch: each step is in the epoch whose record ends at or after it
  // (what a live step record says), the steps after the last one in the next epoch.
  const ends = (history.epochs || []).filter((e) => Number.isFinite(e.step) && Number.isFinite(e.epoch))
    .sort((x, y) => x.step - y.step);
  let e = 0;
  for (const r of [...steps.values()].sort((x, y) => x.step - y.step)) {
    while (e < ends.length && ends[e].step < r.step) e += 1;
    if (ends.length) r.epoch = e < ends.length ? ends[e].epoch : ends[ends.length - 1].epoch + 1;
  }
  const items = [...steps.values()].map((r) => ({ rank, rec: r, partial: partial(r.step) }));
  for (const e of history.epochs || []) items.push({ rank, rec: { kind: "epoch", ...e } });
  for (const a of history.alerts || []) items.push({ rank: a.rank ?? 0, rec: { kind: "alert", ...a } });
  items.sort((x, y) => (x.rec.step ?? 0) - (y.rec.step ?? 0) || KIND_ORDER[x.rec.kind] - KIND_ORDER[y.rec.kind]);
  return items;
}

/** Everything a replay draws, from REST: steps, epochs, alerts and each heatmap's matrix. */
export async function fetchHistory(view) {
  const id = encodeURIComponent(view.runId);
  const stacks = [...view.depth.heatmaps.keys()];
  const tailFrom = Math.max(0, (num(view.summary.last_step) ?? 0) - OVERHEAD_WINDOW + 1);
  const [steps, tail, epochs, alerts, ratios, ...matrices] = await Promise.all([
    api(`/api/runs/${id}/steps`, { rank: view.rank, max_points: 2000 }),
    // the last steps one by one: the replay ends on their true figures (historyRecords)
    api(`/api/runs/${id}/steps`, { rank: view.rank, from: tailFrom, max_points: 4 * OVERHEAD_WINDOW }),
    api(`/api/runs/${id}/epochs`, { rank: view.rank }),
    api(`/api/runs/${id}/alerts`),
    api(`/api/runs/${id}/update_ratios`, { rank: view.rank, max_steps: 2000 }),
    ...[...view.heatmaps.values()].map(({ view: h }) =>
      api(`/api/runs/${id}/timesteps`, { module: h.module, series: h.series, rank: view.rank, max_steps: 500 })),
    ...stacks.map((stack) => api(`/api/runs/${id}/depth`, { stack, rank: view.rank, max_steps: 500 })),
  ]);
  const depth = matrices.splice(matrices.length - stacks.length, stacks.length);
  return { steps, tail, epochs, alerts, matrices, depth, ratios };
}

const HEALTH_EVERY_MS = 10000;

export class ReplayView {
  constructor(root, runId, { rank = 0 } = {}) {
    this.root = root;
    this.runId = runId;
    this.rank = rank;
    this.pos = 0;
    this.playing = false;
    this.seconds = 20; // a whole replay takes this long at normal speed
    this.frame = 0;
    this.playStart = 0; // performance.now() at which position 0 would have played
  }

  /** The header says whether the server answers: a replay has no live socket. */
  async checkServer() {
    try {
      await api("/api/health");
      setServerUp(true);
    } catch {
      setServerUp(false);
    }
  }

  async mount() {
    this.view = new RunView(this.root, this.runId, { rank: this.rank, replay: true });
    await this.view.mount();
    this.checkServer();
    this.health = setInterval(() => this.checkServer(), HEALTH_EVERY_MS);
    this.history = await fetchHistory(this.view);
    const keys = [...this.view.heatmaps.values()].map(({ view }) => ({ module: view.module, series: view.series }));
    this.items = historyRecords(this.history, keys, this.rank);
    this.controls();
    this.play();
  }

  controls() {
    this.playButton = el("button", { type: "button", class: "primary", id: "replay-play", onclick: () => (this.playing ? this.pause() : this.play()) }, "Pause");
    this.slider = el("input", { type: "range", min: 0, max: this.items.length, value: 0, id: "replay-position",
      "aria-label": "replay position", onchange: (e) => this.seek(Number(e.target.value)) });
    this.label = el("span", { class: "note", id: "replay-label" });
    const speed = el("select", { "aria-label": "replay length", id: "replay-speed",
      onchange: (e) => { this.seconds = Number(e.target.value); this.rebase(); } },
      [[60, "slow (60 s)"], [20, "normal (20 s)"], [5, "fast (5 s)"]].map(([v, t]) => el("option", { value: v, selected: v === this.seconds }, t)));
    replaceChildren(document.getElementById("replay-controls"),
      el("div", { class: "toolbar" }, this.playButton, this.slider, speed, this.label));
    this.updateLabel();
  }

  updateLabel() {
    const last = this.pos > 0 ? this.items[this.pos - 1].rec.step : null;
    this.label.textContent = this.pos >= this.items.length
      ? `replayed all ${this.items.length} records`
      : `step ${last ?? "–"} · ${this.pos} of ${this.items.length} records`;
    this.slider.value = String(this.pos);
  }

  /** Where the replay clock says the position is now (records, by elapsed time). */
  due(now = performance.now()) {
    const n = this.items.length;
    return Math.min(n, Math.floor((n * (now - this.playStart)) / (this.seconds * 1000)));
  }

  /** Keep the position and let the clock run from it (on play and on a speed change). */
  rebase() {
    const n = Math.max(1, this.items.length);
    this.playStart = performance.now() - (this.pos / n) * this.seconds * 1000;
  }

  /** The whole replay takes `seconds` of wall clock, however fast frames come. */
  play() {
    if (this.pos >= this.items.length) return;
    this.playing = true;
    this.playButton.textContent = "Pause";
    this.rebase();
    const tick = () => {
      if (!this.playing || this.view.closed) return;
      this.advance(Math.max(this.pos, this.due()));
      if (this.pos < this.items.length) this.frame = requestAnimationFrame(tick);
      else this.pause();
    };
    this.frame = requestAnimationFrame(tick);
  }

  pause() {
    this.playing = false;
    cancelAnimationFrame(this.frame);
    this.playButton.textContent = this.pos >= this.items.length ? "Replayed" : "Play";
  }

  advance(to) {
    if (to > this.pos) this.view.flush(this.items.slice(this.pos, to));
    // At the end, or on a seek, the charts show every record at once (while playing
    // they follow at the view's chart pace).
    if (to > this.pos && (to >= this.items.length || !this.playing)) this.view.chartPace.flush();
    this.pos = to;
    this.updateLabel();
  }

  async seek(to) {
    if (to >= this.pos) {
      this.advance(to);
      this.rebase();
      return;
    }
    // Going back: draw the charts again from nothing, then fast-forward.
    this.pause();
    this.view.unmount();
    this.view = new RunView(this.root, this.runId, { rank: this.rank, replay: true });
    await this.view.mount();
    this.controls();
    this.pos = 0;
    this.advance(to);
  }

  unmount() {
    clearInterval(this.health);
    setServerUp(null);
    this.playing = false;
    cancelAnimationFrame(this.frame);
    if (this.view) this.view.unmount();
  }
}
