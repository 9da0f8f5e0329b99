"""What the background thread does to records: merge a quantity's fields, finish a
run of light step records.

A light step record (no heavy capture, nothing copied from the device: the loss of
a CPU model) needs only the memory fields, its loss as a number and the diagnoses
that judge the loss and the step time. :func:`finish_light` does that for a run of
them in one call: one memory read for the run (taken once per wake anyway), no
per-record clock read (the run's CPU is shared evenly), the
diagnoses in record order as before, so their alerts are the same.

Example:
    >>> import torch
    >>> run = [{"kind": "step", "step": 4, "loss": torch.tensor(0.5), "duration_s": 0.01}]
    >>> finish_light(run, {"rss_bytes": 1}, None, lambda e: None)
    [{'kind': 'step', 'step': 4, 'loss': 0.5, 'duration_s': 0.01, 'rss_bytes': 1}]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def merge_fields(
    record: dict[str, Any], fields: dict[str, Any], alerts: list[dict[str, Any]]
) -> None:
    """Add one quantity's fields to ``record``: ``nonfinite`` deep-merged, ``alerts`` collected."""
    for key, value in fields.items():
        if key == "alerts":
            alerts.extend(value)
        elif key == "nonfinite":
            _deep_merge(record.setdefault("nonfinite", {}), value)
        else:
            record[key] = value


def expected_nonfinite(record: dict[str, Any], marker: str) -> None:
    """Leave out ``nonfinite`` of a step its quantities marked with ``marker`` (a
    GradScaler skipped it: overflowing now and then is how it finds its scale), and
    the marker itself, which is no record field."""
    if record.pop(marker, False):
        record.pop("nonfinite", None)


def _deep_merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + [v for v in value if v not in into[key]]
        else:
            into[key] = value


def plain(value: Any) -> Any:
    """A host tensor left in a record becomes a number or a list."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.dim() == 0 else value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def loss_value(value: Any) -> Any:
    """The step's loss as a number: ``step()`` keeps a one-element tensor (its mean where
    the loss had several), of any shape: ``loss.view(1)``, a one-device DataParallel's
    ``(1,)`` loss. Its ``plain`` would be a list, which the protocol's ``loss`` is not.

    Example:
        >>> loss_value(torch.tensor([0.5])), loss_value(torch.tensor(2.0)), loss_value(None)
        (0.5, 2.0, None)
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return plain(value)


def finish_light(
    records: Sequence[dict[str, Any]],
    memory: dict[str, Any],
    diagnoser: Any,
    failed: Callable[[Exception], None],
    yield_after: float = 200e-6,
) -> list[dict[str, Any]]:
    """The light step ``records`` (changed in place), each followed by the alerts the
    diagnoses emit after it; ``failed`` hears of a diagnosis that raised. Gives the
    GIL back (``time.sleep(0)``) whenever ``yield_after`` seconds have passed."""
    out: list[dict[str, Any]] = []
    since = time.perf_counter()
    for record in records:
        if time.perf_counter() - since >= yield_after:
            time.sleep(0)  # a training thread back from a GIL-free op runs first
            since = time.perf_counter()
        record.update(memory)
        loss = record.get("loss")
        if isinstance(loss, torch.Tensor):
            record["loss"] = loss_value(loss)
        out.append(record)
        if diagnoser is not None:
            try:
                out.extend(diagnoser.observe(record))
            except Exception as e:
                failed(e)
    return out
