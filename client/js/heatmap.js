// The gradient-flow heatmap of one recurrent module's series: x = timestep,
// y = training step, colour = log10 of the gradient norm on a FIXED scale
// (1e-30 .. 1e3), so that a colour means the same in every run and at every moment.
// New rows arrive live through Plotly.extendTraces on z and y (no redraw).

import { plotText } from "./dom.js";
import { axis, extend, layout, plot } from "./charts.js";
import { OnScreen } from "./lazy.js";
import { LOG_MAX, LOG_MIN, logNorm } from "./num.js";

export const MAX_ROWS = 2000; // live rows kept in the browser; older ones scroll out

const TICKS = [-30, -25, -20, -15, -10, -5, 0, 3];

/** What the colour shows, for the colour bar and hover: ‖∂L/∂x_t‖ and friends. */
export function seriesSymbol(series) {
  if (series === "hidden") return "‖∂L/∂h_t‖";
  if (series === "cell") return "‖∂L/∂c_t‖";
  const layer = /^layer(\d+)$/.exec(series);
  if (layer) return `‖∂L/∂x_t‖ (layer ${layer[1]})`;
  return "‖∂L/∂x_t‖";
}

function padRow(values, width) {
  const row = values.map(logNorm);
  while (row.length < width) row.push(null);
  return row;
}

/** A heatmap trace in the dashboard's look (shared with the HTML report). */
export function heatmapTrace(steps, rows, series) {
  return {
    type: "heatmap", z: rows, y: steps, colorscale: "Viridis", zmin: LOG_MIN, zmax: LOG_MAX,
    zsmooth: false, hoverongaps: false,
    colorbar: {
      title: { text: `log10 ${seriesSymbol(series)}`, side: "right" },
      tickvals: TICKS, ticktext: TICKS.map((t) => (t === 0 ? "1" : `1e${t}`)), thickness: 14,
    },
    hovertemplate: `timestep %{x}<br>step %{y}<br>log10 ${seriesSymbol(series)} = %{z:.1f}<extra></extra>`,
  };
}

export class Heatmap extends OnScreen {
  constructor(div, module, series) {
    super(MAX_ROWS);
    this.div = div;
    this.module = module;
    this.series = series;
    this.width = 0;
    this.rows = 0;
    this.lastStep = -1;
  }

  /** First paint: matrix = GET /api/runs/{id}/timesteps answer (possibly empty). */
  async draw(matrix) {
    const steps = matrix && Array.isArray(matrix.steps) ? matrix.steps : [];
    const values = matrix && Array.isArray(matrix.values) ? matrix.values : [];
    this.width = Math.max(matrix && matrix.max_timesteps ? matrix.max_timesteps : 0,
      ...values.map((r) => r.length), 0);
    const rows = values.map((r) => padRow(r, this.width));
    this.rows = rows.length;
    this.lastStep = steps.length ? steps[steps.length - 1] : -1;
    await plot(this.div, [heatmapTrace(steps.slice(), rows, this.series)], layout({
      xaxis: axis("timestep t (sequence position)", { zeroline: false }),
      yaxis: axis("training step", { zeroline: false }),
      margin: { l: 70, r: 16, t: 12, b: 52 },
    }));
    this.drawn = true;
  }

  /** Append rows [{step, values}] now (one extendTraces per frame). */
  append(rows) {
    const fresh = rows.filter((r) => r.step > this.lastStep).sort((a, b) => a.step - b.step);
    if (!fresh.length) return;
    this.lastStep = fresh[fresh.length - 1].step;
    const longest = Math.max(...fresh.map((r) => r.values.length));
    if (this.rows === 0 || longest > this.width) {
      // The first row, or longer sequences than drawn so far: the column count
      // changes, so this one time the trace is rebuilt with every row padded.
      this.width = Math.max(this.width, longest);
      const trace = this.div.data[0];
      const z = (trace.z || []).map((r) => { const c = r.slice(); while (c.length < this.width) c.push(null); return c; });
      const y = (trace.y || []).slice();
      for (const r of fresh) {
        z.push(padRow(r.values, this.width));
        y.push(r.step);
      }
      this.rows = z.length;
      window.Plotly.restyle(this.div, { z: [z], y: [y] }, [0]);
      return;
    }
    this.rows = Math.min(MAX_ROWS, this.rows + fresh.length);
    extend(this.div, { z: [fresh.map((r) => padRow(r.values, this.width))], y: [fresh.map((r) => r.step)] },
      [0], MAX_ROWS);
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
