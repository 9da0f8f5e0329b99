"""Every named scalar of one family at once, as a matrix (for ``/update_ratios``).

``named_points`` (store/chunk_reads.py) reads one field: right for the few fields of
a chart, but a model's ``update_ratios/<p>`` are hundreds of fields, and every heavy
step record is a chunk of its own (its shape differs from the light steps around it),
so reading them field by field visits every chunk once per parameter (386 parameters
x 2,000 chunks: about 1 s). This reads each chunk once: the names of a name set that
start with the prefix are worked out once per set, and each chunk's rows are one
numpy slice. A step sent twice reads from its row written last, as named_points does.

Example (any store):
    >>> steps, names, values, present = named_matrix(store, "run", 0, "update_ratios/",
    ...                                              0, 99)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..columns import ints


def named_matrix(
    store: Any, run_id: str, rank: int, prefix: str, lo: int, hi: int
) -> tuple[list[int], list[str], Any, Any]:
    """(steps, names, values, present) of the named scalars starting with ``prefix``
    in ``lo..hi``: ``values[i, k]`` (float64) is name k at ``steps[i]`` where
    ``present[i, k]``; steps in order, names in the order first seen."""
    sets = store.name_sets(run_id, rank)
    wanted: dict[int, tuple[list[str], list[int]]] = {}  # set id -> its names of prefix
    columns: dict[str, int] = {}
    # step -> ((written, uid of the row), chunk number, row) of its row written last
    latest: dict[int, tuple[tuple[int, int], int, int]] = {}
    chunks: list[tuple[list[int], Any]] = []
    for uid, written, set_id, steps, data in store.named_chunk_rows(run_id, rank, lo, hi):
        found = wanted.get(set_id)
        if found is None:
            names = sets.get(set_id) or {}
            mine = [(n, i) for n, i in names.items() if n.startswith(prefix)]
            found = wanted[set_id] = ([n for n, _ in mine], [i for _, i in mine])
            for name in found[0]:
                columns.setdefault(name, len(columns))
        if not found[0]:
            continue
        numbers = ints(bytes(steps))
        width = len(sets.get(set_id) or {})
        rows = np.frombuffer(bytes(data), "<f8").reshape(len(numbers), width)[:, found[1]]
        chunks.append(([columns[n] for n in found[0]], rows))
        for i, step in enumerate(numbers):
            if lo <= step <= hi:
                key = (int(written), uid + i)
                held = latest.get(step)
                if held is None or held[0] < key:
                    latest[step] = (key, len(chunks) - 1, i)
    ordered = sorted(latest)
    values = np.zeros((len(ordered), len(columns)))
    present = np.zeros((len(ordered), len(columns)), dtype=bool)
    for row, step in enumerate(ordered):
        _, chunk, i = latest[step]
        where, rows = chunks[chunk]
        values[row, where] = rows[i]
        present[row, where] = True
    return ordered, list(columns), values, present
