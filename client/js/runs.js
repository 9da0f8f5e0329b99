// The runs list (#/): name, status, start time, duration, ranks, last step, alerts,
// newest first, filtered by name; live through /ws/live without a run (the server
// sends {"type": "run"} whenever a summary changes). Pick two runs to compare them
// overlaid; archive a run to take it off the list (its data stays, by id).

import { api, href, send } from "./api.js";
import { el, replaceChildren, visible } from "./dom.js";
import { FrameBatcher } from "./batcher.js";
import { connect } from "./live.js";
import { fmt, fmtAgo, fmtDuration, fmtTime, num } from "./num.js";
import { state, stats } from "./state.js";

export class RunsView {
  constructor(root, { preselect = null } = {}) {
    this.root = root;
    this.selected = new Set(preselect ? [preselect] : []);
    this.rows = new Map();
    this.started = new Map(); // id -> start time, for newest first
    this.archived = new Set(); // archived from this page: live summaries do not bring them back
    this.filter = "";
  }

  async mount() {
    this.body = el("tbody", { id: "runs-body" });
    this.compareButton = el("button", { type: "button", class: "primary", id: "compare-button", disabled: true,
      onclick: () => this.compare() }, "Compare 2 selected runs");
    replaceChildren(this.root,
      el("h1", {}, "Runs"),
      el("p", { class: "sub" }, "Training runs streaming to this server, newest first. Open one to see its gradient flow; pick two to overlay them (a bug and its fixed twin)."),
      el("div", { class: "toolbar" },
        el("input", { type: "search", id: "runs-filter", placeholder: "filter by name", "aria-label": "filter runs by name",
          oninput: (e) => { this.filter = e.target.value.trim().toLowerCase(); this.applyFilter(); } }),
        el("span", { class: "spacer" }), this.compareButton),
      this.message = el("p", { class: "note", id: "runs-message", role: "status" }),
      el("table", { class: "runs" },
        el("thead", {}, el("tr", {}, el("th", {}, "compare"), el("th", {}, "name"), el("th", {}, "status"),
          el("th", {}, "started"), el("th", { class: "num" }, "duration"),
          el("th", { class: "num" }, "ranks"), el("th", { class: "num" }, "last step"), el("th", { class: "num", title: "problems: alerts grouped by cause" }, "alerts"),
          el("th", {}, "updated"), el("th", {}, ""))),
        this.body));
    // Live summaries come with every batch a trainer sends (8 runs at 10 steps/s: 80 a
    // second); the latest of each run is applied once per draw (batcher.js).
    this.batcher = new FrameBatcher((runs) => {
      const latest = new Map();
      for (const run of runs) latest.set(run.id, run);
      for (const run of latest.values()) this.upsert(run, true);
    });
    this.heard = new Map(); // run id -> live summaries received (refresh() reads it)
    this.live = connect({}, (msg) => {
      if (msg.type === "run" && msg.run && typeof msg.run.id === "string") {
        this.heard.set(msg.run.id, (this.heard.get(msg.run.id) ?? 0) + 1);
        this.batcher.push(msg.run);
      }
    }, { onOpen: (reconnected) => { if (reconnected) this.refresh(); } });
    // the list is read once the server has subscribed this page (live.js): a run that
    // starts or ends in between is in the list or reaches it live
    await this.live.subscribed;
    await this.refresh();
    this.ticker = setInterval(() => this.tick(), 5000);
    stats.paintedAt = performance.now();
    document.body.dataset.painted = "1";
  }

  unmount() {
    if (this.live) this.live.close();
    if (this.batcher) this.batcher.close();
    clearInterval(this.ticker);
  }

  async refresh() {
    const before = new Map(this.heard);
    const runs = await api("/api/runs");
    for (const run of runs.slice().reverse()) {
      // A live summary that came while the list was read is at least as new as the
      // list's (every change after the subscription comes live): the list's may be
      // older, and drawn after it would take the row back (a finished run shown live).
      if ((this.heard.get(run.id) ?? 0) !== (before.get(run.id) ?? 0)) continue;
      this.upsert(run, false);
    }
    this.renderEmpty();
  }

  renderEmpty() {
    if (this.rows.size === 0 && !this.body.querySelector(".empty-row")) {
      this.body.append(el("tr", { class: "empty-row" }, el("td", { colspan: 10, class: "empty" },
        "No runs yet. Start one with watch(model, run=\"my-run\", server=\"ws://127.0.0.1:8765\").")));
    }
  }

  upsert(run, live) {
    if (this.archived.has(run.id) || run.archived === true) return;
    state.runs.set(run.id, run);
    const empty = this.body.querySelector(".empty-row");
    if (empty) empty.remove();
    const status = String(run.status ?? "unknown");
    const old = this.rows.get(run.id);
    // A run already listed, same status: its changing cells are rewritten in place (a
    // new row per summary restyled the table and replayed the highlight every time).
    if (old && old.dataset.status === status && old.dataset.name === String(run.name ?? run.id)) {
      this.updateCells(old, run);
      this.started.set(run.id, num(run.started) ?? 0);
      this.applyFilter(run.id);
      return;
    }
    const alerts = Number(run.alerts ?? 0);
    const box = el("input", { type: "checkbox", "aria-label": "select for comparison", checked: this.selected.has(run.id),
      onchange: (e) => { if (e.target.checked) this.selected.add(run.id); else this.selected.delete(run.id); this.updateButton(); } });
    const row = el("tr", { dataset: { runId: run.id, status, name: String(run.name ?? run.id) },
      class: live && !old ? "fresh" : null },
      el("td", {}, box),
      el("td", { class: "name" }, el("a", { href: href(`#/run/${encodeURIComponent(run.id)}`), class: "run-link" }, String(run.name ?? run.id))),
      el("td", {}, el("span", { class: `badge ${status}`, dataset: { status } }, status)),
      el("td", { dataset: { field: "started" } }, fmtTime(run.started)),
      el("td", { class: "num", dataset: { field: "duration" }, title: "from the first hello to the latest record" },
        fmtDuration((num(run.updated) ?? NaN) - (num(run.started) ?? NaN))),
      el("td", { class: "num", dataset: { field: "ranks" } }, (run.ranks || []).length || 1),
      el("td", { class: "num", dataset: { field: "last_step" } }, fmt(run.last_step)),
      el("td", { class: "num", dataset: { field: "alerts" } }, alerts ? el("span", { class: "count-alerts" }, String(alerts)) : "0"),
      el("td", { class: "ago", dataset: { t: run.updated ?? "" } }, fmtAgo(run.updated)),
      el("td", { class: "actions" }, status === "live" ? null : el("a", { href: href(`#/replay/${encodeURIComponent(run.id)}`) }, "replay"),
        el("button", { type: "button", class: "archive", title: "take this run off the list; its data stays readable by id",
          onclick: () => this.archive(run) }, "archive")));
    if (old) old.replaceWith(row);
    this.rows.set(run.id, row);
    this.started.set(run.id, num(run.started) ?? 0);
    if (!old) this.order();
    this.applyFilter(run.id);
    this.updateButton();
  }

  /** Rewrite the cells that change while a run streams, each only when its text does. */
  updateCells(row, run) {
    const set = (field, text) => {
      const cell = row.querySelector(`td[data-field=${field}]`);
      if (cell && cell.textContent !== text) cell.textContent = text;
    };
    set("started", fmtTime(run.started));
    set("duration", fmtDuration((num(run.updated) ?? NaN) - (num(run.started) ?? NaN)));
    set("ranks", String((run.ranks || []).length || 1));
    set("last_step", fmt(run.last_step));
    const alerts = Number(run.alerts ?? 0);
    const cell = row.querySelector("td[data-field=alerts]");
    if (cell && cell.textContent !== String(alerts)) {
      cell.replaceChildren(alerts ? el("span", { class: "count-alerts" }, String(alerts)) : "0");
    }
    const ago = row.querySelector("td.ago");
    if (ago && ago.dataset.t !== String(run.updated ?? "")) {
      ago.dataset.t = String(run.updated ?? "");
      ago.textContent = fmtAgo(run.updated);
    }
  }

  /** Newest first by start time (a run's row keeps its place when it updates). */
  order() {
    const ids = [...this.rows.keys()].sort((a, b) => this.started.get(b) - this.started.get(a));
    for (const id of ids) this.body.append(this.rows.get(id));
  }

  applyFilter(only = null) {
    for (const [id, row] of this.rows) {
      if (only !== null && id !== only) continue;
      const run = state.runs.get(id);
      const name = String((run && (run.name ?? run.id)) ?? id).toLowerCase();
      row.hidden = this.filter !== "" && !name.includes(this.filter) && !id.toLowerCase().startsWith(this.filter);
    }
  }

  /** Archive a run (the server wants the ingest token): off this list, data kept. */
  async archive(run) {
    try {
      await send(`/api/runs/${encodeURIComponent(run.id)}/archived`, "PUT", { archived: true });
    } catch (err) {
      this.message.textContent = visible(`Cannot archive ${String(run.name ?? run.id)}: ${err.message}`);
      return;
    }
    this.archived.add(run.id);
    this.selected.delete(run.id);
    const row = this.rows.get(run.id);
    if (row) row.remove();
    this.rows.delete(run.id);
    this.message.textContent = visible(`Archived ${String(run.name ?? run.id)}; it stays readable at #/run/${run.id}.`);
    this.renderEmpty();
    this.updateButton();
  }

  tick() {
    for (const cell of this.body.querySelectorAll("td.ago")) {
      const text = fmtAgo(cell.dataset.t);
      if (cell.textContent !== text) cell.textContent = text;
    }
  }

  updateButton() {
    const n = this.selected.size;
    this.compareButton.disabled = n !== 2;
    this.compareButton.textContent = n === 2 ? "Compare the 2 selected runs" : `Compare: select 2 runs (${n} selected)`;
  }

  compare() {
    const [a, b] = [...this.selected];
    window.location.hash = `#/compare/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
  }
}
