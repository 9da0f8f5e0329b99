"""graph_growth and slowdown: trends over steps, robust to outliers, with their causes."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from gradwatch.trainer_hooks.diagnoses import DiagnosisEngine


def count_nodes(loss: torch.Tensor) -> int:
    """Distinct autograd nodes reachable from loss.grad_fn (an independent count)."""
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(fn for fn, _ in node.next_functions)
    return len(seen)


def carried_state_graph_sizes(detach: bool, steps: int = 8) -> list[int]:
    """graph_nodes of a real LSTM cell loop that carries (h, c) across steps."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(3, 8)
    h = c = torch.zeros(1, 8)
    sizes = []
    for _ in range(steps):
        if detach:
            h, c = h.detach(), c.detach()
        for _t in range(5):
            h, c = cell(torch.randn(1, 3), (h, c))
        loss = h.square().sum()
        loss.backward(retain_graph=True)
        with torch.no_grad():  # through .data-like updates autograd does not see
            for p in cell.parameters():
                p.data.add_(p.grad, alpha=-1e-3)  # type: ignore[arg-type]
                p.grad = None
        sizes.append(count_nodes(loss))
    return sizes


def step(n: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "step", "step": n, "t": float(n), **fields}


def run(engine: DiagnosisEngine, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for r in records for a in engine.observe(r)]


def test_graph_growth_fires_on_state_carried_without_detach_and_not_with_it() -> None:
    growing = carried_state_graph_sizes(detach=False)
    assert growing[-1] > 4 * growing[0]  # the premise: the real graph grows
    alerts = run(
        DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}),
        [step(n, graph_nodes=g) for n, g in enumerate(growing)],
    )
    assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [("graph_growth", "graph", 3)]
    assert alerts[0]["evidence"]["graph_nodes"] == growing[:4]
    assert "detach" in alerts[0]["hint"] and "loss.item()" in alerts[0]["hint"]

    flat = carried_state_graph_sizes(detach=True)
    assert len(set(flat)) == 1
    assert (
        run(
            DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}),
            [step(n, graph_nodes=g) for n, g in enumerate(flat)],
        )
        == []
    )


def test_graph_growth_names_the_module_from_the_capture_stale_state_alert() -> None:
    engine = DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1})
    stale = {"kind": "alert", "code": "graph_growth", "subject": "lstm1", "state": "raised"}
    assert engine.observe(stale) == []  # the capture's own alert is not repeated
    alerts = run(
        engine, [step(n, graph_nodes=100 * (n + 1), rss_bytes=2**20 * n) for n in range(4)]
    )
    (alert,) = alerts
    assert alert["subject"] == "graph" and alert["evidence"]["stale_modules"] == ["lstm1"]
    assert "lstm1 received a hidden state" in alert["message"]
    assert "MiB per step" in alert["message"]


def test_graph_growth_says_at_least_when_the_walk_was_cut_short() -> None:
    records = [step(n, graph_nodes=1000 * (n + 1), graph_truncated=n >= 2) for n in range(4)]
    (alert,) = run(DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}), records)
    assert alert["evidence"]["truncated"] is True and "at least 4,000" in alert["message"]


def test_slowdown_fires_on_a_rising_step_time_explained_by_the_graph() -> None:
    rng = random.Random(1)
    records = [
        step(n, duration_s=0.010 * (1 + 0.2 * n) * rng.uniform(0.9, 1.1), graph_nodes=500 * (n + 1))
        for n in range(40)
    ]
    records[8]["duration_s"] = 5.0  # one pause (GC, checkpoint) does not bend Theil–Sen
    alerts = [a for a in run(DiagnosisEngine(), records) if a["code"] == "slowdown"]
    # steps 0-4 are warm-up; steps 5-12 set the starting speed (median 29 ms, the pause
    # included); the window is judged from 16 steps on (step 20), and the alert is
    # raised after slowdown_sustain (15) judgements in a row
    assert [(a["subject"], a["step"]) for a in alerts] == [("step_time", 34)]
    ev = alerts[0]["evidence"]
    assert ev["explained_by"] == ["graph_nodes"]
    assert 0.0015 < ev["seconds_per_step"] < 0.0025  # the true slope is 0.002 s/step
    assert ev["first_s"] == pytest.approx(0.029, rel=0.05)
    assert "graph grew" in alerts[0]["message"] and "detach" in alerts[0]["hint"]


def test_slowdown_is_silent_on_noisy_but_flat_step_times() -> None:
    rng = random.Random(2)
    records = [step(n, duration_s=0.02 * rng.uniform(0.7, 1.3), graph_nodes=900) for n in range(60)]
    records[0]["duration_s"] = 3.0  # the first step carries start-up work
    assert run(DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}), records) == []


def test_slowdown_names_the_profiled_module_whose_time_grows() -> None:
    records = []
    for n in range(25):
        cell = 0.004 * n
        profile = {
            "": {"forward_s": 0.01 + cell, "backward_s": 0.0, "calls": 1},
            "cell": {"forward_s": cell / 3, "backward_s": 2 * cell / 3, "calls": 40},
            "out": {"forward_s": 0.001, "backward_s": 0.001, "calls": 1},
        }
        records.append(step(n, duration_s=0.01 + cell, profile=profile))
    (alert,) = [
        a
        for a in run(DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}), records)
        if a["code"] == "slowdown"
    ]
    assert alert["evidence"]["module"] == "cell" and alert["evidence"]["explained_by"] == []
    assert "most of the added time is in cell" in alert["message"]
    # these records carry neither: not measured is not "did not grow"
    assert "the graph size and memory are not measured" in alert["message"]


def test_slowdown_clears_when_step_time_levels_off() -> None:
    engine = DiagnosisEngine(
        {
            "raise_after": 1,
            "slowdown_sustain": 1,
            "slowdown_window": 16,
            "clear_after": 3,
            "slowdown_skip_first": 1,
        }
    )
    rising = [step(n, duration_s=0.01 * (n + 1)) for n in range(20)]
    flat = [step(n, duration_s=0.2) for n in range(20, 50)]
    states = [a["state"] for a in run(engine, rising + flat)]
    assert states == ["raised", "cleared"]


def test_graph_growth_stays_raised_while_a_large_graph_keeps_growing_linearly() -> None:
    # +18 nodes per step from 28: after 300 steps the window grows by only 2%, but the
    # graph is 190x its starting size and still growing, so the alert must hold.
    records = [step(n, graph_nodes=28 + 18 * n) for n in range(300)]
    alerts = run(DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}), records)
    assert [a["state"] for a in alerts] == ["raised"] + ["updated"] * (len(alerts) - 1)
    assert alerts[-1]["evidence"]["start_nodes"] == 28


def test_slowdown_holds_through_noise_on_a_long_linear_slowdown() -> None:
    rng = random.Random(3)
    records = [step(n, duration_s=0.05 * (1 + 0.5 * n) * rng.uniform(0.7, 1.3)) for n in range(200)]
    alerts = [
        a
        for a in run(DiagnosisEngine({"raise_after": 1, "slowdown_sustain": 1}), records)
        if a["code"] == "slowdown"
    ]
    assert [a["state"] for a in alerts].count("raised") == 1
    assert "cleared" not in [a["state"] for a in alerts]


@pytest.mark.parametrize("seed", range(5))
def test_slowdown_is_silent_on_machine_load_bursts_and_level_shifts(seed: int) -> None:
    # a loaded shared machine: ±50% jitter, a burst of 10 steps at 2-20x, and from
    # step 200 on every step 1.8x slower (another process started): no slowdown
    rng = random.Random(seed)
    records = []
    for n in range(400):
        base = 0.01 * (1.8 if n >= 200 else 1.0) * rng.uniform(1.0, 2.0)
        if 120 <= n < 130:
            base *= rng.uniform(2, 20)
        records.append(step(n, duration_s=base, graph_nodes=900))
    assert [a for a in run(DiagnosisEngine(), records) if a["code"] == "slowdown"] == []


@pytest.mark.parametrize(
    ("field", "said", "fix"),
    [
        ("graph_nodes", "the autograd graph grew", "Detach carried state"),
        ("rss_bytes", "process memory grew", "tensors kept across steps"),
        (None, "neither the graph size nor memory grew", "work that grows with time"),
    ],
)
def test_slowdown_message_and_fix_always_tell_the_same_story(
    field: str | None, said: str, fix: str
) -> None:
    records = []
    for n in range(60):
        fields: dict[str, Any] = {"graph_nodes": 500, "rss_bytes": 10**9}
        if field is not None:
            fields[field] = int(fields[field] * (1 + 0.05 * n))
        records.append(step(n, duration_s=0.01 * (1 + 0.1 * n), **fields))
    alerts = [a for a in run(DiagnosisEngine(), records) if a["code"] == "slowdown"]
    assert alerts and all(a["state"] != "cleared" for a in alerts)
    for a in alerts:
        assert said in a["message"] and fix in a["hint"]


def test_slowdown_sees_the_graph_grow_when_few_steps_measure_it() -> None:
    # A carried hidden state under the default budget: the graph's size is in one
    # record of 40 (a captured step), memory in every one. The 30-step window holds
    # 0-1 graph sizes; the slowdown is the graph's all the same.
    records = []
    for n in range(400):
        fields: dict[str, Any] = {"duration_s": 0.002 * (1 + 0.02 * n), "rss_bytes": 2**30}
        if n % 40 == 3:
            fields["graph_nodes"] = 22 + 9 * n
        records.append(step(n, **fields))
    alerts = [a for a in run(DiagnosisEngine(), records) if a["code"] == "slowdown"]
    assert alerts and all(a["state"] != "cleared" for a in alerts)
    for a in alerts:
        assert "the autograd graph grew" in a["message"], a["message"]
        assert "Detach carried state" in a["hint"]
        assert a["evidence"]["explained_by"] == ["graph_nodes"]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"rss_bytes": 2**30}, "memory did not grow with it (the graph size is not measured yet)"),
        ({"rss_bytes": 2**30, "graph_nodes": 500}, "neither the graph size nor memory grew"),
    ],
)
def test_slowdown_says_which_of_graph_and_memory_it_measured(
    fields: dict[str, Any], said: str
) -> None:
    records = [step(n, duration_s=0.01 * (1 + 0.1 * n), **fields) for n in range(60)]
    alerts = [a for a in run(DiagnosisEngine(), records) if a["code"] == "slowdown"]
    assert alerts and all(said in a["message"] for a in alerts)
