"""A real Lightning Trainer with GradwatchCallback: steps per optimizer step, epochs, end."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradwatch.integrations.lightning import GradwatchCallback
from gradwatch.protocol import to_float

# Lightning's advice (worker processes, logging) and its use of deprecated torch APIs
# are not what these tests check.
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Regressor(L.LightningModule):
    """A small GRU regressor that remembers every batch's loss."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.rnn = nn.GRU(3, 8, batch_first=True)
        self.head = nn.Linear(8, 1)
        self.losses: list[float] = []
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.fail_at is not None and len(self.losses) == self.fail_at:
            raise RuntimeError("the data went bad")
        x, y = batch
        out, _ = self.rnn(x)
        loss = nn.functional.mse_loss(self.head(out[:, -1]), y)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(samples: int = 64, batch: int = 8) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(samples, 5, 3, generator=g), torch.randn(samples, 1, generator=g)
    data = TensorDataset(x, y)
    return DataLoader(data, batch_size=batch, shuffle=False)


def trainer(callback: GradwatchCallback, epochs: int, accumulate: int) -> L.Trainer:
    return L.Trainer(
        max_epochs=epochs, accumulate_grad_batches=accumulate, callbacks=[callback],
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )


def _window_means(losses: list[float], size: int) -> list[float]:
    """The mean of each run of `size` consecutive losses, the last run maybe shorter."""
    windows = [losses[i : i + size] for i in range(0, len(losses), size)]
    return [sum(window) / len(window) for window in windows]


@pytest.mark.parametrize(("epochs", "accumulate", "per_epoch"), [(2, 2, 4), (1, 1, 8), (3, 4, 2)])
def test_one_step_per_optimizer_step_and_an_epoch_each(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
    epochs: int, accumulate: int, per_epoch: int,
) -> None:
    spool = tmp_path / "run.jsonl"
    module = Regressor()
    trainer(GradwatchCallback(run="pl", spool=spool, every=1), epochs, accumulate).fit(
        module, loader()
    )
    steps, epoch_records = spooled(spool, "step"), spooled(spool, "epoch")
    assert [s["step"] for s in steps] == list(range(epochs * per_epoch))
    assert [s["epoch"] for s in steps] == [e for e in range(epochs) for _ in range(per_epoch)]
    assert [e["steps"] for e in epoch_records] == [per_epoch] * epochs
    assert spooled(spool, "end")[0]["status"] == "finished"
    # the step's loss: the mean of the losses of the batches accumulated into it
    assert [s["loss"] for s in steps] == pytest.approx(
        _window_means(module.losses, accumulate), rel=1e-5)
    # the gradient norms are the model's own parameters, names without a wrapper prefix
    norms = [s for s in steps if s.get("param_norms")]
    assert norms and "rnn.weight_ih_l0" in norms[-1]["param_norms"]


def mixed_trainer(callback: GradwatchCallback) -> L.Trainer:
    """One epoch under 16-mixed with a GradScaler starting at 2**16: what
    precision="16-mixed" builds on a GPU, asked for by hand on this CPU."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    return L.Trainer(
        max_epochs=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)],
        callbacks=[callback], accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip


class MixedRegressor(L.LightningModule):
    """An MLP under 16-mixed precision that keeps each step's true gradient norms: the
    scaled gradients backward left, divided by the scale backward ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.true_norms: list[dict[str, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_after_backward(self) -> None:
        scale = self.trainer.precision_plugin.scaler.get_scale()
        self.true_norms.append({n: p.grad.float().norm().item() / scale  # type: ignore[union-attr]
                                for n, p in self.named_parameters()})

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_under_16_mixed_the_norms_are_unscaled_without_being_told_the_scaler(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
) -> None:
    spool = tmp_path / "amp.jsonl"
    module = MixedRegressor()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
    mixed_trainer(GradwatchCallback(run="pl-amp", spool=spool, every=1, quiet=True)).fit(
        module, DataLoader(data, batch_size=8))
    steps = spooled(spool, "step")
    assert len(steps) == len(module.true_norms) == 8
    for record, true in zip(steps, module.true_norms, strict=True):
        # not 65536x: the callback handed the plugin's scaler to watch() (a step the
        # scaler skipped for overflowing is Infinity on both sides)
        norms = {name: to_float(value) for name, value in record["param_norms"].items()}
        assert norms == pytest.approx(true, rel=1e-5)
    assert spooled(spool, "alert") == []  # nor a nonfinite alarm for a skipped step


def _runs(http: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{http}/api/runs", timeout=5) as answer:  # noqa: S310
        return list(json.loads(answer.read()))


def test_a_failing_fit_ends_crashed_and_a_good_one_finished_on_a_real_server(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    good = GradwatchCallback(run="pl-good", server=server.url, spool=tmp_path / "good.jsonl")
    trainer(good, 1, 2).fit(Regressor(), loader())
    bad = GradwatchCallback(run="pl-bad", server=server.url, spool=tmp_path / "bad.jsonl")
    with pytest.raises(RuntimeError, match="the data went bad"):
        trainer(bad, 2, 2).fit(Regressor(fail_at=5), loader())
    assert bad.monitor is not None and bad.monitor.closed
    found = {r["name"]: r for r in _runs(server.http)}
    assert found["pl-good"]["status"] == "finished"
    assert found["pl-good"]["last_step"] == 3
    assert found["pl-bad"]["status"] == "crashed"
    assert found["pl-bad"]["last_step"] == 1  # batches 0-4 ran: two optimizer steps


def test_the_standalone_pytorch_lightning_package_runs_the_same_callback(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]]
) -> None:
    pl = importlib.import_module("pytorch_lightning")

    class Linear(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(3, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.mse_loss(self.layer(batch[0][:, -1]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    spool = tmp_path / "pl.jsonl"
    pl.Trainer(
        max_epochs=1, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        callbacks=[GradwatchCallback(run="standalone", spool=spool)],
    ).fit(Linear(), loader())
    assert [s["step"] for s in spooled(spool, "step")] == [0, 1, 2, 3]
    assert spooled(spool, "end")[0]["status"] == "finished"


DDP = """
import sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {here!r})
import lightning as L
from test_lightning import Regressor, loader
from gradwatch.integrations.lightning import GradwatchCallback

if __name__ == "__main__":
    callback = GradwatchCallback(run="pl-ddp", server={server!r}, spool={spool!r})
    L.Trainer(max_epochs=1, accumulate_grad_batches=2, accelerator="cpu", devices=2,
              strategy="ddp", callbacks=[callback], logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False,
              use_distributed_sampler=True).fit(Regressor(), loader())
"""


@pytest.mark.timeout(320)
@pytest.mark.slow
def test_under_ddp_each_rank_reports_as_its_rank_of_one_run(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP.format(here=str(Path(__file__).parent), server=server.url,
                                 spool=str(tmp_path / "ddp.jsonl")))
    # Lightning's DDP launcher runs this script again for rank 1; gloo on loopback
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = _runs(server.http)
    assert run["name"] == "pl-ddp"
    assert run["ranks"] == [0, 1] and run["world_size"] == 2
    assert run["status"] == "finished"
    # 64 samples over 2 ranks: 4 batches of 8 each, accumulation 2 -> 2 steps per rank
    for rank in (0, 1):
        url = f"{server.http}/api/runs/{run['id']}/steps?rank={rank}&fields=loss"
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
            steps = json.loads(answer.read())
        assert steps["fields"]["loss"]["step"] == [0, 1], (rank, steps)


class Counted(Regressor):
    """Counts the graph of each loss backward runs from, after that backward."""

    def __init__(self, graph_size: Callable[[Any], int]) -> None:
        super().__init__()
        self.graph_size = graph_size
        self.sizes: list[int] = []
        self._last: torch.Tensor | None = None

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.count_last()
        self._last = loss

    def count_last(self) -> None:
        if self._last is not None:
            self.sizes.append(self.graph_size(self._last.grad_fn))
            self._last = None


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_graph_of_each_step_is_read_from_the_loss_backward_ran_from(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
    graph_size: Callable[[Any], int], accumulate: int,
) -> None:
    # Lightning hands callbacks a detached copy of the loss: the graph comes from
    # on_before_backward, so graph size is recorded (it was missing before)
    spool = tmp_path / "run.jsonl"
    module = Counted(graph_size)
    trainer(GradwatchCallback(run="pl", spool=spool, every=1), 1, accumulate).fit(
        module, loader())
    module.count_last()
    steps = spooled(spool, "step")
    assert len(steps) == 8 // accumulate and len(module.sizes) == 8
    walked = [s for s in steps if "graph_nodes" in s]  # a steady graph: at doubling gaps
    assert walked[0]["step"] == 0
    last = [module.sizes[accumulate * s["step"] + accumulate - 1] for s in walked]
    assert [s["graph_nodes"] for s in walked] == last
    assert spooled(spool, "alert") == []


class Keeper(Regressor):
    """Keeps every loss it returns, graph and all (outputs saved for the epoch's end)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.kept.append(loss)
        return loss


def test_a_module_that_keeps_its_losses_is_named(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]]
) -> None:
    # backward runs from Lightning's loss / normalize, a node the module never holds:
    # the kept-loss check watches the module's loss below it
    spool = tmp_path / "run.jsonl"
    trainer(GradwatchCallback(run="pl", spool=spool), 1, 1).fit(Keeper(), loader())
    alerts = spooled(spool, "alert")
    assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [("graph_growth", "loss", 2)]
    assert "loss.item()" in alerts[0]["hint"]


@pytest.mark.parametrize(("samples", "schedule"), [(80, {0: 4}), (64, {0: 3, 1: 5})])
def test_a_short_last_window_records_the_mean_of_its_own_batches(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
    samples: int, schedule: dict[int, int],
) -> None:
    # Lightning divides each batch's loss by accumulate_grad_batches, in an epoch's
    # short last window too (10 batches by 4: 4, 4, 2): that window's losses sum to
    # 2/4 of its mean. The scheduler changes the window per epoch (8 by 3, then by 5).
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    spool = tmp_path / "run.jsonl"
    module = Regressor()
    epochs, per_epoch = 2, samples // 8
    L.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[GradientAccumulationScheduler(scheduling=schedule),
                   GradwatchCallback(run="pl-short", spool=spool, every=1)],
    ).fit(module, loader(samples))
    expected: list[float] = []
    for epoch in range(epochs):
        size = schedule[max(e for e in schedule if e <= epoch)]
        expected += _window_means(module.losses[epoch * per_epoch : (epoch + 1) * per_epoch], size)
    steps = spooled(spool, "step")
    assert [s["step"] for s in steps] == list(range(len(expected)))
    assert [s["loss"] for s in steps] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(("accumulate", "epochs"), [(2, 2), (4, 3)])
def test_a_fit_resumed_from_a_checkpoint_steps_with_its_optimizer(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
    accumulate: int, epochs: int,
) -> None:
    # Lightning restores global_step from the checkpoint after on_fit_start: read there,
    # the first batch looked like a step of its own, and every window after it split
    first = trainer(GradwatchCallback(run="pl-first", spool=tmp_path / "first.jsonl"), 1,
                    accumulate)
    first.fit(Regressor(), loader())
    checkpoint = tmp_path / "epoch-1.ckpt"
    first.save_checkpoint(checkpoint)
    spool = tmp_path / "resumed.jsonl"
    module = Regressor()
    resumed = trainer(GradwatchCallback(run="pl-resumed", spool=spool, every=1), epochs,
                      accumulate)
    resumed.fit(module, loader(), ckpt_path=checkpoint)
    steps = spooled(spool, "step")
    taken = resumed.global_step - first.global_step
    assert taken == (epochs - 1) * 8 // accumulate  # the checkpoint's epoch is not redone
    assert [s["step"] for s in steps] == list(range(taken))
    assert [s["loss"] for s in steps] == pytest.approx(
        _window_means(module.losses, accumulate), rel=1e-5)
    assert [e["steps"] for e in spooled(spool, "epoch")] == [8 // accumulate] * (epochs - 1)


class BFloat16Regressor(L.LightningModule):
    """An MLP trained in bfloat16 (``bf16-true``): each batch's loss is a bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        assert loss.dtype == torch.bfloat16
        self.losses.append(float(loss))  # a bfloat16 is exactly a float
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.mark.parametrize("accumulate", [2, 4])
def test_a_bfloat16_loss_is_summed_over_the_window_in_float32(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]], accumulate: int,
) -> None:
    # Summed in bfloat16 (8 bits of mantissa) the window's mean was off by up to ~0.4 %;
    # dividing by 2 or 4 is exact, so the float32 sum is the mean to float32 rounding
    spool = tmp_path / "bf16.jsonl"
    module = BFloat16Regressor()
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(96, 6, generator=g), 3 * torch.randn(96, 1, generator=g))
    L.Trainer(
        max_epochs=1, precision="bf16-true", accumulate_grad_batches=accumulate,
        callbacks=[GradwatchCallback(run="pl-bf16", spool=spool, every=1)],
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    ).fit(module, DataLoader(data, batch_size=8))
    steps = spooled(spool, "step")
    assert len(steps) == 12 // accumulate
    assert [s["loss"] for s in steps] == pytest.approx(
        _window_means(module.losses, accumulate), rel=1e-6)


class ManualRegressor(L.LightningModule):
    """Manual optimization as Lightning's docs show it: ``training_step`` runs backward
    and the optimizer itself and returns nothing. ``accumulate`` batches make one
    optimizer step, each batch's loss divided by it before backward; ``twice`` runs a
    second backward per batch (a GAN's two losses)."""

    def __init__(self, accumulate: int = 1, twice: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.rnn = nn.GRU(3, 8, batch_first=True)
        self.head = nn.Linear(8, 1)
        self.accumulate = accumulate
        self.twice = twice
        self.losses: list[float] = []  # what each batch's backward ran from

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        x, y = batch
        out, _ = self.rnn(x)
        loss = nn.functional.mse_loss(self.head(out[:, -1]), y) / self.accumulate
        self.losses.append(float(loss))
        self.manual_backward(loss)
        if self.twice:
            self.manual_backward(self.head.weight.square().sum())
        if (batch_idx + 1) % self.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pytest.mark.parametrize("accumulate", [1, 2, 4])
def test_manual_optimization_records_the_loss_backward_ran_from(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]], accumulate: int
) -> None:
    """A ``training_step`` that returns nothing: the step's loss is the sum of the
    losses its batches ran backward from (each already divided by ``accumulate``)."""
    spool = tmp_path / "manual.jsonl"
    module = ManualRegressor(accumulate)
    trainer(GradwatchCallback(run="pl-manual", spool=spool, every=1), 2, 1).fit(
        module, loader())
    steps = spooled(spool, "step")
    assert [s["step"] for s in steps] == list(range(2 * 8 // accumulate))
    sums = [sum(module.losses[i : i + accumulate])
            for i in range(0, len(module.losses), accumulate)]  # fmt: skip
    assert [s["loss"] for s in steps] == pytest.approx(sums, rel=1e-5)
    assert all(s.get("param_norms") for s in steps)


def test_manual_optimization_with_two_backward_passes_a_batch_records_no_loss(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]]
) -> None:
    """Two losses a batch (a GAN's): no one of them is the step's loss, and their sum is
    not one either."""
    spool = tmp_path / "two.jsonl"
    trainer(GradwatchCallback(run="pl-two", spool=spool, every=1), 1, 1).fit(
        ManualRegressor(twice=True), loader())
    steps = spooled(spool, "step")
    assert [s["step"] for s in steps] == list(range(8))
    assert [s.get("loss") for s in steps] == [None] * 8
    assert steps[-1]["backward_passes"] == 2


def test_manual_optimization_under_16_mixed_records_the_unscaled_loss(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]]
) -> None:
    """The loss backward runs from is scaled (65536x at first): the step's is not."""
    spool = tmp_path / "manual-amp.jsonl"
    module = ManualRegressor()
    callback = GradwatchCallback(run="pl-manual-amp", spool=spool, every=1, quiet=True)
    mixed_trainer(callback).fit(module, loader())
    steps = spooled(spool, "step")
    assert [s["loss"] for s in steps] == pytest.approx(module.losses, rel=1e-5)


class Costly(GradwatchCallback):
    """Its work at each optimizer step takes the given seconds in turn (busy, as a
    slow callback's would)."""

    def __init__(self, seconds: list[float], spend: Callable[[float], float],
                 **options: Any) -> None:
        super().__init__(**options)
        self.seconds = seconds
        self.spend = spend
        self.took: list[float] = []

    def _window_mean(self, trainer: Any, pl_module: Any) -> torch.Tensor | None:
        self.took.append(self.spend(self.seconds[len(self.took) % len(self.seconds)]))
        return super()._window_mean(trainer, pl_module)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_callbacks_own_time_counts_in_the_steps_overhead(
    tmp_path: Path, spooled: Callable[[Path, str], list[dict[str, Any]]],
    spend: Callable[[float], float], accumulate: int,
) -> None:
    # what the callback does around step() is gradwatch's cost too: a step charged
    # nothing follows a charged one, so time carried to the next record would show
    spool = tmp_path / "run.jsonl"
    callback = Costly([0.0, 0.05, 0.0, 0.03, 0.08, 0.0], spend, run="pl", spool=spool,
                      every=10**9)
    trainer(callback, 1, accumulate).fit(Regressor(), loader())
    steps = spooled(spool, "step")
    assert len(steps) == len(callback.took) == 8 // accumulate
    for step, took in zip(steps, callback.took, strict=True):
        counted = step["overhead"] * step["duration_s"]
        assert counted >= took, (step["step"], counted, took)
        if step["step"] > 0:  # light steps of a small GRU: well under a millisecond
            assert counted < took + 0.019, (step["step"], counted, took)
