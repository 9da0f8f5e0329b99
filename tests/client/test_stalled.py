"""A trainer that hangs while connected: the runs list and the run view say `stalled`
(real Chromium, real server), and `live` again when steps come back."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import step_record

pytestmark = pytest.mark.browser


def test_the_runs_list_and_the_run_view_show_stalled_then_live(
    gradwatch_server: Any, open_page: Any, raw_trainer: Any
) -> None:
    # 8 s without a step: long enough for both pages to load first on a loaded box
    server = gradwatch_server(env={"GRADWATCH_STALLED_MIN_S": "8",
                                   "GRADWATCH_STALLED_FACTOR": "10"})
    trainer = raw_trainer(server, "hangs")
    trainer.send([step_record(s, timesteps=8) for s in range(10)])
    listing = open_page(server)
    row = f"tr[data-run-id='{trainer.run_id}']"
    listing.page.wait_for_selector(f"{row} .badge[data-status=live]")
    view = open_page(server, f"#/run/{trainer.run_id}")
    view.page.wait_for_selector("body[data-painted='1'] .toolbar .badge.live")
    # nothing more arrives: both pages are told by the server, without a reload
    listing.page.wait_for_selector(f"{row} .badge[data-status=stalled]", timeout=30_000)
    view.page.wait_for_selector(".toolbar .badge.stalled", timeout=30_000)
    assert view.page.inner_text(".toolbar .badge.stalled") == "stalled"
    trainer.send([step_record(10, timesteps=8)])
    listing.page.wait_for_selector(f"{row} .badge[data-status=live]", timeout=30_000)
    view.page.wait_for_selector(".toolbar .badge.live", timeout=30_000)
    for w in (listing, view):
        assert w.errors == [], w.errors
        assert w.foreign_requests() == [], w.foreign_requests()
