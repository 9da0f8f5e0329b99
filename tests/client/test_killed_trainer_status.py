"""A trainer killed with SIGKILL: the open runs list and run view follow the API,
`stalled` and then `stale` once it wrote nothing for GRADWATCH_STALE_AFTER_S, pushed
by the server, without a reload (docs/API.md: `stalled` is a hang while the process
and its connection live). Real server, real Chromium, a real trainer process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

import pytest

from .conftest import assert_clean

pytestmark = pytest.mark.browser

# Stalled 1 s after the last step, stale 4 s after the last write: small for a test.
QUICK = {"GRADWATCH_STALE_AFTER_S": "4", "GRADWATCH_STALLED_MIN_S": "1",
         "GRADWATCH_STALLED_FACTOR": "1"}  # fmt: skip

# A trainer streaming one step every 50 ms until it is killed; it says when it streams.
TRAINER = """
import itertools, json, sys, time
from websockets.sync.client import connect
url, run_id = sys.argv[1], sys.argv[2]
with connect(url + "/ws/ingest") as ws:
    ws.send(json.dumps({"type": "hello", "protocol": 1, "run_id": run_id, "run": "killed",
                        "rank": 0, "world_size": 1, "model": {"recurrent": []}}))
    for seq in itertools.count():
        step = {"kind": "step", "step": seq, "t": time.time(), "duration_s": 0.01, "loss": 1.0}
        ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": 0, "seq": seq,
                            "records": [step]}))
        ws.recv(timeout=30)  # its ack
        if seq == 0:
            print("streaming", flush=True)
        time.sleep(0.05)  # the step time of this trainer
"""


def api_status(server: Any, run_id: str) -> str:
    with urllib.request.urlopen(f"{server.http}/api/runs/{run_id}", timeout=30) as answer:  # noqa: S310
        return str(json.load(answer)["status"])


def test_a_killed_trainers_run_goes_stale_on_open_pages(gradwatch_server, open_page):
    server = gradwatch_server(env=QUICK)
    run_id = str(uuid.uuid4())
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, server.url, run_id],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline().strip() == "streaming"
        listing = open_page(server)
        row = f"tr[data-run-id='{run_id}']"
        listing.page.wait_for_selector(f"{row} .badge[data-status=live]")
        view = open_page(server, f"#/run/{run_id}")
        view.page.wait_for_selector("body[data-painted='1'] .toolbar .badge.live")
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        listing.page.wait_for_selector(f"{row} .badge[data-status=stale]", timeout=30_000)
        view.page.wait_for_selector(".toolbar .badge.stale", timeout=30_000)
        assert view.page.inner_text(".toolbar .badge.stale") == "stale"
        assert api_status(server, run_id) == "stale"
        for w in (listing, view):
            assert_clean(w)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        trainer.wait(timeout=30)
        if trainer.stdout is not None:
            trainer.stdout.close()
