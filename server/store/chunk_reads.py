"""Reading the chunks every step record is stored in (store/chunks.py).

The points of a plain field, the step count of a range, one module's per-step
series and the records' notes (``timestep_layout``, ``nonfinite``); the named scalars
are read by store/named_reads.py. A chunk is found on its ``(run_id, rank, step_lo)``
key: its steps lie within ``SPAN`` steps of ``step_lo``. Values come back as the
backend stores the same numbers sent as JSON (SQLite: the strings ``"NaN"``/
``"Infinity"``), so they order and compare as the rollups do.

Example (any store):
    >>> store.chunk_points("run", 0, 0, 99, "loss")  # doctest: +SKIP
    [(0, 1, 0.5), (1, 2, 0.25)]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..columns import floats, ints
from .chunks import INT_FIELDS, SPAN, stored_floats

_RANGE = "step_lo >= ? AND step_lo <= ? AND step_hi >= ? ORDER BY step_lo, uid"


class ChunkReads:
    """Mixed into the stores' reads; the backend supplies ``query`` and ``scalar_in``."""

    def query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def scalar_in(self, value: Any) -> Any:
        raise NotImplementedError

    def _chunks(
        self, columns: str, table: str, where: str, params: tuple[Any, ...], lo: int, hi: int
    ) -> list[tuple[Any, ...]]:
        return self.query(
            f"SELECT {columns} FROM {table} WHERE {where} AND {_RANGE}",  # noqa: S608
            (*params, lo - SPAN + 1, hi, lo),
        )

    def _fields(self, text: str) -> dict[str, int]:
        cache: dict[str, dict[str, int]] = self.__dict__.setdefault("_chunk_fields", {})
        found = cache.get(text)
        if found is None:
            if len(cache) > 1000:
                cache.clear()
            found = cache[text] = {name: i for i, name in enumerate(json.loads(text))}
        return found

    def chunk_points(
        self, run_id: str, rank: int, lo: int, hi: int, field: str
    ) -> list[tuple[int, int, Any]]:
        """(step, uid, stored value) of a plain field in ``lo..hi``, in (step, uid) order."""
        out: list[tuple[int, int, Any]] = []
        for step_lo, step_hi, uid, n, fields, steps, data in self._chunks(
            "step_lo, step_hi, uid, n, fields, steps, data",
            "step_chunks",
            "run_id = ? AND rank = ?",
            (run_id, rank),
            lo,
            hi,
        ):
            at = self._fields(fields).get(field)
            if at is None:
                continue
            raw = bytes(data[8 * n * at : 8 * n * (at + 1)])
            if field in INT_FIELDS:
                values: list[Any] = ints(raw)
            else:
                values = stored_floats(floats(raw), self.scalar_in)
            numbers = ints(bytes(steps))
            if lo <= step_lo and step_hi <= hi:
                out.extend(zip(numbers, range(uid, uid + n), values, strict=True))
            else:
                out.extend(
                    (s, uid + i, v)
                    for i, (s, v) in enumerate(zip(numbers, values, strict=True))
                    if lo <= s <= hi
                )
        out.sort(key=lambda p: (p[0], p[1]))
        return out

    def chunk_count(self, run_id: str, rank: int, lo: int, hi: int) -> tuple[int, Any, Any]:
        """(count, first, last) of the chunked steps in ``lo..hi``."""
        count, first, last = 0, None, None
        for step_lo, step_hi, n, steps in self._chunks(
            "step_lo, step_hi, n, steps",
            "step_chunks",
            "run_id = ? AND rank = ?",
            (run_id, rank),
            lo,
            hi,
        ):
            if lo <= step_lo and step_hi <= hi:
                inside = [step_lo, step_hi]
                count += n
            else:
                inside = [s for s in ints(bytes(steps)) if lo <= s <= hi]
                count += len(inside)
            if inside:
                first = inside[0] if first is None else min(first, inside[0])
                last = inside[-1] if last is None else max(last, inside[-1])
        return count, first, last

    def series_steps(
        self, family: str, run_id: str, module: str, series: str, rank: int, lo: int, hi: int
    ) -> dict[int, tuple[int, int, int]]:
        """Each step of one module's series in ``lo..hi``: step -> (the chunk's step_lo,
        its uid, the step's place in it); the series are not read. A step sent twice
        is read from its last chunk in (step_lo, uid) order."""
        out: dict[int, tuple[int, int, int]] = {}
        for step_lo, uid, steps in self._chunks(
            "step_lo, uid, steps",
            "series_chunks",
            "run_id = ? AND family = ? AND module = ? AND series = ? AND rank = ?",
            (run_id, family, module, series, rank),
            lo,
            hi,
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
        """The notes of the records in ``lo..hi`` that have some (store/records.py), by
        record uid."""
        out: dict[int, dict[str, Any]] = {}
        for uid, steps, text in self._chunks(
            "uid, steps, notes",
            "step_chunks",
            "run_id = ? AND rank = ? AND notes IS NOT NULL",
            (run_id, rank),
            lo,
            hi,
        ):
            found = zip(ints(bytes(steps)), json.loads(text), strict=True)
            for i, (step, note) in enumerate(found):
                if note is not None and lo <= step <= hi:
                    out[uid + i] = note
        return out


def combined_counts(parts: Sequence[tuple[Any, Any, Any]]) -> tuple[int, Any, Any]:
    """(count, first, last) of several (count, first, last), None where empty."""
    firsts = [p[1] for p in parts if p[1] is not None]
    lasts = [p[2] for p in parts if p[2] is not None]
    return (
        sum(int(p[0] or 0) for p in parts),
        min(firsts) if firsts else None,
        max(lasts) if lasts else None,
    )
