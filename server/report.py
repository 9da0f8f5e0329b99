"""``gradwatch report RUN -o run.html``: one run as a standalone HTML file.

The file carries Plotly.js inline and the run's data as JSON, so it opens anywhere
with no server and no network: attach it to a message after a demo. It shows the
dashboard's charts (server/report_charts.py mirrors client/js) and one card per
problem, with the modules it involves, its evidence and its fix
(server/report_alerts.py, the dashboard's grouping). Everything from the trainer is
escaped: names are text.

Example:
    $ gradwatch report rotation-lstm -o run.html --db gradwatch.db
    >>> html = render_report(store, "rotation-lstm")   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from html import escape as html_escape
from importlib.resources import files
from pathlib import Path
from typing import Any

from gradwatch.protocol.names import visible

from .report_alerts import alerts_html, problem_cards
from .report_charts import heatmap_figure, line_figures, profile_figure
from .settings import Settings
from .store import RunNotFound, Store, open_store
from .store.tables import SchemaMismatch


def escape(text: str) -> str:
    """Text for the page: HTML escaped, invisible controls shown as codes (a name with
    U+202E is not shown reversed). The stored name stays as sent."""
    return html_escape(visible(text))


TITLES = {
    "norms": ("Gradient norms per layer", "L2 norm of each parameter's gradient and the total; "
              "✕ marks steps with NaN or Inf."),
    "gates": ("Gradient norms per gate", "LSTM gates i f g o, GRU gates r z n."),
    "loss": ("Loss", ""),
    "time": ("Step time", "Wall time of each training step, with its rolling median."),
    "epochs": ("Epoch time", ""),
    "graph": ("Autograd graph and memory", "Nodes reachable from loss.grad_fn (left) and memory "
              "(right, dotted)."),
    "modules": ("Time per module", "Forward and backward time per step."),
}  # fmt: skip

# Draws the figures embedded as JSON; no data is ever interpolated into this script.
_RENDER_JS = """
(function () {
  var figures = JSON.parse(document.getElementById("gradwatch-figures").textContent);
  var css = getComputedStyle(document.documentElement);
  var text = css.getPropertyValue("--text").trim(), grid = css.getPropertyValue("--grid").trim();
  Object.keys(figures).forEach(function (id) {
    var fig = figures[id], layout = fig.layout;
    layout.font = {color: text, family: getComputedStyle(document.body).fontFamily};
    Object.keys(layout).forEach(function (k) {
      if (/^[xy]axis\\d*$/.test(k)) { layout[k].gridcolor = grid; layout[k].linecolor = grid; }
    });
    Plotly.newPlot(document.getElementById(id), fig.data, layout,
      {responsive: true, displaylogo: false, showLink: false});
  });
  document.body.dataset.painted = "1";
})();
"""


class ReportError(ValueError):
    """The report cannot be written: what was expected and what was found."""


def resolve_run(store: Store, ref: str) -> dict[str, Any]:
    """A run summary by id, or by name (the newest run of that name)."""
    try:
        return store.run_summary(ref)
    except RunNotFound:
        pass
    runs = store.list_runs()
    named = [r for r in runs if r["name"] == ref]
    if named:
        return max(named, key=lambda r: r["started"] or 0)
    known = ", ".join(repr(r["name"]) for r in runs[:10]) or "none"
    raise ReportError(f"expected a run id or name in the database, got {ref!r} (runs: {known})")


#: a recurrent module without one row, as the run view says it (client/js/runparts.js)
NO_ROWS = (
    "No per-timestep gradient reached {module} in the recorded steps. Its rows come from "
    "captured steps, once a backward runs through its outputs: a module whose outputs need "
    "no gradient (its weights frozen and its inputs needing none) never gets one."
)


def _note(panel_id: str, title: str, note: str) -> str:
    """A panel with a sentence where a chart would be: why there is none."""
    return (
        f'<section class="panel" id="panel-{panel_id}"><header><h2>{escape(title)}</h2></header>'
        f'<p class="nodata">{escape(note)}</p></section>'
    )


def _panel(panel_id: str, title: str, caption: str, tall: bool = False) -> str:
    cap = f'<p class="caption">{escape(caption)}</p>' if caption else ""
    return (
        f'<section class="panel" id="panel-{panel_id}"><header><h2>{escape(title)}</h2></header>'
        f'<div class="chart{" tall" if tall else ""}" id="chart-{panel_id}"></div>{cap}</section>'
    )


def render_report(store: Store, ref: str, rank: int = 0) -> str:
    """The standalone HTML of one run (Plotly inline, no network)."""
    from plotly.offline import get_plotlyjs

    summary = resolve_run(store, ref)
    run_id = summary["id"]
    detail = store.run_detail(run_id)
    steps = store.steps(run_id, rank=rank, max_points=4000)
    epochs = store.epochs(run_id, rank=rank)
    alerts = store.alerts(run_id)
    figures: dict[str, Any] = {}
    heat_panels: list[str] = []
    heatmap_ids: dict[str, str] = {}
    profiles: list[tuple[str, list[Any]]] = []
    for i, (module, series_list) in enumerate(sorted((detail.get("series") or {}).items())):
        for j, series in enumerate(series_list):
            matrix = store.timesteps(run_id, module, series, rank=rank, max_steps=500)
            pid = f"heatmap-{i}-{j}"
            heatmap_ids.setdefault(module, f"panel-{pid}")
            label = module if series == "input" else f"{module} · {series}"
            heat_panels.append(_panel(pid, f"Gradient flow through time: {label}",
                                      "Rows: training steps; colour: log10 of the norm, fixed "
                                      "scale 1e-30 … 1e3.", tall=True))  # fmt: skip
            figures[f"chart-{pid}"] = heatmap_figure(module, series, matrix)
            if matrix["values"]:
                profiles.append((label, matrix["values"][-1]))
    recorded = detail.get("series") or {}
    silent = [m for m in summary.get("recurrent") or [] if m not in recorded]
    for k, module in enumerate(silent):  # named in the hello, never a row: say so
        heat_panels.append(_note(f"heatmap-none-{k}", f"Gradient flow through time: {module}",
                                 NO_ROWS.format(module=module)))
    if profiles:
        figures["chart-profile"] = profile_figure(profiles)
    lines = line_figures(steps["fields"], epochs)
    line_panels = []
    for key, fig in lines.items():
        figures[f"chart-{key}"] = fig
        line_panels.append(_panel(key, *TITLES[key]))
    profile_panel = ""
    if profiles:
        caption = "Dashed: the vanishing horizon. Shaded: exploding."
        profile_panel = _panel("profile", "Latest per-timestep profile", caption)
    css = (files("gradwatch.client") / "style.css").read_text(encoding="utf-8")
    data = json.dumps(figures, separators=(",", ":"), allow_nan=False)
    # "</script>" inside JSON would end the block; \u003c keeps the JSON identical.
    data = data.replace("<", "\\u003c")
    name = str(summary["name"])
    # problems (the cards below), not records, as the runs list and the dashboard count
    problems = len(problem_cards(alerts))
    status = summary.get("end_status") or "not ended"
    last = summary.get("last_step")
    facts = [f"run {run_id}", f"status {status}", f"ranks {', '.join(map(str, summary['ranks']))}",
             f"last step {last}", f"{problems} alerts", f"host {summary['host']}",
             "report written " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())]  # fmt: skip
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>gradwatch report: {escape(name)}</title>
<style>{css}</style></head>
<body><header class="topbar"><span class="brand">gradwatch report</span></header>
<main><h1 id="run-name">{escape(name)}</h1><p class="sub">{escape(" · ".join(facts))}</p>
<section class="panel" id="panel-alerts"><header><h2>Alerts</h2></header>
{alerts_html(alerts, heatmap_ids)}</section>
<div class="grid">{"".join(heat_panels)}{profile_panel}</div>
<div class="grid">{"".join(line_panels)}</div></main>
<script type="application/json" id="gradwatch-figures">{data}</script>
<script>{get_plotlyjs()}</script>
<script>{_RENDER_JS}</script>
</body></html>
"""


def write_report(db: str, ref: str, output: str | Path, rank: int = 0) -> Path:
    """Write the report of run ``ref`` (id or name) stored in ``db`` to ``output``."""
    settings = Settings(db=db, writer_process=False)  # it only reads: no writer to start
    if settings.db_kind == "sqlite" and not Path(db).is_file():
        raise ReportError(f"expected a gradwatch database at {db!r}, got no such file")
    try:
        store = open_store(settings)
    except SchemaMismatch as error:  # another storage layout: the line says what to do
        raise ReportError(str(error)) from None
    try:
        html = render_report(store, ref, rank=rank)
    finally:
        store.close()
    path = Path(output)
    path.write_text(html, encoding="utf-8")
    return path


def main(args: argparse.Namespace) -> int:
    """The ``gradwatch report`` command."""
    try:
        path = write_report(args.db, args.run, args.output, rank=getattr(args, "rank", 0))
    except ReportError as error:
        print(f"gradwatch report: {error}", file=sys.stderr)
        return 2
    print(f"gradwatch report: wrote {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")
    return 0
