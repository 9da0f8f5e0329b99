"""The charts of ``gradwatch report``, as Plotly figure dicts.

They mirror the dashboard's run view (client/js/heatmap.js, profile.js, panels.js):
the same fixed log10 colour scale for the heatmaps, the same horizon and exploding
band on the profile, the same axis titles and units. Names from the trainer go
through :func:`plot_text`, because Plotly renders some HTML-like tags in labels.

Example:
    >>> fig = heatmap_figure("lstm", "input", {"steps": [0], "values": [[0.0, 1e-3, 1.0]]})
    >>> fig["data"][0]["z"]
    [[-30.0, -3.0, 0.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gradwatch.protocol.codec import to_float
from gradwatch.protocol.names import visible

LOG_MIN = -30.0
LOG_MAX = 3.0
HORIZON_FACTOR = 1e-3
EXPLODING_NORM = 1e2
_TICKS = [-30, -25, -20, -15, -10, -5, 0, 3]
_MIB = 1024 * 1024

Figure = dict[str, Any]
Series = dict[str, dict[str, list[Any]]]


def plot_text(value: object) -> str:
    """Escape text for Plotly labels: a run named ``<b>x</b>`` stays those characters,
    and invisible controls are shown as codes (:func:`~gradwatch.protocol.names.visible`)."""
    text = visible(str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def number(value: Any) -> float | None:
    """A protocol number as a finite float, or None (a gap) for NaN/Inf/missing."""
    if value is None:
        return None
    try:
        f = to_float(value)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def log_norm(value: Any) -> float | None:
    """log10 of a norm on the heatmap's fixed scale; 0 is the floor, NaN a gap."""
    if value is None:
        return None
    try:
        f = to_float(value)
    except ValueError:
        return None
    if math.isnan(f):
        return None
    if f <= 0:
        return LOG_MIN
    if math.isinf(f):
        return LOG_MAX
    return min(LOG_MAX, max(LOG_MIN, math.log10(f)))


def horizon(values: list[Any], factor: float = HORIZON_FACTOR) -> int | None:
    """The earliest timestep whose norm is within ``factor`` of the largest."""
    finite = [number(v) for v in values]
    largest = max((v for v in finite if v is not None), default=0.0)
    if largest <= 0:
        return None
    for t, v in enumerate(finite):
        if v is not None and v >= largest * factor:
            return t
    return None


def series_symbol(series: str) -> str:
    if series == "hidden":
        return "‖∂L/∂h_t‖"
    if series == "cell":
        return "‖∂L/∂c_t‖"
    if series.startswith("layer") and series[5:].isdigit():
        return f"‖∂L/∂x_t‖ (layer {series[5:]})"
    return "‖∂L/∂x_t‖"


def _axis(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": plot_text(title)}, "automargin": True, **extra}


def _layout(**extra: Any) -> dict[str, Any]:
    return {
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "margin": {"l": 64, "r": 24, "t": 16, "b": 52},
        "legend": {"orientation": "h", "y": -0.22},
        **extra,
    }


def heatmap_figure(module: str, series: str, matrix: dict[str, Any]) -> Figure:
    """x = timestep, y = training step, colour = log10 norm on the fixed scale."""
    values: list[list[Any]] = matrix.get("values") or []
    width = max((len(r) for r in values), default=0)
    rows = [[log_norm(v) for v in r] + [None] * (width - len(r)) for r in values]
    symbol = series_symbol(series)
    trace = {
        "type": "heatmap",
        "z": rows,
        "y": list(matrix.get("steps") or []),
        "colorscale": "Viridis",
        "zmin": LOG_MIN,
        "zmax": LOG_MAX,
        "hoverongaps": False,
        "colorbar": {
            "title": {"text": f"log10 {symbol}", "side": "right"},
            "tickvals": _TICKS,
            "ticktext": ["1" if t == 0 else f"1e{t}" for t in _TICKS],
            "thickness": 14,
        },
        "hovertemplate": (
            f"timestep %{{x}}<br>step %{{y}}<br>log10 {symbol} = %{{z:.1f}}<extra></extra>"
        ),
    }
    return {
        "data": [trace],
        "layout": _layout(
            xaxis=_axis("timestep t (sequence position)", zeroline=False),
            yaxis=_axis("training step", zeroline=False),
        ),
    }


def profile_figure(profiles: list[tuple[str, list[Any]]]) -> Figure:
    """The latest per-timestep profile per module, log y, horizon and exploding band.

    Each dashed line is the horizon of the profile it is drawn over, never an alert's:
    an alert judged an older step, and a cleared one no longer holds.
    """
    traces: list[dict[str, Any]] = []
    top, bottom, width = EXPLODING_NORM * 10, 1.0, 1
    for label, values in profiles:
        ys: list[float | None] = []
        for v in values:
            n = number(v)
            ys.append(None if n is None else max(n, 1e-30))
        for y in ys:
            if y is not None:
                top, bottom = max(top, y * 3), min(bottom, y)
        width = max(width, len(ys))
        traces.append({
            "type": "scatter", "mode": "lines+markers", "name": plot_text(label),
            "x": list(range(len(ys))), "y": ys, "marker": {"size": 4},
        })  # fmt: skip
    traces.append({
        "type": "scatter", "mode": "lines", "name": f"exploding (> {EXPLODING_NORM:.0e})",
        "x": [0, width - 1, width - 1, 0, 0],
        "y": [EXPLODING_NORM, EXPLODING_NORM, top, top, EXPLODING_NORM],
        "fill": "toself", "fillcolor": "rgba(220, 50, 50, 0.12)", "line": {"width": 0},
        "hoverinfo": "skip",
    })  # fmt: skip
    for label, values in profiles:
        h = horizon(values)
        if h:
            traces.append({
                "type": "scatter", "mode": "lines", "name": plot_text(f"horizon {label}: t = {h}"),
                "x": [h, h], "y": [min(bottom, 1e-12), top],
                "line": {"dash": "dash", "width": 1.5, "color": "rgb(200, 40, 40)"},
            })  # fmt: skip
    return {
        "data": traces,
        "layout": _layout(
            xaxis=_axis("timestep t", zeroline=False),
            # inputs, hidden and cell states on one axis: each line is named by its series
            yaxis=_axis("gradient norm (log)", type="log", exponentformat="power"),
        ),
    }


def _lines(
    fields: Series,
    names: list[str],
    label: Callable[[str], str],
    scale: Callable[[str, float], float | None] | None = None,
    extra: Callable[[str], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    traces = []
    for name in names:
        s = fields.get(name)
        if not s or not s["step"]:
            continue
        ys = [number(v) for v in s["value"]]
        if scale is not None:
            ys = [None if y is None else scale(name, y) for y in ys]
        trace = {
            "type": "scatter",
            "mode": "lines",
            "name": plot_text(label(name)),
            "x": s["step"],
            "y": ys,
            "line": {"width": 1.6},
        }
        if extra is not None:
            trace.update(extra(name))
        traces.append(trace)
    return traces


def _positive(name: str, y: float) -> float | None:
    return y if y > 0 else None


def _figure(data: list[dict[str, Any]], **layout: Any) -> Figure:
    return {"data": data, "layout": _layout(**layout)}


def _step_axis() -> dict[str, Any]:
    return _axis("training step", zeroline=False)


def _log_axis(title: str) -> dict[str, Any]:
    return _axis(title, type="log", exponentformat="power")


def _norms(fields: Series) -> Figure:
    params = sorted(n for n in fields if n.startswith("param_norms/"))
    traces = _lines(
        fields,
        ["total_norm", *params],
        lambda n: "total norm" if n == "total_norm" else n.split("/", 1)[1],
        _positive,
    )
    bad = sorted(
        fields[f]["step"][i]
        for f in ("total_norm", "loss")
        if f in fields
        for i, v in enumerate(fields[f]["value"])
        if v in ("NaN", "Infinity", "-Infinity")
    )
    if bad:
        traces.append({
            "type": "scatter", "mode": "markers", "name": "non-finite", "x": bad,
            "y": [0.96] * len(bad), "yaxis": "y2",
            "marker": {"symbol": "x", "size": 11, "color": "#d62728"},
        })  # fmt: skip
    hidden = {"overlaying": "y", "range": [0, 1], "visible": False}
    return _figure(
        traces, xaxis=_step_axis(), yaxis=_log_axis("gradient L2 norm (log)"), yaxis2=hidden
    )


def _gates(fields: Series) -> Figure:
    names = sorted(n for n in fields if n.startswith("gate_norms/"))

    def label(name: str) -> str:
        param, _, gate = name[len("gate_norms/") :].rpartition("/")
        return f"{param} [{gate}]"

    traces = _lines(fields, names, label, _positive)
    return _figure(traces, xaxis=_step_axis(), yaxis=_log_axis("gate gradient L2 norm (log)"))


def _step_time(fields: Series) -> Figure:
    grey = {"line": {"width": 1, "color": "#7f7f7f"}}
    traces = _lines(
        fields, ["duration_s"], lambda n: "step time", lambda n, y: y * 1e3, lambda n: grey
    )
    if traces:
        ys = traces[0]["y"]
        window = [[y for y in ys[max(0, i - 24) : i + 1] if y is not None] for i in range(len(ys))]
        trend = [_median(w) for w in window]
        traces.append({
            "type": "scatter", "mode": "lines", "name": "trend (rolling median)",
            "x": traces[0]["x"], "y": trend, "line": {"width": 3, "color": "#d62728"},
        })  # fmt: skip
    return _figure(traces, xaxis=_step_axis(), yaxis=_axis("step time (ms)", rangemode="tozero"))


def _epochs(epochs: list[dict[str, Any]]) -> Figure:
    traces = [{
        "type": "bar", "name": "epoch time", "x": [e.get("epoch") for e in epochs],
        "y": [number(e.get("duration_s")) for e in epochs],
    }] if epochs else []  # fmt: skip
    return _figure(
        traces, xaxis=_axis("epoch", dtick=1), yaxis=_axis("epoch time (s)"), showlegend=False
    )


def _graph(fields: Series) -> Figure:
    memory = ["rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes"]
    labels = {"rss_bytes": "process RSS", "cuda_allocated_bytes": "CUDA allocated",
              "cuda_reserved_bytes": "CUDA reserved"}  # fmt: skip
    dotted = {"yaxis": "y2", "line": {"width": 1.5, "dash": "dot"}}
    traces = _lines(fields, ["graph_nodes"], lambda n: "autograd graph nodes")
    traces += _lines(fields, memory, lambda n: labels[n], lambda n, y: y / _MIB, lambda n: dotted)
    right = _axis("memory (MiB)", overlaying="y", side="right", showgrid=False, rangemode="tozero")
    return _figure(
        traces,
        xaxis=_step_axis(),
        yaxis=_axis("autograd graph nodes (count)", rangemode="tozero"),
        yaxis2=right,
        margin={"l": 64, "r": 64, "t": 16, "b": 52},
    )


def _modules(fields: Series) -> Figure:
    names = sorted(n for n in fields if n.startswith("profile/") and not n.endswith("/calls"))

    def label(name: str) -> str:
        module, _, key = name[len("profile/") :].rpartition("/")
        return f"{module} {key.removesuffix('_s')}"

    traces = _lines(fields, names, label, lambda n, y: y * 1e3)
    yaxis = _axis("time per step (ms)", rangemode="tozero")
    return _figure(traces, xaxis=_step_axis(), yaxis=yaxis)


def line_figures(fields: Series, epochs: list[dict[str, Any]]) -> dict[str, Figure]:
    """The scalar charts of the run view, keyed like its panels; empty ones left out."""
    loss_traces = _lines(fields, ["loss"], lambda n: "loss")
    loss = _figure(loss_traces, xaxis=_step_axis(), yaxis=_axis("loss"))
    out = {
        "norms": _norms(fields),
        "gates": _gates(fields),
        "loss": loss,
        "time": _step_time(fields),
        "epochs": _epochs(epochs),
        "graph": _graph(fields),
        "modules": _modules(fields),
    }
    return {k: v for k, v in out.items() if v["data"]}


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
