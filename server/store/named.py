"""Named scalars stored as one packed row per step record.

``param_norms/<p>``, ``gate_norms/<p>/<g>`` and ``profile/<m>/<forward_s|backward_s|
calls>`` of a record (24 in the benchmark's records) become ONE row of
``named_scalars``: the values as little-endian float64 in the order of a *name set*,
an id into ``named_sets`` (the JSON list of names, per run and rank). One row per
record instead of 24 made these inserts the smaller part of the writer's time
(BENCHMARKS.md, "Ingest: packed named scalars"). NaN and the infinities are NaN/inf
in the blob. Each name keeps its ``series`` id and its rollups (store/rollups.py),
so a long history still reads ~1,000 rollup rows.

A step sent again (a new seq after a restart, or a resumed process) adds a row: the
one written last wins on read, per name (``written``: the writer's clock, then the
record's uid), as the upsert of the previous layout did. Databases written before
this layout keep their ``scalars`` rows, which are still read (store/named_reads.py).

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> builder = NamedBuilder(lambda v: v, set())
    >>> record = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0,'
    ...     ' "records": [{"kind": "step", "step": 4, "param_norms": {"w": 2.5}}]}'
    ... ).records[0]
    >>> builder.add(record, 4, 1)
    >>> group = builder.groups[("param_norms/w",)]
    >>> group.steps, group.values, decode(group.blobs[0])
    ([4], [[2.5]], [2.5])
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradwatch.protocol.messages import NONFINITE_STRINGS

PROFILE_KEYS = ("forward_s", "backward_s", "calls")
NAMED_INSERT = (
    "INSERT INTO named_scalars (run_id, rank, step, uid, written, names, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    # A guard, never expected to fire: a colliding row must not wedge ingest.
    " ON CONFLICT DO NOTHING"
)
_LITTLE = sys.byteorder == "little"


def schema(integer: str, blob: str, serial: str, clustered: str) -> list[str]:
    """CREATE statements of the packed layout (after ``meta`` exists)."""
    return [
        # The names are found by a digest: a set of many long names would exceed
        # PostgreSQL's limit on an index entry (~2.7 KB).
        f"CREATE TABLE IF NOT EXISTS named_sets (id {serial}, run_id TEXT NOT NULL,"
        f" rank {integer} NOT NULL, digest TEXT NOT NULL, names TEXT NOT NULL,"
        " UNIQUE (run_id, rank, digest))",
        # Clustered in SQLite like `steps`: a range of steps is one walk of the table.
        f"CREATE TABLE IF NOT EXISTS named_scalars (run_id TEXT NOT NULL,"
        f" rank {integer} NOT NULL, step {integer} NOT NULL, uid {integer} NOT NULL,"
        f" written {integer} NOT NULL, names {integer} NOT NULL, data {blob} NOT NULL,"
        f" PRIMARY KEY (run_id, rank, step, uid)){clustered}",
        # Runs started before this layout may have `scalars` rows (store/named_reads.py).
        "INSERT INTO meta (key, value) VALUES ('named_from',"  # noqa: S608 (a float)
        f" '{time.time()!r}') ON CONFLICT DO NOTHING",
    ]


def digest(names: tuple[str, ...]) -> tuple[str, str]:
    """(digest, JSON text) of a name set, as ``named_sets`` keeps it."""
    text = json.dumps(list(names), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), text


def decode(data: bytes) -> list[float]:
    """A packed row's values (floats, NaN and infinities included)."""
    return decode_array(data).tolist()


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


@dataclass
class NamedGroup:
    """The records of one batch that share a name set, in batch order: ``values`` are
    as the backend stores a number (``scalar_in``), ``blobs`` their packed rows."""

    steps: list[int] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)
    values: list[list[Any]] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)


class NamedBuilder:
    """Collects a batch's named scalars by name set (used by rows.split_batch).

    ``keys`` receives the run_keys entries of every name set seen (run detail's
    parameters, gate parameters and profiled modules).
    """

    def __init__(self, scalar: Callable[[Any], Any], keys: set[tuple[str, str, str]]) -> None:
        self.scalar = scalar
        self.keys = keys
        self.groups: dict[tuple[str, ...], NamedGroup] = {}
        # The shape of the previous record (its names in order) and its group: names
        # rarely change between records, so most records cost one tuple comparison.
        self._shape: Any = None
        self._group: NamedGroup | None = None
        self._by_shape: dict[Any, NamedGroup] = {}

    def add(self, record: Any, step: int, uid: int) -> None:
        """Add a step record's named scalars (nothing when it has none)."""
        norms, gates, profile = record.param_norms, record.gate_norms, record.profile
        if not (norms or gates or profile):
            return
        values = list(norms.values()) if norms else []
        gate_shape: tuple[Any, ...] = ()
        if gates:
            parts: list[Any] = []
            for param, by_gate in gates.items():
                parts.append(param)
                parts.append(tuple(by_gate))
                values.extend(by_gate.values())
            gate_shape = tuple(parts)
        profile_shape: tuple[Any, ...] = ()
        if profile:
            parts = []
            for module, entry in profile.items():
                parts.append(module)
                for key in PROFILE_KEYS:
                    value = getattr(entry, key)
                    if value is not None:
                        parts.append(key)
                        values.append(value)
                parts.append(None)  # ends the module's keys
            profile_shape = tuple(parts)
        shape = (tuple(norms) if norms else (), gate_shape, profile_shape)
        group = self._group
        if shape != self._shape or group is None:
            group = self._by_shape.get(shape)
            if group is None:
                group = self._by_shape[shape] = self._new_group(shape)
            self._shape, self._group = shape, group
        try:
            packed = array("d", values)
        except TypeError:  # a "NaN"/"Infinity" string: as the backend stores it
            values = [self.scalar(v) for v in values]
            packed = array("d", [NONFINITE_STRINGS[v] if type(v) is str else v for v in values])
        if not _LITTLE:
            packed.byteswap()
        group.steps.append(step)
        group.uids.append(uid)
        group.values.append(values)
        group.blobs.append(packed.tobytes())

    def _new_group(self, shape: Any) -> NamedGroup:
        norms, gates, profile = shape
        names = [f"param_norms/{p}" for p in norms]
        self.keys.update(("param_norms", p, "") for p in norms)
        for i in range(0, len(gates), 2):
            param = gates[i]
            names.extend(f"gate_norms/{param}/{g}" for g in gates[i + 1])
            self.keys.update(("gate_norms", param, g) for g in gates[i + 1])
        module = None
        for part in profile:
            if module is None:
                module = part
                self.keys.add(("profile", module, ""))
            elif part is None:
                module = None
            else:
                names.append(f"profile/{module}/{part}")
        found = self.groups.get(tuple(names))
        if found is None:  # two shapes may name the same set (a None profile value)
            found = self.groups[tuple(names)] = NamedGroup()
        return found
