"""PostgreSQL arrays sent in binary, built a column at a time.

The PostgreSQL store sends a transaction's rows as one array per column (``INSERT ...
SELECT * FROM unnest(...)``). psycopg dumps a list parameter element by element in
Python, which was the largest part of the writer thread's CPU; here an int8 column is
one numpy conversion and a text or bytea column one ``join``. The bytes are PostgreSQL's
binary array format (``array_recv``: a header, then each element's length and bytes),
sent with no type: the statement's cast (``%b::int8[]``) names it, and the server checks
the elements' type against it.

Example:
    >>> bytes(binary_array("int8", [1, None]))[:12].hex()  # 1 dim, has NULLs, of int8
    '000000010000000100000014'
    >>> len(binary_array("bytea", [b"ab", b""])), len(binary_array("text", []))
    (30, 12)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format

# The element types an array may hold: their oids (pg_type) and, where fixed, their size.
OIDS = {"int8": 20, "text": 25, "bytea": 17, "bool": 16}
_FIXED = {"int8": ">i8", "bool": "u1"}
_NULL = struct.pack(">i", -1)
_SIZE = struct.Struct(">i").pack


class BinaryArray(bytes):
    """An array in PostgreSQL's binary format, sent as it is (:func:`register`)."""


def binary_array(kind: str, values: Sequence[Any]) -> BinaryArray:
    """``values`` (None for NULL) as a one-dimensional array of ``kind`` (a key of
    :data:`OIDS`); text is sent as UTF-8."""
    if not values:
        return BinaryArray(struct.pack(">iiI", 0, 0, OIDS[kind]))
    has_null = None in values
    head = struct.pack(">iiIii", 1, int(has_null), OIDS[kind], len(values), 1)
    fixed = _FIXED.get(kind)
    if fixed is not None and not has_null:
        cells = np.empty(len(values), [("size", ">i4"), ("value", fixed)])
        cells["size"] = np.dtype(fixed).itemsize
        cells["value"] = values
        return BinaryArray(head + cells.tobytes())
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
    return BinaryArray(b"".join(parts))


class _AsItIs(Dumper):
    format = Format.BINARY
    oid = 0  # no type: the cast in the statement gives it

    def dump(self, obj: Any) -> Any:
        return obj  # bytes already: no copy of a 300 KB column


def register(adapters: AdaptersMap) -> None:
    """Let ``adapters`` (a connection's) send :class:`BinaryArray` values."""
    adapters.register_dumper(BinaryArray, _AsItIs)
