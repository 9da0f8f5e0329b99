"""A batch's column blocks (docs/PROTOCOL.md, ``columns``) as table rows.

The rows are the ones :func:`gradwatch.server.store.rows.split_batch` makes of the
same records sent one by one, so every read is the same whichever way they came
(tests/server/test_columns.py compares them through the API): ``steps`` rows are
zipped from the columns, each record's named scalars and timestep series are a
slice of the block's bytes (already little-endian float64, as the store keeps
them). Non-finite values are kept as SQLite keeps them from records (the strings
``"NaN"``/``"Infinity"``; ``scalar`` turns them into what the backend stores).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..columns import FLOAT_COLUMNS, INT_COLUMNS, floats, ints
from .named import NamedGroup
from .rows import SCALAR_FIELDS, SplitBatch

if TYPE_CHECKING:
    from ..schema import StepColumns


def _nonfinite_text(value: float) -> Any:
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def stored_floats(data: bytes, scalar: Callable[[Any], Any]) -> list[Any]:
    """A float64 column as the backend stores numbers that came as JSON."""
    values = floats(data)
    total = sum(values)
    if total - total == 0.0:  # finite: no NaN or infinity anywhere (nearly always)
        return values
    return [scalar(_nonfinite_text(v)) for v in values]


def add_blocks(
    out: SplitBatch,
    blocks: list[StepColumns],
    run_id: str,
    rank: int,
    uid: int,
    scalar: Callable[[Any], Any],
) -> tuple[int, int]:
    """Add the rows of ``blocks`` to ``out``; the records' uids follow ``uid``.
    Returns the largest step and epoch seen (-1 when none)."""
    last_step = last_epoch = -1
    for block in blocks:
        n = block.n
        steps = ints(block.step.i64)
        uids = range(uid + 1, uid + 1 + n)
        uid += n
        epochs = ints(block.epoch.i64) if block.epoch is not None else [0] * n
        last_step = max(last_step, max(steps))
        last_epoch = max(last_epoch, max(epochs))
        columns: list[Any] = []
        for name in FLOAT_COLUMNS:
            column = getattr(block, name)
            columns.append(repeat(None) if column is None else stored_floats(column.f64, scalar))
        for name in INT_COLUMNS[1:]:
            column = getattr(block, name)
            columns.append(repeat(None) if column is None else ints(column.i64))
        truncated = block.graph_truncated
        columns.append(repeat(None) if truncated is None else ints(truncated.i64))
        out.steps.extend(
            zip(
                repeat(run_id),
                repeat(rank),
                steps,
                uids,
                epochs,
                *columns,
                repeat(None),  # nonfinite: such records travel in `records`
                repeat(None),  # extra fields: the same
            )
        )
        out.keys.update(
            ("scalar", name, "") for name in SCALAR_FIELDS if getattr(block, name) is not None
        )
        if block.timesteps:
            for module, series_map in block.timesteps.items():
                for series, column in series_map.items():
                    data, width = column.f64, 8 * column.length
                    out.timesteps.extend(
                        (run_id, rank, step, module, series, column.length, data[at : at + width])
                        for step, at in zip(steps, range(0, n * width, width), strict=True)
                    )
                    out.keys.add(("timesteps", module, series))
        if block.named is not None and block.named.names:
            _add_named(out, block.named.names, block.named.f64, steps, uids, scalar)
    return last_step, last_epoch


def _add_named(
    out: SplitBatch,
    names: list[str],
    data: bytes,
    steps: list[int],
    uids: range,
    scalar: Callable[[Any], Any],
) -> None:
    width = len(names)
    group = out.named.get(tuple(names))
    if group is None:
        group = out.named[tuple(names)] = NamedGroup()
        for name in names:
            head, _, tail = name.partition("/")
            if head == "param_norms":
                out.keys.add(("param_norms", tail, ""))
            elif head == "gate_norms":
                param, _, gate = tail.rpartition("/")
                out.keys.add(("gate_norms", param, gate))
            else:
                out.keys.add(("profile", tail.rpartition("/")[0], ""))
    values = stored_floats(data, scalar)
    size = 8 * width
    group.steps.extend(steps)
    group.uids.extend(uids)
    group.values.extend(values[at : at + width] for at in range(0, len(values), width))
    group.blobs.extend(data[at : at + size] for at in range(0, len(data), size))
