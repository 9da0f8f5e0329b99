"""The downsampled scalar history of a run: ``GET /api/runs/{id}/steps``.

Min/max per aligned bucket of steps, answered from the rollups written at ingest
(store/rollups.py) where a bucket is whole, and from the chunks (store/chunk_reads.py)
where it is cut by ``from``/``to``, still open, or finer than the smallest rollup.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from gradwatch.protocol.codec import protocol_number
from gradwatch.protocol.column_shapes import PROFILE_KEYS

from ..downsample import bucket_width
from . import rollups
from .chunks import SCALAR_FIELDS
from .reads import Reads

_FIELDS_EXPECTED = (
    f"fields: expected {', '.join(SCALAR_FIELDS)}, param_norms/<param>,"
    f" update_ratios/<param>, gate_norms/<param>/<gate> or"
    f" profile/<module>/<{'|'.join(PROFILE_KEYS)}>"
)


class HistoryReads(Reads):
    """The ``steps`` query and its buckets, over the other reads (store/reads.py);
    mixed into :class:`gradwatch.server.store.base.Store`."""

    def scalar_fields(self, run_id: str) -> list[str]:
        """Every scalar field name the steps endpoint answers by default for this run
        (``update_ratios/<param>`` only when asked: /update_ratios sums them up)."""
        keys = self.run_keys(run_id)
        present = {key for key, _ in keys.get("scalar", [])}
        return [
            *(name for name in SCALAR_FIELDS if name in present),
            *(f"gate_norms/{key}/{sub}" for key, sub in keys.get("gate_norms", [])),
            *(f"param_norms/{key}" for key, _ in keys.get("param_norms", [])),
            *(f"profile/{key}/{p}" for key, _ in keys.get("profile", []) for p in PROFILE_KEYS),
        ]

    @staticmethod
    def _check_field(name: str) -> None:
        """ValueError "expected ..., got ..." for a name that is not a field."""
        family, _, rest = name.partition("/")
        if not (
            name in SCALAR_FIELDS
            or (family in ("param_norms", "update_ratios") and rest)
            or (family == "gate_norms" and "/" in rest)
            or (family == "profile" and rest.rpartition("/")[2] in PROFILE_KEYS)
        ):
            raise ValueError(f"{_FIELDS_EXPECTED}, got {name!r}")

    def steps(
        self,
        run_id: str,
        rank: int = 0,
        start: int | None = None,
        stop: int | None = None,
        fields: Sequence[str] | None = None,
        max_points: int = 2000,
        max_values: int | None = None,
    ) -> dict[str, Any]:
        """Downsampled scalar series of one rank (docs/API.md ``/steps``): up to
        ``max_points`` rows as they are; beyond that each bucket's min and max, from
        the rollups (a 1e6-step run reads ~1,000 rollup rows per field) where whole.
        ``max_values`` bounds fields x ``max_points``: fields named beyond it are a
        ValueError; the run's own fields (``fields`` None, what the run view asks for)
        get fewer points each instead, at least 2 (the answer's ``max_points``)."""
        if max_points < 2:
            raise ValueError(f"max_points: expected at least 2, got {max_points}")
        self.run_summary(run_id)  # 404 before any work
        names = list(fields) if fields else self.scalar_fields(run_id)
        if max_values is not None and len(names) * max_points > max_values:
            if fields:
                raise ValueError(
                    f"expected fields x max_points of at most {max_values:,} values per "
                    f"answer, got {len(names)} x {max_points:,}; ask for fewer fields or "
                    "points"
                )
            max_points = max(2, max_values // len(names))
        for name in names:
            self._check_field(name)
        lo = 0 if start is None else start
        hi = 2**62 if stop is None else stop
        query = "SELECT name, id FROM series WHERE run_id = ? AND rank = ?"
        ids = {str(name): int(ident) for name, ident in self.query(query, (run_id, rank))}
        total, first, last = self._count(run_id, rank, ids.get(rollups.STEP_SERIES), lo, hi)
        stored = {name: ids[name] for name in names if name in ids}
        downsampled = total > max_points
        if downsampled:
            width = bucket_width(int(first), int(last), max_points // 2)
            read = self._bucketed(run_id, rank, stored, lo, min(hi, int(last)), int(first), width)
        else:
            points = self.field_points(run_id, rank, list(stored), lo, hi)
            read = {name: list(zip(*found, strict=True)) for name, found in points.items()}
        out: dict[str, Any] = {}
        for name in names:
            found = read.get(name, [])
            if name.startswith("profile/") and name.endswith("/calls"):
                # Named rows and their rollups hold counts as float64 (int fields come
                # back as ints: their chunk columns and rollup rows are int64).
                found = [(s, int(v) if v.is_integer() else v) for s, v in found]
            values = [protocol_number(value) for _, value in found]
            out[name] = {"step": [step for step, _ in found], "value": values}
        return {
            "rank": rank,
            "from": start,
            "to": stop,
            "total": total,
            "downsampled": downsampled,
            "max_points": max_points,
            "fields": out,
        }

    def _count(
        self, run_id: str, rank: int, series: int | None, lo: int, hi: int
    ) -> tuple[int, Any, Any]:
        """(count, first, last) of the steps in ``lo..hi`` from the rollups of the step
        numbers (``series``: their id; None: no step stored) and the chunks at the ends."""
        if series is None:
            return 0, None, None
        blocks, rest = rollups.cover(lo, hi)
        parts = [
            self.query(rollups.STEP_COUNT, (series, level, first, last))[0]
            for level, first, last in blocks
        ]
        ends = [self.chunk_steps(run_id, rank, a, b) for a, b in rest]
        parts.extend((len(steps), min(steps), max(steps)) for steps in ends if steps)
        firsts = [p[1] for p in parts if p[1] is not None]
        lasts = [p[2] for p in parts if p[2] is not None]
        count = sum(int(p[0] or 0) for p in parts)
        return count, min(firsts, default=None), max(lasts, default=None)

    def extremes(
        self,
        run_id: str,
        rank: int,
        names: Sequence[str],
        width: int,
        bounds: list[tuple[int, int]],
    ) -> dict[str, list[tuple[int, Any]]]:
        """(step, value) of the min and the max of each bucket of ``width`` steps (a power
        of two) that ``bounds`` name (its first and last steps to read) for each field,
        from the chunks (adjacent buckets read as one range), as the rollups answer."""
        spans: list[list[int]] = []
        for start, end in sorted(bounds):
            if spans and start == spans[-1][1] + 1:
                spans[-1][1] = end
            else:
                spans.append([start, end])
        read = [self.field_points(run_id, rank, names, start, end) for start, end in spans]
        out: dict[str, list[tuple[int, Any]]] = {}
        for name in names:
            parts = [part[name] for part in read if name in part]
            steps = np.fromiter(chain.from_iterable(p for p, _ in parts), np.int64)
            values = np.array([v for _, p in parts for v in p])  # all ints, or all floats
            records = np.empty(len(values), rollups.ROW_DTYPES[values.dtype.kind])
            records["ls"] = records["hs"] = steps
            records["lv"] = records["hv"] = values
            out[name] = rollups.extremes(steps // width, records, self.kind)
        return out

    def _bucketed(
        self,
        run_id: str,
        rank: int,
        series: dict[str, int],
        lo: int,
        hi: int,
        first: int,
        width: int,
    ) -> dict[str, list[tuple[int, Any]]]:
        """(step, value) of each bucket's min and max, in step order, of each field
        (``series``: its id) for the steps ``lo..hi`` (``first`` the first one stored):
        whole buckets from the rollups, the rest (cut by the range's ends, or finer than
        every level) from the chunks, read once for every field."""
        buckets = range(first // width, hi // width + 1)
        # The coarsest level whose blocks tile a bucket; None: buckets finer than every one.
        level = max((lv for lv in rollups.LEVELS if 1 << lv <= width), default=None)
        whole = [b for b in buckets if b * width >= lo and b * width + width - 1 <= hi]
        inner = whole if level is not None else []
        raw = [b for b in buckets if not inner or b < inner[0] or b > inner[-1]]
        bounds = [(max(b * width, lo), min(b * width + width - 1, hi)) for b in raw]
        found = self.extremes(run_id, rank, list(series), width, bounds) if raw else {}
        out: dict[str, list[tuple[int, Any]]] = {}
        for name, ident in series.items():
            points = dict(found.get(name, []))
            if inner and level is not None:
                shift = (width.bit_length() - 1) - level
                span = (ident, level, inner[0] << shift, ((inner[-1] + 1) << shift) - 1)
                rows = self.query(rollups.SERIES_ROWS, span)
                points.update(rollups.bucket_extremes(rows, shift, self.kind))
            out[name] = sorted(points.items())
        return out
