"""A real training run (watch() on a tiny LSTM, in a thread) streams into a real server
while the dashboard is open in headless Chromium: the heatmap gains rows, and the
`vanishing` alert of an LSTM with the loss on its last timestep appears with its fix.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from .conftest import chart, scroll_to, wait_js, wait_points

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TIMESTEPS = 121
BEFORE_PAGE = 4  # steps trained before the page is open
AFTER_PAGE = 10  # steps trained while it watches


def train_long_lstm(
    server_url: str, name: str, page_open: threading.Event, errors: list[Any]
) -> None:
    """The scenario of issue #4: one LSTM over 121 timesteps, loss on the last one only."""
    try:
        import torch
        from torch import nn

        from gradwatch.trainer_hooks import watch

        torch.manual_seed(0)

        class LongLSTM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = nn.LSTM(1, 16, batch_first=True)
                self.head = nn.Linear(16, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                out, _ = self.lstm(x)
                return self.head(out[:, -1])

        model = LongLSTM()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        with watch(model, run=name, server=server_url, every=1) as monitor:
            for step in range(BEFORE_PAGE + AFTER_PAGE):
                if step == BEFORE_PAGE and not page_open.wait(60):
                    raise TimeoutError("the dashboard did not open within 60 s")
                x = torch.randn(8, TIMESTEPS, 1)
                loss = nn.functional.mse_loss(model(x), x.mean(dim=1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                monitor.step(loss)
    except BaseException as error:  # the test's main thread reports it
        errors.append(error)
        page_open.set()


def test_real_training_streams_rows_and_its_vanishing_alert_shows_the_fix(
    gradwatch_server, open_page
):
    server = gradwatch_server()
    page_open = threading.Event()
    errors: list[Any] = []
    trainer = threading.Thread(
        target=train_long_lstm, args=(server.url, "long-lstm live", page_open, errors), daemon=True
    )
    trainer.start()
    w = open_page(server)
    w.page.wait_for_selector("#runs-body a.run-link", timeout=60_000)
    assert w.page.inner_text("#runs-body a.run-link") == "long-lstm live"
    w.page.click("#runs-body a.run-link")
    w.page.wait_for_selector("body[data-view='run'][data-painted='1']")
    heat = "chart-heatmap-lstm-input"
    rows_at_paint = chart(w.page, heat, "d.data[0].z.length")
    assert rows_at_paint <= BEFORE_PAGE
    page_open.set()  # the rest of training streams while the page watches

    total = BEFORE_PAGE + AFTER_PAGE
    scroll_to(w.page, heat)
    wait_js(w.page, f"() => document.getElementById('{heat}').data[0].z.length === {total}", 90)
    trainer.join(timeout=60)
    assert not errors, errors
    assert chart(w.page, heat, "d.data[0].y[d.data[0].y.length - 1]") == total - 1
    assert chart(w.page, heat, "d.data[0].z[0].length") == TIMESTEPS
    assert chart(w.page, "chart-profile", "d.data[0].y.length") == TIMESTEPS
    scroll_to(w.page, "chart-time")
    wait_points(w.page, "chart-time", total)

    alert = "#alerts-list article.alert[data-code=vanishing]"
    w.page.wait_for_selector(alert, timeout=30_000)
    assert "lstm" in w.page.inner_text(f"{alert} .head")
    assert "BPTT" in w.page.inner_text(f"{alert} .fix")
    assert "horizon" in w.page.inner_text(f"{alert} dl")
    w.screenshot("real-training-run")
    assert w.errors == [], w.errors
    assert w.foreign_requests() == [], w.foreign_requests()
