"""The budget inside watch(): real training, records read back from the spool.

No timed assertions: the budget's decisions follow measured costs, so these tests
make one heavy capture many times costlier than another (``exact_hidden=True``
re-runs a fused LSTM unrolled, one kernel call per timestep, on every heavy step)
and compare the two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.quantities.base import Quantity
from gradwatch.trainer_hooks.schedule import DEFAULT_BUDGET, Schedule


class LongLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
            if r["kind"] == "step"]


def test_heavy_steps_become_rarer_when_heavy_capture_costs_more(tmp_path: Path) -> None:
    # the same model under the same budget: one pays for exact_hidden on every heavy
    # step (an unrolled re-run, many plain steps' work)
    torch.manual_seed(0)
    runs = {}
    for name, options in (("cheap", {}), ("costly", {"exact_hidden": True})):
        model = LongLSTM()
        # a budget the light steps of so small a model fit on a loaded box too
        monitor = watch(model, run=name, spool=tmp_path / f"{name}.jsonl", diagnose=False,
                        overhead=0.15, **options)
        runs[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01), monitor)
    x, y = torch.randn(16, 100, 1), torch.randn(16, 100, 1)
    # one run after the other: a schedule measures the wall time between its own
    # records, which interleaved steps of another model would be part of
    for model, optimizer, monitor in runs.values():
        for _ in range(150):
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
    intervals = {name: monitor.schedule.interval for name, (_, _, monitor) in runs.items()}
    for _, _, monitor in runs.values():
        monitor.close()
    records = {name: steps_of(tmp_path / f"{name}.jsonl") for name in runs}
    heavy = {name: [r["step"] for r in rs if "param_norms" in r] for name, rs in records.items()}
    assert intervals["costly"] > intervals["cheap"], intervals
    assert len(heavy["costly"]) < len(heavy["cheap"]), heavy
    assert heavy["costly"][:5] == [0, 3, 6, 9, 12]  # the calibration, then the budget
    for name, rs in records.items():
        # light steps keep every step's loss, time and overhead
        assert [r["step"] for r in rs] == list(range(150)), name
        assert all(isinstance(r["loss"], float) and r["duration_s"] > 0 for r in rs), name
        assert all(r["overhead"] >= 0 for r in rs), name
        assert "timesteps" not in rs[1] and "graph_nodes" not in rs[1]  # a light step


def test_watch_without_options_uses_the_default_budget_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with watch(nn.Linear(2, 1), run="x", spool=path, diagnose=False) as monitor:
        assert monitor.schedule.budget == DEFAULT_BUDGET
    hello = next(m for m in read_spool(path) if m["type"] == "hello")
    assert hello["config"]["every"] == 1 and hello["config"]["overhead"] == DEFAULT_BUDGET
    with watch(nn.Linear(2, 1), run="x", spool=path, every=1, diagnose=False) as monitor:
        assert monitor.schedule.budget is None  # every= alone: exactly every N-th step
    with watch(nn.Linear(2, 1), run="x", spool=path, every=3, overhead=0.05,
               diagnose=False) as monitor:
        assert (monitor.schedule.every, monitor.schedule.budget) == (3, 0.05)


class Charged(Quantity):
    """A light quantity that says its hooks spent ``seconds`` on every step."""

    name = "charged"
    heavy = False

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def start_step(self, capture: bool) -> None:
        super().start_step(capture)
        self.cost_s += self.seconds


def test_the_overhead_field_counts_timed_hooks_and_the_unseen_cost_of_heavy_steps(
    tmp_path: Path,
) -> None:
    # Synthetic costs into the real Monitor: a quantity whose hooks report 2 ms a
    # step, and a schedule that has measured heavy steps 5 ms longer than light ones
    # of which its timers saw 1 ms (4 ms unseen).
    schedule = Schedule(every=2, overhead=0.5)
    for step in range(40):
        heavy = schedule.capture(step)
        schedule.observe(step, heavy, 0.002 if heavy else 0.001,
                         span_s=0.015 if heavy else 0.010)
    assert schedule.hidden_s() == pytest.approx(0.004)
    path = tmp_path / "run.jsonl"
    model = nn.Linear(2, 1)
    monitor = watch(model, run="x", spool=path, every=2, diagnose=False)
    charged = Charged(0.002)
    monitor.quantities.append(charged)
    monitor.schedule = schedule
    schedule._next = 0  # type: ignore[attr-defined]  # heavy at the next step
    for _ in range(6):
        model(torch.randn(4, 2)).sum().backward()
        monitor.step()
    monitor.close()
    heavy = 0
    for r in steps_of(path)[1:]:
        spent = r["overhead"] * r["duration_s"]
        assert spent >= 0.002  # the hooks' timed cost
        if "param_norms" in r:
            heavy += 1
            assert spent >= 0.002 + 0.004  # and what heavy steps cost unseen
    assert heavy >= 2
