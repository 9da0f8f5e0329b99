"""PostgreSQL arrays sent in binary, built a column at a time.

The writer sends a transaction's rows as one array per column (``INSERT ... SELECT *
FROM unnest(...)``). psycopg dumps a list parameter element by element in Python,
which was the largest part of the writer thread's CPU; here an int8 column is one
numpy conversion and a text or bytea column one ``join``. The bytes are PostgreSQL's
binary array format (``array_recv``): a header, then each element's length and bytes.

Example:
    >>> bytes(binary_array("int8", [1, None]))[:12].hex()  # 1 dim, has NULLs, of int8
    '000000010000000100000014'
    >>> len(binary_array("bytea", [b"ab", b""])), len(binary_array("text", []))
    (30, 12)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format

# Element type -> (its oid, its array type's oid): pg_type.
OIDS = {"int8": (20, 1016), "text": (25, 1009), "bytea": (17, 1001), "bool": (16, 1000)}
_NULL = struct.pack(">i", -1)
_SIZE = struct.Struct(">i").pack
_FIXED = {"int8": ">i8", "bool": "u1"}


class BinaryArray(bytes):
    """An array in PostgreSQL's binary format; its type says which element type."""

    oid: ClassVar[int]


_KINDS: dict[str, type[BinaryArray]] = {
    kind: type(f"{kind.capitalize()}Array", (BinaryArray,), {"oid": array_oid})
    for kind, (_, array_oid) in OIDS.items()
}


def binary_array(kind: str, values: Sequence[Any]) -> BinaryArray:
    """``values`` (None for NULL) as a one-dimensional array of ``kind`` (a key of
    :data:`OIDS`); text is sent as UTF-8."""
    element_oid = OIDS[kind][0]
    wrap = _KINDS[kind]
    if not values:
        return wrap(struct.pack(">iiI", 0, 0, element_oid))
    has_null = None in values
    head = struct.pack(">iiIii", 1, int(has_null), element_oid, len(values), 1)
    fixed = _FIXED.get(kind)
    if fixed is not None and not has_null:
        cells = np.empty(len(values), [("size", ">i4"), ("value", fixed)])
        cells["size"] = np.dtype(fixed).itemsize
        cells["value"] = values
        return wrap(head + cells.tobytes())
    parts = [head]
    for value in values:
        if value is None:
            parts.append(_NULL)
            continue
        if kind == "text":
            data = str(value).encode()
        elif fixed is not None:
            data = np.array(value, fixed).tobytes()
        else:
            data = value if isinstance(value, bytes) else bytes(value)
        parts += (_SIZE(len(data)), data)
    return wrap(b"".join(parts))


class _BinaryArrayDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> Any:
        return obj  # bytes already: no copy of a 300 KB column


def register(adapters: AdaptersMap) -> None:
    """Let ``adapters`` (a connection's) send :class:`BinaryArray` values as they are."""
    for wrap in _KINDS.values():
        dumper = type(f"{wrap.__name__}Dumper", (_BinaryArrayDumper,), {"oid": wrap.oid})
        adapters.register_dumper(wrap, dumper)
