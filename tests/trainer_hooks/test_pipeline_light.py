"""Light step records handled as runs on the background thread keep every field of
every step, carry the thread's CPU in their overhead, and get the alerts a record by
record pass gives them, in the same place."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from gradwatch.protocol import read_spool
from gradwatch.protocol.sink import SpoolSink
from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine
from gradwatch.trainer_hooks.pipeline import Item, Pipeline

from .light_sequences import scenario


def spooled(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]


def thread_cpu(pipeline: Pipeline) -> float:
    ident = pipeline._thread.ident
    assert ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def burst(pipeline: Pipeline, items: list[Item]) -> None:
    """Queue every item before the thread looks (it sleeps its gap: 30 s), then flush:
    one wake finds them all."""
    pipeline.min_gap = 30.0
    assert pipeline.flush(timeout=30)  # the thread now sleeps 30 s unless flushed
    for item in items:
        assert pipeline.put(item)
    assert pipeline.flush(timeout=30)


def test_a_wake_of_light_records_keeps_each_steps_fields_and_charges_its_cpu(
    tmp_path: Path,
) -> None:
    path = tmp_path / "light.jsonl"
    pipeline = Pipeline(SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0}),
                        quantities=[], diagnoser=DiagnosisEngine())
    items = []
    for n in range(150):  # more than one run (64), tensors and floats as losses
        loss: Any = torch.tensor(0.5 + n) if n % 2 else 0.25 + n
        items.append(Item({"kind": "step", "step": n, "epoch": n // 100, "t": 100.0 + n,
                           "duration_s": 1e-6 * (1 + n), "loss": loss, "overhead": 0.0}))
    try:
        before = thread_cpu(pipeline)
        burst(pipeline, items)
        spent = thread_cpu(pipeline) - before
    finally:
        assert pipeline.close(timeout=30)
    steps = [r for r in spooled(path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(150))
    for n, r in enumerate(steps):
        assert r["loss"] == (0.5 + n if n % 2 else 0.25 + n)
        assert type(r["loss"]) is float
        assert r["duration_s"] == 1e-6 * (1 + n) and r["epoch"] == n // 100
        assert r["rss_bytes"] > 0
        assert r["overhead"] > 0  # steps of a few µs: any CPU of this thread shows
    # what the records say this thread spent on them is no more than it spent (the
    # first wake has no shared part from earlier wakes to add)
    charged = sum(r["overhead"] * r["duration_s"] for r in steps)
    assert 0 < charged <= spent


def test_alerts_through_the_pipeline_are_the_engines_record_by_record(tmp_path: Path) -> None:
    path = tmp_path / "alerts.jsonl"
    pipeline = Pipeline(SpoolSink(path, {"type": "hello", "run_id": "r", "rank": 0}),
                        quantities=[], diagnoser=DiagnosisEngine())
    # heavy records (every 10th) go the record-by-record way between the light runs
    items = [Item(r, heavy="total_norm" in r) for r in scenario("mixed")]
    try:
        burst(pipeline, items)
    finally:
        assert pipeline.close(timeout=30)
    out = spooled(path)
    assert len([r for r in out if r["kind"] == "step"]) == 600
    engine = DiagnosisEngine()
    expected: list[dict[str, Any]] = []
    for record in out:  # the records as sent (memory fields included)
        if record["kind"] != "alert":
            expected += [record, *engine.observe(record)]
    assert len(expected) > 600 + 10  # the mixed run raises and clears alerts
    assert out == expected + engine.finish()
