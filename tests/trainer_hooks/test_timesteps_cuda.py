"""On CUDA: the same series as autograd, through cuDNN's fused LSTM and CUDA's fused
cell (one autograd node makes both h and c), and no host synchronisation while a
step is captured and closed. Skipped, as `MISSING PART: CUDA`, without a CUDA device."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

# A named part (tests/conftest.py): `MISSING PART: CUDA` without a GPU, counted in the
# session's summary; GRADWATCH_REQUIRE_CUDA=1 makes its absence fail.
pytestmark = pytest.mark.usefixtures("cuda_device")
F64 = torch.float64
CUDA = torch.device("cuda")


@contextmanager
def no_sync() -> Iterator[None]:
    """Any host-device synchronisation inside the block raises."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def syncs(step: Callable[[], Any]) -> bool:
    try:
        with no_sync():
            step()
    except RuntimeError as e:
        if "synchroniz" in str(e):
            return True
        raise
    return False


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.cell = nn.LSTMCell(32, 8)

    def forward(self, x: torch.Tensor, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
        out, _ = self.lstm(x)
        h = c = out.new_zeros(out.shape[0], 8)
        loss = out.new_zeros(())
        for t in range(out.shape[1]):
            h, c = self.cell(out[:, t], (h, c))
            if keep is not None:
                h.retain_grad()
                keep.append(h)
            loss = loss + h.square().sum() * (t + 1)
        return loss


def test_cuda_series_equal_autograd_and_the_step_never_syncs() -> None:
    torch.manual_seed(0)
    model = Net().to(CUDA)
    x = torch.randn(4, 12, 3, device=CUDA)
    if syncs(lambda: model(x).backward()):
        pytest.skip("this torch build synchronises in the plain step already")
    q = RecurrentTimesteps()
    q.attach(model)
    payload: dict[str, Any] = {}

    def captured() -> None:
        q.start_step(True)
        model(x).backward()
        payload.update(q.finish_step(None))  # device tensors only

    assert not syncs(captured), "gradwatch synchronised with the device during the step"
    got = {m: {k: v.cpu() for k, v in s.items()} for m, s in payload["timesteps"].items()}
    q.detach()
    xr = x.clone().requires_grad_()
    kept: list[torch.Tensor] = []
    model(xr, kept).backward()
    assert xr.grad is not None
    expected_input = torch.linalg.vector_norm(xr.grad.to(F64), dim=(0, 2)).cpu()
    torch.testing.assert_close(got["lstm"]["input"], expected_input, rtol=1e-5, atol=0.0)
    expected_hidden = torch.stack(
        [torch.linalg.vector_norm(h.grad.to(F64)) for h in kept]  # type: ignore[union-attr]
    ).cpu()
    torch.testing.assert_close(got["cell"]["hidden"], expected_hidden, rtol=1e-5, atol=0.0)
    assert got["cell"]["cell"].shape == (12,)


def test_cuda_exact_hidden_keeps_the_fused_outputs() -> None:
    torch.manual_seed(1)
    lstm = nn.LSTM(3, 8, num_layers=2).to(CUDA)
    x = torch.randn(10, 4, 3, device=CUDA)
    plain = lstm(x)[0].detach()
    q = RecurrentTimesteps(exact_hidden=True)
    q.attach(lstm)
    q.start_step(True)
    out = lstm(x)[0]
    out.square().sum().backward()
    series = q.finish_step(None)["timesteps"]["LSTM"]
    q.detach()
    torch.testing.assert_close(out.detach(), plain, rtol=1e-4, atol=1e-5)
    assert set(series) == {"input", "hidden", "cell", "layer1"}
    assert bool((series["hidden"] > 0).all())
