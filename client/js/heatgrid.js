// The run view's heatmap grid and alert jumps, kept apart from its data flow (run.js):
// a module's series or a stack first seen live joins the grid beside its siblings, and
// an alert's "raised at step" link scrolls to the chart it is about and marks the step.
// Each takes the RunView (``run``) whose panels it places.

import { alertTarget } from "./alerts.js";
import { bySeries } from "./history.js";
import { num } from "./num.js";
import { heatmapPanel } from "./runparts.js";

const domOrder = (a, b) => (a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING ? -1 : 1);

/** A panel that joins the heatmap grid after load (a series or stack first seen live). */
export function joinPanel(run, section, view, before) {
  if (run.noHeat) run.noHeat.remove();
  run.noHeat = null;
  run.heatGrid.insertBefore(section, before);
  if (run.byPanel && run.observer) {
    run.byPanel.set(section, view);
    run.observer.observe(section);
  } else view.force();
}

/** A module's series first seen live: its heatmap panel joins the page now. */
export function addHeatmap(run, key) {
  const [module, series] = [key.slice(0, key.lastIndexOf("|")), key.slice(key.lastIndexOf("|") + 1)];
  // The module's placeholder, still empty, gives way to its first real series (a cell's
  // "hidden" and "cell" instead of the "input" guessed before any step came).
  let spot = null;
  for (const [other, { view, panel: p, placeholder }] of run.heatmaps) {
    if (placeholder && view.module === module && !view.hasData) {
      spot = p.section.nextSibling;
      run.heatmaps.delete(other);
      if (run.byPanel) run.byPanel.delete(p.section);
      if (run.observer) run.observer.unobserve(p.section);
      p.section.remove();
    }
  }
  const h = heatmapPanel(module, series);
  run.heatmaps.set(key, h);
  run.profile.panel.section.hidden = false;
  // Beside its module's other heatmaps, in their order (a layer's after the input).
  const later = [...run.heatmaps.values()].filter(({ view }) => view.module === module && bySeries(view.series, series) > 0)
    .sort((a, b) => bySeries(a.view.series, b.view.series));
  const siblings = [...run.heatmaps.values()].filter(({ view }) => view.module === module && view !== h.view);
  const before = later.length ? later[0].panel.section
    : siblings.length ? siblings.map(({ panel: p }) => p.section).sort(domOrder).pop().nextSibling
      : spot || run.profile.panel.section;
  h.view.setHistory(null);
  joinPanel(run, h.panel.section, h.view, before);
  return h;
}

/** Scroll to the chart an alert is about and mark the step where it fired. */
export async function gotoAlert(run, first, latest) {
  const target = alertTarget(latest);
  let section = null;
  const step = num(first.step);
  const text = `${latest.code} at step ${first.step}`;
  const stackMap = target.kind === "depth" ? run.depth.heatmaps.get(target.stack) : null;
  if (stackMap || target.kind === "heatmap") {
    const h = stackMap || [...run.heatmaps.values()].find(({ view }) => view.module === target.module);
    if (h) {
      await h.view.setVisible(true);
      h.view.mark(step, "#ff4d4d", text);
      section = h.panel.section;
    } else section = run.profile.panel.section;
  } else {
    const c = run.charts.get(target.kind) || run.charts.get("norms");
    await c.view.setVisible(true);
    if (c.view.hasData) {
      window.Plotly.relayout(c.panel.chart, {
        shapes: [{ type: "line", yref: "paper", y0: 0, y1: 1, x0: step, x1: step, line: { color: "#ff4d4d", width: 2, dash: "dot" } }],
        annotations: [{ yref: "paper", y: 1, x: step, yanchor: "bottom", text: text, showarrow: false, font: { color: "#ff4d4d" } }],
      });
    }
    section = c.panel.section;
  }
  section.scrollIntoView({ behavior: "smooth", block: "center" });
  section.classList.add("flash");
  setTimeout(() => section.classList.remove("flash"), 1200);
  section.dataset.marked = String(first.step);
}
