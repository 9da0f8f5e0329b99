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
// With more grouped lines than this (a model with hundreds or thousands of parameters),
// only the lines drawn are Plotly traces: the TOP_K largest, re-ranked as points
// arrive, or up to MAX_MATCHES that match a search. The others' points wait here, so
// a search draws them at once; a trace (and a legend entry, and an extendTraces slot
// per live batch) for each of thousands of parameters would make the chart unusable.
export const MAX_TRACES = 64;
export const MAX_MATCHES = 24;

/** The first index of the rising `steps` whose step is at or after `step`. */
export function stepIndex(steps, step) {
  let lo = 0;
  let hi = steps.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (steps[mid] < step) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Put `value` at its step in the rising `steps` and its `values`; false (nothing
 * changed) when that step is there already: a record sent twice counts once.
 */
export function placeIn(steps, values, step, value) {
  const at = stepIndex(steps, step);
  if (steps[at] === step) return false;
  steps.splice(at, 0, step);
  values.splice(at, 0, value);
  return true;
}

/** Points [{key, step, value}] in step order (a new array; equal steps keep their order). */
export function byStep(points) {
  return points.slice().sort((a, b) => a.step - b.step);
}

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
    this.lastStep = new Map(); // key -> last step drawn: a point at or before it is late
    // key -> the history's last step: a late point at or before it is the history's
    // (drawn, or left out by the server's downsampling), not drawn again.
    this.historyEnd = new Map();
    this.historyHasData = false;
    // Grouped charts keep every line's points as given (spec.value not applied), so
    // that a bounded chart (more than MAX_TRACES lines) can draw any of them later.
    this.kept = new Map(); // key -> {step: [], value: []}
    this.bounded = false;
    this.chosen = ""; // the keys drawn as traces in a bounded chart, joined
    this.shown = 0;
    this.of = 0; // grouped lines known (drawn or not)
  }

  setHistory(series) {
    super.setHistory(series);
    Promise.resolve(series).then((s) => {
      // an answer that came after a later history replaced it says nothing of this chart
      if (this.history === series) this.historyHasData = Object.keys(s || {}).some((k) => this.spec.match(k));
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
    const keys = Object.keys(series).filter((k) => this.spec.match(k)).sort(this.spec.order);
    if (this.spec.group) {
      for (const key of keys) {
        const s = series[key];
        this.kept.set(key, { step: s.step.slice(), value: s.value.slice() });
        this.fromHistory(key, s);
      }
      if (this.groupedKeys().length > MAX_TRACES) {
        this.bounded = true;
        await this.render(true);
        this.drawn = true;
        return;
      }
    }
    const traces = [];
    for (const key of keys) {
      const s = series[key];
      this.index.set(key, traces.length);
      this.fromHistory(key, s);
      traces.push(this._trace(key, s.step.slice(), s.value));
    }
    await plot(this.div, traces, layout({ ...this.spec.layout, ...(this.spec.group ? { legend: GROUPED } : {}) }));
    this.drawn = true;
    this.showTop();
    fitLogTicks(this.div);
  }

  /** Where a line's history ends: its last step drawn, and the history's. */
  fromHistory(key, s) {
    const end = s.step.length ? s.step[s.step.length - 1] : -1;
    this.lastStep.set(key, end);
    this.historyEnd.set(key, end);
  }

  /** A point before the line's last step that history does not cover: to be placed. */
  isLate(key, step) {
    return step > (this.historyEnd.get(key) ?? -1);
  }

  /** Which traces are drawn: those whose name contains `text`, or the top ones. */
  filter(text) {
    this.query = text.trim().toLowerCase();
    if (this.bounded) {
      if (this.drawn) this.render();
    } else this.showTop();
  }

  groupedKeys() {
    return [...this.kept.keys()].filter((k) => this.spec.group(k));
  }

  /** The latest drawable value of a kept line (-Infinity: none): what the top ones are ranked by. */
  latest(key) {
    const s = this.kept.get(key);
    for (let j = s.value.length - 1; j >= 0; j -= 1) {
      const y = this.spec.value(s.value[j], key);
      if (y !== null) return y;
    }
    return -Infinity;
  }

  /** A bounded chart's traces: the ungrouped lines, then the top or the searched ones. */
  choose() {
    const grouped = this.groupedKeys();
    const query = this.query;
    const byLatest = (keys) => keys.map((k) => [k, this.latest(k)]).sort((a, b) => b[1] - a[1]).map(([k]) => k);
    const picked = query
      ? byLatest(grouped.filter((k) => String(this.spec.label(k)).toLowerCase().includes(query))).slice(0, MAX_MATCHES)
      : byLatest(grouped).slice(0, TOP_K);
    this.of = grouped.length;
    const rest = [...this.kept.keys()].filter((k) => !this.spec.group(k));
    return [...rest, ...picked.sort(this.spec.order)];
  }

  /** Draw a bounded chart's chosen lines from the kept points (a new plot the first time). */
  async render(first = false) {
    const chosen = this.choose();
    this.chosen = chosen.join("\n");
    this.index = new Map(chosen.map((k, i) => [k, i]));
    const traces = chosen.map((k) => { const s = this.kept.get(k); return this._trace(k, s.step.slice(), s.value); });
    const lay = layout({ ...this.spec.layout, legend: GROUPED });
    if (first) await plot(this.div, traces, lay);
    else await window.Plotly.react(this.div, traces, this.div.layout);
    this.shown = chosen.length - chosen.filter((k) => !this.spec.group(k)).length;
    this.div.dataset.drawnLines = String(this.shown);
    this.div.dataset.lines = String(this.of);
    if (this.searchBox) this.searchBox.placeholder = `search ${this.of} lines (${TOP_K} largest drawn)`;
    fitLogTicks(this.div);
  }

  showTop() {
    if (this.bounded) return;
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

  /**
   * Live points [{key, step, value}] now, one extendTraces for the whole batch. A point
   * for a step before the line's last one (records do not always come in step order)
   * is put at its step; one for a step the line has already is left out.
   */
  append(points) {
    const ordered = byStep(points);
    const placed = this.spec.group ? this.keep(ordered) : false;
    if (this.bounded) {
      this.appendBounded(ordered, placed);
      return;
    }
    if (this.spec.group && this.groupedKeys().length > MAX_TRACES) {
      // grown past MAX_TRACES (a live run's first records): bounded from now on
      for (const { key, step } of ordered) if (this.spec.match(key)) this.lastStep.set(key, Math.max(step, this.lastStep.get(key) ?? -1));
      this.bounded = true;
      this.render();
      if (this.onFirstData) this.onFirstData();
      return;
    }
    const byTrace = new Map();
    const fresh = new Map();
    const late = [];
    for (const point of ordered) {
      const { key, step, value } = point;
      if (!this.spec.match(key)) continue;
      const last = this.lastStep.get(key);
      if (last !== undefined && step <= last) {
        if (this.isLate(key, step)) late.push(point);
        continue;
      }
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
    this.placeLate(late);
    fitLogTicks(this.div);
  }

  /**
   * Late points put at their steps in the drawn traces: one restyle of each trace that
   * changed (extendTraces only appends). Rare: ingest sends a batch's records in step
   * order (server/live.py); a resent batch's points are all there already.
   */
  placeLate(points) {
    const traces = new Map(); // trace index -> {x, y, changed}
    for (const { key, step, value } of points) {
      const idx = this.index.get(key);
      if (idx === undefined) continue;
      if (!traces.has(idx)) {
        const t = this.div.data[idx];
        traces.set(idx, { x: Array.from(t.x), y: Array.from(t.y), changed: false });
      }
      const t = traces.get(idx);
      if (t.x.length >= MAX_LIVE_POINTS && step < t.x[0]) continue; // before the points kept
      if (!placeIn(t.x, t.y, step, this.spec.value(value, key))) continue;
      t.changed = true;
      if (t.x.length > MAX_LIVE_POINTS) {
        t.x.shift();
        t.y.shift();
      }
    }
    const changed = [...traces].filter(([, t]) => t.changed);
    if (!changed.length) return;
    window.Plotly.restyle(this.div, { x: changed.map(([, t]) => t.x), y: changed.map(([, t]) => t.y) },
      changed.map(([i]) => i));
  }

  /**
   * A grouped chart's record of every point given (the last MAX_LIVE_POINTS per line),
   * in step order; true when a late point was put before a line's last one.
   */
  keep(points) {
    let placed = false;
    for (const { key, step, value } of points) {
      if (!this.spec.match(key)) continue;
      let s = this.kept.get(key);
      if (!s) this.kept.set(key, (s = { step: [], value: [] }));
      if (s.step.length && step <= s.step[s.step.length - 1]) {
        // late: at its step; a step there already (sent twice, or the history's) is not
        if (this.isLate(key, step) && placeIn(s.step, s.value, step, value)) placed = true;
      } else {
        s.step.push(step);
        s.value.push(value);
      }
      if (s.step.length > MAX_LIVE_POINTS) {
        s.step.splice(0, s.step.length - MAX_LIVE_POINTS);
        s.value.splice(0, s.value.length - MAX_LIVE_POINTS);
      }
    }
    return placed;
  }

  /**
   * Live points for a bounded chart: appended to the drawn lines, or a redraw from the
   * kept points when the top ones changed or a late point was `placed` among them.
   */
  appendBounded(points, placed = false) {
    const fresh = points.some(({ key }) => this.spec.match(key) && !this.lastStep.has(key));
    const byTrace = new Map();
    for (const { key, step, value } of points) {
      if (!this.spec.match(key)) continue;
      const last = this.lastStep.get(key);
      if (last !== undefined && step <= last) continue; // placed in the kept points (keep)
      this.lastStep.set(key, step);
      const idx = this.index.get(key);
      if (idx === undefined) continue;
      if (!byTrace.has(idx)) byTrace.set(idx, { x: [], y: [] });
      byTrace.get(idx).x.push(step);
      byTrace.get(idx).y.push(this.spec.value(value, key));
    }
    if (placed || this.choose().join("\n") !== this.chosen) {
      this.render(); // drawn again from the kept points
    } else if (byTrace.size) {
      const indices = [...byTrace.keys()];
      extend(this.div, { x: indices.map((i) => byTrace.get(i).x), y: indices.map((i) => byTrace.get(i).y) },
        indices, MAX_LIVE_POINTS);
      fitLogTicks(this.div);
    }
    if (fresh && this.onFirstData) this.onFirstData();
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
