"""Named scalars: one name set per chunk, its values packed as rows of float64.

``param_norms/<p>``, ``gate_norms/<p>/<g>`` and ``profile/<m>/<forward_s|backward_s|
calls>`` of a record (a later family is a new prefix of names) are stored in the
order of a *name set*: an id into ``named_sets`` (the JSON list of names, per run and
rank), and each chunk of ``named_chunks`` (store/chunks.py) holds n rows of its
values as little-endian float64 (NaN and the infinities included). Each name keeps
its ``series`` id and its rollups (store/set_rollups.py).

A step sent again (a new seq after a restart, or a resumed process) adds a row: the
one written last wins on read, per name (``written``: the writer's clock, then the
record's uid; store/named_reads.py).

Example:
    >>> text = digest(("param_norms/w",))[1]
    >>> text, decode_view(bytes(8)).tolist()
    ('["param_norms/w"]', [0.0])
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array

_LITTLE = sys.byteorder == "little"


def digest(names: tuple[str, ...]) -> tuple[str, str]:
    """(digest, JSON text) of a name set, as ``named_sets`` keeps it."""
    text = json.dumps(list(names), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), text


def decode_array(data: bytes) -> array[float]:
    """Packed values (one or many rows back to back) as an ``array('d')``."""
    values = array("d")
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values


def decode_view(data: bytes) -> memoryview[float] | array[float]:
    """Packed values as a sequence of floats without copying them where the machine is
    little-endian (a float view of the bytes: 4x faster than an array for one field
    of 20k rows); ``view[i::width].tolist()`` is a field of rows of ``width`` values."""
    return memoryview(data).cast("d") if _LITTLE else decode_array(data)
