// Compare two runs overlaid (#/compare/<a>/<b>): a bug variant and its fixed twin on
// the same axes (loss, total norm, step time, graph size, the latest per-timestep
// profiles), with their heatmaps side by side. Live points append to both.

import { api } from "./api.js";
import { axis, plot, purgeAll } from "./charts.js";
import { el, replaceChildren } from "./dom.js";
import { FrameBatcher } from "./batcher.js";
import { Heatmap } from "./heatmap.js";
import { connect } from "./live.js";
import { seriesValues } from "./num.js";
import { panel } from "./panels.js";
import { profileLayout, profileTraces } from "./profile.js";
import { finite, LineChart, positive } from "./series.js";
import { state, stats } from "./state.js";

const COLORS = { A: "#1f77b4", B: "#ff7f0e" };
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
    this.batcher = new FrameBatcher((items) => this.flush(items));
    this.sockets = [];
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
    for (const [k, s] of [["A", sa], ["B", sb]]) {
      const module = (s.recurrent || Object.keys(s.series || {}))[0];
      if (!module) continue;
      const series = ((s.series || {})[module] || ["input"])[0];
      const p = panel("heatmap", `${this.names[k]}: ${module}`, null, { tall: true, id: `cmp-heat-${k}` });
      this.heatmaps[k] = new Heatmap(p.chart, module, series);
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
    await this.load();
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
        if (m.steps && m.steps.length) this.latest[`${k}|${h.module}`] = m.values[m.values.length - 1];
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

  profileTraces() {
    const profiles = Object.entries(this.latest).map(([key, values]) => {
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
        this.latest[`${k}|${h.module}`] = values;
        profileChanged = true;
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
