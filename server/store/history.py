"""The downsampled scalar history of a run: ``GET /api/runs/{id}/steps``.

Min/max per aligned bucket of steps, answered from the rollups written at ingest
(``rollups.py``) where a bucket is whole, and from the step rows where it is cut by
``from``/``to``, still open, finer than the smallest rollup, or older than the
rollups. Mixed into :class:`gradwatch.server.store.reads.Reads`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..downsample import bucket_width
from . import rollups, rows, set_rollups
from .chunk_reads import combined_counts, merged_points
from .named_reads import NamedReads, bucket_extremes

_PARAM_FAMILIES = ("param_norms", "gate_norms", "profile")
PROFILE_KEYS = ("forward_s", "backward_s", "calls")


class HistoryReads(NamedReads):
    """The ``steps`` query and its buckets; the backend supplies ``query``/``sql``.

    Named fields are read from their packed rows (:class:`NamedReads`)."""

    # How this backend orders stored values (min/max); PostgreSQL has its own.
    value_key = staticmethod(rollups.sqlite_key)
    _rollups_from: float | None = None

    def reader(self) -> Any:
        raise NotImplementedError

    def sql(self, text: str) -> str:
        raise NotImplementedError

    def scalar_fields(self, run_id: str) -> list[str]:
        raise NotImplementedError

    def run_summary(self, run_id: str) -> dict[str, Any]:
        raise NotImplementedError

    # ----- series ------------------------------------------------------------------
    def bucket_extremes(
        self,
        table: str,
        where: str,
        params: Sequence[Any],
        expr: str,
        bounds: Sequence[tuple[int, int]],
    ) -> list[tuple[int, Any]]:
        """(step, value) of the min and the max of ``expr`` in each bucket: ``bounds``
        are the buckets' first and last steps, inside the range of ``params``.

        SQLite: an aggregate query with one ``min()``/``max()`` takes its bare columns
        from the row holding that extreme, so ``step`` is the extreme's own step. Text
        ranks above numbers, so the ``"NaN"``/``"Infinity"`` strings win every ``max``.
        """
        # One small range query per bucket and extreme, all on one connection: SQLite
        # walks each step range in its clustered key, where a single GROUP BY over the
        # whole range sorted 1e6 rows into a temporary B-tree (measured ~2.5x slower).
        # ``where`` ends with "step >= ? AND step <= ?", its last two parameters.
        head = tuple(params[:-2])
        conn = self.reader()
        found: list[tuple[int, Any]] = []
        try:
            cur = conn.cursor()
            for fn in ("min", "max"):
                sql = self.sql(
                    f"SELECT step, {fn}({expr}) FROM {table} WHERE {where}"  # noqa: S608
                    f" AND {expr} IS NOT NULL"
                )
                for start, end in bounds:
                    cur.execute(sql, (*head, start, end))
                    row = cur.fetchone()
                    if row is not None and row[1] is not None:
                        found.append((row[0], row[1]))
        finally:
            conn.rollback()
        return found

    def _field_sql(self, name: str) -> str | None:
        """The ``steps`` column of a plain field, None for a named one (packed rows);
        ValueError "expected ..., got ..." for a name that is not a field."""
        if name in rows.SCALAR_FIELDS:
            return name
        family, _, rest = name.partition("/")
        if (
            (family == "param_norms" and rest)
            or (family == "gate_norms" and "/" in rest)
            or (family == "profile" and rest.rpartition("/")[2] in PROFILE_KEYS)
        ):
            return None
        raise ValueError(
            "fields: expected loss, duration_s, total_norm, graph_nodes, rss_bytes,"
            " cuda_allocated_bytes, cuda_reserved_bytes, overhead, param_norms/<param>,"
            " gate_norms/<param>/<gate> or profile/<module>/<forward_s|backward_s|calls>,"
            f" got {name!r}"
        )

    def steps(
        self,
        run_id: str,
        rank: int = 0,
        start: int | None = None,
        stop: int | None = None,
        fields: Sequence[str] | None = None,
        max_points: int = 2000,
    ) -> dict[str, Any]:
        """Downsampled scalar series of one rank (docs/API.md ``/steps``).

        Up to ``max_points`` rows come back as they are; beyond that each bucket's min
        and max (aligned buckets of a power-of-two width, downsample.bucket_width) come
        from the rollups kept at ingest (store/rollups.py), so a 1e6-step run reads
        ~1,000 rollup rows per field; only a bucket cut by ``from``/``to``, buckets
        finer than the finest rollup, and runs older than the rollups read step rows.
        """
        if max_points < 2:
            raise ValueError(f"max_points: expected at least 2, got {max_points}")
        started = self.run_summary(run_id)["started"]  # 404 before any work
        names = list(fields) if fields else self.scalar_fields(run_id)
        columns = {name: self._field_sql(name) for name in names}
        lo = 0 if start is None else start
        hi = 2**62 if stop is None else stop
        where = "run_id = ? AND rank = ? AND step >= ? AND step <= ?"
        params = (run_id, rank, lo, hi)
        rolled = self._rolled(started)
        counted = self._rollup_count(run_id, rank, lo, hi) if rolled else None
        if counted is None:
            ((total, first, last),) = self.query(
                f"SELECT COUNT(*), MIN(step), MAX(step) FROM steps WHERE {where}",  # noqa: S608
                params,
            )
            total, first, last = combined_counts([(total, first, last), self.chunk_count(*params)])
        else:
            total, first, last = counted
        total = int(total)
        out: dict[str, Any] = {}
        downsampled = total > max_points
        width = bucket_width(int(first), int(last), max_points // 2) if downsampled else 1
        level = rollups.level_for(width) if downsampled and rolled else None
        sets: dict[int, dict[str, int]] | None = None
        memo: dict[Any, Any] = {}  # packed rows read once for all the named fields
        for name, column in columns.items():
            args: tuple[Any, ...]
            series: int | None = None
            if column is None or level is not None:
                found_id = self.query(
                    "SELECT id FROM series WHERE run_id = ? AND rank = ? AND name = ?",
                    (run_id, rank, name),
                )
                series = found_id[0][0] if found_id else None
            if column is None:
                if series is None:
                    out[name] = {"step": [], "value": []}
                    continue
                if sets is None:
                    sets = self.name_sets(run_id, rank)
            found: Sequence[tuple[Any, ...]]
            if column is None and sets:
                found = self._named_field(
                    run_id,
                    rank,
                    name,
                    series,
                    started,
                    sets,
                    memo,
                    lo,
                    hi,
                    (int(first), int(last), width, level) if downsampled else None,
                )
            else:
                if column is None:  # a run written before the packed rows
                    table, sql = "scalars", "value"
                    clause = "series = ? AND step >= ? AND step <= ?"
                    args = (series, lo, hi)
                else:
                    table, sql, clause, args = "steps", column, where, params
                if not downsampled and table == "steps":
                    found = merged_points(
                        self.query(
                            f"SELECT step, uid, {sql} FROM steps WHERE {clause}"  # noqa: S608
                            f" AND {sql} IS NOT NULL ORDER BY step, uid",
                            args,
                        ),
                        self.chunk_points(run_id, rank, lo, hi, name),
                    )
                elif not downsampled:
                    found = self.query(
                        f"SELECT step, {sql} FROM {table} WHERE {clause}"  # noqa: S608
                        f" AND {sql} IS NOT NULL ORDER BY step",
                        args,
                    )
                else:
                    bounded = (*args[:-1], min(hi, int(last)))
                    raw = partial(self.bucket_extremes, table, clause, bounded, sql)
                    if table == "steps":
                        raw = partial(self._plain_extremes, run_id, rank, name, raw)
                    found = self._bucketed(
                        lo, min(hi, int(last)), int(first), width, level, series, raw
                    )
            if name in rows.INTEGER_FIELDS or _is_count(name):
                # PostgreSQL rollups hold them as float8, packed rows hold float64.
                found = [(s, _integral(v)) for s, v in found]
            out[name] = {"step": [r[0] for r in found], "value": [_number(r[1]) for r in found]}
        return {
            "rank": rank,
            "from": start,
            "to": stop,
            "total": total,
            "downsampled": downsampled,
            "fields": out,
        }

    def _stored_scalar(self, value: float) -> Any:
        """A non-finite float of a set's rollup row as this backend stores it."""
        return self.scalar_in(rows.scalar_out(value))

    def _rolled(self, started: Any) -> bool:
        """Whether a run started when this database already kept rollups."""
        if self._rollups_from is None:
            found = self.query("SELECT value FROM meta WHERE key = 'rollups_from'")
            self._rollups_from = float(found[0][0]) if found else float("inf")
        return started is not None and float(started) >= self._rollups_from

    def _rollup_count(
        self, run_id: str, rank: int, lo: int, hi: int
    ) -> tuple[int, Any, Any] | None:
        """(count, first, last) of the steps in ``lo..hi`` from the step numbers' rollups
        (whole blocks) and the rows at the ends; None when the rank has no rollups."""
        found = self.query(
            "SELECT id FROM series WHERE run_id = ? AND rank = ? AND name = ?",
            (run_id, rank, rollups.STEP_SERIES),
        )
        if not found:
            return None
        blocks, rest = rollups.cover(lo, hi)
        parts = [
            self.query(text, (found[0][0], level, first, last))[0]
            for level, first, last in blocks
            # Per series and per set of series (store/set_rollups.py).
            for text in (
                "SELECT SUM(n), MIN(min_step), MAX(max_step) FROM rollups"
                " WHERE series = ? AND level = ? AND block >= ? AND block <= ?",
                set_rollups.STEP_COUNT,
            )
        ]
        for a, b in rest:
            parts.append(
                self.query(
                    "SELECT COUNT(*), MIN(step), MAX(step) FROM steps"
                    " WHERE run_id = ? AND rank = ? AND step >= ? AND step <= ?",
                    (run_id, rank, a, b),
                )[0]
            )
            parts.append(self.chunk_count(run_id, rank, a, b))
        return combined_counts(parts)

    def _plain_extremes(
        self,
        run_id: str,
        rank: int,
        name: str,
        from_rows: Callable[[Sequence[tuple[int, int]]], list[tuple[int, Any]]],
        bounds: Sequence[tuple[int, int]],
    ) -> list[tuple[int, Any]]:
        """Each bucket's min and max of a plain field: from SQL over the rows where no
        chunk holds steps of the buckets, else in Python over rows and chunks alike."""
        lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
        chunked = self.chunk_points(run_id, rank, lo, hi, name)
        if not chunked:
            return from_rows(bounds)
        points = self.query(
            f"SELECT step, uid, {name} FROM steps WHERE run_id = ? AND rank = ?"  # noqa: S608
            f" AND step >= ? AND step <= ? AND {name} IS NOT NULL ORDER BY step, uid",
            (run_id, rank, lo, hi),
        )
        steps, values = (list(c) for c in zip(*merged_points(points, chunked), strict=True))
        cuts = [(bisect_left(steps, a), bisect_right(steps, b)) for a, b in bounds]
        lows, highs = bucket_extremes(steps, values, cuts, self.value_key)
        return lows + highs

    def _named_field(
        self,
        run_id: str,
        rank: int,
        name: str,
        series: int | None,
        started: Any,
        sets: dict[int, dict[str, int]],
        memo: dict[Any, Any],
        lo: int,
        hi: int,
        buckets: tuple[int, int, int, int | None] | None,
    ) -> list[tuple[int, Any]]:
        """A named field from its packed rows: every point of ``lo..hi``, or with
        ``buckets`` (first, last, width, level) each bucket's min and max."""
        if buckets is None:
            steps, values = self.named_points(
                run_id, rank, name, lo, hi, memo, sets, series, started
            )
            return list(zip(steps, values, strict=True))
        first, last, width, level = buckets
        return self._bucketed(
            lo,
            min(hi, last),
            first,
            width,
            level,
            series,
            lambda bounds: self.named_extremes(
                run_id, rank, name, bounds, memo, sets, series, started
            ),
        )

    def _bucketed(
        self,
        lo: int,
        hi: int,
        first: int,
        width: int,
        level: int | None,
        series: int | None,
        raw_extremes: Callable[[Sequence[tuple[int, int]]], list[tuple[int, Any]]],
    ) -> list[tuple[int, Any]]:
        """(step, value) of each bucket's min and max, in step order, for the steps
        ``lo..hi`` (``first`` the first one stored); ``raw_extremes`` answers the
        buckets that the rollups do not (from the rows)."""
        buckets = range(first // width, hi // width + 1)
        raw = list(buckets)
        found: dict[int, Any] = {}
        if level is not None and series is not None:
            # Buckets cut by the range's ends mix steps inside and outside it: only
            # those read step rows; the rest are whole rollup blocks.
            inner = [b for b in buckets if b * width >= lo and b * width + width - 1 <= hi]
            raw = [b for b in buckets if not inner or b < inner[0] or b > inner[-1]]
            if inner:
                shift = (width.bit_length() - 1) - level
                span = (series, level, inner[0] << shift, ((inner[-1] + 1) << shift) - 1)
                merged = rollups.merge_buckets(
                    [
                        *self.query(
                            "SELECT block, min_step, min_v, max_step, max_v FROM rollups"
                            " WHERE series = ? AND level = ? AND block >= ? AND block <= ?",
                            span,
                        ),
                        *(
                            (block, *set_rollups.series_at(data, at, kind, self._stored_scalar))
                            for at, kind, block, data in self.query(set_rollups.SERIES_ROWS, span)
                        ),
                    ],
                    shift,
                    self.value_key,
                )
                for lo_step, lo_v, hi_step, hi_v in merged.values():
                    found[lo_step] = lo_v
                    found[hi_step] = hi_v
        if raw:
            bounds = [(max(b * width, lo), min(b * width + width - 1, hi)) for b in raw]
            found.update(raw_extremes(bounds))
        return sorted(found.items())


def _is_count(name: str) -> bool:
    """``profile/<module>/calls``: a count, kept as float64 in the packed rows."""
    return name.startswith("profile/") and name.endswith("/calls")


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _number(value: Any) -> Any:
    """A column value as the protocol writes it (JSON text from json paths included)."""
    kind = type(value)
    if kind is float:  # the common case first: ~2.5x faster over 50k values
        return value if value - value == 0 else rows.scalar_out(value)
    if kind is int:
        return value
    if isinstance(value, str):
        if value in ("NaN", "Infinity", "-Infinity"):
            return value
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    if isinstance(value, bool):
        return int(value)
    return rows.scalar_out(value)
