// Gradient flow through depth (issue 19): per stack of blocks a depth x training-step
// heatmap (x = block l, y = step, colour = ‖∂L/∂x_l‖ on the page's heatmap scale),
// the latest depth profile (‖∂L/∂x_l‖ against l, log y), and the update-to-weight
// ratio of each block (log y, with the 1e-3 rule of thumb as a dashed line). History
// from GET /api/runs/{id}/depth and /update_ratios; live records' `depth` and
// `update_ratios` land in the same views (run.js feeds take()). A model with many
// parameters is summed up per block, as the server does (server/depth_reads.py): a
// block's ratio is the largest finite ratio of its parameters; the chart shows the
// top blocks and a search box finds the others (series.js).

import { plotText } from "./dom.js";
import { axis, layout, plot } from "./charts.js";
import { Heatmap } from "./heatmap.js";
import { num, seriesValues } from "./num.js";
import { panel, heatmapPanelId } from "./panels.js";
import { lineSearch } from "./runparts.js";
import { LineChart, positive } from "./series.js";

export const RATIO_GUIDE = 1e-3; // the update-to-weight rule of thumb
const RATIO = "update_ratio_block/";
const FLOOR = 1e-30; // a block with no gradient sits at the heatmap's floor on log axes

/** The block a parameter belongs to: the longest block name holding it, else its module. */
export function blockOf(param, blocks) {
  let best = "";
  for (const b of blocks) if (b.length > best.length && param.startsWith(`${b}.`)) best = b;
  if (best) return best;
  const dot = param.lastIndexOf(".");
  return dot > 0 ? param.slice(0, dot) : param;
}

/** A block's ratio from its parameters': the largest finite one, else Infinity, else NaN. */
export function blockRatio(values) {
  const ns = values.map(num).filter((n) => n !== null);
  const finite = ns.filter(Number.isFinite);
  if (finite.length) return Math.max(...finite);
  return ns.some((n) => n === Infinity || n === -Infinity) ? Infinity : NaN;
}

/** Block l's label: its module name where the trainer said it, else "stack[l]". */
export function blockLabel(stack, names, l) {
  return Array.isArray(names) && typeof names[l] === "string" ? names[l] : `${stack}[${l}]`;
}

// Blocks labelled by name along x up to this many (long names cut from the left);
// beyond, by number (the depth profile's hover names each block).
const NAMED_TICKS = 12;
const TICK_CHARS = 24;

/** Tick labels of `width` blocks: their names (shortened) when few, else Plotly's numbers. */
export function blockTicks(stack, names, width) {
  if (width < 1 || width > NAMED_TICKS) return { tickmode: "auto" };
  const ticks = [...Array(width).keys()];
  const short = (t) => (t.length > TICK_CHARS ? `…${t.slice(t.length - TICK_CHARS + 1)}` : t);
  return { tickmode: "array", tickvals: ticks, ticktext: ticks.map((l) => plotText(short(blockLabel(stack, names, l)))) };
}

/** A stack's depth heatmap: the time heatmap's drawing, with blocks along x. */
class DepthHeatmap extends Heatmap {
  constructor(div, stack, names) {
    super(div, stack, "depth");
    this.names = names;
  }

  xAxis() {
    return axis("block l (gradient at its input; loss side right)", { zeroline: false, range: this.xRange(),
      ...blockTicks(this.module, this.names, this.width) });
  }

  maxWidth(matrix) {
    return matrix && matrix.max_blocks ? matrix.max_blocks : 0;
  }

  traces() {
    const [heat, line] = super.traces();
    const what = `log10 ‖∂L/∂x_l‖${this.scale === "relative" ? " / step peak" : ""}`;
    heat.colorbar.title.text = what;
    heat.hovertemplate = `block %{x}<br>step %{y}<br>${what} = %{z:.1f}<extra></extra>`;
    line.name = "depth horizon";
    line.hovertemplate = "step %{y}: gradient reaches down to block %{x} (1e-3 of the peak)<extra></extra>";
    return [heat, line];
  }

  append(rows) {
    const before = this.width;
    super.append(rows);
    // More blocks than drawn: the tick labels follow the new width.
    if (this.width !== before && this.div.layout) window.Plotly.relayout(this.div, { xaxis: { ...this.div.layout.xaxis, ...this.xAxis() } });
  }
}

/** The latest depth profile of every stack: ‖∂L/∂x_l‖ against block l (log y). */
class DepthProfile {
  constructor(div, note) {
    this.div = div;
    this.note = note;
    this.latest = new Map(); // stack -> {step, values, names}
    this.drawn = false;
    this.visible = true;
    this.stale = false;
  }

  set(stack, step, values, names) {
    const prev = this.latest.get(stack);
    if (prev && prev.step > step) return false;
    this.latest.set(stack, { step, values, names });
    return true;
  }

  traces() {
    return [...this.latest].map(([stack, p]) => {
      const labels = p.values.map((_, l) => blockLabel(stack, p.names, l));
      return {
        type: "scatter", mode: "lines+markers", name: plotText(stack), marker: { size: 5 }, line: { width: 2 },
        x: p.values.map((_, l) => l),
        y: p.values.map((v) => { const n = num(v); return n === null || !Number.isFinite(n) ? null : Math.max(n, FLOOR); }),
        customdata: labels.map((label, l) => [plotText(label), String(p.values[l])]),
        hovertemplate: `${plotText(stack)} · %{customdata[0]}<br>‖∂L/∂x_l‖ %{customdata[1]}<extra>step ${p.step}</extra>`,
      };
    });
  }

  layout() {
    // One stack: its block names along x; several: block numbers (names in the hover).
    const stacks = [...this.latest];
    const one = stacks.length === 1 ? stacks[0] : null;
    const ticks = one ? blockTicks(one[0], one[1].names, one[1].values.length) : {};
    return layout({
      xaxis: axis("block l (input of; loss side right)", { zeroline: false, ...ticks }),
      yaxis: axis("gradient norm ‖∂L/∂x_l‖ (log)", { type: "log", exponentformat: "power" }),
    });
  }

  renderNote() {
    const steps = [...this.latest.values()].map((p) => p.step);
    const text = steps.length ? `step ${Math.max(...steps)}` : "";
    if (this.note.textContent !== text) this.note.textContent = text;
    this.div.dataset.step = steps.length ? String(Math.max(...steps)) : "";
  }

  async draw() {
    await plot(this.div, this.traces(), this.layout());
    this.drawn = true;
    this.renderNote();
  }

  setVisible(visible) {
    this.visible = visible;
    if (visible && this.stale) this.redraw();
  }

  redraw() {
    if (!this.drawn) return;
    this.stale = !this.visible;
    if (this.stale) return;
    window.Plotly.react(this.div, this.traces(), this.layout());
    this.renderNote();
  }

  get hasData() {
    return this.latest.size > 0;
  }
}

/** The chart spec of the ratio chart (series.js LineChart): one line per block. */
function ratioSpec(stackOf) {
  return {
    match: (k) => k.startsWith(RATIO),
    label: (k) => k.slice(RATIO.length),
    group: (k) => stackOf(k.slice(RATIO.length)) || "other modules",
    value: positive,
    layout: {
      xaxis: axis("training step", { zeroline: false }),
      yaxis: axis("update / weight ‖Δw‖ / ‖w‖ (log)", { type: "log", exponentformat: "power" }),
      // Shapes on a log axis take log10 coordinates: y = -3 is 1e-3.
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: Math.log10(RATIO_GUIDE), y1: Math.log10(RATIO_GUIDE),
        line: { dash: "dash", width: 1.5, color: "#d62728" } }],
      annotations: [{ xref: "paper", x: 0, y: Math.log10(RATIO_GUIDE), xanchor: "left", yanchor: "bottom",
        text: "1e-3 rule of thumb", showarrow: false, font: { color: "#d62728", size: 11 } }],
    },
  };
}

/** Each stack's block names as the trainer's hello says them (config.depth_blocks). */
function helloBlocks(summary, rank) {
  const hellos = summary.hello || {};
  const hello = hellos[String(rank)] || Object.values(hellos)[0] || {};
  const said = hello.config && hello.config.depth_blocks;
  return said && typeof said === "object" ? said : {};
}

/**
 * The depth panels of a run view: heatmaps (one per stack), the latest profile and the
 * ratio chart. run.js adds sections() to the page, load()s history, take()s live step
 * records and draws at its pace (views()).
 */
export class DepthPanels {
  constructor(summary, rank, onNewPanel) {
    this.rank = rank;
    this.names = helloBlocks(summary, rank);
    this.onNewPanel = onNewPanel; // a panel that joins after load: (section, view)
    this.heatmaps = new Map(); // stack -> {view, panel}
    this.stackOfBlock = new Map();
    for (const [stack, names] of Object.entries(this.names)) if (Array.isArray(names)) for (const b of names) this.stackOfBlock.set(b, stack);
    const prof = panel("depth-profile", "Latest depth profile", "Gradient norm at the input of each block l in the latest recorded step (log scale): the gradient the loss sends down the residual stream, loss side right. A drop towards block 0: vanishing through depth; a rise: exploding.");
    this.profile = { view: new DepthProfile(prof.chart, prof.note), panel: prof };
    const ratio = panel("ratios", "Update-to-weight ratio per block", "‖w_after − w_before‖ / ‖w_before‖ of each optimizer step, per block: the largest ratio among the block's parameters. Dashed: the 1e-3 rule of thumb (far above: steps too big; far below: the block barely learns). With many blocks the largest are drawn; search for the others.");
    ratio.nodata.textContent = "No update ratios yet. They are measured around a torch.optim optimizer's step() on the watched parameters, on recorded steps: call monitor.step() after optimizer.step(). An optimizer that is not a torch.optim.Optimizer, or one that steps copies of the parameters, gives none.";
    const view = new LineChart(ratio.chart, ratioSpec((b) => this.stackOfBlock.get(b)));
    ratio.section.querySelector("header").append(lineSearch("ratios", view));
    this.ratios = { view, panel: ratio };
    // In the model's order, as the hello lists the stacks (the summary sorts by name).
    const order = Object.keys(this.names);
    const at = (stack) => (order.includes(stack) ? order.indexOf(stack) : order.length);
    const stacks = Array.isArray(summary.depth) ? summary.depth.slice() : [];
    for (const stack of stacks.sort((a, b) => at(a) - at(b))) this.addStack(stack);
  }

  /** The panels, in page order (heatmaps, profile; the ratio chart goes with the lines). */
  sections() {
    return [...[...this.heatmaps.values()].map((h) => h.panel.section), this.profile.panel.section];
  }

  addStack(stack) {
    const p = panel("depth", `Gradient flow through depth: ${stack}`,
      "Each row is one training step, each column a block l (its input's gradient ‖∂L/∂x_l‖, loss side right); the dotted red line is the depth horizon (the lowest block within 1e-3 of the step's peak).",
      { tall: true, id: heatmapPanelId(`depth-${stack}`, "input") });
    p.section.dataset.stack = stack;
    p.section.classList.add("heat");
    const h = { view: new DepthHeatmap(p.chart, stack, this.names[stack]), panel: p };
    this.heatmaps.set(stack, h);
    return h;
  }

  /**
   * History of every stack (resolves when it is set on the heatmaps) and of the ratios
   * (drawn when it comes, as the line charts' history: first paint does not wait).
   */
  async load(api, runId, onError) {
    const id = encodeURIComponent(runId);
    const stacks = [...this.heatmaps.keys()];
    const ratios = api(`/api/runs/${id}/update_ratios`, { rank: this.rank, max_steps: 2000 });
    ratios.catch(onError);
    this.ratios.view.setHistory(ratios.then((r) => this.ratioSeries(r)));
    const matrices = await Promise.all(stacks.map((stack) =>
      api(`/api/runs/${id}/depth`, { stack, rank: this.rank, max_steps: 500 })));
    stacks.forEach((stack, i) => {
      const m = matrices[i];
      if (m && Array.isArray(m.blocks) && m.blocks.length && !this.names[stack]) this.names[stack] = m.blocks;
      if (m && m.steps && m.steps.length) this.profile.view.set(stack, m.steps[m.steps.length - 1], m.values[m.values.length - 1], this.names[stack]);
      this.heatmaps.get(stack).view.setHistory(m);
    });
  }

  /** The /update_ratios answer as LineChart series {key: {step, value}}. */
  ratioSeries(answer) {
    const out = {};
    for (const b of (answer && answer.blocks) || []) {
      if (b.stack) this.stackOfBlock.set(b.name, b.stack);
      const steps = [];
      const values = [];
      b.values.forEach((v, i) => { if (v !== null) { steps.push(answer.steps[i]); values.push(v); } });
      out[RATIO + b.name] = { step: steps, value: values };
    }
    return out;
  }

  /**
   * A live step record: its depth rows (held by the heatmaps) and its ratios per block
   * as chart points [{key, step, value}] (the caller gives them to the line charts).
   * Returns whether the profile changed.
   */
  take(rec, points) {
    let changed = false;
    for (const [stack, wire] of Object.entries(rec.depth || {})) {
      const values = seriesValues(wire);
      if (values === null) continue;
      const h = this.heatmaps.get(stack) || this.joinLive(stack);
      h.view.hold([{ step: rec.step, values }]);
      changed = this.profile.view.set(stack, rec.step, values, this.names[stack]) || changed;
    }
    if (rec.update_ratios && typeof rec.update_ratios === "object") {
      const known = [...this.stackOfBlock.keys()];
      const byBlock = new Map();
      for (const [param, value] of Object.entries(rec.update_ratios)) {
        const b = blockOf(param, known);
        if (!byBlock.has(b)) byBlock.set(b, []);
        byBlock.get(b).push(value);
      }
      for (const [b, values] of byBlock) points.push({ key: RATIO + b, step: rec.step, value: blockRatio(values) });
    }
    // A replay's records (replay.js) carry the ratios as the server summed them up.
    for (const [b, value] of Object.entries(rec.update_ratio_blocks || {})) points.push({ key: RATIO + b, step: rec.step, value });
    return changed;
  }

  /** A stack first seen live: its heatmap joins the page now. */
  joinLive(stack) {
    const h = this.addStack(stack);
    h.view.setHistory(null);
    this.onNewPanel(h.panel.section, h.view, this.profile.panel.section);
    return h;
  }

  /** {view, panel} of the heatmaps and the profile (the ratio chart is a line chart). */
  views() {
    return [...this.heatmaps.values(), this.profile];
  }

  rescale() {
    for (const { view } of this.heatmaps.values()) view.rescale();
  }
}
