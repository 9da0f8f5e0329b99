// The alerts panel: each diagnosis's message, evidence and fix, with a button that
// takes you to the chart and the step where it fired. All text goes through text
// nodes: alert text quotes module names, which come from the trainer.

import { el, replaceChildren } from "./dom.js";
import { fmt } from "./num.js";

const ORDER = { error: 0, warning: 1, info: 2 };

function evidenceText(value) {
  if (Array.isArray(value)) {
    const shown = value.slice(0, 8).map(evidenceText).join(", ");
    return value.length > 8 ? `[${shown}, … ${value.length} values]` : `[${shown}]`;
  }
  if (value !== null && typeof value === "object") {
    return Object.entries(value).slice(0, 8).map(([k, v]) => `${k}: ${evidenceText(v)}`).join(", ");
  }
  if (typeof value === "number" || value === "NaN" || value === "Infinity" || value === "-Infinity") return fmt(value);
  return String(value);
}

/** Which chart an alert points at (the run view resolves the key to a panel). */
export function alertTarget(alert) {
  switch (alert.code) {
    case "vanishing":
    case "exploding":
      return { kind: "heatmap", module: alert.subject };
    case "nonfinite":
      return { kind: "norms" };
    case "graph_growth":
      return { kind: "graph" };
    case "slowdown":
      return { kind: "time" };
    case "hotspot":
      return { kind: "modules" };
    case "spike":
      // a loss spike on the loss chart; a block's gradient spike on its stack's depth
      // heatmap (the norms where the page has none)
      return alert.subject === "loss" ? { kind: "loss" } : { kind: "depth", stack: alert.subject };
    case "no_gradient":
      return alert.subject && alert.subject !== "model" ? { kind: "heatmap", module: alert.subject } : { kind: "norms" };
    default:
      return { kind: "norms" };
  }
}

/** The cause an alert belongs to (alerts sharing it are one problem, one card). */
export function problemOf(alert) {
  if (typeof alert.problem === "string" && alert.problem) return alert.problem;
  if (alert.code === "graph_growth" || alert.code === "no_gradient") return String(alert.code);
  return `${alert.code}:${alert.subject ?? ""}`;
}

/** 1 when an alert record opens a problem, as the server counts them (server/store/rows.py
 * `opens_problem`): the sender says so, or, from a sender that does not group, a raise
 * without a `problem`. */
export function opensProblem(alert) {
  if (typeof alert.opens_problem === "boolean") return alert.opens_problem ? 1 : 0;
  return alert.problem == null && alert.state === "raised" ? 1 : 0;
}

export class AlertsPanel {
  /** onGoto(alert) is called when the user asks to see an alert on its chart. */
  constructor(list, onGoto) {
    this.list = list;
    this.onGoto = onGoto;
    // rank|problem -> {rank, members: Map(code|subject -> {first, latest, held})}
    this.problems = new Map();
  }

  add(alert, rank) {
    const key = `${rank}|${problemOf(alert)}`;
    let problem = this.problems.get(key);
    if (!problem) {
      problem = { rank, members: new Map() };
      this.problems.set(key, problem);
    }
    const member = `${alert.code}|${alert.subject ?? ""}`;
    const known = problem.members.get(member);
    // held: the latest record that still held, so that a cleared card keeps the
    // message and the fix that belong together
    const held = alert.state === "cleared" ? null : alert;
    if (!known) problem.members.set(member, { first: alert, latest: alert, held });
    else if ((alert.step ?? 0) >= (known.latest.step ?? 0)) {
      known.latest = alert;
      if (held) known.held = held;
    }
  }

  /** Problems (cards), not records: what every count on screen shows. */
  get size() {
    return this.problems.size;
  }

  get active() {
    return [...this.problems.values()].filter((p) => this._members(p).some((m) => m.latest.state !== "cleared")).length;
  }

  _members(problem) {
    return [...problem.members.values()].sort((a, b) => (a.first.step ?? 0) - (b.first.step ?? 0));
  }

  render() {
    if (!this.problems.size) {
      replaceChildren(this.list, el("p", { class: "empty" }, "No alerts: no diagnosis has fired for this run."));
      return;
    }
    const cards = [...this.problems.values()].map((p) => {
      const members = this._members(p);
      const open = members.filter((m) => m.latest.state !== "cleared");
      const lead = open[0] ?? members[0];
      return { rank: p.rank, members, lead, cleared: open.length === 0 };
    });
    cards.sort((a, b) => (a.cleared ? 1 : 0) - (b.cleared ? 1 : 0)
      || (ORDER[a.lead.latest.severity] ?? 3) - (ORDER[b.lead.latest.severity] ?? 3)
      || (a.members[0].first.step ?? 0) - (b.members[0].first.step ?? 0));
    replaceChildren(this.list, cards.map((card) => this._item(card)));
  }

  _item({ rank, members, lead, cleared }) {
    const { first, latest } = lead;
    const shown = lead.held ?? latest; // a cleared record says only "no longer holds"
    const severity = ["error", "warning", "info"].includes(shown.severity) ? shown.severity : "info";
    const evidence = shown.evidence && typeof shown.evidence === "object" ? Object.entries(shown.evidence) : [];
    const stepText = latest.step !== first.step
      ? `raised at step ${first.step}, latest at step ${latest.step}` : `at step ${first.step}`;
    const subjects = [...new Set(members.map((m) => String(m.first.subject ?? "")).filter(Boolean))];
    const codes = [...new Set(members.map((m) => String(m.first.code)))];
    const others = members.filter((m) => m !== lead);
    return el("article", { class: `alert ${severity}${cleared ? " cleared" : ""}`,
      dataset: { code: String(latest.code), problem: problemOf(latest), members: String(members.length) } },
      el("div", { class: "head" },
        el("span", { class: `badge ${cleared ? "cleared" : severity}` }, cleared ? "cleared" : severity),
        el("span", { class: "code" }, codes.join(", ")),
        subjects.length ? el("span", { class: "mono subjects" }, subjects.join(", ")) : null,
        rank ? el("span", { class: "note" }, `rank ${rank}`) : null,
        el("button", { type: "button", class: "goto", title: "show on the chart",
          onclick: () => this.onGoto(first, latest) }, `${stepText} →`)),
      el("p", { class: "message" }, String(shown.message ?? "")),
      cleared ? el("p", { class: "note cleared-note" }, String(latest.message ?? "")) : null,
      shown.hint ? el("p", { class: "fix" }, String(shown.hint)) : null,
      others.length ? el("ul", { class: "members" }, others.map((m) => el("li", {},
        el("span", { class: "mono" }, String(m.first.subject ?? "")), " ",
        String((m.held ?? m.latest).message ?? "")))) : null,
      evidence.length ? el("dl", {}, evidence.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, evidenceText(v))))) : null);
  }
}
