"""Runs that judge the diagnoses: healthy models under step-time jitter, and bug variants.

Shared by the false-alarm suite (tests/trainer_hooks/test_false_alarms.py) and
``bench/diagnoses.py --alarms``. Two kinds of model:

- the examples (examples/*.py), their bug variants and their healthy twins
  (``--fixed``), run in-process;
- models written the way public tutorials write them, not designed for gradwatch:
  a 2-layer GRU language model (truncated BPTT, hidden state repackaged), an
  ``nn.LSTMCell`` decoder loop, a seq2seq with Bahdanau attention (a GRU encoder and
  a decoder looping over target tokens, ``profile=True``), and an ``nn.LSTMCell``
  time-series model trained with ``torch.optim.LBFGS`` and a closure; and a ReLU RNN
  that meets a long batch now and then, under Adam (healthy: it absorbs the gradient
  spikes) and under plain SGD (a bug variant: the first spike wrecks it).

:func:`jittered` injects the noise of a loaded machine: before each
``monitor.step`` it sleeps a seeded random U(0, 1) times the step's own work, so
step times vary by ±50% around their mean.

Example:
    >>> alerts, durations = run_model("lstmcell_decoder", steps=3, seed=0)
    >>> len(durations), alerts
    (3, [])
"""

from __future__ import annotations

import importlib.util
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.monitor import Monitor

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

#: what a healthy model may say because it is true of it: the tutorial seq2seq does loop
#: over target tokens in its decoder (one alert, raised once, never cleared). (The fixed
#: rotation_lstm's total norm jumps from ~0.5 to 95-190 for several steps around step
#: 176; Adam absorbs it and the loss stays in its band: no exploding, nothing allowed.)
EXPECTED: dict[str, set[tuple[str, str]]] = {
    "seq2seq_bahdanau": {("hotspot", "decoder")},
    # Adam, no clipping: at steps 414-416 (seed 2) the batch loss jumps from ~0.07 to
    # 0.77, 4.9, 2.3 (41x its median) with the total norm from ~0.7 to 13, and takes
    # ten steps to come back: a real loss spike of the run, not noise
    "seq2seq_attention-fixed": {("spike", "loss")},
    # the long batches (80 timesteps through a recurrent gain of 1.05) have losses of
    # 150-350,000 against a median of ~4.4: the outputs explode over long sequences.
    # Adam absorbs the update (no exploding), but the loss spikes are real, one per
    # long batch, each cleared three steps later
    "rnn_long_batches": {("spike", "loss")},
}

#: example -> (the alert code its bug variant must raise, its subject)
BUGS: dict[str, tuple[str, str]] = {
    "long_lstm": ("vanishing", "lstm"),
    "rotation_lstm": ("graph_growth", "lstm1"),
    "tree_gru": ("graph_growth", "cell"),
    "seq2seq_attention": ("hotspot", "decoder"),
}

#: example -> (alert code, subject, step) of a bug that strikes at a known step, later
#: than 10 steps (a spike is judged against a band of at least 20 earlier values)
AT_STEP: dict[str, tuple[str, str, int]] = {
    "tiny_gpt": ("spike", "loss", 80),
}


@contextmanager
def jittered(seed: int) -> Iterator[None]:
    """Sleep U(0, 1) x the step's own work before every ``Monitor.step`` (seeded)."""
    rng = random.Random(seed)
    original = Monitor.step
    last = [time.perf_counter()]

    def step(self: Monitor, loss: Any = None) -> None:
        work = time.perf_counter() - last[0]
        time.sleep(rng.uniform(0.0, 1.0) * min(work, 1.0))
        original(self, loss)
        last[0] = time.perf_counter()

    Monitor.step = step  # type: ignore[method-assign]
    try:
        yield
    finally:
        Monitor.step = original  # type: ignore[method-assign]


def spool_alerts(path: Path) -> tuple[list[dict[str, Any]], list[float]]:
    """(alert records, every step record's duration_s) of a spool."""
    records = [r for m in list(read_spool(path))[1:] for r in m["records"]]
    alerts = [r for r in records if r["kind"] == "alert"]
    return alerts, [float(r["duration_s"]) for r in records if r["kind"] == "step"]


def run_example(name: str, *argv: str, seed: int = 0) -> tuple[list[dict[str, Any]], list[float]]:
    """Run examples/<name>.py in-process under jitter; (alerts, step durations)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(
        f"gradwatch_bench_{name}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / f"{name}.jsonl"
        with jittered(seed):
            module.main([*argv, "--seed", str(seed), "--spool", str(spool), "--quiet"])
        return spool_alerts(spool)


# --- models written the way tutorials write them -------------------------------------


class GRULanguageModel(nn.Module):
    """The word-language-model tutorial's RNN model, tiny: embedding, 2-layer GRU, decoder."""

    def __init__(self, vocab: int = 40, hidden: int = 24) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, num_layers=2)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.rnn(self.embedding(x), h)
        return self.decoder(out), h


def _gru_lm(steps: int, monitor_for: Callable[[nn.Module], Monitor]) -> None:
    vocab, bptt, batch = 40, 12, 8
    corpus = torch.zeros(bptt * steps + 1, batch, dtype=torch.long)
    for t in range(1, corpus.shape[0]):  # a Markov chain a model can learn
        corpus[t] = (corpus[t - 1] * 7 + torch.randint(0, 3, (batch,))) % vocab
    model = GRULanguageModel(vocab)
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)
    h = torch.zeros(2, batch, 24)
    with monitor_for(model) as monitor:
        for i in range(steps):
            x, y = corpus[i * bptt : (i + 1) * bptt], corpus[i * bptt + 1 : (i + 1) * bptt + 1]
            h = h.detach()  # repackage_hidden
            out, h = model(x, h)
            loss = nn.functional.cross_entropy(out.view(-1, vocab), y.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            monitor.step(loss)


class CellDecoder(nn.Module):
    """An ``nn.LSTMCell`` run in a Python loop, a loss on every output (teacher forcing)."""

    def __init__(self, hidden: int = 24) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(1, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        outs = []
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            outs.append(self.out(h))
        return torch.stack(outs, 1)


def _sine(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    phase = torch.rand(batch, 1) * 6.28
    wave = torch.sin(phase + 0.3 * torch.arange(length + 1).float()).unsqueeze(-1)
    return wave[:, :-1], wave[:, 1:]


def _lstmcell_decoder(steps: int, monitor_for: Callable[[nn.Module], Monitor]) -> None:
    model = CellDecoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with monitor_for(model) as monitor:
        for _ in range(steps):
            x, y = _sine(8, 16)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)


class BahdanauAttention(nn.Module):
    """The seq2seq tutorial's additive attention: scores from the query and the keys."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.Wa = nn.Linear(hidden, hidden)
        self.Ua = nn.Linear(hidden, hidden)
        self.Va = nn.Linear(hidden, 1)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)
        return torch.bmm(torch.softmax(scores, dim=-1), keys)


class Seq2Seq(nn.Module):
    """Tutorial-style: batched GRU encoder; the decoder loops over target tokens, calling
    attention on the previous hidden state and a fused GRU of length 1 per token."""

    def __init__(self, vocab: int = 12, hidden: int = 16, target_len: int = 10) -> None:
        super().__init__()
        self.target_len = target_len
        self.enc_embedding = nn.Embedding(vocab, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = AttnDecoder(vocab, hidden, target_len)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        keys, h = self.encoder(self.enc_embedding(src))
        return self.decoder(keys, h, tgt)


class AttnDecoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, target_len: int) -> None:
        super().__init__()
        self.target_len = target_len
        self.embedding = nn.Embedding(vocab, hidden)
        self.attention = BahdanauAttention(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, keys: torch.Tensor, h: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        token = torch.zeros(tgt.shape[0], 1, dtype=torch.long)
        outs = []
        for i in range(self.target_len):
            query = h.permute(1, 0, 2)
            context = self.attention(query, keys)
            x = torch.cat((self.embedding(token), context), dim=2)
            out, h = self.gru(x, h)
            outs.append(self.out(out))
            token = tgt[:, i].unsqueeze(1)  # teacher forcing
        return torch.cat(outs, 1)


def _seq2seq_bahdanau(steps: int, monitor_for: Callable[[nn.Module], Monitor]) -> None:
    model = Seq2Seq()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with monitor_for(model) as monitor:
        for _ in range(steps):
            src = torch.randint(1, 12, (8, 10))
            out = model(src, src.flip(1))  # learn to reverse
            loss = nn.functional.cross_entropy(out.reshape(-1, 12), src.flip(1).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)


def _lbfgs_lstmcell(steps: int, monitor_for: Callable[[nn.Module], Monitor]) -> None:
    """The time-sequence-prediction example, tiny: LSTMCell over a sine, LBFGS with a closure."""
    model = CellDecoder(hidden=12)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    x, y = _sine(4, 16)
    with monitor_for(model) as monitor:
        for _ in range(steps):

            def closure() -> torch.Tensor:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            loss = optimizer.step(closure)
            monitor.step(loss)


def _rnn_long_batches(
    steps: int, monitor_for: Callable[[nn.Module], Monitor], sgd: bool = False
) -> None:
    """A ReLU RNN (recurrent weight 1.05 x identity) on batches of 10 timesteps, with one
    of 80 from a length bucket at step 8 and every 50 steps after: the gradient grows
    ~1.05 per timestep back, so those batches' total norms are ~1e4-1e5x the others'.
    Adam absorbs them and trains on; plain SGD (``sgd=True``) is wrecked by the first."""
    rnn = nn.RNN(4, 16, nonlinearity="relu", batch_first=True)
    head = nn.Linear(16, 1)
    with torch.no_grad():
        rnn.weight_hh_l0.copy_(1.05 * torch.eye(16))
    model = nn.ModuleDict({"rnn": rnn, "head": head})
    optimizer: torch.optim.Optimizer
    if sgd:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with monitor_for(model) as monitor:
        for step in range(steps):
            x = torch.randn(8, 80 if step % 50 == 8 else 10, 4)
            out, _ = rnn(x)
            target = x[:, -5:, 0].sum(1, keepdim=True)
            loss = nn.functional.mse_loss(head(out[:, -1]), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)


def _rnn_long_batch_sgd(steps: int, monitor_for: Callable[[nn.Module], Monitor]) -> None:
    _rnn_long_batches(steps, monitor_for, sgd=True)


MODELS: dict[str, tuple[Callable[[int, Callable[[nn.Module], Monitor]], None], dict[str, Any]]] = {
    "gru_lm": (_gru_lm, {}),
    "lstmcell_decoder": (_lstmcell_decoder, {}),
    "seq2seq_bahdanau": (_seq2seq_bahdanau, {"profile": True}),
    "lbfgs_lstmcell": (_lbfgs_lstmcell, {}),
    "rnn_long_batches": (_rnn_long_batches, {}),
}

_BUG_MODELS = {"rnn_long_batch_sgd": _rnn_long_batch_sgd}

#: models whose bug the diagnoses must name within 10 steps -> (code, subject); trained
#: like :data:`MODELS` by :func:`run_model`
MODEL_BUGS: dict[str, tuple[str, str]] = {
    "rnn_long_batch_sgd": ("exploding", "total_norm"),
}


def run_model(
    name: str, steps: int = 500, seed: int = 0
) -> tuple[list[dict[str, Any]], list[float]]:
    """Train one of :data:`MODELS` for ``steps`` under jitter; (alerts, step durations)."""
    train, options = MODELS[name] if name in MODELS else (_BUG_MODELS[name], {})
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / f"{name}.jsonl"

        def monitor_for(model: nn.Module) -> Monitor:
            return watch(model, run=name, spool=spool, every=1, **options)

        with jittered(seed):
            train(steps, monitor_for)
        return spool_alerts(spool)
