"""Every step record stored as columns: one row per *chunk* of records.

A block (a wire ``columns`` block, or step records turned into one) is cut by
store/split.py into chunks of records in step order spanning fewer than :data:`SPAN`
steps, and each chunk is ONE row of each table, with its step numbers (``steps``: n
int64), its first and last step and the uid of its first record (the next ones follow):

- ``step_chunks``: the plain fields (``fields`` names the n-value columns of ``data``,
  little-endian int64 or float64) and ``notes``, each record's other fields as JSON;
- ``named_chunks``: the named scalars (``param_norms/<p>``, ``update_ratios/<p>``,
  ``gate_norms/<p>/<g>``, ``profile/<m>/<key>``) as n rows of float64 in the order of
  a set of series (``names``: the id of their rollup set, store/rollups.py); a step
  sent again adds a row, and the one written last (``written``, then the uid) wins;
- ``series_chunks``: one per-step series of a module (``timesteps``, or ``depth`` of a
  stack), n rows of ``len`` float64.

One row per chunk instead of ~4 per record is what let SQLite ingest pass 50,000
records/s (BENCHMARKS.md, "Ingest").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradwatch.protocol.column_shapes import FLOAT_COLUMNS

from ..column_checks import INT_COLUMNS

# The int plain fields of a step record, as int64 (the float ones: FLOAT_COLUMNS);
# ``backward_passes`` comes only from records (store/split.py), never on the wire.
INT_FIELDS = (*INT_COLUMNS, "graph_truncated", "backward_passes")
# The plain fields a chunk may hold, in the order of its ``fields``.
CHUNK_FIELDS = ("epoch", *FLOAT_COLUMNS, *INT_FIELDS[1:])
# The plain fields the history API serves (docs/API.md, ``/steps``), each rolled up.
SCALAR_FIELDS = (
    "loss",
    "duration_s",
    "total_norm",
    "graph_nodes",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "overhead",
    "backward_passes",
)
# A chunk's steps lie within step_lo .. step_lo + SPAN - 1, so the chunks that may
# hold a step range are found on the (run, rank, step_lo) key alone.
SPAN = 4096

# The columns of each table, in the order of its rows (and of PostgreSQL's COPY).
_RANGE = ("step_lo", "step_hi", "uid")
_SERIES = ("family", "module", "series")
TABLES = {
    "step_chunks": ("run_id", "rank", *_RANGE, "n", "fields", "steps", "data", "notes"),
    "named_chunks": ("run_id", "rank", *_RANGE, "written", "names", "n", "steps", "data"),
    "series_chunks": ("run_id", "rank", *_SERIES, *_RANGE, "n", "len", "steps", "data"),
}


@dataclass
class ColumnGroup:
    """One chunk's series for the rollups: ``matrix[i, k]`` (all int64 or all float64)
    is the series named ``names[k]`` at ``steps[i]``; the writer adds the id of their
    set (store/chunk_writes.py)."""

    steps: list[int]
    names: tuple[str, ...]
    matrix: Any
    set_id: int = 0


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
