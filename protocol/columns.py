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
import binascii
import struct
import sys
from array import array
from operator import itemgetter
from typing import Any

from .codec import dumps
from .messages import MAX_NAME_CHARS, MAX_RECORDS_PER_BATCH, MAX_TIMESTEPS, NONFINITE_STRINGS

__all__ = ["batch_records", "block_json", "from_columns", "slice_block", "to_columns"]

INT_COLUMNS = ("step", "epoch", "graph_nodes", "rss_bytes", "cuda_allocated_bytes",
               "cuda_reserved_bytes")
FLOAT_COLUMNS = ("t", "duration_s", "loss", "total_norm", "overhead")
BOOL_COLUMN = "graph_truncated"
# The order of a block's columns (any order is valid on the wire).
SCALAR_COLUMNS = (*INT_COLUMNS, BOOL_COLUMN, *FLOAT_COLUMNS)
PROFILE_KEYS = ("forward_s", "backward_s", "calls")
_NESTED = ("param_norms", "gate_norms", "profile", "timesteps")
_ALLOWED = frozenset(("kind", *SCALAR_COLUMNS, *_NESTED))
_PROFILE_SET = frozenset(PROFILE_KEYS)
_IS_FLOAT = float.__instancecheck__
_ONE, _ZERO = struct.pack("<d", 1.0), bytes(8)
_NUMBERS_OR_TEXT = frozenset((float, int, str))
_LITTLE = sys.byteorder == "little"
_MAX_CALLS = 2**53  # calls travel as float64: larger counts would not come back exact


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


_STRUCTS: dict[tuple[str, int], struct.Struct] = {}


def _struct(code: str, n: int) -> struct.Struct:
    """The compiled little-endian format of ``n`` values (``Struct.pack`` of a list of
    floats costs ~40% of ``array("d", ...)``; compiling the format once saves ~25%)."""
    found = _STRUCTS.get((code, n))
    if found is None:
        if len(_STRUCTS) > 1024:  # lengths seen are few; bound them all the same
            _STRUCTS.clear()
        found = _STRUCTS[(code, n)] = struct.Struct(f"<{n}{code}")
    return found


def _pack_floats(values: list[Any]) -> bytes | None:
    """Little-endian float64 bytes of protocol numbers (floats, ints, "NaN", "Infinity",
    "-Infinity"); None when any is something else (a bool, None, another string, an
    int too big for a float). An object that converts itself to a float (a NumPy
    scalar, say; the Monitor sends none) may pass as that float."""
    try:
        data = _struct("d", len(values)).pack(*values)
    except (struct.error, OverflowError, TypeError):
        pass  # a string ("NaN"?), None, a list...: the careful way below
    else:
        # struct.pack takes a bool as 1.0 or 0.0, which the server would refuse. Bytes
        # without either value anywhere had no bool: no pass over the values needed
        # (a type check costs twice the packing; this, a tenth of it).
        if (_ONE not in data and _ZERO not in data) or all(map(_IS_FLOAT, values)):
            return data
    types = set(map(type, values))
    if not types <= _NUMBERS_OR_TEXT:
        return None
    if str in types:
        values = [NONFINITE_STRINGS.get(v, v) if type(v) is str else v for v in values]
    try:
        return _struct("d", len(values)).pack(*values)
    except (struct.error, OverflowError, TypeError):
        return None


def _pack_ints(values: list[Any], kind: type) -> bytes | None:
    """Little-endian int64 bytes of ints >= 0 (``kind`` int) or of bools; else None."""
    if set(map(type, values)) != {kind}:
        return None
    try:
        data = _struct("q", len(values)).pack(*values)
    except (struct.error, OverflowError):
        return None
    return data if kind is bool or min(values) >= 0 else None


def _series_bytes(series: Any) -> bytes | None:
    """A timestep series (a list of numbers or ``{"f64": base64}``) as little-endian
    float64 bytes, or None when it is not one the server would take."""
    if type(series) is list:
        return _pack_floats(series)
    if type(series) is not dict:
        return None
    text = series.get("f64")
    if len(series) != 1 or type(text) is not str:
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if len(data) % 8 == 0 else None


def _shape(record: Any) -> tuple[Any, dict[str, Any], list[Any], list[bytes]] | None:
    """(shape key, record without None fields, named values, series bytes) of a step
    record a block can hold, or None. Scalar types are checked per column later."""
    if type(record) is not dict or record.get("kind") != "step":
        return None
    if not _ALLOWED.issuperset(record):
        return None
    if None in record.values():
        record = {k: v for k, v in record.items() if v is not None}
    if "step" not in record:
        return None
    values: list[Any] = []
    norms_key: tuple[Any, ...] = ()
    gates_key: tuple[Any, ...] = ()
    profile_key: tuple[Any, ...] = ()
    series_key: tuple[Any, ...] = ()
    chunks: list[bytes] = []
    norms = record.get("param_norms")
    if norms is not None:
        if type(norms) is not dict or not norms:
            return None
        norms_key = tuple(norms)
        values.extend(norms.values())
    gates = record.get("gate_norms")
    if gates is not None:
        if type(gates) is not dict or not gates:
            return None
        parts: list[Any] = []
        for param, by_gate in gates.items():
            if type(by_gate) is not dict or not by_gate:
                return None
            parts.append(param)
            parts.append(tuple(by_gate))
            values.extend(by_gate.values())
        gates_key = tuple(parts)
    profile = record.get("profile")
    if profile is not None:
        if type(profile) is not dict or not profile:
            return None
        parts = []
        for module, entry in profile.items():
            if type(entry) is not dict or not _PROFILE_SET.issuperset(entry):
                return None
            parts.append(module)
            before = len(values)
            for field in PROFILE_KEYS:
                value = entry.get(field)
                if value is not None:
                    calls_ok = type(value) is int and 0 <= value <= _MAX_CALLS
                    if field == "calls" and not calls_ok:
                        return None
                    parts.append(field)
                    values.append(value)
            if len(values) == before:  # no value at all: the entry would vanish
                return None
            parts.append(None)  # ends the module's keys
        profile_key = tuple(parts)
    timesteps = record.get("timesteps")
    if timesteps is not None:
        if type(timesteps) is not dict or not timesteps:
            return None
        parts = []
        for module, by_series in timesteps.items():
            if type(by_series) is not dict or not by_series:
                return None
            parts.append(module)
            for name, series in by_series.items():
                data = _series_bytes(series)
                if data is None or len(data) > 8 * MAX_TIMESTEPS:
                    return None
                parts.append(name)
                parts.append(len(data) >> 3)
                chunks.append(data)
            parts.append(None)
        series_key = tuple(parts)
    key = (tuple(record), norms_key, gates_key, profile_key, series_key)
    return key, record, values, chunks


def _name_ok(name: Any) -> bool:
    return type(name) is str and 0 < len(name) <= MAX_NAME_CHARS


def _layout(key: Any) -> tuple[tuple[str, ...], list[str], list[tuple[str, str, int]]] | None:
    """(scalar columns, named names, timestep columns) of a shape, or None when a name
    is not one a block can carry (too long, empty, a gate with "/", not text)."""
    fields, norms, gates, profile, series = key
    scalars = tuple(c for c in SCALAR_COLUMNS if c in fields)
    names = [f"param_norms/{p}" for p in norms if _name_ok(p)]
    if len(names) != len(norms):
        return None
    for i in range(0, len(gates), 2):
        param, by_gate = gates[i], gates[i + 1]
        if not _name_ok(param) or not all(_name_ok(g) and "/" not in g for g in by_gate):
            return None
        names.extend(f"gate_norms/{param}/{g}" for g in by_gate)
    module = None
    for part in profile:
        if module is None:
            if not _name_ok(part):
                return None
            module = part
        elif part is None:
            module = None
        else:
            names.append(f"profile/{module}/{part}")
    if any(len(name) > MAX_NAME_CHARS for name in names):
        return None
    columns: list[tuple[str, str, int]] = []
    module = None
    i = 0
    while i < len(series):
        if module is None:
            module = series[i]
            if not _name_ok(module):
                return None
            i += 1
        elif series[i] is None:
            module = None
            i += 1
        else:
            if not _name_ok(series[i]):
                return None
            columns.append((module, series[i], series[i + 1]))
            i += 2
    return scalars, names, columns


class _Group:
    """The records of one shape, in order (``index``: their places in the input)."""

    __slots__ = ("chunks", "index", "layout", "records", "values")

    def __init__(self, layout: tuple[tuple[str, ...], list[str], list[tuple[str, str, int]]]):
        self.layout = layout
        self.index: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.values: list[Any] = []  # named values, record after record
        self.chunks: list[bytes] = []  # series bytes, record after record

    def columns(self) -> tuple[dict[str, bytes], bytes | None] | int:
        """The packed bytes of every column, or the position of a record that cannot go
        in a block (a value of the wrong type)."""
        scalars, names, _ = self.layout
        out: dict[str, bytes] = {}
        for name in scalars:
            values = list(map(itemgetter(name), self.records))
            column = _column(name, values)
            if column is None:
                return next(i for i, v in enumerate(values) if _column(name, [v]) is None)
            out[name] = column
        named = None
        if names:
            named = _pack_floats(self.values)
            if named is None:
                width = len(names)
                return next(
                    i for i in range(len(self.records))
                    if _pack_floats(self.values[i * width : (i + 1) * width]) is None
                )
        return out, named

    def drop(self, position: int) -> tuple[int, dict[str, Any]]:
        width, depth = len(self.layout[1]), len(self.layout[2])
        del self.values[position * width : (position + 1) * width]
        del self.chunks[position * depth : (position + 1) * depth]
        return self.index.pop(position), self.records.pop(position)


def _column(name: str, values: list[Any]) -> bytes | None:
    if name in FLOAT_COLUMNS:
        return _pack_floats(values)
    return _pack_ints(values, bool if name == BOOL_COLUMN else int)


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
            found = _shape(record)
        except Exception:  # an odd value (one that cannot be compared, say): rest
            found = None
        if found is None:
            rest.append((i, record))
            continue
        key, clean, values, chunks = found
        group = groups.get(key)
        if group is None:
            layout = None if key in refused else _layout(key)
            if layout is None:
                refused.add(key)
                rest.append((i, record))
                continue
            group = groups[key] = _Group(layout)
        group.index.append(i)
        group.records.append(clean)
        group.values.extend(values)
        group.chunks.extend(chunks)
    blocks: list[tuple[int, dict[str, Any]]] = []
    late = False
    for group in groups.values():
        while group.records:
            columns = group.columns()
            if not isinstance(columns, int):
                blocks.extend(_blocks(group, *columns, max_bytes))
                break
            # A value of the wrong type: that record goes as it came, the server says why.
            index, _ = group.drop(columns)
            rest.append((index, records[index]))
            late = True
    if late:
        rest.sort(key=itemgetter(0))
    blocks.sort(key=itemgetter(0))  # in order of their first record
    return [r for _, r in rest], [b for _, b in blocks]


def _per_block(
    layout: tuple[tuple[str, ...], list[str], list[tuple[str, str, int]]], max_bytes: int | None
) -> int:
    """How many records of this layout a block of at most ``max_bytes`` of JSON holds."""
    if max_bytes is None:
        return MAX_RECORDS_PER_BATCH
    scalars, names, series = layout
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
            block[name] = {kind: _b64(column[8 * start : 8 * stop])}
        if named is not None:
            data = named[8 * start * width : 8 * stop * width]
            block["named"] = {"names": names, "f64": _b64(data)}
        if series:
            chunks = group.chunks[start * depth : stop * depth]
            timesteps: dict[str, dict[str, Any]] = {}
            for j, (module, name, length) in enumerate(series):
                data = b"".join(chunks[j::depth])
                timesteps.setdefault(module, {})[name] = {"len": length, "f64": _b64(data)}
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
        parsed = []
        for name in named["names"]:
            head, _, tail = name.partition("/")
            owner, _, key = tail.rpartition("/")
            parsed.append((head, tail, owner, key))
        values = _values(named, "d")
        width = len(parsed)
        for i, record in enumerate(records):
            row = values[i * width : (i + 1) * width]
            for (head, tail, owner, key), value in zip(parsed, row, strict=True):
                if head == "param_norms":
                    record.setdefault("param_norms", {})[tail] = value
                elif head == "gate_norms":
                    record.setdefault("gate_norms", {}).setdefault(owner, {})[key] = value
                else:
                    entry = record.setdefault("profile", {}).setdefault(owner, {})
                    entry[key] = int(value) if key == "calls" else value
    for module, by_series in (block.get("timesteps") or {}).items():
        for name, column in by_series.items():
            data = base64.b64decode(column["f64"])
            size = 8 * column["len"]
            for i, record in enumerate(records):
                piece = {"f64": _b64(data[i * size : (i + 1) * size])}
                record.setdefault("timesteps", {}).setdefault(module, {})[name] = piece
    return records


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
    return _b64(base64.b64decode(text)[start * width : stop * width])



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
