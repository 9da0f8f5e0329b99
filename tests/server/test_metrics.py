"""GET /metrics (read with prometheus_client's parser) and the `stalled` status,
against a real server process."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch
from prometheus_client.parser import text_string_to_metric_families

from gradwatch.trainer_hooks import watch

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(wire: Any, server: Any, token: str | None = None) -> Samples:
    status, text, headers = wire.get(server, "/metrics", token)
    assert status == 200, (status, text)
    assert headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def labels(run: str, run_id: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"run": run, "run_id": run_id, **more}.items()))


def scrape_at_step(wire: Any, server: Any, key: tuple[tuple[str, str], ...], step: int) -> Samples:
    """Scrape until ``key``'s gradwatch_step is ``step`` (at most 30 s): the ack of a
    batch goes out before /metrics hears of it."""
    deadline = time.monotonic() + 30
    got = scrape(wire, server)
    while got.get("gradwatch_step", {}).get(key) != step and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the server until it has taken the batch in
        got = scrape(wire, server)
    return got


def test_a_live_trainer_is_in_metrics_with_its_last_step_and_leaves_when_it_ends(
    gradwatch_server: Callable[..., Any], wire: Any, tmp_path: Any
) -> None:
    server = gradwatch_server()
    model = torch.nn.LSTM(3, 6)
    monitor = watch(model, run="prom", server=server.url, spool=tmp_path / "s.jsonl",
                    every=1, diagnose=False)
    losses = []
    try:
        for _ in range(5):
            loss = model(torch.randn(7, 2, 3))[0].pow(2).mean()
            loss.backward()
            monitor.step(loss)
            losses.append(loss.item())
        assert monitor.flush(30)
        run_id = monitor.run_id
        key = labels("prom", run_id, rank="0")
        got = scrape_at_step(wire, server, key, 4)
    finally:
        monitor.close()
    assert got["gradwatch_step"][key] == 4
    assert abs(got["gradwatch_loss"][key] - losses[-1]) < 1e-6
    assert got["gradwatch_grad_norm_total"][key] > 0
    assert 0 < got["gradwatch_step_duration_seconds"][key] < 60
    assert got["gradwatch_overhead_ratio"][key] >= 0
    assert abs(got["gradwatch_last_step_timestamp_seconds"][key] - time.time()) < 60
    assert got["gradwatch_stalled"][labels("prom", run_id)] == 0
    assert run_id not in json.dumps(list(scrape(wire, server).get("gradwatch_step", {})))


def test_open_problems_by_code_and_two_ranks(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server()
    run_id = wire.run_id()
    alert = {"kind": "alert", "code": "vanishing", "severity": "warning", "subject": "lstm1"}
    with wire.connect(server) as r0, wire.connect(server) as r1:
        for rank, ws in enumerate((r0, r1)):
            ws.send(json.dumps(wire.hello(run_id, run="two", rank=rank, world_size=2)))
        r0.send(json.dumps(wire.batch(run_id, 0, [wire.step(0), dict(alert, step=0)])))
        r1.send(json.dumps(wire.batch(run_id, 0, [wire.step(0), wire.step(1),
                                                  dict(alert, step=1, code="graph_growth")],
                                      rank=1)))
        r0.send(json.dumps(wire.batch(run_id, 1, [dict(alert, step=1, subject="lstm2")])))
        assert [wire.recv(r0)["seq"], wire.recv(r1)["seq"], wire.recv(r0)["seq"]] == [0, 0, 1]
        got = scrape(wire, server)
        assert got["gradwatch_step"][labels("two", run_id, rank="0")] == 0
        assert got["gradwatch_step"][labels("two", run_id, rank="1")] == 1
        problems = got["gradwatch_open_problems"]
        assert problems[labels("two", run_id, code="vanishing")] == 2  # two subjects
        assert problems[labels("two", run_id, code="graph_growth")] == 1
        r0.send(json.dumps(wire.batch(run_id, 2, [dict(alert, step=2, state="cleared")])))
        assert wire.recv(r0)["seq"] == 2
        problems = scrape(wire, server)["gradwatch_open_problems"]
        assert problems[labels("two", run_id, code="vanishing")] == 1


def test_metrics_need_the_view_token_when_tokens_are_set(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server(token="ingest-t", view_token="view-t")
    assert wire.get(server, "/metrics")[0] == 401
    assert wire.get(server, "/metrics", "wrong")[0] == 401
    scrape(wire, server, "view-t")
    scrape(wire, server, "ingest-t")


def test_a_trainer_that_hangs_while_connected_shows_stalled_then_live_again(
    gradwatch_server: Callable[..., Any], wire: Any
) -> None:
    server = gradwatch_server(env={"GRADWATCH_STALLED_MIN_S": "1.5",
                                   "GRADWATCH_STALLED_FACTOR": "10"})
    run_id = wire.run_id()
    with wire.connect(server) as trainer, \
            wire.connect(server, path=f"/ws/live?run={run_id}") as view:
        trainer.send(json.dumps(wire.hello(run_id, run="hangs")))
        trainer.send(json.dumps(wire.batch(run_id, 0, [wire.step(i) for i in range(20)])))
        assert wire.recv(trainer)["seq"] == 0
        assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "live"
        # the run view's live feed is told, without a new batch to carry the news
        deadline = time.monotonic() + 30
        pushed = None
        while pushed is None and time.monotonic() < deadline:
            msg = wire.recv(view, timeout=30)
            if msg.get("type") == "run" and msg["run"]["status"] == "stalled":
                pushed = msg
        assert pushed is not None and pushed["run"]["id"] == run_id
        (listed,) = [r for r in wire.get_ok(server, "/api/runs") if r["id"] == run_id]
        assert listed["status"] == "stalled"
        assert scrape(wire, server)["gradwatch_stalled"][labels("hangs", run_id)] == 1
        trainer.send(json.dumps(wire.batch(run_id, 1, [wire.step(20)])))
        assert wire.recv(trainer)["seq"] == 1
        assert wire.get_ok(server, f"/api/runs/{run_id}")["status"] == "live"


def test_overhead_share_is_recent_steps_time_weighted_from_records_and_columns(
    gradwatch_server: Callable[..., Any], wire: Any, tmp_path: Any
) -> None:
    """`gradwatch_overhead_share`: sum(overhead x duration) / sum(duration) of the last
    256 steps, against the API's stored steps. A real trainer under the default
    budget (light steps travel as columns, heavy ones as records), then a rank sent
    as records whose last step is a heavy one (its own share 1.1)."""
    server = gradwatch_server()
    model = torch.nn.LSTM(3, 6)
    monitor = watch(model, run="share", server=server.url, spool=tmp_path / "s.jsonl",
                    diagnose=False)
    try:
        for _ in range(300):
            loss = model(torch.randn(7, 2, 3))[0].pow(2).mean()
            loss.backward()
            monitor.step(loss)
        assert monitor.flush(30)
        run_id = monitor.run_id
        key = labels("share", run_id, rank="0")
        got = scrape_at_step(wire, server, key, 299)
    finally:
        monitor.close()
    fields = wire.get_ok(server, f"/api/runs/{run_id}/steps?fields=overhead,duration_s"
                                 "&from=44&max_points=5000")["fields"]
    assert fields["overhead"]["step"] == list(range(44, 300))
    pairs = list(zip(fields["overhead"]["value"], fields["duration_s"]["value"], strict=True))
    expected = sum(o * d for o, d in pairs) / sum(d for _, d in pairs)
    assert abs(got["gradwatch_overhead_share"][key] - expected) <= 1e-9 * expected

    other = wire.run_id()
    records = []
    for n in range(30):
        heavy = n % 10 == 9
        records.append(wire.step(n, overhead=1.1 if heavy else 0.03 + 0.001 * n,
                                 duration_s=0.02 if heavy else 0.01))
    with wire.connect(server) as ws:
        ws.send(json.dumps(wire.hello(other, run="records")))
        ws.send(json.dumps(wire.batch(other, 0, records)))
        assert wire.recv(ws)["type"] == "ack"
    light = [(0.03 + 0.001 * n) * 0.01 for n in range(30) if n % 10 != 9]
    expected = (sum(light) + 3 * 1.1 * 0.02) / (27 * 0.01 + 3 * 0.02)
    got = scrape_at_step(wire, server, labels("records", other, rank="0"), 29)
    assert abs(got["gradwatch_overhead_share"][labels("records", other, rank="0")]
               - expected) <= 1e-12
    assert got["gradwatch_overhead_ratio"][labels("records", other, rank="0")] == 1.1
