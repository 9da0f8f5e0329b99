"""Reading named scalars straight from their chunks (store/named.py) for ``/steps``.

A named field's history is the chunks of its run and rank in a step range, each
decoded once (a float view of its bytes) and shared by every field of the same query;
a field's values are one C-level slice per chunk (``view[index::width]``). The steps
(and, where a step was sent again, which row of it wins: the one written last) are
worked out once per set of chunks holding the field, so the fields of one name set
share one steps list. Edge and fine buckets take each bucket's min and max in Python
with the rollups' semantics: the backend's value order (``value_key``; values pass
through ``scalar_in`` as stored values do), the earliest step among equal values.

Example (any store):
    >>> store.named_points("run", 0, "param_norms/w", 0, 99, {})  # doctest: +SKIP
    ([0, 1], [0.5, 0.25])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from ..columns import ints
from . import named, rollups
from .chunk_reads import ChunkReads
from .chunks import stored_floats

# (steps, values): one value per step, in step order.
Points = tuple[list[int], list[Any]]
# A named chunk as read: (written, uid, set id, steps, its values as floats).
Chunk = tuple[int, int, int, list[int], "memoryview[float] | Any"]


def steps_layout(chunks: Sequence[Chunk], lo: int, hi: int) -> tuple[list[int], list[int] | None]:
    """(steps, picks) of the rows of ``chunks`` (in (step_lo, uid) order) in ``lo..hi``:
    picks is None where every row is in range and no step repeats, else the place, in
    the chunks' rows back to back, of each step's last written row.

    >>> steps_layout([(1, 10, 0, [3, 4], None), (2, 20, 0, [4, 9], None)], 0, 5)
    ([3, 4], [0, 2])
    """
    steps = [s for c in chunks for s in c[3]]
    if steps and lo <= steps[0] and steps[-1] <= hi and all(map(int.__lt__, steps, steps[1:])):
        return steps, None
    latest: dict[int, tuple[tuple[int, int], int]] = {}
    place = 0
    for written, uid, _, numbers, _ in chunks:
        for i, step in enumerate(numbers):
            found = latest.get(step)
            if lo <= step <= hi and (found is None or found[0] < (written, uid + i)):
                latest[step] = ((written, uid + i), place + i)
        place += len(numbers)
    ordered = sorted(latest)
    return ordered, [latest[step][1] for step in ordered]


class NamedReads(ChunkReads):
    """Mixed into :class:`gradwatch.server.store.history.HistoryReads`."""

    value_key = staticmethod(rollups.sqlite_key)

    def name_sets(self, run_id: str, rank: int) -> dict[int, dict[str, int]]:
        """Each name set of a run and rank: id -> {name: index in its rows}."""
        cache: dict[int, dict[str, int]] = self.__dict__.setdefault("_decoded_sets", {})
        if len(cache) > 10_000:
            cache.clear()
        out = {}
        for set_id, text in self.query(
            "SELECT id, names FROM named_sets WHERE run_id = ? AND rank = ?", (run_id, rank)
        ):
            found = cache.get(set_id)
            if found is None:  # a set never changes: decode its JSON once
                found = cache[set_id] = {n: i for i, n in enumerate(json.loads(text))}
            out[set_id] = found
        return out

    def named_points(
        self,
        run_id: str,
        rank: int,
        name: str,
        lo: int,
        hi: int,
        memo: dict[Any, Any],
        sets: dict[int, dict[str, int]] | None = None,
    ) -> Points:
        """(steps, stored values) of a named field in ``lo..hi``: the last row written
        of each step; ``memo`` shares the decoded chunks between the fields of one query."""
        if sets is None:
            sets = self.name_sets(run_id, rank)
        chunks: list[Chunk] | None = memo.get((lo, hi))
        if chunks is None:
            chunks = memo[lo, hi] = [
                (written, uid, set_id, ints(bytes(steps)), named.decode_view(bytes(data)))
                for uid, written, set_id, steps, data in self._chunks(
                    "uid, written, names, steps, data",
                    "named_chunks",
                    "run_id = ? AND rank = ?",
                    (run_id, rank),
                    lo,
                    hi,
                )
            ]
        held = [(i, sets.get(c[2]) or {}) for i, c in enumerate(chunks)]
        held = [(i, names) for i, names in held if name in names]
        if not held:
            return [], []
        key = ("steps", lo, hi, tuple(i for i, _ in held))
        layout = memo.get(key)
        if layout is None:  # shared by the fields held by the same chunks
            layout = memo[key] = steps_layout([chunks[i] for i, _ in held], lo, hi)
        values: list[float] = []
        for i, names in held:
            rows = len(chunks[i][3])
            column = cast("list[float]", chunks[i][4][names[name] :: len(names)].tolist())
            if len(column) != rows:  # never expected: a chunk of another width
                column = (column + [float("nan")] * rows)[:rows]
            values.extend(column)
        steps, picks = layout
        if picks is not None:
            values = [values[p] for p in picks]
        return steps, self._stored(values)  # the steps list is shared by the fields

    def _stored(self, values: list[float]) -> list[Any]:
        """Decoded floats as the backend stores numbers (SQLite: "NaN" strings), so they
        order and compare as the stored values and the rollups do."""
        return stored_floats(values, self.scalar_in)


def bucket_extremes(
    steps: list[int], values: list[Any], cuts: Sequence[tuple[int, int]], key: rollups.Key
) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
    """(step, value) of the min and of the max of ``values[i:j]`` for each ``(i, j)`` of
    ``cuts`` (``steps`` in order): the earliest of equal values, in ``key``'s order.

    >>> bucket_extremes([0, 1, 5, 6], [2.0, "NaN", 2.0, 1.0], [(0, 2), (2, 4), (4, 4)],
    ...                 rollups.sqlite_key)
    ([(0, 2.0), (6, 1.0)], [(1, 'NaN'), (5, 2.0)])
    """
    try:
        total = sum(values)
        plain = total == total
    except TypeError:
        plain = False
    keys = None if plain else [key(v) for v in values]
    lows: list[tuple[int, Any]] = []
    highs: list[tuple[int, Any]] = []
    for i, j in cuts:
        if i >= j:
            continue
        if keys is None:
            part = values[i:j]
            # min()/max() return the first of equal values, index() finds it: in C.
            lo, hi = i + part.index(min(part)), i + part.index(max(part))
        else:
            at = keys.__getitem__
            lo, hi = min(range(i, j), key=at), max(range(i, j), key=at)
        lows.append((steps[lo], values[lo]))
        highs.append((steps[hi], values[hi]))
    return lows, highs
