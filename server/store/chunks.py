"""Every step record stored as columns: one row per *chunk* of records.

A block (a wire ``columns`` block, or step records turned into one: store/split.py) is
cut into chunks of records in step order spanning fewer than :data:`SPAN` steps, and
each chunk is ONE row of each table, with its step numbers (``steps``: n int64), its
first and last step and the uid of its first record (the next ones follow):

- ``step_chunks``: the plain fields (``fields`` names the n-value columns of ``data``,
  little-endian int64 or float64) and ``notes``, each record's other fields as JSON;
- ``named_chunks``: the named scalars (``param_norms/<p>``, ``update_ratios/<p>``,
  ``gate_norms/<p>/<g>``, ``profile/<m>/<key>``) as n rows of float64 in the order of
  a name set (``names``: an id into ``named_sets``); a step sent again adds a row, and
  the one written last (``written``, then the uid) wins on read;
- ``series_chunks``: one per-step series of a module (``timesteps``, or ``depth`` of a
  stack), n rows of ``len`` float64.

One row per chunk instead of ~4 per record is what let SQLite ingest pass 50,000
records/s (BENCHMARKS.md, "Ingest").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradwatch.protocol.column_shapes import FLOAT_COLUMNS
from gradwatch.protocol.columns import split_name

from ..column_checks import INT_COLUMNS, ints

# The plain fields of a step record; ``backward_passes`` comes only from records
# (store/split.py), never on the wire. ints decode as int64.
INT_FIELDS = (*INT_COLUMNS, "graph_truncated", "backward_passes")
FLOAT_FIELDS = FLOAT_COLUMNS
# The plain fields a chunk may hold, in the order of its ``fields``.
CHUNK_FIELDS = ("epoch", *FLOAT_FIELDS, *INT_FIELDS[1:])
# The plain fields the history API serves (docs/API.md, ``/steps``), each rolled up.
SCALAR_FIELDS = ("loss", "duration_s", "total_norm", "graph_nodes", "rss_bytes",
                 "cuda_allocated_bytes", "cuda_reserved_bytes", "overhead", "backward_passes")
INTEGER_FIELDS = tuple(name for name in SCALAR_FIELDS if name in INT_FIELDS)
# A chunk's steps lie within step_lo .. step_lo + SPAN - 1, so the chunks that may
# hold a step range are found on the (run, rank, step_lo) key alone.
SPAN = 4096

# The columns of each table, in the order of its rows (and of PostgreSQL's COPY).
STEP_COLUMNS = ("run_id", "rank", "step_lo", "step_hi", "uid", "n", "fields", "steps", "data",
                "notes")
NAMED_COLUMNS = ("run_id", "rank", "step_lo", "step_hi", "uid", "written", "names", "n",
                 "steps", "data")
SERIES_COLUMNS = ("run_id", "rank", "family", "module", "series", "step_lo", "step_hi", "uid",
                  "n", "len", "steps", "data")
TABLES = (("step_chunks", STEP_COLUMNS), ("named_chunks", NAMED_COLUMNS),
          ("series_chunks", SERIES_COLUMNS))


def schema(integer: str, blob: str, clustered: str) -> list[str]:
    """CREATE statements of the chunk tables."""
    head = f"run_id TEXT NOT NULL, rank {integer} NOT NULL"
    span = f"step_lo {integer} NOT NULL, step_hi {integer} NOT NULL, uid {integer} NOT NULL"
    return [
        f"CREATE TABLE step_chunks ({head}, {span}, n {integer} NOT NULL,"
        f" fields TEXT NOT NULL, steps {blob} NOT NULL, data {blob} NOT NULL, notes TEXT,"
        f" PRIMARY KEY (run_id, rank, step_lo, uid)){clustered}",
        f"CREATE TABLE named_chunks ({head}, {span}, written {integer} NOT NULL,"
        f" names {integer} NOT NULL, n {integer} NOT NULL, steps {blob} NOT NULL,"
        f" data {blob} NOT NULL, PRIMARY KEY (run_id, rank, step_lo, uid)){clustered}",
        f"CREATE TABLE series_chunks ({head}, family TEXT NOT NULL, module TEXT NOT NULL,"
        f" series TEXT NOT NULL, {span}, n {integer} NOT NULL, len {integer} NOT NULL,"
        f" steps {blob} NOT NULL, data {blob} NOT NULL)",
        "CREATE INDEX series_chunks_lookup"
        " ON series_chunks (run_id, family, module, series, rank, step_lo)",
    ]


@dataclass
class ColumnGroup:
    """One chunk's series for the rollups: ``matrix[i, k]`` (all int64 or all float64)
    is the series named ``names[k]`` at ``steps[i]`` (``name_set``: named scalars); the
    writer adds their ids and kinds (store/chunk_writes.py)."""

    steps: list[int]
    names: tuple[str, ...]
    matrix: Any
    name_set: bool = False
    ids: tuple[int, ...] = ()
    kinds: str = ""


@dataclass
class Chunks:
    """A batch's chunk rows (named rows still need their name set's id) and groups."""

    steps: list[tuple[Any, ...]] = field(default_factory=list)
    # (names, row without written and set id)
    named: list[tuple[tuple[str, ...], tuple[Any, ...]]] = field(default_factory=list)
    series: list[tuple[Any, ...]] = field(default_factory=list)
    groups: list[ColumnGroup] = field(default_factory=list)


def cuts(steps: list[int]) -> list[tuple[int, int]]:
    """(start, stop) of each chunk of a block: runs in step order within SPAN steps.

    >>> cuts([5, 6, 7]), cuts([5, 4, 9000]), cuts([])
    ([(0, 3)], [(0, 1), (1, 2), (2, 3)], [])
    """
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(steps)):
        if steps[i] < steps[i - 1] or steps[i] - steps[start] >= SPAN:
            out.append((start, i))
            start = i
    if steps:
        out.append((start, len(steps)))
    return out


def add_block(
    out: Chunks, block: Any, run_id: str, rank: int, uid: int, keys: set[tuple[str, str, str]]
) -> tuple[int, int]:
    """Add one block's chunk rows, rollup groups and run_keys; its records' uids are
    ``uid + 1 ...`` in block order. Returns the block's last step and last epoch."""
    steps = ints(block.step.i64)
    last_epoch = max(ints(block.epoch.i64)) if block.epoch is not None else 0
    columns = [(name, getattr(block, name, None)) for name in CHUNK_FIELDS]
    present: list[tuple[str, Any]] = [(n, c) for n, c in columns if c is not None]
    raw = [column.i64 if name in INT_FIELDS else column.f64 for name, column in present]
    fields = json.dumps([name for name, _ in present])
    rolled = [(n, data) for (n, _), data in zip(present, raw, strict=True) if n in SCALAR_FIELDS]
    keys.update(("scalar", name, "") for name, _ in rolled)
    named = block.named if block.named is not None and block.named.names else None
    names = tuple(named.names) if named is not None else ()
    for family, owner, key in map(split_name, names):  # a profiled module once, not per key
        keys.add((family, owner, "" if family == "profile" else key))
    # A wire block has no depth series: only blocks made of records do (store/split.py).
    depth = getattr(block, "depth", None) or {}
    series_columns = [
        ("timesteps", module, series, column)
        for module, series_map in (block.timesteps or {}).items()
        for series, column in series_map.items()
    ] + [("depth", stack, "input", column) for stack, column in depth.items()]
    keys.update((family, module, series) for family, module, series, _ in series_columns)
    notes = getattr(block, "notes", None)
    chunks = cuts(steps)
    out.groups.extend(_array_groups(steps, block.step.i64, chunks, rolled, named))
    for start, stop in chunks:
        n, first, lo, hi = stop - start, uid + 1 + start, steps[start], steps[stop - 1]
        data = b"".join(d[8 * start : 8 * stop] for d in raw)
        step_bytes = block.step.i64[8 * start : 8 * stop]
        part = notes[start:stop] if notes is not None else None
        text = json.dumps(part, separators=(",", ":")) if part and any(part) else None
        out.steps.append((run_id, rank, lo, hi, first, n, fields, step_bytes, data, text))
        if named is not None:
            data = named.f64[8 * len(names) * start : 8 * len(names) * stop]
            out.named.append((names, (run_id, rank, lo, hi, first, n, step_bytes, data)))
        for family, module, series, column in series_columns:
            size = 8 * column.length
            out.series.append(
                (run_id, rank, family, module, series, lo, hi, first, n,
                 column.length, step_bytes, column.f64[size * start : size * stop])
            )
    return max(steps), last_epoch


def _array_groups(
    steps: list[int],
    step_bytes: bytes,
    chunks: list[tuple[int, int]],
    rolled: list[tuple[str, bytes]],
    named: Any,
) -> list[ColumnGroup]:
    """Each chunk's rollup groups as numpy matrices of one dtype (store/rollups.py):
    the int columns with the steps, the float columns, the named scalars."""
    n = len(steps)
    ints_ = [(name, data) for name, data in rolled if name in INT_FIELDS]
    floats_ = [(name, data) for name, data in rolled if name not in INT_FIELDS]
    int_bytes = b"".join([step_bytes, *(d for _, d in ints_)])
    matrices: list[tuple[tuple[str, ...], Any, bool]] = [
        (("step", *(name for name, _ in ints_)), np.frombuffer(int_bytes, "<i8").reshape(-1, n).T,
         False)
    ]
    if floats_:
        matrix = np.frombuffer(b"".join(d for _, d in floats_), "<f8").reshape(-1, n).T
        matrices.append((tuple(name for name, _ in floats_), matrix, False))
    if named is not None:
        matrix = np.frombuffer(named.f64, "<f8").reshape(n, len(named.names))
        matrices.append((tuple(named.names), matrix, True))
    return [
        ColumnGroup(steps[start:stop], names, matrix[start:stop], name_set)
        for start, stop in chunks
        for names, matrix, name_set in matrices
    ]


def digest(names: tuple[str, ...]) -> tuple[str, str]:
    """(digest, JSON text) of a name set, as ``named_sets`` keeps it."""
    text = json.dumps(list(names), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), text
