"""A recurrent module with no per-timestep series yet has a panel that says why, never
empty axes: before the first step (the page cannot know a cell's series names yet) and
for a module no gradient reaches (frozen weights, inputs needing none), live and after a
reload. A real watch() streams to a real server while headless Chromium watches."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from .conftest import assert_clean, chart, wait_js

pytestmark = pytest.mark.browser


class Mixed(nn.Module):
    """A cell loop, a frozen LSTM fed data (no gradient ever reaches its outputs) and a
    trainable LSTM, each read by the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(4, 8)
        self.frozen = nn.LSTM(4, 8)
        self.trained = nn.LSTM(4, 8)
        self.head = nn.Linear(8, 1)
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[1], 8)
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(h)
        total = self.head(torch.stack(outs)).square().mean()
        total = total + self.head(self.frozen(x)[0]).square().mean()
        return total + self.head(self.trained(x)[0]).square().mean()


def panels(page: Any) -> dict[str, tuple[bool, bool]]:
    """{panel id: (its no-data note shown, its chart shown)} of the time heatmaps, in page order."""
    found = page.evaluate(
        """() => [...document.querySelectorAll('section.heat')].map(s =>
            [s.id, !s.querySelector('.nodata').hidden, !s.querySelector('.chart').hidden])"""
    )
    return {name: (note, shown) for name, note, shown in found}


def rows(page: Any, name: str) -> int:
    return int(chart(page, f"chart-heatmap-{name}", "d.data ? d.data[0].z.length : 0"))


def test_modules_without_series_say_why_and_a_cell_gets_its_own_series(
    gradwatch_server: Any, open_page: Any
) -> None:
    from gradwatch.trainer_hooks import watch

    torch.manual_seed(0)
    server = gradwatch_server()
    model = Mixed()
    monitor = watch(model, run="placeholders", server=server.url, every=1, quiet=True)
    try:
        monitor.flush()  # the hello: the run and its recurrent modules, no step yet
        w = open_page(server)
        w.page.wait_for_selector("#runs-body a.run-link", timeout=60_000)
        w.page.click("#runs-body a.run-link")
        w.page.wait_for_selector("body[data-view='run'][data-painted='1']")
        # Before any step: one panel per recurrent module, each saying so, no empty axes.
        assert panels(w.page) == {
            "panel-heatmap-cell-input": (True, False),
            "panel-heatmap-frozen-input": (True, False),
            "panel-heatmap-trained-input": (True, False),
        }
        note = w.page.inner_text("#panel-heatmap-frozen-input .nodata")
        assert "No per-timestep gradient has reached frozen yet" in note
        assert "frozen" in note and "need no gradient" in note

        steps = 5
        for _ in range(steps):
            loss = model(torch.randn(6, 3, 4))
            loss.backward()
            monitor.step(loss)
        monitor.flush()
        wait_js(
            w.page,
            """() => ['cell-hidden', 'cell-cell', 'trained-input'].every(n => {
                const d = document.getElementById('chart-heatmap-' + n);
                return d && d.data && d.data[0].z.length === 5; })""",
        )
        # The cell's guessed "input" gave way, in its place, to the series it sends; the
        # trainable LSTM's placeholder filled and shows its chart at the panel's width;
        # the frozen LSTM still says no gradient reached it.
        assert list(panels(w.page).items()) == [
            ("panel-heatmap-cell-hidden", (False, True)),
            ("panel-heatmap-cell-cell", (False, True)),
            ("panel-heatmap-frozen-input", (True, False)),
            ("panel-heatmap-trained-input", (False, True)),
        ]
        # The profile draws inputs and states on one axis; each line's hover names its norm.
        # (Below the heatmaps now, it redraws once scrolled to.)
        w.page.locator("#panel-profile").scroll_into_view_if_needed()
        wait_js(
            w.page,
            """() => { const names = (document.getElementById('chart-profile').data || [])
                .map((t) => t.name);
                const want = ['cell · hidden', 'cell · cell', 'trained'];
                return want.every((n) => names.includes(n)); }""",
        )
        hovers = chart(w.page, "chart-profile",
                       "Object.fromEntries(d.data.map((t) => [t.name, t.hovertemplate]))")
        assert "‖∂L/∂h_t‖" in hovers["cell · hidden"] and "‖∂L/∂c_t‖" in hovers["cell · cell"]
        assert "‖∂L/∂x_t‖" in hovers["trained"]
        assert chart(w.page, "chart-profile", "d.layout.yaxis.title.text") == "gradient norm (log)"
        width = w.page.evaluate(
            "() => document.querySelector('#panel-heatmap-trained-input').clientWidth"
        )
        drawn = chart(w.page, "chart-heatmap-trained-input", "d._fullLayout.width")
        assert 0.8 * width <= drawn <= width, (drawn, width)

        # After a reload, from history alone: the same panels, the same notes.
        w.page.reload()
        w.page.wait_for_selector("body[data-view='run'][data-painted='1']")
        wait_js(
            w.page,
            "() => document.getElementById('chart-heatmap-trained-input').data",
        )
        assert list(panels(w.page).items()) == [
            ("panel-heatmap-cell-hidden", (False, True)),
            ("panel-heatmap-cell-cell", (False, True)),
            ("panel-heatmap-frozen-input", (True, False)),
            ("panel-heatmap-trained-input", (False, True)),
        ]
        assert [rows(w.page, n) for n in ("cell-hidden", "cell-cell", "trained-input")] == [
            steps, steps, steps]
        assert_clean(w)
    finally:
        monitor.close()
