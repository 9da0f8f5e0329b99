"""The history queries behind the REST API (and ``gradwatch report``), and archived runs.

Every method is synchronous and safe from any thread; it answers plain JSON-able
values with non-finite numbers as the protocol's strings. An archived run (a row of
``run_archive``) is hidden from the runs list, its data kept and readable by id.

Example:
    >>> import os, tempfile
    >>> from gradwatch.server.store import open_store
    >>> from gradwatch.server.settings import Settings
    >>> store = open_store(Settings(db=os.path.join(tempfile.mkdtemp(), "g.db")))
    >>> store.set_archived("run-1", True)
    >>> store.archived_ids()
    {'run-1'}
    >>> store.close()
"""

from __future__ import annotations

import json
import time
from typing import Any

from gradwatch.protocol.codec import protocol_number

from ..column_checks import floats
from ..downsample import pick_rows
from .chunk_reads import ChunkReads
from .tables import IGNORE

_RUNS = (
    "SELECT id, name, world_size, started, updated, last_step, last_epoch, alerts, host,"
    " recurrent FROM runs"
)


class RunNotFound(KeyError):
    """No run has this id."""


class Reads(ChunkReads):
    """Query methods; the downsampled scalar history (``steps``) is store/history.py's
    :class:`HistoryReads` over these."""

    # ----- runs --------------------------------------------------------------------
    def list_runs(self) -> list[dict[str, Any]]:
        """Every run's summary, newest first (``status`` is computed by the caller)."""
        runs = self.query(f"{_RUNS} ORDER BY started DESC")
        ranks: dict[str, list[tuple[Any, ...]]] = {}
        for run_id, rank, end_status in self.query(
            "SELECT run_id, rank, end_status FROM ranks ORDER BY run_id, rank"
        ):
            ranks.setdefault(run_id, []).append((rank, end_status))
        return [self._summary(row, ranks.get(row[0], [])) for row in runs]

    def run_summary(self, run_id: str) -> dict[str, Any]:
        found = self.query(f"{_RUNS} WHERE id = ?", (run_id,))
        if not found:
            raise RunNotFound(run_id)
        ranks = self.query(
            "SELECT rank, end_status FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,)
        )
        return self._summary(found[0], [(r, s) for r, s in ranks])

    @staticmethod
    def _summary(row: tuple[Any, ...], ranks: list[tuple[Any, Any]]) -> dict[str, Any]:
        run_id, name, world_size, started, updated, last_step, last_epoch, alerts, host, rec = row
        ended = [s for _, s in ranks if s]
        end_status = "crashed" if "crashed" in ended else None
        if ranks and end_status is None and len(ended) == len(ranks):
            end_status = "finished"
        return {
            "id": run_id,
            "name": name,
            "ranks": [r for r, _ in ranks],
            "world_size": int(world_size),
            "started": started,
            "updated": updated,
            "last_step": last_step,
            "last_epoch": last_epoch,
            "end_status": end_status,
            "alerts": int(alerts or 0),
            "recurrent": json.loads(rec) if rec else [],
            "host": host or "",
        }

    def run_keys(self, run_id: str) -> dict[str, list[tuple[str, str]]]:
        """family -> the (key, sub) of each of a run's series of it, in order."""
        keys: dict[str, list[tuple[str, str]]] = {}
        for family, key, sub in self.query(
            "SELECT family, key, sub FROM run_keys WHERE run_id = ? ORDER BY family, key, sub",
            (run_id,),
        ):
            keys.setdefault(family, []).append((key, sub))
        return keys

    def run_detail(self, run_id: str) -> dict[str, Any]:
        """The summary plus hellos, modules, and which series and parameters exist."""
        summary = self.run_summary(run_id)
        hellos = {
            str(rank): json.loads(hello)
            for rank, hello in self.query(
                "SELECT rank, hello FROM ranks WHERE run_id = ? ORDER BY rank", (run_id,)
            )
        }
        (modules_text,) = self.query("SELECT modules FROM runs WHERE id = ?", (run_id,))[0]
        keys = self.run_keys(run_id)
        series: dict[str, list[str]] = {}
        for key, sub in keys.get("timesteps", []):
            series.setdefault(key, []).append(sub)

        def owners(family: str) -> list[str]:  # a gate's parameter once
            return list(dict.fromkeys(key for key, _ in keys.get(family, [])))

        summary.update(
            hello=hellos,
            modules=json.loads(modules_text) if modules_text else {},
            series=series,
            parameters=owners("param_norms"),
            gate_parameters=owners("gate_norms"),
            profiled_modules=owners("profile"),
            depth=owners("depth"),
            update_ratio_parameters=owners("update_ratios"),
        )
        return summary

    def timesteps(
        self,
        run_id: str,
        module: str,
        series: str = "input",
        rank: int = 0,
        max_steps: int = 500,
        start: int | None = None,
        stop: int | None = None,
        max_cells: int = 1_000_000,
    ) -> dict[str, Any]:
        """The heatmap matrix of one module's series (docs/API.md ``/timesteps``), at
        most ``max_cells`` values: rows keep evenly spaced timesteps where they would
        pass it, cut as they are read (a request never holds more and one row)."""
        self.run_summary(run_id)
        lo = 0 if start is None else start
        hi = 2**62 if stop is None else stop
        key = ("timesteps", module, series)
        total, picked, rows = self.series_rows(run_id, rank, key, lo, hi, max_steps)
        per_row = max(2, max_cells // max(1, len(picked)))
        values: list[list[Any]] = []
        longest = 0
        for packed in rows:
            row = floats(packed)
            longest = max(longest, len(row))
            if len(row) > per_row:
                row = [row[i] for i in pick_rows(len(row), per_row)]
            values.append([protocol_number(v) for v in row])
        # Each row's timestep_layout for this module (docs/PROTOCOL.md): chain unless
        # its record said tree.
        notes = self.notes(run_id, rank, picked[0][0], picked[-1][0]) if picked else {}
        said = [notes.get(uid, {}).get("timestep_layout") or {} for _, uid in picked]
        answer = {
            "module": module,
            "series": series,
            "rank": rank,
            "steps": [step for step, _ in picked],
            "total_steps": total,
            "values": values,
            "layout": [layouts.get(module, "chain") for layouts in said],
            "max_timesteps": longest,
        }
        if longest > per_row:
            # Rows of other lengths were cut alike: index i of a row of n timesteps
            # is pick_rows(n, per_row)[i]; the longest row's indices are given.
            answer["timestep_index"] = pick_rows(longest, per_row)
        return answer

    def epochs(self, run_id: str, rank: int = 0) -> list[dict[str, Any]]:
        self.run_summary(run_id)
        return [
            json.loads(data)
            for (data,) in self.query(
                "SELECT data FROM epochs WHERE run_id = ? AND rank = ? ORDER BY epoch, step",
                (run_id, rank),
            )
        ]

    def alerts(self, run_id: str, rank: int | None = None) -> list[dict[str, Any]]:
        self.run_summary(run_id)
        where, params = ("", (run_id,)) if rank is None else (" AND rank = ?", (run_id, rank))
        query = f"SELECT rank, data FROM alerts WHERE run_id = ?{where} ORDER BY id"  # noqa: S608
        return [{**json.loads(data), "rank": r} for r, data in self.query(query, params)]

    # ----- archived runs -------------------------------------------------------------
    def set_archived(self, run_id: str, archived: bool) -> None:
        """Archive (``True``) or bring back (``False``) one run; idempotent. In a
        transaction of its own: rare and tiny, it must not queue behind a flood of
        batches in the writer."""
        if archived:
            insert = self.insert("run_archive", ("run_id", "archived_at"), IGNORE)
            self._own((insert, (run_id, time.time())))
        else:
            self._own(("DELETE FROM run_archive WHERE run_id = ?", (run_id,)))

    def archived_ids(self) -> set[str]:
        """The ids of every archived run."""
        return {str(run_id) for (run_id,) in self.query("SELECT run_id FROM run_archive")}
