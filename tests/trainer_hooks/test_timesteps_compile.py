"""Under torch.compile the hooks run eagerly (a graph break) and give the eager series."""

from __future__ import annotations

from typing import Any

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


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
# dynamo, resuming after the hook's graph break, peeks at .grad of a non-leaf input
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_an_eager_hook_skips_dynamos_wrapper_outside_a_compiled_region() -> None:
    """Any torch.optim optimizer imports dynamo; a hook called on every cell call must
    not pay torch.compiler.disable's wrapper then (~0.75 µs a call), only inside a
    compiled region, where it is what keeps dynamo from tracing the hook."""
    import sys

    from gradwatch.trainer_hooks.quantities.calls import eager

    callers: list[str] = []

    @eager
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        callers.append(sys._getframe(1).f_code.co_name)  # who called the hook

    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)  # loads dynamo
    assert "torch._dynamo" in sys.modules
    layer = nn.Linear(2, 2)
    layer.register_forward_hook(hook)
    layer(torch.ones(1, 2))
    assert callers == ["call"]  # eager's own wrapper, directly
    compiled = torch.compile(lambda x: layer(x).sin())
    compiled(torch.ones(1, 2))
    assert len(callers) == 2 and callers[1] != "call"  # through the disabled wrapper
    layer(torch.ones(1, 2))
    assert callers[2] == "call"  # and directly again once out of it
