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

/** A layout in the dashboard's look, merged with `extra`. */
export function layout(extra = {}) {
  const c = colors();
  return {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: { family: FONT, color: c.text, size: 13 },
    margin: { l: 64, r: 24, t: 16, b: 52 },
    legend: { orientation: "h", y: -0.22, font: { size: 12 } },
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
