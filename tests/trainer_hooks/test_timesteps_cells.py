"""Cells called in a Python loop: "hidden"[k] = ‖∂L/∂h_k‖₂ (total derivative), exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

from .precision import F32_RTOL

F64 = torch.float64


def series(record: dict[str, Any], module: str, name: str) -> torch.Tensor:
    return torch.tensor(record["timesteps"][module][name], dtype=F64)


def norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in tensors]
    return torch.stack([torch.linalg.vector_norm(g.to(F64)) for g in grads])


class Loop(nn.Module):
    """A cell driven step by step; the loss sees every output (weighted) or only the last."""

    def __init__(self, cell: nn.Module) -> None:
        super().__init__()
        self.cell = cell

    def run(self, x: torch.Tensor, keep: list[Any] | None = None) -> torch.Tensor:
        state: Any = None
        loss = x.new_zeros(())
        for t in range(x.shape[0]):
            state = self.cell(x[t], state) if state is not None else self.cell(x[t])
            if keep is not None:
                for s in state if isinstance(state, tuple) else (state,):
                    s.retain_grad()
                keep.append(state)
            h = state[0] if isinstance(state, tuple) else state
            loss = loss + (t + 1) * h.tanh().square().sum()
        return loss


@pytest.mark.parametrize("cell_type", [nn.LSTMCell, nn.GRUCell, nn.RNNCell])
def test_builtin_cells_are_found_and_each_call_gets_its_total_gradient(
    cell_type: type, captured_step: Any,
) -> None:
    torch.manual_seed(0)
    model = Loop(cell_type(3, 5).double())
    x = torch.randn(9, 4, 3, dtype=F64)
    record = captured_step(model, lambda: model.run(x).backward())
    kept: list[Any] = []
    model.run(x, kept).backward()
    hs = [s[0] if isinstance(s, tuple) else s for s in kept]
    torch.testing.assert_close(series(record, "cell", "hidden"), norms(hs), rtol=1e-12, atol=0.0)
    if cell_type is nn.LSTMCell:
        cs = [s[1] for s in kept]
        torch.testing.assert_close(series(record, "cell", "cell"), norms(cs), rtol=1e-12, atol=0.0)
    else:
        assert set(record["timesteps"]["cell"]) == {"hidden"}


class HandGRU(nn.Module):
    """A hand-written GRU cell (z, r, candidate), as in the tree-GRU report."""

    def __init__(self, n_in: int, n_hidden: int) -> None:
        super().__init__()
        self.gates = nn.Linear(n_in + n_hidden, 2 * n_hidden)
        self.candidate = nn.Linear(n_in + n_hidden, n_hidden)
        self.n_hidden = n_hidden

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        if h is None:
            h = x.new_zeros(x.shape[0], self.n_hidden)
        z, r = torch.sigmoid(self.gates(torch.cat([x, h], 1))).chunk(2, 1)
        cand = torch.tanh(self.candidate(torch.cat([x, r * h], 1)))
        return r * h + (1 - z) * cand


@pytest.mark.parametrize("how", ["module", "name", "class"])
def test_a_user_named_cell_is_watched_by_module_name_or_class(how: str, captured_step: Any) -> None:
    torch.manual_seed(1)
    model = Loop(HandGRU(2, 4).double())
    spec: Any = {"module": model.cell, "name": "cell", "class": HandGRU}[how]
    x = torch.randn(7, 3, 2, dtype=F64)
    record = captured_step(model, lambda: model.run(x).backward(), cells=[spec])
    kept: list[Any] = []
    model.run(x, kept).backward()
    torch.testing.assert_close(series(record, "cell", "hidden"), norms(kept), rtol=1e-12, atol=0.0)


def test_a_decoder_step_called_once_per_target_token_is_indexed_by_call(captured_step: Any) -> None:
    class DecoderStep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(3, 4)
            self.rnn = nn.GRUCell(4, 6)
            self.attend = nn.Linear(6, 6)

        def forward(self, token: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            h = self.rnn(self.embed(token), h)
            return h + torch.tanh(self.attend(h))

    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = DecoderStep()

    torch.manual_seed(2)
    model = Seq2Seq().double()
    tokens = torch.randn(6, 2, 3, dtype=F64)

    def run(keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        h = tokens.new_zeros(2, 6)
        loss = tokens.new_zeros(())
        for t in range(tokens.shape[0]):
            h = model.decoder(tokens[t], h)
            if keep is not None:
                h.retain_grad()
                keep.append(h)
            loss = loss + h.sin().sum() * (t % 3)
        return loss

    record = captured_step(model, lambda: run().backward(), cells=["decoder"])
    kept: list[torch.Tensor] = []
    run(kept).backward()
    got = series(record, "decoder", "hidden")
    torch.testing.assert_close(got, norms(kept), rtol=1e-12, atol=0.0)
    assert len(record["timesteps"]["decoder.rnn"]["hidden"]) == 6  # the inner GRUCell too


def test_calls_of_two_accumulated_micro_batches_continue_the_index(captured_step: Any) -> None:
    torch.manual_seed(3)
    model = Loop(nn.GRUCell(2, 3).double())
    xs = [torch.randn(4, 2, 2, dtype=F64), torch.randn(5, 2, 2, dtype=F64)]

    def accumulate() -> None:
        for x in xs:
            model.run(x).backward()

    record = captured_step(model, accumulate)
    expected = []
    for x in xs:
        kept: list[Any] = []
        model.run(x, kept).backward()
        expected.append(norms(kept))
    got = series(record, "cell", "hidden")
    torch.testing.assert_close(got, torch.cat(expected), rtol=1e-12, atol=0.0)


def test_a_call_whose_output_gets_no_gradient_reads_zero(captured_step: Any) -> None:
    model = Loop(nn.RNNCell(2, 3))
    x = torch.randn(3, 1, 2)

    def run() -> None:
        h1 = model.cell(x[0])
        model.cell(x[1], h1)  # never used by the loss
        model.cell(x[2], h1).sum().backward()

    record = captured_step(model, run)
    got = record["timesteps"]["cell"]["hidden"]
    assert got[1] == 0.0 and got[0] > 0.0 and got[2] > 0.0


def test_many_calls_grow_the_buffer_and_keep_earlier_norms(captured_step: Any) -> None:
    torch.manual_seed(4)
    model = Loop(nn.GRUCell(1, 2).double())
    x = torch.randn(150, 1, 1, dtype=F64)  # more calls than the first buffer holds
    record = captured_step(model, lambda: model.run(x).backward())
    kept: list[Any] = []
    model.run(x, kept).backward()
    torch.testing.assert_close(series(record, "cell", "hidden"), norms(kept), rtol=1e-12, atol=0.0)


def test_a_named_cell_that_matches_nothing_says_what_it_expected() -> None:
    model = Loop(HandGRU(2, 3))
    q = RecurrentTimesteps(cells=["decodr"])
    with pytest.raises(
        ValueError,
        match=r"expected a module, name or class in the model, "
        r"got 'decodr'; modules: 'cell'",
    ):
        q.attach(model)
    with pytest.raises(ValueError, match=r"got a Linear module"):
        RecurrentTimesteps(cells=[nn.Linear(1, 1)]).attach(model)
    with pytest.raises(
        TypeError,
        match=r"expected cells to be modules, module names or "
        r"nn.Module classes, got 3 \(int\)",
    ):
        RecurrentTimesteps(cells=[3]).attach(model)  # type: ignore[list-item]


def test_a_bad_exact_hidden_value_says_what_it_expected() -> None:
    with pytest.raises(
        ValueError,
        match=r"expected exact_hidden to be True, False or an int "
        r">= 0, got 0.5",
    ):
        RecurrentTimesteps(exact_hidden=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"got -2"):
        RecurrentTimesteps(exact_hidden=-2)


def test_a_decoder_with_a_shrinking_batch_keeps_call_order_across_shapes(
    captured_step: Any,
) -> None:
    torch.manual_seed(5)
    model = Loop(nn.LSTMCell(2, 3).double())
    x = torch.randn(7, 5, 2, dtype=F64)
    sizes = [5, 5, 4, 4, 4, 2, 1]  # batch_size_t: sequences end at different steps

    def run(keep: list[Any] | None = None) -> torch.Tensor:
        h = c = x.new_zeros(5, 3)
        loss = x.new_zeros(())
        for t, b in enumerate(sizes):
            h, c = model.cell(x[t, :b], (h[:b], c[:b]))
            if keep is not None:
                h.retain_grad()
                keep.append(h)
            loss = loss + (t % 3) * h.sin().sum()
        return loss

    record = captured_step(model, lambda: run().backward())
    kept: list[torch.Tensor] = []
    run(kept).backward()
    got = series(record, "cell", "hidden")
    torch.testing.assert_close(got, norms(kept), rtol=1e-12, atol=0.0)
    assert bool((got[:6] > 0).all()) and got[6] == 0.0  # the last call feeds nothing


def test_a_user_who_retains_the_cell_outputs_still_reads_their_grad_after_the_step(
    tmp_path: Any,
) -> None:
    """The capture keeps each output's gradient with retain_grad(); it never resets a
    .grad the user may rely on, so retaining them yourself still gives autograd's."""
    from gradwatch.trainer_hooks import watch

    torch.manual_seed(5)
    model = Loop(nn.LSTMCell(3, 5).double())
    x = torch.randn(6, 2, 3, dtype=F64)
    plain: list[Any] = []
    model.run(x, plain).backward()
    want = [[t.grad.clone() for t in state] for state in plain]
    model.zero_grad()
    with watch(model, run="retain", spool=tmp_path / "r.jsonl", diagnose=False) as monitor:
        kept: list[Any] = []
        loss = model.run(x, kept)
        loss.backward()
        monitor.step(loss)
        monitor.step(model.run(x))  # the next step starts and closes: no grad is reset
    for state, expected in zip(kept, want, strict=True):
        for tensor, grad in zip(state, expected, strict=True):
            assert torch.equal(tensor.grad, grad)


class SelfRetaining(nn.Module):
    """A user cell that retains its own output's gradient (for its own inspection)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(2, 3)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        out = self.cell(x, h)
        out.retain_grad()
        return out


def test_an_output_the_cell_retains_itself_is_captured_through_a_node_hook(
    captured_step: Any,
) -> None:
    torch.manual_seed(6)
    model = Loop(SelfRetaining().double())
    x = torch.randn(5, 2, 2, dtype=F64)
    record = captured_step(model, lambda: model.run(x).backward(), cells=[SelfRetaining])
    kept: list[Any] = []
    model.run(x, kept).backward()
    torch.testing.assert_close(
        series(record, "cell", "hidden"), norms(kept), rtol=1e-12, atol=0.0
    )


def test_an_output_changed_in_place_after_the_call_is_warned_about_once(
    captured_step: Any,
) -> None:
    from gradwatch.trainer_hooks.warn import GradwatchWarning

    torch.manual_seed(7)
    model = Loop(nn.GRUCell(2, 3).double())
    x = torch.randn(4, 2, 2, dtype=F64)

    def run() -> None:
        h = model.cell(x[0])
        for t in range(1, x.shape[0]):
            h = model.cell(x[t], h)
            h.mul_(0.5)  # in place, after the hook ran: .grad follows the changed tensor
        h.sum().backward()

    with pytest.warns(GradwatchWarning, match="changed in place") as caught:
        record = captured_step(model, run)
    assert len([w for w in caught if "changed in place" in str(w.message)]) == 1
    assert len(record["timesteps"]["cell"]["hidden"]) == 4


def test_a_float32_loop_gets_the_float64_norms_of_its_float32_gradients(
    captured_step: Any,
) -> None:
    """Float32 gradients on CPU are reduced in float32: equal, to float32 rounding, to
    the norm of autograd's own gradients cast to float64."""
    torch.manual_seed(8)
    model = Loop(nn.LSTMCell(3, 5))
    x = torch.randn(6, 2, 3)
    kept: list[Any] = []
    model.run(x, kept).backward()
    want = norms([s[0] for s in kept])
    record = captured_step(model, lambda: model.run(x).backward())
    torch.testing.assert_close(series(record, "cell", "hidden"), want, rtol=F32_RTOL, atol=0.0)


@pytest.mark.parametrize(
    ("scale", "dtype"),
    [(1e-300, F64), (1e-200, F64), (1.0, F64), (1e300, F64), (1e-40, torch.float32),
     (1e-30, torch.float32), (1e30, torch.float32)],
)
def test_norms_are_right_down_to_1e_300(scale: float, dtype: torch.dtype) -> None:
    """Exact to float64 rounding from the largest values to 1e-300 (float64 gradients,
    scaled) and to float32's subnormals and beyond ~1e19 (float32 gradients whose
    squares underflow or overflow in float32: recomputed in float64)."""
    import math

    from gradwatch.trainer_hooks.quantities.norms import grad_norms

    torch.manual_seed(3)
    grads = [(torch.randn(4, 8, dtype=F64) * scale).to(dtype) for _ in range(3)]
    want = [
        scale * math.sqrt(math.fsum((v / scale) ** 2 for v in g.to(F64).flatten().tolist()))
        for g in grads
    ]
    got = grad_norms(grads)
    assert got.dtype == F64
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), rtol=1e-12, atol=0.0)


def test_norms_of_zero_and_non_finite_gradients() -> None:
    from gradwatch.trainer_hooks.quantities.norms import grad_norms

    for dtype in (F64, torch.float32):
        grads = [torch.zeros(3, dtype=dtype), torch.tensor([1.0, float("inf"), 2.0], dtype=dtype),
                 torch.tensor([1.0, float("nan"), 2.0], dtype=dtype)]
        got = grad_norms(grads).tolist()
        assert got[0] == 0.0 and got[1] == float("inf") and got[2] != got[2]


@pytest.mark.parametrize("per", [3, 1])
def test_norms_in_several_stacked_reductions_keep_their_order(
    monkeypatch: pytest.MonkeyPatch, per: int
) -> None:
    """A loop whose gradients exceed one stacked reduction is reduced in chunks (or,
    one gradient a reduction, tensor by tensor): float32 rounding, in call order."""
    from gradwatch.trainer_hooks.quantities import norms

    monkeypatch.setattr(norms, "STACK_LIMIT", per * 40)  # gradients of 40 elements
    torch.manual_seed(4)
    grads = [torch.randn(5, 8) * 10.0 ** -k for k in range(8)]
    want = torch.stack([torch.linalg.vector_norm(g.to(F64)) for g in grads])
    torch.testing.assert_close(norms.grad_norms(grads), want, rtol=F32_RTOL, atol=0.0)
