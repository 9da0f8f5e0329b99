// Thin wrappers around Plotly: one look for every chart (theme-aware, axis titles with
// units), a registry so the theme toggle can recolour charts in place, and counters.

import { plotText } from "./dom.js";
import { stats } from "./state.js";

const FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", Ubuntu, Arial, sans-serif';
const charts = new Set();

const CONFIG = {
  responsive: true,
  displaylogo: false,
  // Plotly's "edit in chart studio" and the like would reach other origins.
  showLink: false,
  modeBarButtonsToRemove: ["lasso2d", "select2d", "sendDataToCloud"],
  toImageButtonOptions: { format: "png", scale: 2 },
};

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export function colors() {
  return { text: cssVar("--text"), muted: cssVar("--muted"), grid: cssVar("--grid"), line: cssVar("--line"),
    err: cssVar("--err"), warn: cssVar("--warn"), ok: cssVar("--ok"), accent: cssVar("--accent") };
}

/** An axis with a title (name and unit) in the dashboard's look. */
export function axis(title, extra = {}) {
  const c = colors();
  return { title: { text: plotText(title), standoff: 8 }, gridcolor: c.grid, linecolor: c.line,
    zerolinecolor: c.line, automargin: true, ...extra };
}

// Twenty colours that stay apart on light and dark (Plotly's ten repeat after ten
// lines, giving two reds); charts with more lines group them (series.js).
export const COLORWAY = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf", "#0b3d91", "#ffbb00", "#00a087", "#f564a9", "#6f4e37", "#7bc043",
  "#00bfff", "#9b870c", "#c71585", "#4b0082"];

/** A layout in the dashboard's look, merged with `extra`. */
export function layout(extra = {}) {
  const c = colors();
  return {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: FONT, color: c.text, size: 13 },
    margin: { l: 64, r: 24, t: 16, b: 52 },
    colorway: COLORWAY,
    legend: { orientation: "h", y: -0.25, yanchor: "top", font: { size: 12 } },
    hoverlabel: { font: { family: FONT } },
    uirevision: "keep", // zoom survives live updates
    ...extra,
  };
}

/**
 * A layout with the theme's colours of now: layouts are built when a view mounts, and
 * a chart first drawn after a theme change must not keep the colours of then.
 */
export function themed(lay) {
  const c = colors();
  const out = { ...lay, font: { ...(lay.font || {}), color: c.text } };
  for (const key of Object.keys(out)) {
    if (/^[xy]axis\d*$/.test(key)) out[key] = { ...out[key], gridcolor: c.grid, linecolor: c.line, zerolinecolor: c.line };
  }
  return out;
}

/** Draw a new chart into `div`; the div keeps Plotly's data (div.data, div.layout). */
export async function plot(div, traces, lay) {
  await window.Plotly.newPlot(div, traces, themed(lay), CONFIG);
  charts.add(div);
  return div;
}

/**
 * Log axes labelled at whole decades when the data spans two or more (Plotly's own
 * choice labels 2 and 5 in between: "5 2 10^-1 5 2"), at 1, 2, 5 only below that.
 */
export function fitLogTicks(div) {
  const full = div._fullLayout;
  if (!full) return;
  const update = {};
  for (const key of Object.keys(full)) {
    const ax = full[key];
    if (!/^yaxis\d*$/.test(key) || !ax || ax.type !== "log" || !Array.isArray(ax.range)) continue;
    const dtick = Math.abs(ax.range[1] - ax.range[0]) >= 2 ? 1 : "D2";
    if (div.layout[key] && div.layout[key].dtick !== dtick) update[`${key}.dtick`] = dtick;
  }
  if (Object.keys(update).length) window.Plotly.relayout(div, update);
}

/** Append points to traces: one call per chart per frame (see batcher.js). */
export function extend(div, update, indices, maxPoints) {
  stats.extendCalls += 1;
  return maxPoints === undefined
    ? window.Plotly.extendTraces(div, update, indices)
    : window.Plotly.extendTraces(div, update, indices, maxPoints);
}

export function purgeAll() {
  for (const div of charts) window.Plotly.purge(div);
  charts.clear();
}

/** Recolour every chart in place after a theme change (no data is redrawn). */
export function retheme() {
  const c = colors();
  for (const div of charts) {
    if (!div.isConnected || !div.layout) {
      charts.delete(div);
      continue;
    }
    const update = { "font.color": c.text };
    for (const key of Object.keys(div.layout)) {
      if (/^[xy]axis\d*$/.test(key)) {
        update[`${key}.gridcolor`] = c.grid;
        update[`${key}.linecolor`] = c.line;
        update[`${key}.zerolinecolor`] = c.line;
      }
    }
    window.Plotly.relayout(div, update);
  }
}
