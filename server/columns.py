"""Step records sent as columns (docs/PROTOCOL.md, ``columns``): the records a block
stands for, as live viewers receive them (the checks pydantic cannot express are in
server/column_checks.py, which server/schema.py runs on every batch).

A block of 100 records is validated as ~15 base64 strings instead of 100 objects of
~30 numbers each: validating records one by one held the server under ~46,000
records/s before anything was stored (BENCHMARKS.md, "Ingest in columns").

Example:
    >>> import base64, struct
    >>> from gradwatch.server.schema import parse_message
    >>> steps = base64.b64encode(struct.pack("<2q", 4, 5)).decode()
    >>> losses = base64.b64encode(struct.pack("<2d", 0.5, 0.25)).decode()
    >>> batch = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0,'
    ...     ' "records": [], "columns": [{"kind": "step", "n": 2,'
    ...     f' "step": {{"i64": "{steps}"}}, "loss": {{"f64": "{losses}"}}}}]}}')
    >>> [(r["step"], r["loss"]) for r in block_records(batch.columns[0])]
    [(4, 0.5), (5, 0.25)]
"""

from __future__ import annotations

import base64
from typing import Any, cast

from gradwatch.protocol.codec import dumps
from gradwatch.protocol.column_shapes import FLOAT_COLUMNS
from gradwatch.protocol.columns import add_named

from .column_checks import INT_COLUMNS, floats, ints
from .schema import RECORDS, Batch, StepColumns

__all__ = ["INT_COLUMNS", "block_records", "floats", "ints", "records_json"]

def _b64(data: bytes) -> str:
    # URL-safe, as the server re-encodes packed series of records (docs/PROTOCOL.md).
    return base64.urlsafe_b64encode(data).decode("ascii")


def block_records(block: StepColumns) -> list[dict[str, Any]]:
    """The step records a block stands for (timestep series packed), in order."""
    n = block.n
    steps = ints(block.step.i64)
    epochs = ints(block.epoch.i64) if block.epoch is not None else [0] * n
    records: list[dict[str, Any]] = [
        {"kind": "step", "step": s, "epoch": e} for s, e in zip(steps, epochs, strict=True)
    ]
    for name in (*FLOAT_COLUMNS, *INT_COLUMNS[1:], "graph_truncated"):
        column = getattr(block, name)
        if column is None:
            continue
        if name in FLOAT_COLUMNS:
            values: list[Any] = floats(column.f64)
        elif name == "graph_truncated":
            values = [bool(v) for v in ints(column.i64)]
        else:
            values = ints(column.i64)
        for record, value in zip(records, values, strict=True):
            record[name] = value
    if block.timesteps:
        for record in records:
            record["timesteps"] = {}
        for module, series_map in block.timesteps.items():
            for record in records:
                record["timesteps"][module] = {}
            for series, column in series_map.items():
                width = 8 * column.length
                for i, record in enumerate(records):
                    data = column.f64[i * width : (i + 1) * width]
                    record["timesteps"][module][series] = {"f64": _b64(data)}
    if block.named is not None:
        add_named(records, block.named.names, floats(block.named.f64))
    return records


def records_json(batch: Batch) -> str:
    """The JSON array of a batch's records, its step records in step order.

    The trainer hands its sender records in step order, but a batch carries its step
    records in two parts (docs/PROTOCOL.md, ``columns``): those a block cannot hold (a
    heavy step's) in ``records``, the others in blocks grouped by shape. Listed part by
    part, a heavy step came before the light steps just before it (steps 3, 2, 4, 5),
    and a live chart draws in arrival order. So the step records are put back in step
    order among their own places (a stable sort: two records of one step keep their
    order); alerts, epochs and ends stay where they are. A batch without blocks is in
    the trainer's order already and is dumped as one list.
    """
    if not batch.columns:
        return RECORDS.dump_json(batch.records, exclude_unset=True).decode()
    # (step or None, its JSON): records one by one, then the blocks' records
    items: list[tuple[int | None, str]] = [
        (
            record.step if record.kind == "step" else None,
            RECORDS.dump_json([record], exclude_unset=True).decode()[1:-1],
        )
        for record in batch.records
    ]
    # dumps: non-finite floats as "NaN"/"Infinity" strings
    items += [
        (record["step"], dumps(record))
        for block in batch.columns
        for record in block_records(block)
    ]
    slots = [i for i, (step, _) in enumerate(items) if step is not None]
    ordered = sorted((items[i] for i in slots), key=lambda item: cast(int, item[0]))
    for i, item in zip(slots, ordered, strict=True):
        items[i] = item
    return "[" + ",".join(text for _, text in items) + "]"
