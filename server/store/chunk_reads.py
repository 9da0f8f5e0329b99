"""Reading the chunks every step record is stored in (store/chunks.py): the fields'
points, one module's per-step series, the records' notes, the named scalars.

A chunk is found on its ``(run_id, rank, step_lo)`` key: its steps lie within ``SPAN``
steps of ``step_lo``. Values come back as ints (int64 fields) or floats, NaN and the
infinities included, in either backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from operator import itemgetter
from typing import Any

import numpy as np

from ..columns import floats, ints
from ..downsample import pick_rows
from .chunks import INT_FIELDS, SCALAR_FIELDS, SPAN
from .tables import Database

# (steps, values): one value per step, in step order.
Points = tuple[list[int], list[Any]]


@lru_cache(maxsize=10_000)
def _positions(text: str) -> dict[str, int]:
    """name -> place of a chunk's ``fields`` (a JSON list), decoded once: they never
    change (the dict is shared: read it, never change it)."""
    return {name: i for i, name in enumerate(json.loads(text))}


class ChunkReads(Database):
    """Mixed into the stores' reads (store/history.py, store/reads.py)."""

    def _chunks(
        self, columns: str, table: str, key: tuple[Any, ...], lo: int, hi: int, where: str = ""
    ) -> list[tuple[Any, ...]]:
        """``columns`` of the chunks of one rank (``key``: run_id, rank, then the values
        ``where`` names) that may hold a step of ``lo..hi``."""
        return self.query(
            f"SELECT {columns} FROM {table} WHERE run_id = ? AND rank = ?{where}"  # noqa: S608
            " AND step_lo >= ? AND step_lo <= ? AND step_hi >= ? ORDER BY step_lo, uid",
            (*key, lo - SPAN + 1, hi, lo),
        )

    def field_points(
        self, run_id: str, rank: int, names: Sequence[str], lo: int, hi: int
    ) -> dict[str, Points]:
        """(steps, values) in ``lo..hi`` of each field of ``names`` that has some, each
        table's chunks read once for all, in step order, a step sent twice read from
        the record written last (a named field's as :meth:`named_matrix`)."""
        plain = [name for name in names if name in SCALAR_FIELDS]
        out = self._plain_points(run_id, rank, plain, lo, hi) if plain else {}
        if wanted := set(names).difference(plain):
            steps, found, values, present = self.named_matrix(
                run_id, rank, wanted.__contains__, lo, hi
            )
            for k, name in enumerate(found):
                held = present[:, k]
                out[name] = (np.array(steps)[held].tolist(), values[held, k].tolist())
        return out

    def _plain_points(
        self, run_id: str, rank: int, names: Sequence[str], lo: int, hi: int
    ) -> dict[str, Points]:
        found: dict[str, list[tuple[int, int, Any]]] = {name: [] for name in names}
        for step_lo, step_hi, uid, n, fields, steps, data in self._chunks(
            "step_lo, step_hi, uid, n, fields, steps, data", "step_chunks", (run_id, rank), lo, hi
        ):
            numbers = ints(bytes(steps))
            for name, at in _positions(fields).items():
                if name not in found:
                    continue
                raw = bytes(data[8 * n * at : 8 * n * (at + 1)])
                values: list[Any] = ints(raw) if name in INT_FIELDS else floats(raw)
                rows = zip(numbers, range(uid, uid + n), values, strict=True)
                if lo <= step_lo and step_hi <= hi:
                    found[name].extend(rows)
                else:
                    found[name].extend(p for p in rows if lo <= p[0] <= hi)
        out: dict[str, Points] = {}
        for name, points in found.items():
            if points:
                points.sort(key=itemgetter(0, 1))
                # a step sent twice (a resumed process of the run) reads as the record
                # written last, the highest uid, as a named field's does
                last = {step: value for step, _, value in points}
                out[name] = (list(last), list(last.values()))
        return out

    def chunk_steps(self, run_id: str, rank: int, lo: int, hi: int) -> list[int]:
        """The steps of the step records in ``lo..hi`` (a step sent twice, twice)."""
        rows = self._chunks("steps", "step_chunks", (run_id, rank), lo, hi)
        return [s for (steps,) in rows for s in ints(bytes(steps)) if lo <= s <= hi]

    def series_rows(
        self, run_id: str, rank: int, key: tuple[str, str, str], lo: int, hi: int, most: int
    ) -> tuple[int, list[tuple[int, int]], Iterator[bytes]]:
        """One module's series (``key``: family, module, series) in ``lo..hi``: how many
        steps hold it, (step, record uid) of at most ``most`` of them (evenly spaced:
        pick_rows) and their packed series, each read as it is iterated: the database
        cuts it out of its chunk, so a heatmap of 500 steps moves 500 series, not 500
        chunks. A step sent twice is read from its last chunk in (step_lo, uid) order."""
        where = " AND family = ? AND module = ? AND series = ?"
        places: dict[int, tuple[int, int, int]] = {}  # step -> (step_lo, uid, place)
        for step_lo, uid, steps in self._chunks(
            "step_lo, uid, steps", "series_chunks", (run_id, rank, *key), lo, hi, where
        ):
            for i, step in enumerate(ints(bytes(steps))):
                if lo <= step <= hi:
                    places[step] = (step_lo, uid, i)
        every = sorted(places)
        picked = [every[k] for k in pick_rows(len(every), most)]
        query = (
            "SELECT substr(data, CAST(? * 8 * len + 1 AS INTEGER), CAST(8 * len AS INTEGER))"  # noqa: S608
            f" FROM series_chunks WHERE run_id = ? AND rank = ?{where} AND step_lo = ? AND uid = ?"
        )

        def rows() -> Iterator[bytes]:
            for step in picked:
                step_lo, uid, i = places[step]
                ((data,),) = self.query(query, (i, run_id, rank, *key, step_lo, uid))
                yield bytes(data) if data else b""  # SQLite: NULL for a series of no values

        # A record's uid: its chunk's uid plus its place in the chunk.
        return len(every), [(s, places[s][1] + places[s][2]) for s in picked], rows()

    def notes(self, run_id: str, rank: int, lo: int, hi: int) -> dict[int, dict[str, Any]]:
        """The notes of the records in ``lo..hi`` that have some, by record uid."""
        out: dict[int, dict[str, Any]] = {}
        for uid, steps, text in self._chunks(
            "uid, steps, notes", "step_chunks", (run_id, rank), lo, hi, " AND notes IS NOT NULL"
        ):
            found = zip(ints(bytes(steps)), json.loads(text), strict=True)
            for i, (step, note) in enumerate(found):
                if note is not None and lo <= step <= hi:
                    out[uid + i] = note
        return out

    def named_matrix(
        self, run_id: str, rank: int, wanted: Callable[[str], bool], lo: int, hi: int
    ) -> tuple[list[int], list[str], Any, Any]:
        """(steps, names, values, present) of every named scalar that ``wanted`` picks in
        ``lo..hi``, each chunk read once: ``values[i, k]`` is name k at ``steps[i]`` where
        ``present[i, k]``, of the rows of that step that hold name k the one written last
        (``written``, then uid); names in the order first seen."""
        sets: dict[int, dict[str, int]] = {}  # set id -> name -> place
        for set_id, name, at in self.query(
            "SELECT m.set_id, s.name, m.position FROM series s JOIN rollup_members m"
            " ON m.series = s.id WHERE s.run_id = ? AND s.rank = ?",
            (run_id, rank),
        ):
            sets.setdefault(set_id, {})[name] = at
        picked: dict[int, tuple[Any, list[int]]] = {}  # set id -> (columns, places)
        columns: dict[str, int] = {}
        parts: list[tuple[tuple[int, int], Any, Any, Any]] = []
        for uid, written, set_id, steps, data in self._chunks(
            "uid, written, names, steps, data", "named_chunks", (run_id, rank), lo, hi
        ):
            names = sets.get(set_id) or {}
            found = picked.get(set_id)
            if found is None:
                mine = [(n, i) for n, i in names.items() if wanted(n)]
                places = np.array([columns.setdefault(n, len(columns)) for n, _ in mine], np.intp)
                found = picked[set_id] = (places, [i for _, i in mine])
            if len(found[0]):
                numbers = np.frombuffer(bytes(steps), "<i8")
                # In range, and of a step written twice in one chunk its later row.
                keep = (numbers >= lo) & (numbers <= hi)
                keep[:-1] &= numbers[1:] != numbers[:-1]
                rows = np.frombuffer(bytes(data), "<f8").reshape(len(numbers), len(names))
                parts.append(((written, uid), numbers[keep], found[0], rows[keep][:, found[1]]))
        every = np.unique(np.concatenate([p[1] for p in parts])) if parts else np.array([], int)
        values = np.zeros((len(every), len(columns)))
        present = np.zeros(values.shape, dtype=bool)
        for _, numbers, where, rows in sorted(parts, key=itemgetter(0)):  # the last written wins
            at = np.searchsorted(every, numbers)[:, None]
            values[at, where], present[at, where] = rows, True
        return every.tolist(), list(columns), values, present
