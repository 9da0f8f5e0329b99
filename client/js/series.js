// Scalar series per step: the names are those of GET /api/runs/{id}/steps
// ("loss", "param_norms/<param>", "gate_norms/<param>/<gate>", ...), so history from
// REST and live step records land in the same traces. LineChart draws history once
// and then only appends (Plotly.extendTraces), never redrawing what is there.

import { plotText } from "./dom.js";
import { extend, fitLogTicks, layout, plot } from "./charts.js";
import { OnScreen } from "./lazy.js";
import { isNonFinite, num } from "./num.js";

export const SCALARS = ["loss", "duration_s", "total_norm", "graph_nodes", "rss_bytes",
  "cuda_allocated_bytes", "cuda_reserved_bytes", "overhead"];

// Live points beyond this many per trace push the oldest out of the chart (the full
// history stays on the server; reload for it).
export const MAX_LIVE_POINTS = 20000;
// Points kept for a chart that is off screen; beyond this they are drawn (lazy.js).
const MAX_BACKLOG = 5000;
// With more lines than this, a chart shows the TOP_K largest (by latest value) and
// lists the others in the legend, grouped by module, for a click or a search.
const MAX_SHOWN = 10;
const TOP_K = 8;

/** A step record's scalar fields as [name, value] pairs named like the REST API. */
export function recordFields(rec) {
  const out = [];
  for (const name of SCALARS) {
    if (rec[name] !== undefined && rec[name] !== null) out.push([name, rec[name]]);
  }
  for (const [param, value] of Object.entries(rec.param_norms || {})) out.push([`param_norms/${param}`, value]);
  for (const [param, gates] of Object.entries(rec.gate_norms || {})) {
    for (const [gate, value] of Object.entries(gates || {})) out.push([`gate_norms/${param}/${gate}`, value]);
  }
  for (const [module, p] of Object.entries(rec.profile || {})) {
    for (const key of ["forward_s", "backward_s", "calls"]) {
      if (p && p[key] !== undefined) out.push([`profile/${module}/${key}`, p[key]]);
    }
  }
  return out;
}

/** Steps whose record shows something non-finite (for the markers on the norm chart). */
export function nonFiniteNote(rec) {
  const parts = [];
  if (isNonFinite(rec.total_norm)) parts.push(`total norm ${rec.total_norm}`);
  if (isNonFinite(rec.loss)) parts.push(`loss ${rec.loss}`);
  const nf = rec.nonfinite;
  if (nf && typeof nf === "object") {
    if (Array.isArray(nf.parameters) && nf.parameters.length) parts.push(`parameters: ${nf.parameters.slice(0, 4).join(", ")}`);
    for (const [module, series] of Object.entries(nf.timesteps || {})) {
      for (const [name, first] of Object.entries(series || {})) parts.push(`${module}.${name} from t=${first}`);
    }
  }
  return parts.length ? parts.join("; ") : null;
}

/**
 * One chart of scalar series.
 *   spec = {
 *     match(key) -> bool,         which series keys belong here
 *     label(key) -> string,       legend text (escaped here)
 *     value(v, key) -> number|null, what to draw (null: a gap)
 *     trace(key) -> {...},        extra trace attributes (yaxis, line)
 *     layout: {...}               axes with titles and units
 *   }
 * Keys are series names, optionally prefixed ("A|loss") by views that overlay runs.
 */
export class LineChart extends OnScreen {
  constructor(div, spec) {
    super(MAX_BACKLOG);
    this.div = div;
    this.spec = spec;
    this.index = new Map(); // key -> trace index
    this.lastStep = new Map(); // key -> last step drawn (drops replayed/duplicate points)
    this.historyHasData = false;
  }

  setHistory(series) {
    super.setHistory(series);
    Promise.resolve(series).then((s) => {
      this.historyHasData = Object.keys(s || {}).some((k) => this.spec.match(k));
    }, () => {});
  }

  wants(point) {
    return this.spec.match(point.key);
  }

  _trace(key, steps, values) {
    const trace = {
      type: "scatter", mode: "lines", name: plotText(this.spec.label(key)),
      x: steps, y: values.map((v) => this.spec.value(v, key)),
      hovertemplate: `${plotText(this.spec.label(key))}<br>step %{x}<br>%{y:.4g}<extra></extra>`,
      connectgaps: false, line: { width: 1.6 },
      ...(this.spec.trace ? this.spec.trace(key) : {}),
    };
    const group = this.spec.group ? this.spec.group(key) : null;
    if (group) Object.assign(trace, { legendgroup: plotText(group), legendgrouptitle: { text: plotText(group) } });
    if (trace.type === "bar") {
      delete trace.mode;
      delete trace.connectgaps;
      delete trace.line;
    }
    return trace;
  }

  /** First paint from history: series = {key: {step: [...], value: [...]}}. */
  async draw(series = {}) {
    const traces = [];
    for (const key of Object.keys(series).filter((k) => this.spec.match(k)).sort(this.spec.order)) {
      const s = series[key];
      this.index.set(key, traces.length);
      this.lastStep.set(key, s.step.length ? s.step[s.step.length - 1] : -1);
      traces.push(this._trace(key, s.step.slice(), s.value));
    }
    await plot(this.div, traces, layout({ ...this.spec.layout, ...(this.spec.group ? { legend: GROUPED } : {}) }));
    this.drawn = true;
    this.showTop();
    fitLogTicks(this.div);
  }

  /** Which traces are drawn: those whose name contains `text`, or the top ones. */
  filter(text) {
    this.query = text.trim().toLowerCase();
    this.showTop();
  }

  showTop() {
    const data = this.div.data || [];
    const grouped = data.map((t, i) => [t, i]).filter(([t]) => t.legendgroup);
    if (!grouped.length) return;
    let shown;
    if (this.query) shown = new Set(grouped.filter(([t]) => String(t.name).toLowerCase().includes(this.query)).map(([, i]) => i));
    else if (grouped.length > MAX_SHOWN) {
      const last = (t) => { const ys = Array.from(t.y || []); for (let j = ys.length - 1; j >= 0; j -= 1) if (ys[j] !== null) return ys[j]; return -Infinity; };
      shown = new Set(grouped.sort((a, b) => last(b[0]) - last(a[0])).slice(0, TOP_K).map(([, i]) => i));
    } else shown = new Set(grouped.map(([, i]) => i));
    const indices = grouped.map(([, i]) => i);
    window.Plotly.restyle(this.div, { visible: indices.map((i) => (shown.has(i) ? true : "legendonly")) }, indices);
    this.shown = shown.size;
  }

  /** True when there is something to draw (else the panel says there is no data). */
  get hasData() {
    return this.index.size > 0 || this.backlog.length > 0 || this.historyHasData;
  }

  /** Append live points [{key, step, value}] now, one extendTraces for the whole batch. */
  append(points) {
    const byTrace = new Map();
    const fresh = new Map();
    for (const { key, step, value } of points) {
      if (!this.spec.match(key)) continue;
      const last = this.lastStep.get(key);
      if (last !== undefined && step <= last) continue;
      this.lastStep.set(key, step);
      const idx = this.index.get(key);
      if (idx === undefined) {
        if (!fresh.has(key)) fresh.set(key, { step: [], value: [] });
        fresh.get(key).step.push(step);
        fresh.get(key).value.push(value);
        continue;
      }
      if (!byTrace.has(idx)) byTrace.set(idx, { x: [], y: [] });
      const t = byTrace.get(idx);
      t.x.push(step);
      t.y.push(this.spec.value(value, key));
    }
    if (byTrace.size) {
      const indices = [...byTrace.keys()];
      extend(this.div, { x: indices.map((i) => byTrace.get(i).x), y: indices.map((i) => byTrace.get(i).y) },
        indices, MAX_LIVE_POINTS);
    }
    if (fresh.size) {
      // A series seen for the first time (a new parameter, a profile switched on).
      const traces = [];
      for (const [key, s] of fresh) {
        this.index.set(key, this.index.size);
        traces.push(this._trace(key, s.step, s.value));
      }
      window.Plotly.addTraces(this.div, traces);
      this.showTop();
      if (this.onFirstData) this.onFirstData();
    }
    fitLogTicks(this.div);
  }
}

// A grouped legend to the right (many entries scroll there instead of pushing the plot).
const GROUPED = { orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", groupclick: "toggleitem",
  font: { size: 11 }, grouptitlefont: { size: 11 } };

/** Series values for log axes: only positive finite numbers; 0 and NaN are gaps. */
export function positive(v) {
  const n = num(v);
  return n !== null && Number.isFinite(n) && n > 0 ? n : null;
}

export function finite(v) {
  const n = num(v);
  return n !== null && Number.isFinite(n) ? n : null;
}
