"""Reading named scalars from their chunks (store/named.py) for ``/steps``.

A named field's history is the rows of its run and rank in a step range, each
decoded once and shared by every field of the same query; the field's values are
one C-level slice per name set (``flat[index::width]``). Where several rows hold the
same step (a step sent again), the one written last wins, per name. Edge and fine
buckets take each bucket's min and max in Python with the rollups' semantics: the
backend's value order (``value_key``; values pass through ``scalar_in`` as stored
values do), the earliest step among equal values.

Example (any store):
    >>> store.named_points("run", 0, "param_norms/w", 0, 99, {})  # doctest: +SKIP
    ([0, 1], [0.5, 0.25])
"""

from __future__ import annotations

import json
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any, cast

from . import named, rollups
from .chunk_reads import ChunkReads
from .chunks import stored_floats

# (steps, values): one value per step, in step order.
Points = tuple[list[int], list[Any]]


class PackedSpan:
    """The packed rows of one run and rank in a step range, grouped by name set and
    decoded on first use."""

    def __init__(
        self,
        found: Sequence[tuple[Any, ...]],
        sets: dict[int, dict[str, int]],
        order: Sequence[tuple[int, int]] | None = None,
        only: int | None = None,
    ) -> None:
        """``found``: rows ``(step, set id, data)`` in (step, uid) order, or ``(step,
        data)`` of the name set ``only``; ``order``: their (written, uid), needed only
        where a step has several rows."""
        self.sets = sets
        # set id -> (steps, write order (written, uid), data), in (step, uid) order
        self.rows: dict[int, tuple[list[int], Sequence[tuple[int, int]], Sequence[bytes]]] = {}
        self._values: dict[int, memoryview[float] | array[float]] = {}
        if not found:
            self.repeats = False
            return
        # Transposed in C; nearly always a single name set, kept as it came.
        if only is not None:
            steps, data = (list(c) for c in zip(*found, strict=True))
            set_ids = [only]
        else:
            steps, set_ids, data = (list(c) for c in zip(*found, strict=True))
        self.repeats = len(set(steps)) != len(steps)  # some step has several rows
        if order is None:
            order = [(0, 0)] * len(steps)
        if only is not None or set_ids.count(set_ids[0]) == len(set_ids):
            self.rows[set_ids[0]] = (steps, order, data)
            return
        parts: dict[int, tuple[list[int], list[tuple[int, int]], list[bytes]]] = {}
        for row in zip(steps, order, set_ids, data, strict=True):
            part = parts.get(row[2])
            if part is None:
                part = parts[row[2]] = ([], [], [])
            part[0].append(row[0])
            part[1].append(row[1])
            part[2].append(row[3])
        self.rows.update(parts)

    def columns(self, name: str) -> list[tuple[list[int], Sequence[tuple[int, int]], list[float]]]:
        """(steps, write order, values) of ``name`` from each name set holding it."""
        out = []
        for set_id, (steps, order, data) in self.rows.items():
            names = self.sets.get(set_id)
            index = names.get(name) if names else None
            if index is None:
                continue
            assert names is not None
            width = len(names)
            flat = self._values.get(set_id)
            if flat is None:
                # One buffer per name set; each field is then a strided slice, in C.
                flat = self._values[set_id] = named.decode_view(b"".join(map(bytes, data)))
            if len(flat) != width * len(steps):  # never expected: rows of another width
                values = [_at(named.decode(bytes(d)), index) for d in data]
            else:
                values = cast("list[float]", flat[index::width].tolist())
            out.append((steps, order, values))
        return out


def _at(values: list[float], index: int) -> float:
    return values[index] if index < len(values) else float("nan")


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
        of each step; ``memo`` shares the decoded rows between the fields of one query."""
        if sets is None:
            sets = self.name_sets(run_id, rank)
        span = memo.get((lo, hi))
        if span is None:
            span = memo[lo, hi] = self._packed_span(run_id, rank, lo, hi, sets)
        parts = span.columns(name)
        if len(parts) == 1 and not span.repeats:
            steps, _, values = parts[0]
            return steps, self._stored(values)  # the steps list is shared by the fields
        if not parts:
            return [], []
        # Several name sets, or a step sent again: the last written wins.
        latest: dict[int, tuple[tuple[int, int], Any]] = {}
        for steps, order, values in parts:
            for step, at, value in zip(steps, order, self._stored(values), strict=True):
                found = latest.get(step)
                if found is None or found[0] < at:
                    latest[step] = (at, value)
        ordered = sorted(latest)
        return ordered, [latest[step][1] for step in ordered]

    def named_extremes(
        self,
        run_id: str,
        rank: int,
        name: str,
        bounds: Sequence[tuple[int, int]],
        memo: dict[Any, Any],
        sets: dict[int, dict[str, int]] | None = None,
    ) -> list[tuple[int, Any]]:
        """(step, value) of the min and the max of each bucket (``bounds``: its first
        and last steps), as :meth:`bucket_extremes` answers them from SQL."""
        spans: list[list[int]] = []  # adjacent buckets are read as one range
        for start, end in sorted(bounds):
            if spans and start == spans[-1][1] + 1:
                spans[-1][1] = end
            else:
                spans.append([start, end])
        lows: list[tuple[int, Any]] = []
        highs: list[tuple[int, Any]] = []
        for start, end in spans:
            steps, values = self.named_points(run_id, rank, name, start, end, memo, sets)
            # The buckets' index ranges, found once per steps list (shared by the
            # fields of one name set); the entry holds the list, so its id stays its own.
            entry = memo.get(("cuts", id(steps), start, end))
            if entry is None or entry[0] is not steps:
                inside = [b for b in bounds if start <= b[0] and b[1] <= end]
                cuts = [(bisect_left(steps, a), bisect_right(steps, b)) for a, b in inside]
                entry = memo["cuts", id(steps), start, end] = (steps, cuts)
            found = bucket_extremes(steps, values, entry[1], self.value_key)
            lows.extend(found[0])
            highs.extend(found[1])
        return lows + highs

    def _packed_span(
        self, run_id: str, rank: int, lo: int, hi: int, sets: dict[int, dict[str, int]]
    ) -> PackedSpan:
        found = self.named_chunk_rows(run_id, rank, lo, hi)
        if len({r[0] for r in found}) == len(found):  # no step twice: no order needed
            return PackedSpan([r[:3] for r in found], sets)
        return PackedSpan([r[:3] for r in found], sets, [r[3:] for r in found])

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
