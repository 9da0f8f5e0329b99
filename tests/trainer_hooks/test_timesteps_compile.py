"""Under torch.compile the hooks run eagerly (a graph break) and give the eager series."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, 4, batch_first=True)
        self.cell = nn.GRUCell(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        h = out[:, 0]
        for t in range(out.shape[1]):
            h = self.cell(out[:, t], h)
        return h.square().sum()


@pytest.mark.slow
# torch's own compile stack touches a deprecated torch.jit API while it sets up
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
# dynamo, resuming after the hooks' graph break, peeks at .grad of a non-leaf input
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_compiled_model_gives_the_eager_series_on_every_step() -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(3, 5, 2)
    q = RecurrentTimesteps()
    q.attach(model)
    q.start_step(True)
    model(x).backward()
    eager = q.finish_step(None)["timesteps"]
    compiled = torch.compile(model)
    for _ in range(3):  # later steps must not fall back or recompile into silence
        q.start_step(True)
        compiled(x).backward()
        got = q.finish_step(None)["timesteps"]
        assert got.keys() == eager.keys()
        for module, series in eager.items():
            for name, values in series.items():
                torch.testing.assert_close(got[module][name], values, rtol=1e-5, atol=0.0)
    q.start_step(False)
    compiled(x).backward()
    assert q.finish_step(None) == {}
    q.detach()
