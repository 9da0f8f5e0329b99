"""An example streams into a real `gradwatch serve`; its alert is stored and served."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - 127.0.0.1 test server
        return json.loads(answer.read())


def test_long_lstm_streams_to_a_server_and_its_vanishing_alert_is_served(
    gradwatch_server: Any, load_example: Any
) -> None:
    server = gradwatch_server(token="ingest-secret")
    summary = load_example("long_lstm").main(
        ["--steps", "3", "--server", server.url, "--token", "ingest-secret", "--quiet"]
    )
    assert summary["output"] == server.url
    # close() returned after the last batch was acknowledged, so it is stored now
    runs = [
        r for r in get(f"{server.http}/api/runs?token=ingest-secret") if r["name"] == "long_lstm"
    ]
    assert len(runs) == 1 and runs[0]["last_step"] == 2 and runs[0]["alerts"] >= 1
    alerts = get(f"{server.http}/api/runs/{runs[0]['id']}/alerts?token=ingest-secret")
    (vanishing,) = [a for a in alerts if a["code"] == "vanishing" and a["state"] == "raised"]
    assert vanishing["subject"] == "lstm" and "truncated BPTT" in vanishing["hint"]
