// Compare two runs overlaid (#/compare/<a>/<b>): a bug variant and its fixed twin on
// the same axes (loss, total norm, step time, graph size, the latest per-timestep
// profiles), with their heatmaps side by side. Live points append to both.

import { api } from "./api.js";
import { axis, plot, purgeAll } from "./charts.js";
import { el, replaceChildren, visible } from "./dom.js";
import { CHARTS as CHART_PACE, FrameBatcher } from "./batcher.js";
import { HeatLink, Heatmap } from "./heatmap.js";
import { heatmapKeys } from "./history.js";
import { connect } from "./live.js";
import { seriesValues } from "./num.js";
import { panel } from "./panels.js";
import { profileLayout, profileTraces } from "./profile.js";
import { heatTitle as panelTitle } from "./runparts.js";
import { finite, LineChart, positive } from "./series.js";
import { state, stats } from "./state.js";

const COLORS = { A: "#1f77b4", B: "#ff7f0e" };
const seriesLabel = (module, series) => panelTitle(module, series).replace("Gradient flow through time: ", "");
const heatTitle = (name, module, series) => `${name}: ${seriesLabel(module, series)}`;
const stepAxis = () => axis("training step", { zeroline: false });

const CHARTS = [
  ["loss", "Loss", finite, () => axis("loss")],
  ["total_norm", "Total gradient norm", positive, () => axis("gradient L2 norm (log)", { type: "log", exponentformat: "power" })],
  ["duration_s", "Step time", (v) => { const n = finite(v); return n === null ? null : n * 1e3; }, () => axis("step time (ms)", { rangemode: "tozero" })],
  ["graph_nodes", "Autograd graph nodes", finite, () => axis("graph nodes (count)", { rangemode: "tozero" })],
];

export class CompareView {
  constructor(root, a, b) {
    this.root = root;
    this.ids = { A: a, B: b };
    this.charts = [];
    this.heatmaps = {};
    this.loaded = false;
    this.buffer = [];
    this.batcher = new FrameBatcher((items) => this.flush(items), CHART_PACE);
    this.sockets = [];
    this.heatLink = new HeatLink(); // both heatmaps on one colour range
  }

  async mount() {
    const [sa, sb] = await Promise.all([this.summary("A"), this.summary("B")]);
    state.runs.set(this.ids.A, sa);
    state.runs.set(this.ids.B, sb);
    this.names = { A: String(sa.name ?? sa.id), B: String(sb.name ?? sb.id) };
    const label = (k) => this.names[k.slice(0, 1)];
    const grids = [];
    for (const [field, title, value, yaxis] of CHARTS) {
      const p = panel(`cmp-${field}`, title, null);
      const view = new LineChart(p.chart, { match: (k) => k.endsWith(`|${field}`), label, value,
        trace: (k) => ({ line: { width: 2, color: COLORS[k.slice(0, 1)] } }), layout: { xaxis: stepAxis(), yaxis: yaxis() } });
      this.charts.push(view);
      grids.push(p.section);
    }
    const prof = panel("cmp-profile", "Latest per-timestep profiles", "Both runs, every recurrent module, log scale.");
    this.profileDiv = prof.chart;
    const heat = [];
    this.heatPanels = {};
    for (const [k, s] of [["A", sa], ["B", sb]]) {
      // the series a run has recorded, where it has any (a module that got no gradient
      // has nothing to compare)
      const keys = heatmapKeys(s);
      const recorded = keys.filter((c) => !c.placeholder);
      const choices = recorded.length ? recorded : keys;
      if (!choices.length) continue;
      const { module, series } = choices[0];
      const p = panel("heatmap", heatTitle(this.names[k], module, series), null, { tall: true, id: `cmp-heat-${k}` });
      if (choices.length > 1) {
        // Each run's own modules: a stacked or multi-layer model is compared layer by layer.
        const select = el("select", { id: `cmp-heat-select-${k}`, "aria-label": `${this.names[k]}: heatmap of` },
          choices.map((c, i) => el("option", { value: String(i) }, seriesLabel(c.module, c.series))));
        select.addEventListener("change", () => this.showHeatmap(k, choices[Number(select.value)]));
        p.note.append(select);
      }
      this.heatPanels[k] = p;
      this.heatmaps[k] = new Heatmap(p.chart, module, series);
      this.heatmaps[k].link = this.heatLink;
      heat.push(p.section);
    }
    replaceChildren(this.root,
      el("h1", {}, "Compare"),
      el("p", { class: "sub" },
        el("span", { style: `color:${COLORS.A}` }, "━ "), el("strong", { id: "cmp-name-a" }, this.names.A), "  vs  ",
        el("span", { style: `color:${COLORS.B}` }, "━ "), el("strong", { id: "cmp-name-b" }, this.names.B)),
      el("div", { class: "grid" }, grids), el("div", { class: "grid" }, heat), prof.section);
    for (const k of ["A", "B"]) {
      this.sockets.push(connect({ run: this.ids[k] }, (msg) => {
        if (msg.type !== "records" || msg.run_id !== this.ids[k] || msg.rank !== 0) return;
        for (const rec of msg.records || []) {
          stats.records += 1;
          if (this.loaded) this.batcher.push({ k, rec });
          else this.buffer.push({ k, rec });
        }
      }));
    }
    // history is read once the server has subscribed both sockets (live.js): a record in
    // between is in the history or reaches the page live
    await Promise.all(this.sockets.map((s) => s.subscribed));
    await this.load();
  }

  /** Show another module/series of run `k` in its heatmap: its history, then live rows. */
  async showHeatmap(k, { module, series }) {
    const p = this.heatPanels[k];
    const h = new Heatmap(p.chart, module, series);
    if (this.heatmaps[k]) this.heatLink.leave(this.heatmaps[k]);
    h.link = this.heatLink;
    this.heatmaps[k] = null; // live rows of the old choice stop here
    this.pendingHeat = h;
    p.section.querySelector("h2").textContent = visible(heatTitle(this.names[k], module, series));
    const m = await api(`/api/runs/${encodeURIComponent(this.ids[k])}/timesteps`, { module, series, rank: 0, max_steps: 300 });
    if (this.pendingHeat !== h) return; // another choice came meanwhile
    h.setHistory(m);
    await h.setVisible(true);
    this.heatmaps[k] = h;
    for (const key of Object.keys(this.latest)) if (key.startsWith(`${k}|`)) delete this.latest[key];
    if (m.steps && m.steps.length) this.setLatest(`${k}|${module}`, m.steps[m.steps.length - 1], m.values[m.values.length - 1]);
    window.Plotly.react(this.profileDiv, this.profileTraces(), this.profileDiv.layout);
    Object.assign(p.section.dataset, { module, series, rows: String(m.steps ? m.steps.length : 0) });
  }

  summary(k) {
    return api(`/api/runs/${encodeURIComponent(this.ids[k])}`);
  }

  async load() {
    const fields = {};
    this.latest = {};
    const fieldList = CHARTS.map((c) => c[0]).join(",");
    await Promise.all(["A", "B"].map(async (k) => {
      const id = encodeURIComponent(this.ids[k]);
      const steps = await api(`/api/runs/${id}/steps`, { rank: 0, max_points: 2000, fields: fieldList });
      for (const [name, s] of Object.entries(steps.fields || {})) fields[`${k}|${name}`] = s;
      const h = this.heatmaps[k];
      if (h) {
        const m = await api(`/api/runs/${id}/timesteps`, { module: h.module, series: h.series, rank: 0, max_steps: 300 });
        h.setHistory(m);
        await h.setVisible(true); // the compare view draws everything at once
        if (m.steps && m.steps.length) this.setLatest(`${k}|${h.module}`, m.steps[m.steps.length - 1], m.values[m.values.length - 1]);
      }
    }));
    for (const c of this.charts) c.setHistory(fields);
    await Promise.all(this.charts.map((c) => c.setVisible(true)));
    await plot(this.profileDiv, this.profileTraces(), profileLayout());
    this.loaded = true;
    stats.paintedAt = performance.now();
    document.body.dataset.painted = "1";
    for (const item of this.buffer) this.batcher.push(item);
    this.buffer = [];
  }

  /**
   * A run's latest profile of a module: a record for an older step than the one shown
   * (a late batch, history that answers after live records) leaves it. True if it changed.
   */
  setLatest(key, step, values) {
    const shown = this.latest[key];
    if (shown && shown.step > step) return false;
    this.latest[key] = { step, values };
    return true;
  }

  profileTraces() {
    const profiles = Object.entries(this.latest).map(([key, { values }]) => {
      const [k, module] = [key.slice(0, 1), key.slice(2)];
      return { label: `${this.names[k]} · ${module}`, values };
    });
    const traces = profileTraces(profiles, "rgb(200, 40, 40)");
    let i = 0;
    for (const key of Object.keys(this.latest)) traces[i++].line = { width: 2, color: COLORS[key.slice(0, 1)] };
    return traces;
  }

  flush(items) {
    const points = [];
    const rows = { A: [], B: [] };
    let profileChanged = false;
    for (const { k, rec } of items) {
      if (rec.kind !== "step") continue;
      for (const [field] of CHARTS) if (rec[field] !== undefined && rec[field] !== null) points.push({ key: `${k}|${field}`, step: rec.step, value: rec[field] });
      const h = this.heatmaps[k];
      const values = h && rec.timesteps && rec.timesteps[h.module] ? seriesValues(rec.timesteps[h.module][h.series]) : null;
      if (values !== null) {
        rows[k].push({ step: rec.step, values });
        profileChanged = this.setLatest(`${k}|${h.module}`, rec.step, values) || profileChanged;
      }
    }
    for (const c of this.charts) c.push(points);
    for (const k of ["A", "B"]) if (rows[k].length && this.heatmaps[k]) this.heatmaps[k].push(rows[k]);
    if (profileChanged) window.Plotly.react(this.profileDiv, this.profileTraces(), this.profileDiv.layout);
  }

  unmount() {
    for (const s of this.sockets) s.close();
    this.batcher.close();
    purgeAll();
  }
}
