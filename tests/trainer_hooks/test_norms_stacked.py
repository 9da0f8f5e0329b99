"""A cell's per-call gradient norms through its persistent buffer (``stacked.py``).

``StackedNorms.grad_norms`` must give what ``norms.grad_norms`` gives, row for row and
with each row's precision (float32 rounding, float64-exact where float32 cannot), for
any number of gradients and chunks, while its one buffer is reused from call to call
and from shape to shape; and it must raise where the gradients differ in shape, which
``norms_in_order`` relies on to reduce each shape apart.
"""

from __future__ import annotations

import pytest
import torch

from gradwatch.trainer_hooks.quantities import norms, stacked
from gradwatch.trainer_hooks.quantities.stacked import StackedNorms

from .precision import F32_RTOL
from .test_norms_float32 import SCALES, check_tensor, rows_of


def test_mixed_rows_read_as_without_the_buffer() -> None:
    grads = rows_of(SCALES)
    got = StackedNorms().grad_norms(grads)
    check_tensor(got, grads)
    torch.testing.assert_close(got, norms.grad_norms(grads), rtol=F32_RTOL, atol=0.0)


@pytest.mark.parametrize("per", [2, 3, 5])
def test_chunks_through_one_buffer_keep_every_row_in_its_place(
    monkeypatch: pytest.MonkeyPatch, per: int
) -> None:
    monkeypatch.setattr(stacked, "FLAT_LIMIT", per * 128)  # gradients of 128 elements
    grads = rows_of(SCALES)
    reducer = StackedNorms()
    check_tensor(reducer.grad_norms(grads), grads)
    assert reducer._buffer is not None and reducer._buffer.numel() == per * 128


def test_the_buffer_is_reused_across_steps_and_shapes_without_changing_results() -> None:
    """A later call writes over the buffer: results already returned must not move,
    and a smaller or larger set of another shape reads right."""
    reducer = StackedNorms()
    torch.manual_seed(3)
    first = [torch.randn(32, 128) * (k + 1) for k in range(48)]
    got_first = reducer.grad_norms(first)
    kept = got_first.clone()
    small = [torch.randn(5, 7) * 10.0**-k for k in range(3)]
    check_tensor(reducer.grad_norms(small), small)
    large = [torch.randn(64, 128) for _ in range(40)]
    check_tensor(reducer.grad_norms(large), large)
    assert torch.equal(got_first, kept)
    check_tensor(got_first, first)


def test_shapes_that_differ_raise_and_norms_in_order_reduces_each_apart() -> None:
    grads = [torch.full((4, 4), 2.0), torch.full((2, 8), 3.0), torch.full((4, 4), 1.0)]
    with pytest.raises(RuntimeError):
        StackedNorms().grad_norms(grads)
    got = norms.norms_in_order([*grads, None], torch.device("cpu"), StackedNorms().grad_norms)
    assert got.tolist() == [8.0, 12.0, 4.0, 0.0]


def test_other_dtypes_and_single_large_gradients_go_the_plain_way() -> None:
    reducer = StackedNorms()
    f64 = torch.float64
    doubles = [torch.full((3,), 1e-200, dtype=f64), torch.full((3,), 2.0, dtype=f64)]
    got = reducer.grad_norms(doubles)
    torch.testing.assert_close(got, norms.grad_norms(doubles), rtol=1e-12, atol=0.0)
    big = [torch.ones(stacked.FLAT_LIMIT), torch.full((stacked.FLAT_LIMIT,), 2.0)]
    assert reducer.grad_norms(big).tolist() == [2.0**9.5, 2.0**10.5]
    assert reducer._buffer is None  # neither needed the buffer
