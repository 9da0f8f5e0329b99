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
    default:
      return { kind: "norms" };
  }
}

export class AlertsPanel {
  /** onGoto(alert) is called when the user asks to see an alert on its chart. */
  constructor(list, onGoto) {
    this.list = list;
    this.onGoto = onGoto;
    this.alerts = new Map(); // rank|code|subject -> {first, latest}
  }

  add(alert, rank) {
    const key = `${rank}|${alert.code}|${alert.subject ?? ""}`;
    const known = this.alerts.get(key);
    if (!known) this.alerts.set(key, { first: alert, latest: alert, rank });
    else if ((alert.step ?? 0) >= (known.latest.step ?? 0)) known.latest = alert;
  }

  get size() {
    return this.alerts.size;
  }

  get active() {
    return [...this.alerts.values()].filter((a) => a.latest.state !== "cleared").length;
  }

  render() {
    if (!this.alerts.size) {
      replaceChildren(this.list, el("p", { class: "empty" }, "No alerts: no diagnosis has fired for this run."));
      return;
    }
    const items = [...this.alerts.values()].sort((a, b) => {
      const ca = a.latest.state === "cleared" ? 1 : 0;
      const cb = b.latest.state === "cleared" ? 1 : 0;
      return ca - cb || (ORDER[a.latest.severity] ?? 3) - (ORDER[b.latest.severity] ?? 3) || (a.first.step ?? 0) - (b.first.step ?? 0);
    });
    replaceChildren(this.list, items.map((item) => this._item(item)));
  }

  _item({ first, latest, rank }) {
    const severity = ["error", "warning", "info"].includes(latest.severity) ? latest.severity : "info";
    const cleared = latest.state === "cleared";
    const evidence = latest.evidence && typeof latest.evidence === "object" ? Object.entries(latest.evidence) : [];
    const stepText = latest.step !== first.step
      ? `raised at step ${first.step}, latest at step ${latest.step}` : `at step ${first.step}`;
    return el("article", { class: `alert ${severity}${cleared ? " cleared" : ""}`, dataset: { code: String(latest.code) } },
      el("div", { class: "head" },
        el("span", { class: `badge ${cleared ? "cleared" : severity}` }, cleared ? "cleared" : severity),
        el("span", { class: "code" }, String(latest.code)),
        latest.subject ? el("span", { class: "mono" }, String(latest.subject)) : null,
        rank ? el("span", { class: "note" }, `rank ${rank}`) : null,
        el("button", { type: "button", class: "goto", title: "show on the chart",
          onclick: () => this.onGoto(first, latest) }, `${stepText} →`)),
      el("p", { class: "message" }, String(latest.message ?? "")),
      latest.hint ? el("p", { class: "fix" }, String(latest.hint)) : null,
      evidence.length ? el("dl", {}, evidence.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, evidenceText(v))))) : null);
  }
}
