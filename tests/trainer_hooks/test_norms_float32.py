"""Float32 tensors on CPU: norms in float32, float64 only for the rows float32 cannot give.

``norms.py`` squares and sums float32 tensors in float32 and recomputes in float64 the
rows whose float32 sum is not finite (squares beyond ~1e19 overflow; a NaN or an
infinity) or small enough that underflowed squares could matter. Those rows must be
float64-exact (rtol 1e-12: a float32 sum is off by far more there, or reads 0 or inf),
every other row float32 rounding (``F32_RTOL``), and every row in its place.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool, to_float
from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.quantities import norms

from .precision import F32_RTOL, F64_RTOL

F64 = torch.float64

#: row scales: float32 rows (1.0, 1e-3, 5e3), rows whose float32 squares underflow
#: (1e-20 and 3e-21 lose digits, 1e-25 .. 1e-35 vanish), overflow (1e20, 1e30), zeros
SCALES = [1.0, 1e-25, 1e-3, 1e20, 0.0, 1e-30, 5e3, 1e-35, 1e-20, 1e30, 3e-21]


def exact(t: torch.Tensor) -> float:
    """‖t‖₂ of the float32 values, to float64 rounding."""
    return math.sqrt(math.fsum(v * v for v in t.to(F64).flatten().tolist()))


def rows_of(scales: list[float], shape: tuple[int, ...] = (8, 16)) -> list[torch.Tensor]:
    torch.manual_seed(5)
    return [(torch.randn(shape, dtype=F64) * s).float() for s in scales]


def taken_in_float64(t: torch.Tensor) -> bool:
    """Whether ``norms.py`` recomputes ``t``'s row in float64 by its documented rule: a
    float32 sum of squares that is not finite or below ``numel * UNDERFLOW_SUM``."""
    squares = t.square().sum().item()
    return not math.isfinite(squares) or squares < t.numel() * norms.UNDERFLOW_SUM


def check(got: list[float], tensors: list[torch.Tensor]) -> None:
    """Each row in order: float64-exact where the rule takes float64, else F32_RTOL."""
    assert len(got) == len(tensors)
    for k, (value, t) in enumerate(zip(got, tensors, strict=True)):
        rtol = F64_RTOL if taken_in_float64(t) else F32_RTOL
        assert value == pytest.approx(exact(t), rel=rtol, abs=0.0), (k, value, exact(t))


def check_tensor(got: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    assert got.dtype == F64 and got.shape == (len(tensors),)
    check(got.tolist(), tensors)


def test_mixed_rows_keep_their_order_and_each_row_its_precision() -> None:
    grads = rows_of(SCALES)
    # the case this guards: without the fallback these rows read 0, inf, or are off
    plain = [torch.linalg.vector_norm(g).item() for g in grads]
    assert plain[1] == plain[5] == plain[7] == 0.0 and math.isinf(plain[3])
    assert plain[8] != exact(grads[8])  # 1e-20: subnormal squares, a few digits lost
    assert all(taken_in_float64(grads[k]) for k in (1, 3, 4, 5, 7, 8, 9, 10))
    assert not any(taken_in_float64(grads[k]) for k in (0, 2, 6))
    check_tensor(norms.grad_norms(grads), grads)


@pytest.mark.parametrize("per", [3, 1])
def test_rows_over_several_stacked_reductions(monkeypatch: pytest.MonkeyPatch, per: int) -> None:
    """Chunked stacks (per=3) and one tensor a reduction (per=1): the fallback rows are
    found by their place in the whole list, not in their chunk."""
    monkeypatch.setattr(norms, "STACK_LIMIT", per * 128)  # gradients of 128 elements
    grads = rows_of(SCALES)
    check_tensor(norms.grad_norms(grads), grads)


def test_underflow_hidden_under_one_normal_square_is_recomputed() -> None:
    """4,095 elements whose float32 squares round to 0 (2.6e-23) beside one of 1.22e-18:
    the float32 sum (1.5e-36) looks healthy, yet has lost ~2e-6 of itself. The rule's
    threshold grows with the element count (n x 1.18e-38 / 1e-6), so the row is redone."""
    torch.manual_seed(9)
    signs = torch.randint(0, 2, (2, 4096)).float() * 2 - 1
    grads = [signs[0] * 2.6e-23, signs[1] * 2.6e-23]
    grads[0][0] = 1.22e-18
    plain = grads[0].square().sum().sqrt().item()  # what float32 alone reads
    assert plain > 1e-18 and abs(plain / exact(grads[0]) - 1) > 5e-7
    torch.testing.assert_close(norms.grad_norms(grads), torch.tensor(
        [exact(g) for g in grads], dtype=F64), rtol=F64_RTOL, atol=0.0)


@pytest.mark.parametrize("exponent", [25, 28, 30, 33, 35])
def test_vanishing_gradients_read_their_float64_norm(exponent: int) -> None:
    grads = rows_of([10.0**-exponent] * 3, shape=(32, 128))
    want = torch.tensor([exact(g) for g in grads], dtype=F64)
    assert want.min() > 0
    torch.testing.assert_close(norms.grad_norms(grads), want, rtol=F64_RTOL, atol=0.0)


def test_large_elements_do_not_read_infinity() -> None:
    grads = [torch.full((4, 4), 1e20), torch.full((4, 4), 3e38), torch.full((4, 4), 2e19)]
    got = norms.grad_norms(grads)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.tensor([4e20, 1.2e39, 8e19], dtype=F64),
                               rtol=1e-7, atol=0.0)  # the float32 inputs' own rounding
    check_tensor(got, grads)


def test_non_finite_and_zero_rows() -> None:
    nan = torch.ones(4, 4)
    nan[1, 2] = float("nan")
    inf = torch.ones(4, 4)
    inf[3, 3] = float("-inf")
    grads = [torch.zeros(4, 4), nan, torch.ones(4, 4), inf, torch.zeros(4, 4)]
    got = norms.grad_norms(grads).tolist()
    assert got[0] == 0.0 and got[4] == 0.0
    assert math.isnan(got[1])
    assert got[2] == 4.0
    assert got[3] == math.inf


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (1, 0, 2, 3), (2, 3, 0, 1), (1, 3, 2, 0)])
def test_a_nan_row_anywhere_leaves_every_other_row_its_own_rule(
    order: tuple[int, ...],
) -> None:
    # rows whose sums are all in float32's range take a shortcut (squares read once on
    # the host, min and max): a NaN among them, first or not, must neither hide an
    # overflowing or underflowing row from the float64 recomputation nor move a row
    nan = torch.ones(4, 4)
    nan[2, 1] = float("nan")
    ordinary, overflow, tiny = rows_of([3.0, 1e20, 1e-30], shape=(4, 4))
    rows = [[nan, ordinary, overflow, tiny][i] for i in order]
    got = norms.grad_norms(rows).tolist()
    at = order.index(0)
    assert math.isnan(got[at])
    check([g for k, g in enumerate(got) if k != at], [r for k, r in enumerate(rows) if k != at])


def test_ordinary_rows_in_order_at_float32_rounding() -> None:
    grads = rows_of([1.0, 5e3, 1e-3, 2.0, 7e-2], shape=(8, 16))
    check_tensor(norms.grad_norms(grads), grads)
    check_tensor(norms.tensor_norms(grads[:2], [(torch.cat(grads[2:4]), 2)]),
                 [*grads[:2], *grads[2:4]])


def test_tensor_norms_of_tensors_and_packed_gates() -> None:
    """Tensors of several shapes, then each gate of packed tensors; rows of every kind."""
    tensors = rows_of([1.0, 1e-30, 1e20], shape=(7, 3)) + rows_of([0.0], shape=(5,))
    small, big = rows_of([1e-28, 2.0], shape=(3, 6))
    packed = [(torch.cat([small, big, small * 1e6, big * 1e19]), 4), (rows_of([3.0])[0], 2)]
    rows = tensors + [c for t, gates in packed for c in t.chunk(gates)]
    check_tensor(norms.tensor_norms(tensors, packed), rows)
    check_tensor(norms.tensor_norms([], packed), rows[len(tensors) :])


def test_other_dtypes_keep_float64_accumulation() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.full((64,), 2e-4, dtype=dtype)  # squares underflow in half
        (got,) = norms.tensor_norms([t]).tolist()
        assert got == pytest.approx(exact(t), rel=F64_RTOL, abs=0.0)
    mixed = [torch.full((3,), 1e-200, dtype=F64), torch.full((3,), 1e-30)]
    got = norms.tensor_norms(mixed)
    assert got.dtype == F64 and got[1].item() == pytest.approx(exact(mixed[1]), rel=F64_RTOL)


# ----- end to end, through watch() ------------------------------------------------------


class CellLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(3, 6)
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = c = x.new_zeros(x.shape[1], 6)
        hs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            h.retain_grad()
            hs.append(h)
        return self.head(h).sum(), hs


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
            if r["kind"] == "step"]


def one_step(scale: float, tmp_path: Path, lr: float = 0.1) -> tuple[dict[str, Any], Any]:
    """One watched step of a float32 LSTMCell loop whose loss is multiplied by
    ``scale``; the record and autograd's own hidden-state gradients and parameters."""
    torch.manual_seed(6)
    model = CellLoop()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x = torch.randn(12, 2, 3)
    path = tmp_path / "run.jsonl"
    with watch(model, run="f32", every=1, spool=path, diagnose=False) as monitor:
        loss, hs = model(x)
        (loss * scale).backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}  # type: ignore[union-attr]
        optimizer.step()
        monitor.step(loss)
    (record,) = steps_of(path)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return record, ([h.grad for h in hs], grads, before, after)


@pytest.mark.parametrize("scale", [1.0, 1e-27, 1e-36])
def test_watch_cell_series_and_param_norms(scale: float, tmp_path: Path) -> None:
    """A float32 loop: hidden series, parameter and gate norms of ordinary gradients to
    float32 rounding; of vanishing ones (1e-27: squares vanish in float32; 1e-36: the
    gradients are subnormal themselves) float64-exact."""
    record, (hidden, grads, _, _) = one_step(scale, tmp_path)
    rtol = F32_RTOL if scale == 1.0 else F64_RTOL
    series = record["timesteps"]["cell"]["hidden"]
    want = [exact(g) for g in hidden]
    assert series == pytest.approx(want, rel=rtol, abs=0.0)
    assert min(want) > 0
    for name, g in grads.items():
        assert record["param_norms"][name] == pytest.approx(exact(g), rel=rtol, abs=0.0), name
    for name in ("cell.weight_ih", "cell.weight_hh", "cell.bias_ih", "cell.bias_hh"):
        chunks = [exact(c) for c in grads[name].chunk(4)]
        assert list(record["gate_norms"][name].values()) == pytest.approx(chunks, rel=rtol, abs=0)


def test_watch_reads_huge_gradients_finite_and_nan_as_nan(tmp_path: Path) -> None:
    record, (hidden, grads, _, _) = one_step(1e22, tmp_path, lr=0.0)
    series = record["timesteps"]["cell"]["hidden"]
    assert all(math.isfinite(v) for v in series)
    assert any(math.isinf(torch.linalg.vector_norm(g).item()) for g in hidden)  # float32: inf
    check(series, hidden)
    check([record["param_norms"][name] for name in grads], list(grads.values()))
    assert "nonfinite" not in record

    record, _ = one_step(math.nan, tmp_path / "nan", lr=0.0)
    assert all(math.isnan(to_float(v)) for v in record["timesteps"]["cell"]["hidden"])
    assert all(math.isnan(to_float(v)) for v in record["param_norms"].values())
    assert len(record["nonfinite"]["parameters"]) == len(record["param_norms"])


@pytest.mark.parametrize(("size", "lr"), [(1.0, 0.1), (1e-18, 1e-22), (1e-20, 1e-24)])
def test_update_ratios_of_tiny_steps(size: float, lr: float, tmp_path: Path) -> None:
    """Weights of ``size`` moved by ``lr`` x gradients of order 1: ‖Δw‖ of a 1e-22 and
    of a 1e-24 step (float32 squares of 1e-44 and 1e-48: subnormal or 0) and ‖w‖ of
    tiny weights are float64-exact; the ratio to float32 rounding. (A small Δw needs
    small weights: float32 weights of order 1 absorb it.)"""
    torch.manual_seed(7)
    model = nn.Linear(4, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    path = tmp_path / "run.jsonl"
    with watch(model, run="ratios32", every=1, spool=path, diagnose=False) as monitor:
        loss = model(torch.randn(5, 4)).sum()
        loss.backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        monitor.step(loss)
    (record,) = steps_of(path)
    for name, p in model.named_parameters():
        delta = p.detach() - before[name]
        assert 0 < exact(delta) < 1e-18 or size == 1.0, name
        want = exact(delta) / exact(before[name])
        got = to_float(record["update_ratios"][name])
        assert got == pytest.approx(want, rel=F32_RTOL, abs=0.0), name
        if size != 1.0:  # without the fallback: 0, or off by more than float32 rounding
            plain = torch.linalg.vector_norm(delta) / torch.linalg.vector_norm(before[name])
            assert plain.item() != pytest.approx(want, rel=F32_RTOL), name


def test_scratch_takes_the_rules_of_a_fresh_stack_and_is_reused() -> None:
    """The kept buffer gives every row its rule (float64 rows found by their place),
    is written again the next step (no stale row), grows for a longer step and is
    kept for a shorter one."""
    scratch = norms.Scratch()
    grads = rows_of(SCALES)
    check_tensor(norms.grad_norms(grads, scratch), grads)
    buffer = scratch.buffer
    assert buffer is not None and buffer.numel() == len(SCALES) * 128
    shorter = rows_of([2.0, 1e-30, 7.0], shape=(8, 16))
    check_tensor(norms.grad_norms(shorter, scratch), shorter)
    assert scratch.buffer is buffer  # kept: nothing allocated for a shorter step
    longer = rows_of([1e-3, 4.0] * 8)
    check_tensor(norms.grad_norms(longer, scratch), longer)
    assert scratch.buffer is not buffer and scratch.buffer.numel() == 16 * 128


def test_scratch_beyond_its_limit_stacks_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(norms, "SCRATCH_LIMIT", 5 * 128)
    scratch = norms.Scratch()
    grads = rows_of(SCALES)  # 11 gradients of 128 elements: over the limit
    check_tensor(norms.grad_norms(grads, scratch), grads)
    assert scratch.buffer is None
    check_tensor(norms.grad_norms(grads[:5], scratch), grads[:5])
    assert scratch.buffer is not None


def test_scratch_with_gradients_of_several_shapes_gives_each_its_norm() -> None:
    """A decoder whose batch shrinks: the stack into the buffer refuses the shapes and
    each shape is reduced on its own, every norm in its call's place."""
    scratch = norms.Scratch()
    grads = [*rows_of([1.0, 3.0], shape=(8, 16)), *rows_of([5e-3, 1e-30], shape=(4, 16)),
             *rows_of([2.0], shape=(8, 16))]
    check_tensor(norms.norms_in_order(list(grads), torch.device("cpu"), scratch), grads)
    gaps: list[torch.Tensor | None] = [grads[0], None, grads[2], grads[1]]
    got = norms.norms_in_order(gaps, torch.device("cpu"), scratch).tolist()
    assert got[1] == 0.0
    check([got[0], got[2], got[3]], [grads[0], grads[2], grads[1]])
