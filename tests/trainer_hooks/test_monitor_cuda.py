"""On CUDA: the same numbers, and no host synchronisation in a training step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

# A named part (tests/conftest.py): `MISSING PART: CUDA` without a GPU, counted in the
# session's summary; GRADWATCH_REQUIRE_CUDA=1 makes its absence fail.
pytestmark = pytest.mark.usefixtures("cuda_device")


def records_of(path: Path) -> list[dict[str, Any]]:
    return [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 16, batch_first=True)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    return loss


def test_cuda_steps_never_synchronise_and_norms_match_autograd(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=True)
    path = tmp_path / "cuda.jsonl"
    expected: list[dict[str, float]] = []
    with watch(model, run="cuda", every=1, spool=path, diagnose=False) as monitor:
        # step 0 warms up outside the check (cuDNN plans, the pinned-memory pool)
        monitor.step(train_step(model, opt, torch.randn(8, 30, 3, device="cuda")))
        for _ in range(3):
            x = torch.randn(8, 30, 3, device="cuda")
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = train_step(model, opt, x)
                monitor.step(loss)  # raises if anything in it synchronises
            finally:
                torch.cuda.set_sync_debug_mode("default")
            grads = {n: p.grad for n, p in model.named_parameters()}
            expected.append({n: g.double().norm().item() for n, g in grads.items()})  # type: ignore[union-attr]
            opt.step()
    steps = [r for r in records_of(path) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    for record, norms in zip(steps[1:], expected, strict=True):
        assert record["param_norms"] == pytest.approx(norms, rel=1e-6)
        assert record["cuda_allocated_bytes"] > 0 and record["cuda_reserved_bytes"] > 0
        assert isinstance(record["loss"], float)
        assert record["timesteps"]["lstm"]["input"]  # B's capture on CUDA too


def test_cuda_depth_and_update_ratios_never_synchronise_and_match_autograd(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    path = tmp_path / "cuda.jsonl"
    depth: list[list[float]] = []
    ratios: list[dict[str, float]] = []
    with watch(model, run="cuda-depth", spool=path, diagnose=False) as monitor:
        monitor.step(train_step_of(model, opt, torch.randn(4, 10, 32, device="cuda"), []))
        for _ in range(3):
            x = torch.randn(4, 10, 32, device="cuda")
            kept: list[torch.Tensor] = []
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            torch.cuda.set_sync_debug_mode("error")
            try:
                loss = train_step_of(model, opt, x, kept)
                opt.step()  # the optimizer hooks run here
                monitor.step(loss)  # raises if anything in it synchronises
            finally:
                torch.cuda.set_sync_debug_mode("default")
            depth.append([t.grad.double().norm().item() for t in kept])  # type: ignore[union-attr]
            ratios.append({
                n: ((p.detach() - before[n]).double().norm() / before[n].double().norm()).item()
                for n, p in model.named_parameters()
            })
    steps = [r for r in records_of(path) if r["kind"] == "step"]
    for record, want, ratio in zip(steps[1:], depth, ratios, strict=True):
        assert record["depth"]["layers"] == pytest.approx(want, rel=1e-6)
        assert record["update_ratios"] == pytest.approx(ratio, rel=1e-5)


def train_step_of(
    model: nn.TransformerEncoder, opt: torch.optim.Optimizer, x: torch.Tensor,
    kept: list[torch.Tensor],
) -> torch.Tensor:
    """Forward through the layers by hand, keeping each layer's input for its .grad."""
    h = x.requires_grad_()
    for layer in model.layers:
        h.retain_grad()
        kept.append(h)
        h = layer(h)
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    return loss
