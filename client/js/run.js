// The run view (#/run/<id>): heatmaps, profile, norms, gates, loss, timing, graph and
// memory, alerts. History comes from REST (downsampled on the server); live records
// from /ws/live are buffered and appended once per animation frame. Replay
// (replay.js) feeds the same view from history instead of the socket.

import { api, href } from "./api.js";
import { el, replaceChildren } from "./dom.js";
import { AlertsPanel, opensProblem } from "./alerts.js";
import { renderHeader, renderStats } from "./runheader.js";
import { addHeatmap, gotoAlert, joinPanel } from "./heatgrid.js";
import { CHARTS, FrameBatcher, NUMBERS } from "./batcher.js";
import { purgeAll } from "./charts.js";
import { drawAll } from "./lazy.js";
import { connect } from "./live.js";
import { DepthPanels } from "./depth.js";
import { heatmapKeys, historySeries, latestFromHistory, STAT_FIELDS } from "./history.js";
import { num, seriesValues } from "./num.js";
import { OVERHEAD_WINDOW, OverheadShare } from "./overhead.js";
import { panel, RollingMedian, specs } from "./panels.js";
import { Profile } from "./profile.js";
import { RanksView } from "./ranks.js";
import { CHART_INFO, heatmapPanel, lineSearch, NO_DATA, scalePicker, TrendNote } from "./runparts.js";
import { LineChart, nonFiniteNote, recordFields } from "./series.js";
import { state, stats } from "./state.js";

/**
 * Live items [{rank, rec}] with the step records in step order, among their own places
 * (a stable sort; alerts and epochs stay where they are): the stats, the overhead
 * window and the step-time median take them in that order.
 */
export function inStepOrder(items) {
  const slots = [];
  items.forEach(({ rec }, i) => { if (rec.kind === "step" && Number.isFinite(rec.step)) slots.push(i); });
  const steps = slots.map((i) => items[i]).sort((a, b) => a.rec.step - b.rec.step);
  const out = items.slice();
  slots.forEach((i, j) => { out[i] = steps[j]; });
  return out;
}

export class RunView {
  constructor(root, runId, { rank = 0, replay = false } = {}) {
    this.root = root;
    this.runId = runId;
    this.rank = rank;
    this.replay = replay;
    this.batcher = new FrameBatcher((items) => this.flush(items), NUMBERS);
    // Charts are redrawn at their own, slower pace (batcher.js): numbers stay quick.
    // (A replay is watched as it plays: its charts keep the quicker pace.)
    this.chartPace = new FrameBatcher(() => this.drawCharts(), replay ? NUMBERS : CHARTS);
    this.rankItems = [];
    this.profileChanged = false;
    this.buffer = []; // live records that arrive while history loads
    this.overhead = new OverheadShare();
    this.loaded = false;
    this.charts = new Map();
    this.heatmaps = new Map();
    this.trend = new RollingMedian();
    this.closed = false;
    this.alertsSeen = new Set(); // rank|step|code|subject|state|t of the alerts taken
    this.problemsOpened = 0; // problems opened, history and live (the header's count, as the server counts)
    this.epoch = null; // the latest epoch record's number (step records may not say)
    this.onPrint = () => drawAll(this.allCharts(), { now: true });
    this.printMedia = window.matchMedia("print");
  }

  async mount() {
    if (!this.replay) {
      // The summary and the history are read once the server has subscribed this page
      // (live.js): a record or a status change between a read and the subscription
      // would otherwise reach the page neither way (a run shown live after it ended).
      this.early = []; // live messages that come before the summary
      this.live = connect({ run: this.runId }, (msg) => this.onMessage(msg), {
        onOpen: (reconnected) => { if (reconnected) this.reload(); },
      });
      await this.live.subscribed;
      if (this.closed) return;
    }
    try {
      this.summary = await api(`/api/runs/${encodeURIComponent(this.runId)}`);
    } catch (err) {
      if (this.live) this.live.close(); // no view to feed (an unknown run): no socket either
      throw err;
    }
    state.runs.set(this.runId, this.summary);
    this.build();
    const early = this.early || [];
    this.early = null;
    for (const msg of early) this.onMessage(msg);
    await this.load();
  }

  unmount() {
    this.closed = true;
    window.removeEventListener("beforeprint", this.onPrint);
    this.printMedia.removeEventListener("change", this.onPrint);
    if (this.idleDraw) this.idleDraw.cancel();
    if (this.observer) this.observer.disconnect();
    if (this.live) this.live.close();
    this.batcher.close();
    this.chartPace.close();
    purgeAll();
  }

  reload() {
    // After a reconnect or a lag the stream has a hole: repaint from history.
    if (this.closed) return;
    window.dispatchEvent(new CustomEvent("gradwatch:remount"));
  }

  onMessage(msg) {
    if (this.early) {
      this.early.push(msg);
      return;
    }
    if (msg.type === "records" && msg.run_id === this.runId && this.newRank(msg.rank)) return;
    if (msg.type === "records" && msg.run_id === this.runId && Array.isArray(msg.records)) {
      for (const rec of msg.records) {
        stats.records += 1;
        // Other ranks matter only to the side-by-side charts (ranks.js) and alerts.
        if (msg.rank !== this.rank && rec.kind !== "alert" && !this.ranksView) continue;
        const item = { rank: msg.rank, rec };
        if (this.loaded) this.batcher.push(item);
        else this.buffer.push(item);
      }
    } else if (msg.type === "lagged") {
      this.reload();
    } else if (msg.type === "run" && msg.run && msg.run.id === this.runId) {
      Object.assign(this.summary, msg.run);
      renderHeader(this);
    }
  }

  /**
   * A rank that joined after the page loaded (the ranks of a torchrun job say hello
   * moments apart): repaint, so a one-rank view becomes the side-by-side one. Once per
   * rank and view (state.remounted), so a rank the summary does not list cannot loop.
   */
  newRank(rank) {
    const known = Array.isArray(this.summary.ranks) ? this.summary.ranks : [0];
    const key = `${this.runId}|${rank}`;
    if (this.replay || !Number.isInteger(rank) || known.includes(rank) || state.remounted.has(key)) return false;
    state.remounted.add(key);
    this.reload();
    return true;
  }

  build() {
    const s = this.summary;
    this.statusNode = el("span", { class: "badge" });
    this.subNode = el("p", { class: "sub", id: "run-sub" });
    this.statsNode = el("div", { class: "stats" });
    const ranks = Array.isArray(s.ranks) && s.ranks.length ? s.ranks : [0];
    const rankSelect = ranks.length > 1 ? el("label", {}, "rank ",
      el("select", { onchange: (e) => { window.location.hash = `#/run/${encodeURIComponent(this.runId)}/${e.target.value}`; } },
        ranks.map((r) => el("option", { value: r, selected: r === this.rank }, String(r))))) : null;
    this.alertsList = el("div", { class: "alerts", id: "alerts-list" });
    this.alertsPanel = new AlertsPanel(this.alertsList, (first, latest) => gotoAlert(this, first, latest));
    this.ranksView = ranks.length > 1 && !this.replay ? new RanksView(this.runId, ranks) : null;
    const alertsSection = el("section", { class: "panel", id: "panel-alerts" },
      el("header", {}, el("h2", {}, "Alerts"), el("span", { class: "note" }, "what is wrong, the numbers, and the fix")),
      this.alertsList);

    const heat = [];
    for (const { module, series, placeholder } of heatmapKeys(s)) {
      const h = heatmapPanel(module, series, placeholder);
      heat.push(h.panel.section);
      this.heatmaps.set(`${module}|${series}`, h);
    }
    const prof = panel("profile", "Latest per-timestep profile", "Gradient norm at each timestep in the latest recorded step (log scale). Dashed: the vanishing horizon (earliest timestep within 1e-3 of the largest). Shaded: exploding.");
    this.profile = { view: new Profile(prof.chart), panel: prof };
    const spec = specs();
    const lines = CHART_INFO.map(([kind, title, caption]) => {
      const p = panel(kind, title, caption);
      if (NO_DATA[kind]) p.nodata.textContent = NO_DATA[kind];
      const view = new LineChart(p.chart, spec[kind]);
      if (spec[kind].group) p.section.querySelector("header").append(lineSearch(kind, view));
      this.charts.set(kind, { view, panel: p });
      return p.section;
    });
    this.trendNote = new TrendNote(this.charts.get("time").panel.note);
    // Gradient flow through depth (depth.js): its heatmaps beside the time heatmaps,
    // its ratio chart among the line charts (fed the same live points).
    this.depth = new DepthPanels(s, this.rank, (section, view, before) => joinPanel(this, section, view, before));
    this.charts.set("ratios", this.depth.ratios);
    lines.splice(1, 0, this.depth.ratios.panel.section);
    this.noHeat = heat.length || this.depth.heatmaps.size ? null : el("section", { class: "panel", id: "panel-no-heatmap" },
      el("p", { class: "empty" }, "This run has no recurrent modules with per-timestep capture, so there is no heatmap."));
    // A run with stacks of blocks and no recurrent module: no empty per-timestep profile.
    prof.section.hidden = !heat.length && this.depth.heatmaps.size > 0;
    this.heatGrid = el("div", { class: "grid" }, heat, this.noHeat, prof.section, this.depth.sections());
    replaceChildren(this.root,
      el("h1", { id: "run-name" }, String(s.name ?? s.id)),
      this.subNode,
      el("div", { class: "toolbar" }, this.statusNode, rankSelect, el("span", { class: "spacer" }),
        this.replay ? el("a", { href: href(`#/run/${encodeURIComponent(this.runId)}`) }, "live view")
          : el("a", { href: href(`#/replay/${encodeURIComponent(this.runId)}`) }, "replay from history"),
        el("a", { href: href(`#/?compare=${encodeURIComponent(this.runId)}`) }, "compare with…")),
      this.replay ? el("div", { id: "replay-controls" }) : null,
      this.statsNode,
      alertsSection,
      this.ranksView ? this.ranksView.section : null,
      el("div", { class: "toolbar" }, el("span", { class: "spacer" }),
        scalePicker(() => { for (const { view } of this.heatmaps.values()) view.rescale(); this.depth.rescale(); })),
      this.heatGrid,
      el("div", { class: "grid" }, lines));
    renderHeader(this);
  }

  /**
   * History, then live. What is on screen first (alerts, heatmaps, profile) does not
   * wait for the scalar series, which take longest on a long run: the line charts
   * below draw when those arrive (and when they are scrolled to, lazy.js).
   */
  async load() {
    const id = encodeURIComponent(this.runId);
    const heatmaps = [...this.heatmaps.values()];
    const scalars = this.replay ? Promise.resolve([{ fields: {} }, []]) : Promise.all([
      api(`/api/runs/${id}/steps`, { rank: this.rank, max_points: 2000 }),
      api(`/api/runs/${id}/epochs`, { rank: this.rank }),
      // the last steps one by one (the series above may be downsampled): the overhead
      // stat's window, and the stats row's last step with its own values
      api(`/api/runs/${id}/steps`, { rank: this.rank, fields: STAT_FIELDS.join(","),
        from: Math.max(0, (num(this.summary.last_step) ?? 0) - OVERHEAD_WINDOW + 1), max_points: 4 * OVERHEAD_WINDOW }),
    ]);
    const fields = scalars.then(([steps, epochs, tail]) => {
      if (tail) {
        this.overhead.fromHistory(tail.fields || {});
        this.historyLatest = latestFromHistory(tail.fields || {}, this.summary.last_epoch);
      }
      return historySeries(steps, epochs);
    });
    // every line chart but the ratios, whose history comes from /update_ratios (depth.js)
    for (const { view } of this.charts.values()) if (view !== this.depth.ratios.view) view.setHistory(fields);
    if (this.ranksView) this.ranksView.load().catch((err) => this.showError(err));
    const [alerts, , ...matrices] = this.replay ? [[], null, ...heatmaps.map(() => null)] : await Promise.all([
      api(`/api/runs/${id}/alerts`),
      this.depth.load(api, this.runId, (err) => this.showError(err)).catch((err) => this.showError(err)),
      ...heatmaps.map(({ view }) =>
        api(`/api/runs/${id}/timesteps`, { module: view.module, series: view.series, rank: this.rank, max_steps: 500 })),
    ]);
    if (this.closed) return;
    // The ratio chart's history comes on a request of its own: its "no data" note waits
    // for that answer too, not for the chart to be scrolled to.
    Promise.resolve(this.depth.ratios.view.history).then(() => { if (!this.closed) this.updateNoData(); }, () => {});
    heatmaps.forEach(({ view }, i) => {
      const m = matrices[i];
      if (m && m.steps && m.steps.length) this.profile.view.set(view.module, view.series, m.steps[m.steps.length - 1], m.values[m.values.length - 1]);
      view.setHistory(m);
    });
    for (const a of alerts) this.addAlert(a, a.rank ?? 0);
    this.alertsPanel.render();
    this.updateNoData();
    // First paint: the profile, and whichever charts are on screen (lazy.js).
    await Promise.all([this.profile.view.draw(), this.depth.profile.view.draw(), this.observeVisibility()]);
    if (this.closed) return;
    this.loaded = true;
    stats.paintedAt = performance.now();
    document.body.dataset.painted = "1";
    for (const item of this.buffer) this.batcher.push(item);
    this.buffer = [];
    // The charts not on screen draw in idle time, and all at once for printing.
    window.addEventListener("beforeprint", this.onPrint);
    this.printMedia.addEventListener("change", this.onPrint);
    if (this.printMedia.matches) this.onPrint();
    fields.then((f) => this.scalarsArrived(f), (err) => this.showError(err))
      .then(() => { if (!this.closed) this.idleDraw = drawAll(this.allCharts()); });
  }

  /** Every chart view of the page (line charts, ranks' charts, heatmaps). */
  allCharts() {
    return [...this.lineCharts(), ...this.heatmaps.values(), ...this.depth.heatmaps.values()].map(({ view }) => view);
  }

  scalarsArrived(fields) {
    if (this.closed) return;
    if (!this.trend.values.length && fields.duration_s) for (const v of fields.duration_s.value.slice(-25)) this.trend.push(v);
    const latest = this.historyLatest;
    if (!this.statsStep || (latest && latest.step >= this.statsStep)) renderStats(this, latest);
    this.updateNoData();
    this.trendNote.fromHistory(fields.trend);
    stats.scalarsAt = performance.now();
    document.body.dataset.scalars = "1";
  }

  showError(err) {
    stats.errors.push(String(err.message || err));
    this.statsNode.replaceChildren(el("div", { class: "error-box", role: "alert" }, String(err.message || err)));
  }

  /** Watch which charts are on screen; resolves when the first ones seen are drawn. */
  observeVisibility() {
    const byPanel = new Map();
    this.byPanel = byPanel;
    for (const { view, panel: p } of [...this.lineCharts(), ...this.heatmaps.values(), this.profile, ...this.depth.views()]) byPanel.set(p.section, view);
    if (!byPanel.size) return Promise.resolve();
    return new Promise((resolve) => {
      let first = true;
      this.observer = new IntersectionObserver((entries) => {
        const draws = entries.map((e) => Promise.resolve(byPanel.get(e.target).setVisible(e.isIntersecting)));
        if (first) {
          first = false;
          Promise.all(draws).then(resolve);
        }
        this.updateNoData();
      }, { rootMargin: "200px" });
      for (const section of byPanel.keys()) this.observer.observe(section);
    });
  }

  addAlert(alert, rank) {
    // an alert both in the history and among the first live records counts once
    const key = `${rank}|${alert.step}|${alert.code}|${alert.subject ?? ""}|${alert.state}|${alert.t}`;
    if (this.alertsSeen.has(key)) return;
    this.alertsSeen.add(key);
    this.problemsOpened += opensProblem(alert);
    this.alertsPanel.add(alert, rank);
  }

  /**
   * Pending live records: the numbers (stats, header, alerts, trend note) now; the
   * charts' points are kept for drawCharts, at the charts' pace.
   */
  flush(pending) {
    const items = inStepOrder(pending);
    const points = [];
    const rows = new Map();
    let lastStep = null;
    let alertsChanged = false;
    let profileChanged = false;
    let trendChanged = false;
    if (this.ranksView) this.rankItems.push(...items);
    for (const { rank, rec, partial } of items) {
      if (rank !== this.rank && rec.kind !== "alert") continue; // drawn by ranksView above
      if (rec.kind === "step") {
        lastStep = rec;
        // A replay's record rebuilt from downsampled history holds a few of its step's
        // fields, picked as its bucket's min or max: no part of a window of steps.
        if (!partial) this.overhead.push(rec.step, rec.overhead, rec.duration_s);
        for (const [key, value] of recordFields(rec)) points.push({ key, step: rec.step, value });
        if (nonFiniteNote(rec)) points.push({ key: "nonfinite", step: rec.step, value: 1 });
        const m = this.trend.push(rec.duration_s, rec.step);
        if (m !== null) {
          points.push({ key: "trend", step: rec.step, value: m });
          // A median of a full window only: a run's first steps do not tilt the trend.
          if (this.trend.values.length >= this.trend.size) {
            this.trendNote.add(rec.step, m);
            trendChanged = true;
          }
        }
        this.depthChanged = this.depth.take(rec, points) || this.depthChanged;
        for (const [module, seriesMap] of Object.entries(rec.timesteps || {})) {
          for (const [series, wire] of Object.entries(seriesMap || {})) {
            const values = seriesValues(wire);
            if (values === null) continue;
            const key = `${module}|${series}`;
            if (!rows.has(key)) rows.set(key, []);
            rows.get(key).push({ step: rec.step, values });
            this.profile.view.set(module, series, rec.step, values);
            profileChanged = true;
          }
        }
      } else if (rec.kind === "epoch") {
        this.epoch = Math.max(num(this.epoch) ?? -1, num(rec.epoch) ?? -1);
        points.push({ key: "epoch_time", step: rec.epoch, value: rec.duration_s });
      } else if (rec.kind === "alert") {
        this.addAlert(rec, rank);
        alertsChanged = true;
      } else if (rec.kind === "end") {
        this.summary.status = rec.status;
        renderHeader(this);
      }
    }
    for (const { view } of this.charts.values()) view.hold(points);
    for (const [key, list] of rows) {
      const h = this.heatmaps.get(key) || addHeatmap(this, key);
      h.view.hold(list);
    }
    this.profileChanged ||= profileChanged;
    this.chartPace.push(true);
    if (trendChanged) this.trendNote.render();
    if (alertsChanged) this.alertsPanel.render();
    if (lastStep) {
      // a late record (an older step than the stats show) changes the charts only
      if (!(lastStep.step < this.statsStep)) renderStats(this, lastStep);
      this.summary.last_step = Math.max(num(this.summary.last_step) ?? -1, lastStep.step);
    }
    if (lastStep || alertsChanged) renderHeader(this);
    this.updateNoData();
  }

  /** Draw what the charts on screen hold (the others draw when scrolled to, lazy.js). */
  drawCharts() {
    if (this.closed) return;
    if (this.ranksView && this.rankItems.length) {
      const items = this.rankItems;
      this.rankItems = [];
      this.ranksView.push(items);
    }
    for (const { view } of [...this.charts.values(), ...this.heatmaps.values(), ...this.depth.heatmaps.values()]) view.catchUp();
    if (this.depthChanged) {
      this.depthChanged = false;
      this.depth.profile.view.redraw();
    }
    if (this.profileChanged) {
      this.profileChanged = false;
      this.profile.view.redraw();
    }
    this.updateNoData();
  }

  /** {view, panel} of every line chart: this rank's, and the ranks side by side. */
  lineCharts() {
    return [...this.charts.values(), ...(this.ranksView ? this.ranksView.entries() : [])];
  }

  updateNoData() {
    // A chart with nothing to draw says why instead of empty axes (a heatmap: a module
    // no gradient has reached yet).
    for (const { view, panel: p } of [...this.lineCharts(), ...this.heatmaps.values()]) {
      p.nodata.hidden = view.hasData;
      const wasHidden = p.chart.hidden;
      p.chart.hidden = !view.hasData;
      // Drawn while hidden, a chart has no size yet: fit it once it shows.
      if (wasHidden && view.hasData && view.drawn) window.Plotly.Plots.resize(p.chart);
    }
    this.profile.panel.nodata.hidden = this.profile.view.hasData;
    // The depth profile: only where the run has stacks of blocks, its chart once drawn.
    const { view: dv, panel: dp } = this.depth.profile;
    dp.section.hidden = !dv.hasData && !this.depth.heatmaps.size;
    dp.nodata.hidden = dv.hasData;
    const wasHidden = dp.chart.hidden;
    dp.chart.hidden = !dv.hasData;
    if (wasHidden && dv.hasData && dv.drawn) window.Plotly.Plots.resize(dp.chart);
  }
}
