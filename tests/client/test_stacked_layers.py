"""A real 2-layer fused GRU (watch() in a thread) streams into a real server while the
run view is open in headless Chromium: the module's input and its layer 1 get a
heatmap each, in that order and labelled, ahead of the next module's, both live (layer
1 first seen live) and from history after a reload; the rows drawn are the rows the
server stored.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.request
from typing import Any

import pytest

from .conftest import chart, scroll_to, wait_js

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEPS = 8
TIMESTEPS = 20
INPUT, LAYER1 = "chart-heatmap-gru-input", "chart-heatmap-gru-layer1"


def train_stacked_gru(server_url: str, page_open: threading.Event, errors: list[Any]) -> None:
    try:
        import torch
        from torch import nn

        from gradwatch.trainer_hooks import watch

        torch.manual_seed(0)

        class Stacked(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.gru = nn.GRU(3, 12, num_layers=2, dropout=0.2, batch_first=True)
                self.post = nn.LSTM(12, 6, batch_first=True)
                self.head = nn.Linear(6, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.head(self.post(self.gru(x)[0])[0][:, -1])

        model = Stacked()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        with watch(model, run="stacked-gru", server=server_url, every=1) as monitor:
            if not page_open.wait(60):
                raise TimeoutError("the dashboard did not open within 60 s")
            for _ in range(STEPS):
                x = torch.randn(4, TIMESTEPS, 3)
                loss = (model(x) - x[:, -1, :1]).square().mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                monitor.step(loss)
    except BaseException as error:  # the test's main thread reports it
        errors.append(error)
        page_open.set()


def heat_order(page: Any) -> list[tuple[str, str, str]]:
    return page.evaluate(
        "() => [...document.querySelectorAll('section.heat')].map(s =>"
        " [s.dataset.module, s.dataset.series, s.querySelector('h2').textContent])"
    )


def relative(row: list[float]) -> list[float]:
    """The dashboard's default colour value: decades below the row's peak (heatscale.js)."""
    peak = max(v for v in row if math.isfinite(v))
    return [max(-30.0, math.log10(v / peak)) if v > 0 else -30.0 for v in row]


def test_a_stacked_gru_shows_its_input_and_layer1_heatmaps_live_and_from_history(
    gradwatch_server, open_page
):
    server = gradwatch_server()
    page_open = threading.Event()
    errors: list[Any] = []
    trainer = threading.Thread(
        target=train_stacked_gru, args=(server.url, page_open, errors), daemon=True
    )
    trainer.start()
    try:
        w = open_page(server)
        w.page.wait_for_selector("#runs-body a.run-link", timeout=60_000)
        run_id = w.page.get_attribute("#runs-body tr", "data-run-id")
        w.page.click("#runs-body a.run-link")
        w.page.wait_for_selector("body[data-view='run'][data-painted='1']")
        # no step yet: each module's input heatmap, waiting for rows
        assert [s[:2] for s in heat_order(w.page)] == [["gru", "input"], ["post", "input"]]
    finally:
        page_open.set()
    # layer 1 arrives live with the first step, and its heatmap joins after the input's
    wait_js(w.page, f"() => !!document.getElementById('{LAYER1}')", 60)
    trainer.join(timeout=90)
    assert not errors, errors
    for heat in (INPUT, LAYER1):
        scroll_to(w.page, heat)
        wait_js(w.page, f"() => document.getElementById('{heat}').data[0].z.length === {STEPS}")
    order = heat_order(w.page)
    assert [s[:2] for s in order] == [["gru", "input"], ["gru", "layer1"], ["post", "input"]]
    assert order[0][2] == "Gradient flow through time: gru"
    assert order[1][2] == "Gradient flow through time: gru · input of layer 1"

    stored = json.load(urllib.request.urlopen(  # noqa: S310
        f"{server.http}/api/runs/{run_id}/timesteps?module=gru&series=layer1&max_steps=500"
    ))  # fmt: skip
    assert stored["steps"] == list(range(STEPS))
    assert chart(w.page, LAYER1, "Array.from(d.data[0].y)") == stored["steps"]
    for step in (0, STEPS - 1):
        drawn = chart(w.page, LAYER1, f"Array.from(d.data[0].z[{step}])")
        assert len(drawn) == TIMESTEPS
        assert drawn == pytest.approx(relative(stored["values"][step]), abs=1e-9)
    # the two series are different numbers, not one drawn twice
    assert chart(w.page, INPUT, "Array.from(d.data[0].z[0])") != drawn

    w.page.reload()
    w.page.wait_for_selector("body[data-painted='1']")
    assert heat_order(w.page) == order
    scroll_to(w.page, LAYER1)
    wait_js(w.page, f"() => document.getElementById('{LAYER1}').data[0].z.length === {STEPS}")
    labels = chart(w.page, "chart-profile", "d.data.map(t => t.name)")
    assert "gru" in labels and "gru · layer1" in labels
    w.screenshot("stacked-gru-layers")
    assert w.errors == [], w.errors
