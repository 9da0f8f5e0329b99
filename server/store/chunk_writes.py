"""The writer thread's work for one batch's chunks: their rows, and their rollups.

Each series (a plain field, a named scalar, the step numbers) gets an id in ``series``
and each set of series one in ``rollup_sets`` (a name set is the set of its names'
series); the rollups of every chunk's series are kept one row per set and block
(store/rollups.py), merged with the row of that block stored, once per transaction.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import chain
from typing import Any

import numpy as np

from . import rollups
from .chunks import TABLES, ColumnGroup
from .rollups import array_blocks, merge_arrays
from .split import SplitBatch
from .tables import IGNORE, Database

MEMBER_COLUMNS = ("series", "set_id", "position", "kind")
SET_COLUMNS = ("set_id", "level", "block", "n", "step_lo", "step_hi", "data")
# A block's row is computed from the stored one (merged), so the new row replaces it.
UPSERT = (
    " ON CONFLICT (set_id, level, block) DO UPDATE SET n = excluded.n,"
    " step_lo = excluded.step_lo, step_hi = excluded.step_hi, data = excluded.data"
)
# A step or epoch of -1 (none in the transaction's batches) leaves NULL as it is.
RUN_UPDATE = (
    "UPDATE runs SET updated = ?,"
    " last_step = CASE WHEN ? > COALESCE(last_step, -1) THEN ? ELSE last_step END,"
    " last_epoch = CASE WHEN ? > COALESCE(last_epoch, -1) THEN ? ELSE last_epoch END,"
    " alerts = alerts + ? WHERE id = ?"
)


class ChunkWrites(Database):
    """Chunk rows and rollups (the Store empties the caches: ``_forget_ids``)."""

    # (run_id, rank), name -> series id; (run_id, rank), names -> set id.
    # Only the writer thread touches them; both are forgotten after a rollback.
    _series_ids: dict[tuple[tuple[str, int], str], int]
    _set_ids: dict[tuple[tuple[str, int], tuple[str, ...]], int]
    # run_keys rows this writer wrote (run_id, family, key, sub).
    _keys_written: set[tuple[str, str, str, str]]
    # The chunk rows (by table) and rollup groups of the transaction being written.
    _rows_pending: dict[str, list[tuple[Any, ...]]]
    _rollups_pending: list[ColumnGroup]
    # run id -> (largest step, largest epoch, problems) of the transaction's batches.
    _runs_pending: dict[str, tuple[int, int, int]]
    # The clock of the last batch written: a re-sent step's newest row wins on read.
    _written: int = 0

    def _forget_ids(self) -> None:
        """Ids (and run_keys) written in a rolled-back transaction are gone."""
        self._series_ids, self._set_ids, self._keys_written = {}, {}, set()

    def _store_series(self, cur: Any, key: tuple[str, int], names: Iterable[str]) -> None:
        """Know the series id of each name of a rank (``key``: run_id, rank) in
        ``_series_ids``: those not known yet are made in one insert, then the rank's ids
        read in one query (a new run's first batch names every series)."""
        new = [(*key, name) for name in dict.fromkeys(names) if (key, name) not in self._series_ids]
        if new:
            self._insert_rows(cur, "series", ("run_id", "rank", "name"), sorted(new), IGNORE)
            cur.execute(self.sql("SELECT name, id FROM series WHERE run_id = ? AND rank = ?"), key)
            self._series_ids.update({(key, str(n)): int(i) for n, i in cur.fetchall()})

    def _insert_rows(
        self, cur: Any, table: str, columns: Sequence[str], rows: list[Any], then: str = ""
    ) -> None:
        """Insert rows into a table, ``then`` on a conflict (PostgreSQL: as arrays)."""
        cur.executemany(self.sql(self.insert(table, columns, then)), rows)

    def _write_chunks(self, cur: Any, run_id: str, rank: int, chunks: SplitBatch) -> None:
        """A batch's chunk rows and rollup groups, written by :meth:`_flush`."""
        wanted = [(names, "f") for names, _ in chunks.named]
        wanted += [(chunk.names, chunk.matrix.dtype.kind) for chunk in chunks.groups]
        set_ids = iter(self._set_ids_of(cur, (run_id, rank), wanted))
        named_rows = []
        if chunks.named:
            self._written = written = max(time.time_ns(), self._written + 1)
            named_rows = [(*row[:5], written, next(set_ids), *row[5:]) for _, row in chunks.named]
        for table, rows in zip(TABLES, (chunks.steps, named_rows, chunks.series), strict=True):
            self._rows_pending.setdefault(table, []).extend(rows)
        for chunk in chunks.groups:
            # Written once per transaction (_flush): the batches of one run that commit
            # together share their coarse blocks, one row each.
            self._rollups_pending.append(replace(chunk, set_id=next(set_ids)))

    def _discard_pending(self) -> None:
        self._rows_pending, self._rollups_pending, self._runs_pending = {}, [], {}

    def _flush(self, cur: Any) -> None:
        """Write the chunk rows and rollups of every batch of this transaction: one
        insert per table, not one per batch; each run's row once (its largest step and
        epoch, its batches' problems; in id order, before the rollup sets, as every
        writer locks them)."""
        for table, columns in TABLES.items():
            if rows := self._rows_pending.pop(table, None):
                self._insert_rows(cur, table, columns, rows)
        runs = sorted(self._runs_pending.items())
        now = time.time()
        rows = [(now, s, s, e, e, problems, run) for run, (s, e, problems) in runs]
        cur.executemany(self.sql(RUN_UPDATE), rows)
        if self._rollups_pending:
            self._write_set_rollups(cur, joined(self._rollups_pending))

    def _write_set_rollups(self, cur: Any, groups: list[ColumnGroup]) -> None:
        """One row per set and block (store/rollups.py), merged with the row of
        that block already stored (read in one query for every set)."""
        computed = [
            (g.set_id, *array_blocks(np.array(g.steps, np.int64), g.matrix, self.kind))
            for g in groups
        ]
        stored = self._stored_set_rows(cur, [(c[0], c[1]) for c in computed])
        found: list[tuple[Any, ...]] = []
        for set_id, blocks, values in computed:
            old_rows = stored.get(set_id, {})
            again = [at for at, b in enumerate(blocks) if (b[0], b[1]) in old_rows]
            if again:
                data = b"".join(bytes(old_rows[blocks[at][:2]][3]) for at in again)
                old = np.frombuffer(data, values.dtype).reshape(len(again), -1)
                values[again] = merge_arrays(old, values[again], self.kind)
            for at, (level, block, n, lo, hi) in enumerate(blocks):
                old_row = old_rows.get((level, block))
                if old_row is not None:
                    n, lo, hi = n + old_row[0], min(lo, old_row[1]), max(hi, old_row[2])
                found.append((set_id, level, block, n, lo, hi, values[at].tobytes()))
        self._insert_rows(cur, "set_rollups", SET_COLUMNS, found, UPSERT)

    def _set_ids_of(
        self, cur: Any, key: tuple[str, int], wanted: list[tuple[tuple[str, ...], str]]
    ) -> list[int]:
        """The id of each set of a rank's series ``names`` (all of numpy's ``kind``: a
        series' kind never changes), the key of their rollups and a named chunk's ``names``.
        Those not known yet are stored together (another replica may store one first):
        a new run's first batch costs a few statements, not a few per set."""
        missing = {names: kind for names, kind in wanted if (key, names) not in self._set_ids}
        if missing:
            self._store_series(cur, key, chain.from_iterable(missing))
            made = []  # (names, kind, series ids, digest, series ids as text)
            for names, kind in missing.items():
                ids = [self._series_ids[key, name] for name in names]
                text = json.dumps(ids, separators=(",", ":"))
                made.append((names, kind, ids, hashlib.sha256(text.encode()).hexdigest(), text))
            made.sort(key=lambda m: m[3])  # one order of row locks for every writer
            sets = [(m[3], m[4]) for m in made]
            self._insert_rows(cur, "rollup_sets", ("digest", "series"), sets, IGNORE)
            clause, params = self.any_of("digest", [m[3] for m in made])
            cur.execute(self.sql(f"SELECT digest, id FROM rollup_sets WHERE {clause}"), params)  # noqa: S608
            by_digest = {str(d): int(i) for d, i in cur.fetchall()}
            members = sorted(
                (series, by_digest[digest], at, kind)
                for _, kind, ids, digest, _ in made
                for at, series in enumerate(ids)
            )
            self._insert_rows(cur, "rollup_members", MEMBER_COLUMNS, members, IGNORE)
            for names, _, _, digest, _ in made:
                self._set_ids[key, names] = by_digest[digest]
        return [self._set_ids[key, names] for names, _ in wanted]

    def _stored_set_rows(
        self, cur: Any, sets: list[tuple[int, list[tuple[Any, ...]]]]
    ) -> dict[int, dict[tuple[int, int], tuple[Any, ...]]]:
        """set id -> (level, block) -> (n, step_lo, step_hi, data) of the stored rows
        of these blocks (``sets``: each set's blocks, ``(level, block, ...)``), read
        in one query: one block range per set and level."""
        ranges: list[tuple[int, int, int, int]] = []
        for set_id, blocks in sets:
            for level in rollups.LEVELS:
                at = [b[1] for b in blocks if b[0] == level]
                if at:
                    ranges.append((set_id, level, min(at), max(at)))
        found: dict[int, dict[tuple[int, int], tuple[Any, ...]]] = {}
        if ranges:
            for set_id, level, block, *row in self._set_rows_in(cur, ranges):
                found.setdefault(set_id, {})[level, block] = tuple(row)
        return found

    def _set_rows_in(self, cur: Any, ranges: list[tuple[int, int, int, int]]) -> list[Any]:
        """The ``set_rollups`` rows of each ``(set id, level, first block, last block)``."""
        clause = "(set_id = ? AND level = ? AND block >= ? AND block <= ?)"
        query = f"SELECT {', '.join(SET_COLUMNS)} FROM set_rollups WHERE "  # noqa: S608
        cur.execute(self.sql(query + " OR ".join([clause] * len(ranges))), list(chain(*ranges)))
        return list(cur.fetchall())


def joined(groups: list[ColumnGroup]) -> list[ColumnGroup]:
    """Groups of the same series (one run's batches in one transaction) as one group:
    one array_blocks call instead of one per batch and a merge of their shared blocks."""
    by_set: dict[int, list[ColumnGroup]] = {}
    for group in groups:
        by_set.setdefault(group.set_id, []).append(group)
    return [
        replace(
            same[0],
            steps=list(chain.from_iterable(g.steps for g in same)),
            matrix=np.concatenate([g.matrix for g in same]),
        )
        if len(same) > 1
        else same[0]
        for same in by_set.values()
    ]
