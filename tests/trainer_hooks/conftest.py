"""Fixtures shared by the capture tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

CapturedStep = Callable[..., dict[str, Any]]


def _captured_step(model: nn.Module, step: Callable[[], Any], **options: Any) -> dict[str, Any]:
    """One captured step through attach/start_step/finish_step/encode; the record."""
    q = RecurrentTimesteps(**options)
    q.attach(model)
    try:
        q.start_step(True)
        step()
        payload = q.finish_step(None)
        host = {m: {k: v.cpu() for k, v in s.items()} for m, s in payload["timesteps"].items()}
        return q.encode({"timesteps": host})
    finally:
        q.detach()


@pytest.fixture
def captured_step() -> CapturedStep:
    """`captured_step(model, step, **options)`: drive RecurrentTimesteps by hand for one
    captured step (no Monitor) and return the record fields it encodes."""
    return _captured_step
