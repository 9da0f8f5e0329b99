"""Reading the chunks every step record is stored in (store/chunks.py): a plain
field's points, one module's per-step series, the records' notes, the named scalars.

A chunk is found on its ``(run_id, rank, step_lo)`` key: its steps lie within ``SPAN``
steps of ``step_lo``. Values come back as ints (int64 fields) or floats, NaN and the
infinities included, in either backend.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..columns import floats, ints
from .chunks import INT_FIELDS, SPAN
from .tables import Database

# (steps, values): one value per step, in step order.
Points = tuple[list[int], list[Any]]
# A named chunk as read: (written, uid, set id, steps, its values as float64).
Chunk = tuple[int, int, int, list[int], Any]


class ChunkReads(Database):
    """Mixed into the stores' reads (store/history.py, store/reads.py)."""

    def _chunks(
        self, columns: str, table: str, run_id: str, rank: int, lo: int, hi: int,
        where: str = "", params: tuple[Any, ...] = (),
    ) -> list[tuple[Any, ...]]:
        """``columns`` of the chunks of one rank that may hold a step of ``lo..hi``."""
        return self.query(
            f"SELECT {columns} FROM {table} WHERE run_id = ? AND rank = ?{where}"  # noqa: S608
            " AND step_lo >= ? AND step_lo <= ? AND step_hi >= ? ORDER BY step_lo, uid",
            (run_id, rank, *params, lo - SPAN + 1, hi, lo),
        )

    def _positions(self, text: str) -> dict[str, int]:
        """name -> place of a JSON list of names (a chunk's fields, a name set), decoded
        once: they never change."""
        cache: dict[str, dict[str, int]] = self.__dict__.setdefault("_positions_of", {})
        found = cache.get(text)
        if found is None:
            if len(cache) > 10_000:
                cache.clear()
            found = cache[text] = {name: i for i, name in enumerate(json.loads(text))}
        return found

    def chunk_points(self, run_id: str, rank: int, field: str, lo: int, hi: int) -> Points:
        """(steps, values) of a plain field in ``lo..hi``, in (step, uid) order:
        both rows of a step sent twice are kept."""
        out: list[tuple[int, int, Any]] = []
        for step_lo, step_hi, uid, n, fields, steps, data in self._chunks(
            "step_lo, step_hi, uid, n, fields, steps, data", "step_chunks", run_id, rank, lo, hi
        ):
            at = self._positions(fields).get(field)
            if at is None:
                continue
            raw = bytes(data[8 * n * at : 8 * n * (at + 1)])
            values: list[Any] = ints(raw) if field in INT_FIELDS else floats(raw)
            found = zip(ints(bytes(steps)), range(uid, uid + n), values, strict=True)
            if lo <= step_lo and step_hi <= hi:
                out.extend(found)
            else:
                out.extend(p for p in found if lo <= p[0] <= hi)
        out.sort(key=lambda p: (p[0], p[1]))
        return [p[0] for p in out], [p[2] for p in out]

    def chunk_steps(self, run_id: str, rank: int, lo: int, hi: int) -> list[int]:
        """The steps of the step records in ``lo..hi`` (a step sent twice, twice)."""
        rows = self._chunks("steps", "step_chunks", run_id, rank, lo, hi)
        return [s for (steps,) in rows for s in ints(bytes(steps)) if lo <= s <= hi]

    def series_steps(
        self, family: str, run_id: str, module: str, series: str, rank: int, lo: int, hi: int
    ) -> dict[int, tuple[int, int, int]]:
        """Each step of one module's series in ``lo..hi``: step -> (the chunk's step_lo,
        its uid, the step's place in it); the series are not read. A step sent twice
        is read from its last chunk in (step_lo, uid) order."""
        out: dict[int, tuple[int, int, int]] = {}
        for step_lo, uid, steps in self._chunks(
            "step_lo, uid, steps", "series_chunks", run_id, rank, lo, hi,
            " AND family = ? AND module = ? AND series = ?", (family, module, series),
        ):
            for i, step in enumerate(ints(bytes(steps))):
                if lo <= step <= hi:
                    out[step] = (step_lo, uid, i)
        return out

    def series_row(
        self, family: str, run_id: str, module: str, series: str, rank: int,
        where: tuple[int, int, int],
    ) -> bytes:
        """One step's packed series from its chunk (``where`` from series_steps); the
        database cuts it out, so a heatmap of 500 steps moves 500 series, not 500
        chunks."""
        step_lo, uid, i = where
        ((data,),) = self.query(
            "SELECT substr(data, CAST(? * 8 * len + 1 AS INTEGER), CAST(8 * len AS INTEGER))"
            " FROM series_chunks WHERE run_id = ? AND family = ? AND module = ?"
            " AND series = ? AND rank = ? AND step_lo = ? AND uid = ?",
            (i, run_id, family, module, series, rank, step_lo, uid),
        )
        return bytes(data) if data else b""  # SQLite: NULL for a series of no values

    def notes(self, run_id: str, rank: int, lo: int, hi: int) -> dict[int, dict[str, Any]]:
        """The notes of the records in ``lo..hi`` that have some, by record uid."""
        out: dict[int, dict[str, Any]] = {}
        for uid, steps, text in self._chunks(
            "uid, steps, notes", "step_chunks", run_id, rank, lo, hi, " AND notes IS NOT NULL"
        ):
            found = zip(ints(bytes(steps)), json.loads(text), strict=True)
            for i, (step, note) in enumerate(found):
                if note is not None and lo <= step <= hi:
                    out[uid + i] = note
        return out

    def name_sets(self, run_id: str, rank: int) -> dict[int, dict[str, int]]:
        """Each name set of a run and rank: id -> {name: index in its rows}."""
        return {
            set_id: self._positions(text)
            for set_id, text in self.query(
                "SELECT id, names FROM named_sets WHERE run_id = ? AND rank = ?", (run_id, rank)
            )
        }

    def _named_chunks(self, run_id: str, rank: int, lo: int, hi: int) -> list[Chunk]:
        """The named chunks of one rank that may hold a step of ``lo..hi``."""
        return [
            (written, uid, set_id, ints(bytes(steps)), np.frombuffer(bytes(data), "<f8"))
            for uid, written, set_id, steps, data in self._chunks(
                "uid, written, names, steps, data", "named_chunks", run_id, rank, lo, hi
            )
        ]

    def named_points(
        self, run_id: str, rank: int, name: str, lo: int, hi: int, memo: dict[Any, Any]
    ) -> Points:
        """(steps, values) of a named field in ``lo..hi``: the last row written
        of each step. ``memo`` shares the chunks (float64 arrays) and each set of
        chunks' steps between the fields of one query; a field's values are one strided
        slice per chunk."""
        sets = memo.get("sets")
        if sets is None:
            sets = memo["sets"] = self.name_sets(run_id, rank)
        chunks: list[Chunk] | None = memo.get((lo, hi))
        if chunks is None:
            chunks = memo[lo, hi] = self._named_chunks(run_id, rank, lo, hi)
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
            values.extend(cast("list[float]", chunks[i][4][names[name] :: len(names)].tolist()))
        steps, picks = layout
        if picks is not None:
            values = [values[p] for p in picks]
        # The steps list is shared by the fields of a name set.
        return steps, values


    def named_matrix(
        self, run_id: str, rank: int, prefix: str, lo: int, hi: int
    ) -> tuple[list[int], list[str], Any, Any]:
        """(steps, names, values, present) of every named scalar starting with ``prefix``
        in ``lo..hi``, each chunk read once (``/update_ratios``: hundreds of fields,
        which :meth:`named_points` would read every chunk for): ``values[i, k]`` is
        name k at ``steps[i]`` where ``present[i, k]``; names in the order first seen."""
        sets = self.name_sets(run_id, rank)
        wanted: dict[int, tuple[list[int], list[int]]] = {}  # set id -> (columns, places)
        columns: dict[str, int] = {}
        chunks: list[Chunk] = []
        parts: list[tuple[list[int], Any]] = []
        for chunk in self._named_chunks(run_id, rank, lo, hi):
            names = sets.get(chunk[2]) or {}
            found = wanted.get(chunk[2])
            if found is None:
                mine = [(n, i) for n, i in names.items() if n.startswith(prefix)]
                places = [columns.setdefault(n, len(columns)) for n, _ in mine]
                found = wanted[chunk[2]] = (places, [i for _, i in mine])
            if found[0]:
                chunks.append(chunk)
                rows = chunk[4].reshape(len(chunk[3]), len(names))
                parts.append((found[0], rows[:, found[1]]))
        steps, picks = steps_layout(chunks, lo, hi)
        values = np.zeros((sum(len(c[3]) for c in chunks), len(columns)))
        present = np.zeros(values.shape, dtype=bool)
        row = 0
        for where, rows in parts:
            values[row : row + len(rows), where] = rows
            present[row : row + len(rows), where] = True
            row += len(rows)
        if picks is not None:
            values, present = values[picks], present[picks]
        return steps, list(columns), values, present

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
