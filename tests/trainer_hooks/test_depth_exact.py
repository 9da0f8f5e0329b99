"""``depth``: ‖∂L/∂x_l‖ at the input of every block equals plain autograd (float64).

The reference is an unwatched twin of the same model, same seed, whose block inputs
are kept with ``retain_grad()`` (the input of block 0 is the data, made to require
grad): the gradient autograd itself computes for each block's input.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch

F64 = torch.float64


def steps_of(path: Path) -> list[dict[str, Any]]:
    return [
        r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
        if r["kind"] == "step"
    ]


def reference_norms(
    model: nn.Module, blocks: list[nn.Module], run: Callable[[nn.Module], torch.Tensor]
) -> list[float]:
    """‖x_l.grad‖ of every block's input, from retain_grad() in an unwatched run."""
    inputs: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(blocks))}
    handles = []
    for i, block in enumerate(blocks):
        def keep(module: nn.Module, args: tuple[Any, ...], i: int = i) -> None:
            x = args[0]
            if x.requires_grad:
                x.retain_grad()
            inputs[i].append(x)
        handles.append(block.register_forward_pre_hook(keep))
    try:
        run(model).backward()
    finally:
        for h in handles:
            h.remove()
    norms = []
    for i in range(len(blocks)):
        squares = [x.grad.to(F64).square().sum().item() for x in inputs[i] if x.grad is not None]
        norms.append(sum(squares) ** 0.5)
    return norms


class Residual(nn.Module):
    """A pre-norm residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 8, depth: int = 5) -> None:
        super().__init__()
        self.embed = nn.Linear(3, width)
        self.blocks = nn.ModuleList([Residual(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def watched_record(
    model: nn.Module, run: Callable[[nn.Module], torch.Tensor], tmp_path: Path, **options: Any
) -> dict[str, Any]:
    path = tmp_path / "run.jsonl"
    with watch(model, run="depth", spool=path, diagnose=False, **options) as monitor:
        loss = run(model)
        loss.backward()
        monitor.step(loss)
    (record,) = steps_of(path)
    return record


def test_transformer_encoder_depth_equals_autograd(tmp_path: Path) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.1, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(F64)
    twin = copy.deepcopy(model)
    src = torch.randn(3, 7, 16, dtype=F64)
    mask = nn.Transformer.generate_square_subsequent_mask(7, dtype=F64)

    def run(m: nn.Module) -> torch.Tensor:
        torch.manual_seed(5)  # the same dropout masks in both runs
        return m(src.clone().requires_grad_(), mask=mask).square().mean()

    expected = reference_norms(twin, list(twin.layers), run)
    record = watched_record(model, lambda m: run(m), tmp_path)
    assert list(record["depth"]) == ["layers"]
    assert record["depth"]["layers"] == pytest.approx(expected, rel=1e-12, abs=0.0)
    assert min(expected) > 0
    # the watched model's gradients are those of the unwatched twin
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.equal(p.grad, q.grad), name


def test_residual_mlp_blocks_depth_equals_autograd_and_raw_input_stays_untouched(
    tmp_path: Path,
) -> None:
    torch.manual_seed(1)
    model = ResidualMLP().to(F64)
    twin = copy.deepcopy(model)
    x = torch.randn(6, 3, dtype=F64)
    expected = reference_norms(twin, list(twin.blocks), lambda m: m(x).pow(2).sum())
    record = watched_record(model, lambda m: m(x).pow(2).sum(), tmp_path)
    assert record["depth"]["blocks"] == pytest.approx(expected, rel=1e-12, abs=0.0)
    assert x.grad is None and not x.requires_grad


def test_raw_data_fed_to_the_first_block_gets_its_gradient(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = nn.Sequential(*[Residual(4) for _ in range(3)]).to(F64)
    twin = copy.deepcopy(model)
    x = torch.randn(5, 4, dtype=F64)
    expected = reference_norms(
        twin, list(twin), lambda m: m(x.clone().requires_grad_()).sum()
    )
    record = watched_record(model, lambda m: m(x).sum(), tmp_path)
    assert record["depth"]["Sequential"] == pytest.approx(expected, rel=1e-12, abs=0.0)
    assert x.grad is None


class Named(nn.Module):
    """Blocks as attributes (no container) and a Sequential of mixed classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 6)
        self.first = Residual(6)
        self.second = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        self.third = Residual(6)
        self.mixed = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixed(self.third(self.second(self.first(self.stem(x)))))


def test_user_named_blocks_equal_autograd(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = Named().to(F64)
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, dtype=F64)

    def run(m: nn.Module) -> torch.Tensor:
        return m(x).square().sum()

    trunk = reference_norms(twin, [twin.first, twin.second, twin.third], run)
    twin.zero_grad()
    mixed = reference_norms(twin, list(twin.mixed), run)
    record = watched_record(
        model, run, tmp_path, blocks=[{"trunk": [model.first, "second", "third"]}, "mixed"]
    )
    assert set(record["depth"]) == {"trunk", "mixed"}  # nothing found by itself here
    assert record["depth"]["trunk"] == pytest.approx(trunk, rel=1e-12, abs=0.0)
    assert record["depth"]["mixed"] == pytest.approx(mixed, rel=1e-12, abs=0.0)


def test_micro_batches_combine_as_one_batch(tmp_path: Path) -> None:
    torch.manual_seed(4)
    model = ResidualMLP(depth=3).to(F64)
    twin = copy.deepcopy(model)
    xs = [torch.randn(4, 3, dtype=F64), torch.randn(2, 3, dtype=F64)]

    def run(m: nn.Module) -> torch.Tensor:
        return sum((m(x).sum() for x in xs), torch.zeros((), dtype=F64))

    expected = reference_norms(twin, list(twin.blocks), run)
    path = tmp_path / "run.jsonl"
    with watch(model, run="depth", every=1, spool=path, diagnose=False) as monitor:
        for x in xs:  # gradient accumulation: one backward per micro-batch
            model(x).sum().backward()
        monitor.step()
    (record,) = steps_of(path)
    assert record["depth"]["blocks"] == pytest.approx(expected, rel=1e-12, abs=0.0)


def test_lbfgs_step_reports_the_last_evaluation(tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = ResidualMLP(depth=3).to(F64)
    x = torch.randn(4, 3, dtype=F64)
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=4)
    kept: list[list[torch.Tensor]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        inputs: list[torch.Tensor] = []
        h = model.embed(x)
        loss = model.head(_through(model, h, inputs)).pow(2).sum()
        loss.backward()
        kept.append(inputs)
        return loss

    path = tmp_path / "run.jsonl"
    with watch(model, run="depth", every=1, spool=path, diagnose=False) as monitor:
        optimizer.step(closure)
        monitor.step()
    (record,) = steps_of(path)
    assert len(kept) > 1 and record["backward_passes"] == len(kept)
    last = [t.grad.to(F64).norm().item() for t in kept[-1]]  # type: ignore[union-attr]
    assert record["depth"]["blocks"] == pytest.approx(last, rel=1e-12, abs=0.0)


def _through(model: ResidualMLP, h: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
    for block in model.blocks:
        h.retain_grad()
        inputs.append(h)
        h = block(h)
    return h


def test_light_steps_carry_no_depth_and_remove_leaves_no_hook(tmp_path: Path) -> None:
    model = ResidualMLP(depth=2)
    path = tmp_path / "run.jsonl"
    before = [dict(b._forward_pre_hooks) for b in model.blocks]
    monitor = watch(model, run="depth", spool=path, diagnose=False, every=2)
    for _ in range(3):
        model(torch.randn(2, 3)).sum().backward()
        monitor.step()
    monitor.close()
    assert [b._forward_pre_hooks for b in model.blocks] == before
    assert ["depth" in r for r in steps_of(path)] == [True, False, True]


def test_containers_of_mixed_or_parameterless_children_are_not_stacks() -> None:
    from gradwatch.trainer_hooks.quantities.depth import find_stacks

    model = nn.Sequential(
        nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2),
        nn.Sequential(nn.ReLU(), nn.ReLU()),
        nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]),
    )
    assert list(find_stacks(model)) == ["4"]
    with pytest.raises(ValueError, match=r"in the model, got 'nope'; modules:"):
        find_stacks(model, ["nope"])
    with pytest.raises(ValueError, match="container of blocks"):
        find_stacks(model, ["0"])


def test_grad_scaler_depth_is_unscaled_while_the_scale_moves(tmp_path: Path) -> None:
    torch.manual_seed(6)
    model = ResidualMLP(depth=3)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights stay: references hold
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    xs = [torch.randn(4, 3) * (1 + i) for i in range(3)]
    expected = [reference_norms(twin, list(twin.blocks), lambda m, x=x: m(x).sum()) for x in xs]
    path = tmp_path / "run.jsonl"
    with watch(model, run="depth", every=1, spool=path, diagnose=False, scaler=scaler) as monitor:
        for x in xs:
            loss = model(x).sum()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()  # changes the scale in place before monitor.step()
            monitor.step(loss)
    assert scaler.get_scale() == 2048.0
    for record, want in zip(steps_of(path), expected, strict=True):
        assert record["depth"]["blocks"] == pytest.approx(want, rel=1e-6)
