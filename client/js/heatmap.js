// The gradient-flow heatmap of one recurrent module's series: x = timestep,
// y = training step, colour = the norm on one of two scales (heatscale.js): decades
// below each step's peak (default; where the gradient dies shows whatever the norms'
// size) or log10 of the norm. A dotted line marks the vanishing horizon of each step.
// New rows are appended to the drawn traces (z and y, the horizon's x and y), with one
// redraw per batch of rows; the history is never rebuilt.

import { plotText } from "./dom.js";
import { axis, layout, plot } from "./charts.js";
import { fitRange, rowHorizon, scaleRow, scaleTicks } from "./heatscale.js";
import { seriesSymbol } from "./profile.js";
import { OnScreen } from "./lazy.js";
import { stats } from "./state.js";

export const MAX_ROWS = 2000; // live rows kept in the browser; older ones scroll out

/** The colour scale every heatmap of the page uses ("relative" or "absolute"). */
export const heatScale = { current: "relative" };

/** Append to a trace's arrays in place, keeping the last MAX_ROWS (as extendTraces does). */
function appendKept(trace, columns) {
  for (const [key, values] of Object.entries(columns)) {
    const kept = Array.from(trace[key] || []).concat(values);
    trace[key] = kept.length > MAX_ROWS ? kept.slice(kept.length - MAX_ROWS) : kept;
  }
}

function pad(row, width) {
  const out = row.slice();
  while (out.length < width) out.push(null);
  return out;
}

/** A heatmap trace in the dashboard's look: z already scaled, range [zmin, zmax]. */
export function heatmapTrace(steps, z, series, range = [-30, 3], scale = "absolute") {
  const what = scale === "relative" ? `log10 ${seriesSymbol(series)} / step peak` : `log10 ${seriesSymbol(series)}`;
  return {
    type: "heatmap", z, y: steps, colorscale: "Viridis", zmin: range[0], zmax: range[1],
    zsmooth: false, hoverongaps: false,
    colorbar: { title: { text: what, side: "right" }, ...scaleTicks(range, scale), thickness: 14 },
    hovertemplate: `timestep %{x}<br>step %{y}<br>${what} = %{z:.1f}<extra></extra>`,
  };
}

/** The vanishing horizon per step as a line over the heatmap. */
function horizonTrace(steps, horizons) {
  return {
    type: "scatter", mode: "lines", x: horizons, y: steps, name: "vanishing horizon",
    line: { color: "rgba(255, 77, 77, 0.95)", width: 2, dash: "dot" }, connectgaps: false,
    showlegend: false,
    hovertemplate: "step %{y}: gradient reaches back to t = %{x} (1e-3 of the peak)<extra></extra>",
  };
}

/**
 * Heatmaps drawn side by side (compare) share one colour range, so that one colour
 * means the same number of decades in both: each reports the range its rows need.
 */
export class HeatLink {
  constructor() {
    this.needs = new Map(); // heatmap -> [zmin, zmax] its own rows need
  }

  /** The range every member draws on, given what `h` needs now; redraws the others. */
  range(h, need) {
    this.needs.set(h, need);
    const all = [...this.needs.values()];
    const range = [Math.min(...all.map((r) => r[0])), Math.max(...all.map((r) => r[1]))];
    for (const other of this.needs.keys()) {
      if (other !== h && other.drawn && (other.range[0] !== range[0] || other.range[1] !== range[1])) {
        queueMicrotask(() => other.redraw());
      }
    }
    return range;
  }

  leave(h) {
    this.needs.delete(h);
  }
}

export class Heatmap extends OnScreen {
  constructor(div, module, series) {
    super(MAX_ROWS);
    this.div = div;
    this.module = module;
    this.series = series;
    this.width = 0;
    this.steps = []; // the rows drawn: their steps and raw values (for a change of scale)
    this.raw = [];
    this.range = null;
    this.lastStep = -1;
  }

  get rows() {
    return this.steps.length;
  }

  /** True when a row is drawn or on its way (else the panel says no gradient came yet). */
  get hasData() {
    const h = this.history;
    return this.steps.length > 0 || this.backlog.length > 0
      || Boolean(h && Array.isArray(h.steps) && h.steps.length);
  }

  /** The answer's widest row as its endpoint says it (a subclass reads its own key). */
  maxWidth(matrix) {
    return matrix && matrix.max_timesteps ? matrix.max_timesteps : 0;
  }

  xAxis() {
    return axis("timestep t (sequence position)", { zeroline: false, range: this.xRange() });
  }

  /** First paint: matrix = GET /api/runs/{id}/timesteps answer (possibly empty). */
  async draw(matrix) {
    this.steps = matrix && Array.isArray(matrix.steps) ? matrix.steps.slice() : [];
    this.raw = matrix && Array.isArray(matrix.values) ? matrix.values.slice() : [];
    this.width = Math.max(this.maxWidth(matrix), ...this.raw.map((r) => r.length), 0);
    this.lastStep = this.steps.length ? this.steps[this.steps.length - 1] : -1;
    await plot(this.div, this.traces(), layout({
      xaxis: this.xAxis(),
      yaxis: axis("training step", { zeroline: false }),
      margin: { l: 70, r: 16, t: 12, b: 52 },
    }));
    this.drawn = true;
  }

  xRange() {
    return [-0.5, Math.max(0, this.width - 1) + 0.5];
  }

  traces() {
    const scale = heatScale.current;
    const z = this.raw.map((r) => pad(scaleRow(r, scale), this.width));
    const need = fitRange(z, scale);
    this.range = this.link ? this.link.range(this, need) : need;
    this.scale = scale;
    return [heatmapTrace(this.steps.slice(), z, this.series, this.range, scale),
      horizonTrace(this.steps.slice(), this.raw.map(rowHorizon))];
  }

  /** Redraw every row on the page's current scale (the scale picker changed). */
  rescale() {
    if (!this.drawn || this.scale === heatScale.current) return;
    this.redraw();
  }

  redraw() {
    if (this.drawn && this.div.layout) window.Plotly.react(this.div, this.traces(), this.div.layout);
  }

  /**
   * Append rows [{step, values}] now (one redraw per batch). A row for a step before the
   * last one drawn (a late batch) goes in at its step, with one full redraw; a step drawn
   * already (sent twice) is not drawn again.
   */
  append(rows) {
    const fresh = [];
    let late = [];
    for (const r of rows.slice().sort((a, b) => a.step - b.step)) {
      if (r.step > this.lastStep) {
        if (!fresh.length || fresh[fresh.length - 1].step !== r.step) fresh.push(r);
      } else {
        late.push(r);
      }
    }
    if (late.length) {
      const drawn = new Set(this.steps);
      // (add returns the set: a step twice in one batch goes in once)
      late = late.filter((r) => !drawn.has(r.step) && drawn.add(r.step));
    }
    if (!fresh.length && !late.length) return;
    for (const r of late) {
      let at = this.steps.length;
      while (at > 0 && this.steps[at - 1] > r.step) at -= 1;
      this.steps.splice(at, 0, r.step);
      this.raw.splice(at, 0, r.values);
    }
    if (fresh.length) this.lastStep = fresh[fresh.length - 1].step;
    for (const r of fresh) {
      this.steps.push(r.step);
      this.raw.push(r.values);
    }
    if (this.steps.length > MAX_ROWS) {
      this.steps.splice(0, this.steps.length - MAX_ROWS);
      this.raw.splice(0, this.raw.length - MAX_ROWS);
    }
    const added = [...late, ...fresh];
    const longest = Math.max(...added.map((r) => r.values.length));
    const z = fresh.map((r) => scaleRow(r.values, this.scale));
    const [lo, hi] = fitRange(z, this.scale);
    const grows = this.steps.length === added.length || longest > this.width || lo < this.range[0] || hi > this.range[1];
    if (late.length || grows || this.scale !== heatScale.current) {
      // Late rows, the first rows, longer sequences or norms outside the colour range:
      // this one time every row is redrawn (in step order, padded to the new width, on
      // the new range).
      this.width = Math.max(this.width, longest);
      window.Plotly.react(this.div, this.traces(), { ...this.div.layout, xaxis: { ...this.div.layout.xaxis, range: this.xRange() } });
      return;
    }
    // Both traces grow, then one redraw: two extendTraces calls would redraw the whole
    // heatmap (its image, axes and colour bar) twice per frame.
    const [heat, line] = this.div.data;
    const steps = fresh.map((r) => r.step);
    appendKept(heat, { z: z.map((r) => pad(r, this.width)), y: steps });
    appendKept(line, { x: fresh.map((r) => rowHorizon(r.values)), y: steps.slice() });
    stats.extendCalls += 1;
    window.Plotly.redraw(this.div);
  }

  /** Mark a training step with a line across the heatmap (an alert fired there). */
  mark(step, color, text) {
    window.Plotly.relayout(this.div, {
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: step, y1: step, line: { color, width: 2, dash: "dot" } }],
      annotations: [{ xref: "paper", x: 0, y: step, yanchor: "bottom", xanchor: "left", text: plotText(text),
        showarrow: false, font: { color } }],
    });
  }
}
