"""Step records as packed columns: the ``columns`` of a batch (docs/PROTOCOL.md).

A server validating step records one JSON object at a time topped out at ~46,000
records/s; a block of records of one shape is a handful of base64 strings instead
(BENCHMARKS.md, "Ingest in columns"). :func:`to_columns` splits records into those
that travel as blocks and the rest, which travel in ``records`` as before: other
kinds, fields a block cannot hold (``nonfinite``, a field a newer trainer adds) and
badly typed values, so the server names what is wrong with them as it always did.
:func:`from_columns` is the reference decoder.

Standard library only: the training process imports it (it runs on the Monitor's
background thread, whose time counts as gradwatch's overhead, so the work per record
is a few C-level calls per field, not a Python loop per number).

Example:
    >>> rest, blocks = to_columns([
    ...     {"kind": "step", "step": 3, "loss": 0.5, "param_norms": {"w": 2.0}},
    ...     {"kind": "epoch", "epoch": 0},
    ...     {"kind": "step", "step": 4, "loss": "NaN", "param_norms": {"w": 1.0}},
    ... ])
    >>> rest
    [{'kind': 'epoch', 'epoch': 0}]
    >>> blocks[0]["n"], blocks[0]["step"], blocks[0]["named"]["names"]
    (2, {'i64': 'AwAAAAAAAAAEAAAAAAAAAA=='}, ['param_norms/w'])
    >>> from_columns(blocks[0])[1]
    {'kind': 'step', 'step': 4, 'loss': nan, 'param_norms': {'w': 1.0}}
"""

from __future__ import annotations

import base64
import sys
from array import array
from operator import itemgetter
from typing import Any

from .codec import dumps
from .column_shapes import (
    BOOL_COLUMN,
    FLOAT_COLUMNS,
    SCALAR_COLUMNS,
    Layout,
    b64,
    layout,
    pack_column,
    pack_floats,
    shape,
)
from .messages import MAX_RECORDS_PER_BATCH

__all__ = [
    "add_named",
    "batch_records",
    "block_json",
    "from_columns",
    "slice_block",
    "split_name",
    "to_columns",
]

_LITTLE = sys.byteorder == "little"


class _Group:
    """The records of one shape, in order (``index``: their places in the input)."""

    __slots__ = ("chunks", "index", "layout", "records", "values")

    def __init__(self, columns: Layout):
        self.layout = columns
        self.index: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.values: list[Any] = []  # named values, record after record
        self.chunks: list[bytes] = []  # series bytes, record after record

    def columns(self) -> tuple[dict[str, bytes], bytes | None] | list[int]:
        """The packed bytes of every column, or the positions of the records that cannot
        go in a block (a value of the wrong type in the first column that has one)."""
        scalars, names, _ = self.layout
        out: dict[str, bytes] = {}
        for name in scalars:
            values = list(map(itemgetter(name), self.records))
            column = pack_column(name, values)
            if column is None:
                return [i for i, v in enumerate(values) if pack_column(name, [v]) is None]
            out[name] = column
        named = None
        if names:
            named = pack_floats(self.values)
            if named is None:
                width = len(names)
                return [
                    i for i in range(len(self.records))
                    if pack_floats(self.values[i * width : (i + 1) * width]) is None
                ]
        return out, named

    def drop(self, positions: list[int]) -> list[int]:
        """Take out the records at ``positions`` (ascending); their input places."""
        width, depth = len(self.layout[1]), len(self.layout[2])
        places = []
        for position in reversed(positions):
            del self.values[position * width : (position + 1) * width]
            del self.chunks[position * depth : (position + 1) * depth]
            del self.records[position]
            places.append(self.index.pop(position))
        return places


def to_columns(
    records: list[dict[str, Any]], max_bytes: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split records into (rest, blocks): step records that a block can hold, grouped by
    shape (their fields, named names and series lengths) into blocks of at most 10,000
    records, in order of their first record; everything else stays in ``rest``, in
    order. The records given are not changed.

    ``max_bytes``: cut blocks so that each one's JSON should stay within it (from the
    sizes of its columns; a single record may exceed it)."""
    rest: list[tuple[int, Any]] = []
    groups: dict[Any, _Group] = {}
    refused: set[Any] = set()  # shapes with a name a block cannot carry
    for i, record in enumerate(records):
        try:
            found = shape(record)
        except Exception:  # an odd value (one that cannot be compared, say): rest
            found = None
        if found is None:
            rest.append((i, record))
            continue
        key, clean, values, chunks = found
        group = groups.get(key)
        if group is None:
            fields = None if key in refused else layout(key)
            if fields is None:
                refused.add(key)
                rest.append((i, record))
                continue
            group = groups[key] = _Group(fields)
        group.index.append(i)
        group.records.append(clean)
        group.values.extend(values)
        group.chunks.extend(chunks)
    blocks: list[tuple[int, dict[str, Any]]] = []
    late = False
    for group in groups.values():
        while group.records:
            columns = group.columns()
            if isinstance(columns, tuple):
                blocks.extend(_blocks(group, *columns, max_bytes))
                break
            # Values of the wrong type: those records go as they came, the server says why.
            rest.extend((index, records[index]) for index in group.drop(columns))
            late = True
    if late:
        rest.sort(key=itemgetter(0))
    blocks.sort(key=itemgetter(0))  # in order of their first record
    return [r for _, r in rest], [b for _, b in blocks]


def _per_block(fields: Layout, max_bytes: int | None) -> int:
    """How many records of this layout a block of at most ``max_bytes`` of JSON holds."""
    if max_bytes is None:
        return MAX_RECORDS_PER_BATCH
    scalars, names, series = fields
    values = len(scalars) + len(names) + sum(length for _, _, length in series)
    columns = len(scalars) + (1 if names else 0) + len(series)
    # Fixed: the keys and names around the columns (+4 for each column's base64 padding).
    fixed = 64 + 44 * columns + len(dumps(names)) + sum(
        len(dumps(m)) + len(dumps(s)) for m, s, _ in series
    )
    per_record = 32 * values / 3  # 8 bytes a value, 4/3 as base64
    fit = int((max_bytes - fixed) / per_record) if per_record else MAX_RECORDS_PER_BATCH
    return max(1, min(MAX_RECORDS_PER_BATCH, fit))


def _blocks(
    group: _Group, scalars: dict[str, bytes], named: bytes | None, max_bytes: int | None
) -> list[tuple[int, dict[str, Any]]]:
    _, names, series = group.layout
    width, depth = len(names), len(series)
    out = []
    total = len(group.records)
    size = _per_block(group.layout, max_bytes)
    for start in range(0, total, size):
        stop = min(total, start + size)
        block: dict[str, Any] = {"kind": "step", "n": stop - start}
        for name, column in scalars.items():
            kind = "f64" if name in FLOAT_COLUMNS else "i64"
            block[name] = {kind: b64(column[8 * start : 8 * stop])}
        if named is not None:
            data = named[8 * start * width : 8 * stop * width]
            block["named"] = {"names": names, "f64": b64(data)}
        if series:
            chunks = group.chunks[start * depth : stop * depth]
            timesteps: dict[str, dict[str, Any]] = {}
            for j, (module, name, length) in enumerate(series):
                data = b"".join(chunks[j::depth])
                timesteps.setdefault(module, {})[name] = {"len": length, "f64": b64(data)}
            block["timesteps"] = timesteps
        out.append((group.index[start], block))
    return out


# -- reading blocks back --------------------------------------------------------------


def _values(column: dict[str, str], code: str) -> list[Any]:
    values = array(code)
    values.frombytes(base64.b64decode(column["i64" if code == "q" else "f64"]))
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


def from_columns(block: dict[str, Any]) -> list[dict[str, Any]]:
    """The step records a block stands for, in order: numbers as ints and floats (NaN
    and infinities as floats), ``graph_truncated`` as a bool, series packed."""
    n = block["n"]
    records: list[dict[str, Any]] = [{"kind": "step"} for _ in range(n)]
    for name in SCALAR_COLUMNS:
        if name in block:
            values = _values(block[name], "d" if name in FLOAT_COLUMNS else "q")
            if name == BOOL_COLUMN:
                values = [bool(v) for v in values]
            for record, value in zip(records, values, strict=True):
                record[name] = value
    named = block.get("named")
    if named is not None:
        add_named(records, named["names"], _values(named, "d"))
    for module, by_series in (block.get("timesteps") or {}).items():
        for name, column in by_series.items():
            data = base64.b64decode(column["f64"])
            size = 8 * column["len"]
            for i, record in enumerate(records):
                piece = {"f64": b64(data[i * size : (i + 1) * size])}
                record.setdefault("timesteps", {}).setdefault(module, {})[name] = piece
    return records


def split_name(name: str) -> tuple[str, str, str]:
    """A block's named scalar as (family, owner, key): ``param_norms/<p>`` and
    ``update_ratios/<p>`` -> (.., p, ""), ``gate_norms/<p>/<g>`` -> (.., p, g),
    ``profile/<m>/<k>`` -> (.., m, k).

    >>> split_name("gate_norms/lstm.weight_hh_l0/f"), split_name("update_ratios/a/b")
    (('gate_norms', 'lstm.weight_hh_l0', 'f'), ('update_ratios', 'a/b', ''))
    """
    head, _, tail = name.partition("/")
    if head in ("param_norms", "update_ratios"):
        return head, tail, ""
    owner, _, key = tail.rpartition("/")
    return head, owner, key


def add_named(records: list[dict[str, Any]], names: list[str], values: Any) -> None:
    """Put a block's named values (record-major rows of ``len(names)``) back into its
    records' ``param_norms``, ``gate_norms`` and ``profile``."""
    width = len(names)
    parts = [split_name(name) for name in names]
    for i, record in enumerate(records):
        row = values[i * width : (i + 1) * width]
        for (family, owner, key), value in zip(parts, row, strict=True):
            if family in ("param_norms", "update_ratios"):
                record.setdefault(family, {})[owner] = value
            elif family == "gate_norms":
                record.setdefault("gate_norms", {}).setdefault(owner, {})[key] = value
            else:
                entry = record.setdefault("profile", {}).setdefault(owner, {})
                entry[key] = int(value) if key == "calls" else value


def batch_records(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Every record a ``batch`` message carries: its ``records``, then its blocks'."""
    records: list[dict[str, Any]] = list(message.get("records", []))
    for block in message.get("columns", []):
        records.extend(from_columns(block))
    return records


def slice_block(block: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """The block of records ``start`` … ``stop - 1`` of ``block`` (to split a block too
    big for one message)."""
    out: dict[str, Any] = {"kind": "step", "n": stop - start}
    for name in SCALAR_COLUMNS:
        if name in block:
            kind = "f64" if name in FLOAT_COLUMNS else "i64"
            out[name] = {kind: _cut(block[name][kind], 8, start, stop)}
    named = block.get("named")
    if named is not None:
        out["named"] = {
            "names": named["names"],
            "f64": _cut(named["f64"], 8 * len(named["names"]), start, stop),
        }
    timesteps = block.get("timesteps")
    if timesteps is not None:
        out["timesteps"] = {
            module: {
                name: {"len": c["len"], "f64": _cut(c["f64"], 8 * c["len"], start, stop)}
                for name, c in by_series.items()
            }
            for module, by_series in timesteps.items()
        }
    return out


def _cut(text: str, width: int, start: int, stop: int) -> str:
    return b64(base64.b64decode(text)[start * width : stop * width])



def block_json(block: dict[str, Any]) -> str:
    """``codec.dumps(block)`` of a block made here, ~20x faster: base64 text needs no
    escaping, so only names go through the encoder (which would otherwise scan every
    character of ~3 KB per benchmark record)."""
    parts = ['{"kind":"step","n":', str(int(block["n"]))]
    for name in SCALAR_COLUMNS:
        column = block.get(name)
        if column is not None:
            kind = "f64" if name in FLOAT_COLUMNS else "i64"
            parts += [',"', name, '":{"', kind, '":"', column[kind], '"}']
    named = block.get("named")
    if named is not None:
        parts += [',"named":{"names":', dumps(named["names"]), ',"f64":"', named["f64"], '"}']
    timesteps = block.get("timesteps")
    if timesteps is not None:
        modules = []
        for module, by_series in timesteps.items():
            series = [
                "".join((dumps(name), ':{"len":', str(int(c["len"])), ',"f64":"', c["f64"], '"}'))
                for name, c in by_series.items()
            ]
            modules.append(f"{dumps(module)}:{{{','.join(series)}}}")
        parts += [',"timesteps":{', ",".join(modules), "}"]
    parts.append("}")
    return "".join(parts)
