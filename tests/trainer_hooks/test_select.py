"""``include=`` / ``exclude=``: every quantity watches the same names; typos fail early."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(3, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleList([nn.Linear(4, 1) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.encoder(x)
        for block in self.blocks:
            h = torch.tanh(block(h))
        return sum((head(h) for head in self.heads), torch.zeros(()))


def record_of(tmp_path: Path, **options: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "run.jsonl"
    with watch(model, run="select", spool=path, diagnose=False, **options) as monitor:
        model(torch.randn(5, 2, 3)).sum().backward()
        optimizer.step()
        monitor.step()
    (record,) = [r for m in read_spool(path) if m["type"] == "batch" for r in m["records"]
                 if r["kind"] == "step"]
    return record


def test_by_default_everything_is_watched(tmp_path: Path) -> None:
    record = record_of(tmp_path)
    assert set(record["depth"]) == {"blocks", "heads"}
    assert "encoder" in record["timesteps"]
    assert len(record["param_norms"]) == len(record["update_ratios"]) == 4 + 6 + 4


def test_include_and_exclude_narrow_every_quantity_alike(tmp_path: Path) -> None:
    record = record_of(tmp_path, include=["blocks", "heads"], exclude=["*.bias", "heads"])
    assert list(record["depth"]) == ["blocks"]
    assert "timesteps" not in record
    names = ["blocks.0.weight", "blocks.1.weight", "blocks.2.weight"]
    assert list(record["param_norms"]) == list(record["update_ratios"]) == names
    squares = sum(v * v for v in record["param_norms"].values())
    assert record["total_norm"] == pytest.approx(squares**0.5, rel=1e-12, abs=0.0)


def test_fnmatch_wildcards_cover_modules_and_parameters(tmp_path: Path) -> None:
    record = record_of(tmp_path, exclude="blocks.[12]*")
    assert "blocks.0.weight" in record["param_norms"]
    assert not any(n.startswith(("blocks.1", "blocks.2")) for n in record["param_norms"])
    assert set(record["depth"]) == {"blocks", "heads"}  # the stack itself is still watched


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"include": ["decoder"]}, "expected include= pattern 'decoder' to match a parameter or "
                                   "module name, got no match; names: 'encoder', 'blocks'"),
        ({"exclude": ["*.weight_ih"]}, "expected exclude= pattern '*.weight_ih' to match"),
        ({"include": [3]}, "expected include= to be a pattern or a list of patterns"),
        ({"exclude": ""}, "expected exclude= to be a pattern or a list of patterns"),
    ],
)
def test_a_pattern_that_matches_nothing_fails_at_watch(
    options: dict[str, Any], message: str, tmp_path: Path
) -> None:
    model = Model()
    before = [dict(m._forward_pre_hooks) for m in model.modules()]
    with pytest.raises((ValueError, TypeError)) as caught:
        watch(model, run="select", spool=tmp_path / "r.jsonl", **options)
    assert message in str(caught.value)
    assert [m._forward_pre_hooks for m in model.modules()] == before  # nothing attached
