"""The writer thread's scalar work for one batch: packed named rows and rollups.

Mixed into :class:`gradwatch.server.store.base.Store`. Each name set of a batch
(store/named.py) becomes one id in ``named_sets`` and one row per record in
``named_scalars``; each name and each plain ``steps`` column keeps its ``series`` id,
and the rollups of all of them are computed column-wise (store/columns.py) and
upserted in one ``executemany``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import Any

from . import named, rollups, rows
from .chunks import NAMED_CHUNK_INSERT
from .columns import Group, aggregate_columns

# (index in a `steps` row, series name) of the columns the history API serves, and
# the step numbers themselves (their rollups count the steps of a range).
ROLLED_COLUMNS = (
    (rows.STEP_COLUMNS.index("step"), rollups.STEP_SERIES),
    *((rows.STEP_COLUMNS.index(f), f) for f in rows.SCALAR_FIELDS),
)
_STEP = rows.STEP_COLUMNS.index("step")
_UID = rows.STEP_COLUMNS.index("uid")


class ScalarWrites:
    """Packed named scalars and rollups; the Store supplies SQL and series ids."""

    value_key = staticmethod(rollups.sqlite_key)
    # (run_id, rank), name -> series id; (run_id, rank), names -> (set id, series ids).
    # Only the writer thread touches them; both are forgotten after a rollback.
    _series_ids: dict[tuple[tuple[str, int], str], int]
    _name_sets: dict[tuple[tuple[str, int], tuple[str, ...]], tuple[int, list[int]]]
    # run_keys rows this writer wrote (run_id, family, key, sub).
    _keys_written: set[tuple[str, str, str, str]]
    # The rollup groups of the transaction being written.
    _rollups_pending: list[Group]
    # The clock of the last batch written: a re-sent step's newest row wins on read.
    _written: int = 0

    def sql(self, text: str) -> str:
        raise NotImplementedError

    def insert_ignore(self, table: str, columns: Sequence[str]) -> str:
        raise NotImplementedError

    def _forget_ids(self) -> None:
        """Ids (and run_keys) written in a rolled-back transaction are gone."""
        self._series_ids.clear()
        self._name_sets.clear()
        self._keys_written.clear()

    def _series(self, cur: Any, run_id: str, rank: int, name: str) -> int:
        key = (run_id, rank)
        found = self._series_ids.get((key, name))
        if found is None:
            cur.execute(
                self.sql(self.insert_ignore("series", ("run_id", "rank", "name"))),
                (run_id, rank, name),
            )
            cur.execute(
                self.sql("SELECT id FROM series WHERE run_id = ? AND rank = ? AND name = ?"),
                (run_id, rank, name),
            )
            found = self._series_ids[key, name] = int(cur.fetchone()[0])
        return found

    def _name_set(
        self, cur: Any, run_id: str, rank: int, names: tuple[str, ...]
    ) -> tuple[int, list[int]]:
        """(id in ``named_sets``, series id of each name) of a name set."""
        key = (run_id, rank)
        found = self._name_sets.get((key, names))
        if found is None:
            digest, text = named.digest(names)
            cur.execute(
                self.sql(self.insert_ignore("named_sets", ("run_id", "rank", "digest", "names"))),
                (run_id, rank, digest, text),
            )
            cur.execute(
                self.sql("SELECT id FROM named_sets WHERE run_id = ? AND rank = ? AND digest = ?"),
                (run_id, rank, digest),
            )
            set_id = int(cur.fetchone()[0])
            series = [self._series(cur, run_id, rank, name) for name in names]
            found = self._name_sets[key, names] = (set_id, series)
        return found

    def _write_scalars(self, cur: Any, batch: Any, split: rows.SplitBatch) -> None:
        run_id, rank = batch.run_id, batch.rank
        chunked = split.chunks.named if split.chunks is not None else []
        if split.named or chunked:
            self._written = written = max(time.time_ns(), self._written + 1)
        if chunked:
            cur.executemany(
                self.sql(NAMED_CHUNK_INSERT),
                [
                    (*row[:5], written, self._name_set(cur, run_id, rank, names)[0], *row[5:])
                    for names, row in chunked
                ],
            )
        if split.named:
            packed: list[tuple[Any, ...]] = []
            for names, group in split.named.items():
                set_id = self._name_set(cur, run_id, rank, names)[0]
                packed.extend(
                    zip(
                        repeat(run_id),
                        repeat(rank),
                        group.steps,
                        group.uids,
                        repeat(written),
                        repeat(set_id),
                        group.blobs,
                    )
                )
            cur.executemany(self.sql(named.NAMED_INSERT), packed)
        groups = rollup_groups(
            split,
            lambda names: self._name_set(cur, run_id, rank, names)[1],
            lambda name: self._series(cur, run_id, rank, name),
        )
        for chunk in split.chunks.groups if split.chunks is not None else ():
            if chunk.name_set:
                ids = self._name_set(cur, run_id, rank, chunk.names)[1]
            else:
                ids = [self._series(cur, run_id, rank, name) for name in chunk.names]
            groups.append(Group(chunk.steps, chunk.uids, ids, chunk.columns))
        # Upserted once per transaction (_flush_rollups): the batches of one run that
        # commit together share their coarse blocks, one row each instead of one per
        # batch (the upserts were a fifth of the server's time at 40k records/s).
        self._rollups_pending.extend(groups)

    def _flush_rollups(self, cur: Any) -> None:
        """Upsert the rollups of every batch of this transaction."""
        if self._rollups_pending:
            groups = joined(self._rollups_pending)
            self._rollups_pending = []  # `groups` may be the very list
            self._upsert_rollups(cur, aggregate_columns(groups, self.value_key))

    # PostgreSQL sends them as one statement of arrays (store/postgres.py).
    def _upsert_rollups(self, cur: Any, found: list[tuple[Any, ...]]) -> None:
        cur.executemany(self.sql(rollups.UPSERT), found)


def joined(groups: list[Group]) -> list[Group]:
    """Groups of the same series (one run's batches in one transaction) as one group:
    aggregating them apart and merging their shared blocks cost ~4x more (the merge
    is per block in Python; one group's blocks are min()/max() over slices)."""
    by_series: dict[tuple[int, ...], list[Group]] = {}
    for group in groups:
        by_series.setdefault(tuple(group.series), []).append(group)
    if len(by_series) == len(groups):
        return groups
    out = []
    for same in by_series.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        out.append(
            Group(
                list(chain.from_iterable(g.steps for g in same)),
                list(chain.from_iterable(g.order for g in same)),
                same[0].series,
                [
                    list(chain.from_iterable(g.columns[k] for g in same))
                    for k in range(len(same[0].series))
                ],
            )
        )
    return out


def rollup_groups(
    split: rows.SplitBatch,
    set_series: Callable[[tuple[str, ...]], list[int]],
    series_of: Callable[[str], int],
) -> list[Group]:
    """A batch's series as column groups for :func:`aggregate_columns`: one per name
    set (``set_series``: the series id of each of its names), one for the plain
    ``steps`` columns every record has, one for each column with gaps (``series_of``:
    a name's series id, asked only for columns that have values)."""
    groups = [
        # One tuple per name, transposed in C.
        Group(group.steps, group.uids, set_series(names), list(zip(*group.values, strict=True)))
        for names, group in split.named.items()
    ]
    if not split.steps:
        return groups
    columns = list(zip(*split.steps, strict=True))
    steps, uids = columns[_STEP], columns[_UID]
    whole: list[int] = []
    whole_columns: list[Sequence[Any]] = []
    for at, name in ROLLED_COLUMNS:
        values = columns[at]
        if None not in values:
            whole.append(series_of(name))
            whole_columns.append(values)
            continue
        kept = [i for i, v in enumerate(values) if v is not None]
        if kept:
            groups.append(
                Group(
                    [steps[i] for i in kept],
                    [uids[i] for i in kept],
                    [series_of(name)],
                    [[values[i] for i in kept]],
                )
            )
    groups.append(Group(steps, uids, whole, whole_columns))
    return groups
