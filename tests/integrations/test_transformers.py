"""A real Hugging Face Trainer with GradwatchCallback, on a tiny model made from a config."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

from gradwatch.integrations.transformers import GradwatchCallback

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

Spooled = Callable[[Path, str], list[dict[str, Any]]]


class Examples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, lm: bool) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 50, (n, 6), generator=g)
        self.labels = self.ids.clone() if lm else torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny(kind: str) -> torch.nn.Module:
    """Built from a config: no download, a few thousand parameters."""
    torch.manual_seed(0)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=16,
                                          n_layer=1, n_head=2))
    return BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=2))


def train(model: torch.nn.Module, out: Path, callback: GradwatchCallback, *, samples: int,
          batch: int, accumulate: int, epochs: int, lm: bool) -> Trainer:
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=batch, num_train_epochs=epochs,
        gradient_accumulation_steps=accumulate, logging_steps=1, save_strategy="no",
        report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=1e-3,
        dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Examples(samples, lm),
                      callbacks=[callback])
    trainer.train()
    return trainer


@pytest.mark.parametrize(
    ("kind", "accumulate", "epochs", "per_epoch"),
    [("bert", 2, 2, 4), ("gpt2", 4, 1, 2), ("bert", 1, 1, 8)],
)
def test_one_step_per_optimizer_step_with_the_trainers_loss(
    tmp_path: Path, spooled: Spooled, kind: str, accumulate: int, epochs: int, per_epoch: int
) -> None:
    spool = tmp_path / "run.jsonl"
    trainer = train(tiny(kind), tmp_path / "out", GradwatchCallback(run=kind, spool=spool),
                    samples=64, batch=8, accumulate=accumulate, epochs=epochs, lm=kind == "gpt2")
    steps = spooled(spool, "step")
    assert [s["step"] for s in steps] == list(range(epochs * per_epoch))
    assert trainer.state.global_step == len(steps)
    assert [e["steps"] for e in spooled(spool, "epoch")] == [per_epoch] * epochs
    assert spooled(spool, "end")[0]["status"] == "finished"
    # logging_steps=1: the Trainer logs each optimizer step's loss (rounded to 4 places)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == len(steps)
    assert [s["loss"] for s in steps] == pytest.approx(logged, abs=2e-4)
    assert any(s.get("param_norms") for s in steps)


CRASHING = """
import sys, torch, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {here!r})
from test_transformers import Examples, tiny, train
from gradwatch.integrations.transformers import GradwatchCallback

class Broken(Examples):
    calls = 0

    def __getitem__(self, i):
        Broken.calls += 1
        if Broken.calls > 36:  # in the fifth batch of 8
            raise RuntimeError("a corrupt sample")
        return super().__getitem__(i)

import test_transformers
test_transformers.Examples = Broken
train(tiny("bert"), {out!r}, GradwatchCallback(run="hf-crash", server={server!r}),
      samples=64, batch=8, accumulate=1, epochs=1, lm=False)
"""


@pytest.mark.timeout(320)
def test_with_a_grad_scaler_the_norms_are_unscaled_without_being_told_the_scaler(
    tmp_path: Path, spooled: Spooled
) -> None:
    norms, totals = {}, {}
    for scaled in (False, True):
        spool = tmp_path / f"scaled-{scaled}.jsonl"
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
            num_train_epochs=1, save_strategy="no", report_to=[], use_cpu=True,
            disable_tqdm=True, learning_rate=1e-3, dataloader_num_workers=0, seed=0,
        )
        callback = GradwatchCallback(run="hf-amp", spool=spool, every=1, quiet=True)
        trainer = Trainer(model=tiny("bert"), args=args, train_dataset=Examples(16, False),
                          callbacks=[callback])
        if scaled:
            # what fp16=True gives accelerate on a GPU; on this CPU it is set by hand.
            # A power of two: the scaled run's true gradients are the plain run's exactly.
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        trainer.train()
        steps = spooled(spool, "step")
        norms[scaled] = [s["param_norms"] for s in steps]
        totals[scaled] = [s["total_norm"] for s in steps]
    assert len(norms[True]) == len(norms[False]) == 4
    # the first step's gradients are the same to the bit; the scaler's optimizer path
    # then rounds the updates a little differently, and the runs part a little
    assert norms[True][0] == pytest.approx(norms[False][0], rel=1e-6)
    assert totals[True] == pytest.approx(totals[False], rel=0.02)  # not 65536x


def test_training_that_raises_ends_the_run_crashed(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    script = CRASHING.format(here=str(Path(__file__).parent), out=str(tmp_path / "out"),
                             server=server.url)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "a corrupt sample" in done.stderr, done.stderr[-2000:]
    with urllib.request.urlopen(f"{server.http}/api/runs", timeout=5) as answer:  # noqa: S310
        (run,) = json.loads(answer.read())
    assert run["name"] == "hf-crash"
    assert run["status"] == "crashed"
    # four batches loaded; the loader reads one batch ahead, so three were trained
    assert run["last_step"] == 2


class BrokenAt(Examples):
    """Raises on the `fail_at`-th sample read: a corrupt sample in the middle of training."""

    def __init__(self, n: int, fail_at: int) -> None:
        super().__init__(n, lm=False)
        self.reads, self.fail_at = 0, fail_at

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.reads += 1
        if self.reads > self.fail_at:
            raise RuntimeError("a corrupt sample")
        return super().__getitem__(i)


class FailingLoss(Trainer):
    """Raises in the third optimizer step's loss, once: a failure inside forward/backward."""

    failed = False

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if self.state.global_step == 2 and not self.failed:
            self.failed = True
            raise FloatingPointError("the loss blew up")
        return super().compute_loss(model, inputs, *args, **kwargs)


def _runs(server: Any) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.http}/api/runs", timeout=5) as answer:  # noqa: S310
        return list(json.loads(answer.read()))


@pytest.mark.parametrize(
    ("failure", "added"),
    [("a batch", "callbacks="), ("the loss", "callbacks="), ("a batch", "add_callback"),
     ("the loss", "add_callback")],
)
def test_a_caught_training_exception_marks_the_run_crashed_at_once(
    gradwatch_server: Callable[..., Any], tmp_path: Path, failure: str, added: str
) -> None:
    """The process lives on (a sweep, a notebook): the run must not stay live."""
    server = gradwatch_server()
    callback = GradwatchCallback(run="hf-caught", server=server.url, spool=tmp_path / "s.jsonl")
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_train_epochs=1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, seed=0, logging_steps=1,
    )
    data = BrokenAt(64, 36) if failure == "a batch" else Examples(64, lm=False)
    kind = FailingLoss if failure == "the loss" else Trainer
    given = [callback] if added == "callbacks=" else []
    trainer = kind(model=tiny("bert"), args=args, train_dataset=data, callbacks=given)
    if added == "add_callback":
        trainer.add_callback(callback)
    with pytest.raises((RuntimeError, FloatingPointError)) as raised:
        trainer.train()
    assert str(raised.value) in ("a corrupt sample", "the loss blew up")
    # Still in this process: the run already says crashed, with the steps it made.
    (run,) = _runs(server)
    assert run["name"] == "hf-caught" and run["status"] == "crashed", run
    assert run["last_step"] == (2 if failure == "a batch" else 1)
    assert callback.monitor is not None and callback.monitor.closed
    # The Trainer still trains afterwards, as a new run, ending finished.
    if failure == "the loss":
        trainer.train()
        assert sorted(r["status"] for r in _runs(server)) == ["crashed", "finished"]


@pytest.mark.parametrize("keep_all", [False, True])
def test_the_graph_of_each_step_is_read_from_the_batch_loss(
    tmp_path: Path, spooled: Spooled, graph_size: Callable[[Any], int], keep_all: bool
) -> None:
    # The Trainer's step loss is a detached sum: the graph comes from the last batch's
    # loss the model returned, so graph size is recorded (it was missing before), and a
    # loss kept alive by the user's code is named.
    spool = tmp_path / "run.jsonl"
    model = tiny("bert")
    kept: list[torch.Tensor] = []
    sizes: list[int] = []

    def count(module: Any, args: Any, output: Any) -> None:
        if module.training and output.loss is not None and output.loss.grad_fn is not None:
            if kept and not keep_all:  # the last batch's, after its backward
                sizes.append(graph_size(kept.pop().grad_fn))
            kept.append(output.loss)

    model.register_forward_hook(count)
    callback = GradwatchCallback(run="graph", spool=spool, every=1)
    train(model, tmp_path / "out", callback, samples=48, batch=4, accumulate=2, epochs=1,
          lm=False)
    sizes += [graph_size(loss.grad_fn) for loss in kept]  # counted as gradwatch does:
    kept.clear()  # at the step's end, after backward
    steps, alerts = spooled(spool, "step"), spooled(spool, "alert")
    assert len(steps) == 6 and len(sizes) == 12
    # each step walked (a steady graph is walked at doubling gaps): the second of its
    # two accumulated batches
    walked = [s for s in steps if "graph_nodes" in s]
    assert walked[0]["step"] == 0
    assert [s["graph_nodes"] for s in walked] == [sizes[2 * s["step"] + 1] for s in walked]
    assert all(s["graph_truncated"] is False for s in walked)
    if keep_all:  # every batch's loss (and graph) kept: named, with the fix
        assert [(a["code"], a["subject"], a["step"]) for a in alerts] == [
            ("graph_growth", "loss", 2)]
        assert "loss.item()" in alerts[0]["hint"]
    else:
        assert alerts == []


class TupleClassifier(torch.nn.Module):
    """A plain module that returns ``(loss, logits)``, or a list of them, as models with
    ``return_dict=False`` do: the Trainer trains on ``outputs[0]``."""

    def __init__(self, as_list: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 2)
        self.as_list = as_list

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        out, _ = self.rnn(self.embed(input_ids))
        logits = self.head(out[:, -1])
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return [loss, logits] if self.as_list else (loss, logits)


@pytest.mark.parametrize(("as_list", "accumulate", "samples"), [(False, 2, 48), (True, 3, 40)])
def test_a_model_returning_a_tuple_records_its_first_item_as_the_loss(
    tmp_path: Path, spooled: Spooled, graph_size: Callable[[Any], int],
    as_list: bool, accumulate: int, samples: int,
) -> None:
    # Only a ModelOutput's or a mapping's "loss" was read: such a model's steps had
    # neither loss nor graph. 40 samples by 4, 3 at a time: windows of 3, 3, 3 and 1.
    spool = tmp_path / "run.jsonl"
    model = TupleClassifier(as_list)
    sizes: list[int] = []  # each training batch's graph, counted as the model returns it

    def count(module: Any, args: Any, output: Any) -> None:
        if module.training:
            sizes.append(graph_size(output[0].grad_fn))

    model.register_forward_hook(count)
    trainer = train(model, tmp_path / "out", GradwatchCallback(run="tuple", spool=spool, every=1),
                    samples=samples, batch=4, accumulate=accumulate, epochs=1, lm=False)
    steps = spooled(spool, "step")
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    batches = samples // 4
    assert len(steps) == len(logged) == -(-batches // accumulate) and len(sizes) == batches
    assert [s.get("loss") for s in steps] == pytest.approx(logged, abs=2e-4)
    # each walked step's graph: the last batch of its window's
    walked = [s for s in steps if "graph_nodes" in s]
    assert walked and walked[0]["step"] == 0
    last = [min((s["step"] + 1) * accumulate, batches) - 1 for s in walked]
    assert [s["graph_nodes"] for s in walked] == [sizes[i] for i in last]


class SlowLossOutput:
    """A model output the Trainer reads as ``outputs[0]``; its ``loss`` attribute, read
    by the callback's forward hook, takes the model's next given seconds (busy)."""

    def __init__(self, loss: torch.Tensor, logits: torch.Tensor, wait: Callable[[], None]):
        self._items = (loss, logits)
        self._wait = wait

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._items[i]

    @property
    def loss(self) -> torch.Tensor:
        self._wait()
        return self._items[0]


class SlowLossClassifier(TupleClassifier):
    def __init__(self, seconds: list[float], spend: Callable[[float], float]) -> None:
        super().__init__(as_list=False)
        self.seconds = seconds
        self.spend = spend
        self.took: list[float] = []

    def _wait(self) -> None:
        self.took.append(self.spend(self.seconds[len(self.took) % len(self.seconds)]))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        loss, logits = super().forward(input_ids, labels)
        return SlowLossOutput(loss, logits, self._wait)


def test_the_callbacks_own_time_counts_in_the_steps_overhead(
    tmp_path: Path, spooled: Spooled, spend: Callable[[float], float]
) -> None:
    # what the callback does in its forward hook is gradwatch's cost too: a step charged
    # nothing follows a charged one, so time carried to the next record would show
    spool = tmp_path / "run.jsonl"
    model = SlowLossClassifier([0.0, 0.05, 0.0, 0.03, 0.08, 0.0], spend)
    callback = GradwatchCallback(run="costly", spool=spool, every=10**9)
    train(model, tmp_path / "out", callback, samples=24, batch=4, accumulate=1, epochs=1,
          lm=False)
    steps = spooled(spool, "step")
    assert len(steps) == len(model.took) == 6
    for step, took in zip(steps, model.took, strict=True):
        counted = step["overhead"] * step["duration_s"]
        assert counted >= took, (step["step"], counted, took)
        if step["step"] > 0:  # light steps of a small LSTM: well under a millisecond
            assert counted < took + 0.019, (step["step"], counted, took)
