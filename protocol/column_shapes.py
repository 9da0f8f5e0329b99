"""Which step records a block of ``columns`` can hold, and their values packed.

A record fits when every field is one a block has a column for and every value has the
type the server takes (docs/PROTOCOL.md): :func:`shape` gives its shape (the key that
groups records into blocks) and its named values and series bytes; :func:`layout`
turns a shape into a block's columns and names, or refuses names a block cannot
carry. Packing is a few C-level calls per field (struct, base64), no Python loop per
number: it runs on the Monitor's background thread.

Example:
    >>> key, record, values, chunks = shape({"kind": "step", "step": 1, "loss": None,
    ...                                      "param_norms": {"w": 0.5}})
    >>> record, values
    ({'kind': 'step', 'step': 1, 'param_norms': {'w': 0.5}}, [0.5])
    >>> layout(key)  # scalar columns, named names, timestep columns
    (('step',), ['param_norms/w'], [])
    >>> shape({"kind": "step", "step": 1, "nonfinite": {}}) is None
    True
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

from .messages import MAX_NAME_CHARS, MAX_TIMESTEPS, NONFINITE_STRINGS

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
# (scalar columns, named names, timestep columns as (module, series, length))
Layout = tuple[tuple[str, ...], list[str], list[tuple[str, str, int]]]
_MAX_CALLS = 2**53  # calls travel as float64: larger counts would not come back exact


def b64(data: bytes) -> str:
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


def pack_floats(values: list[Any]) -> bytes | None:
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


def pack_ints(values: list[Any], kind: type) -> bytes | None:
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
        return pack_floats(series)
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


def shape(record: Any) -> tuple[Any, dict[str, Any], list[Any], list[bytes]] | None:
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


def layout(key: Any) -> Layout | None:
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


def pack_column(name: str, values: list[Any]) -> bytes | None:
    if name in FLOAT_COLUMNS:
        return pack_floats(values)
    return pack_ints(values, bool if name == BOOL_COLUMN else int)
