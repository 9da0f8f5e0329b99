"""Archived runs: hidden from the runs list, their data kept and readable by id.

One row per archived run in ``run_archive`` (its own table, so an existing database
gains it through ``CREATE TABLE IF NOT EXISTS`` with no migration). The write runs on
its own short connection: it is rare, tiny, and must not queue behind a flood of
batches in the writer thread.

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

import contextlib
import time
from collections.abc import Sequence
from typing import Any

TABLE = "CREATE TABLE IF NOT EXISTS run_archive (run_id TEXT PRIMARY KEY, archived_at {number})"


class Archive:
    """Mixed into Store: set_archived() and archived_ids()."""

    def connect(self) -> Any:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    def sql(self, text: str) -> str:  # pragma: no cover - provided by Store
        raise NotImplementedError

    def query(
        self, text: str, params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:  # pragma: no cover
        raise NotImplementedError

    def set_archived(self, run_id: str, archived: bool) -> None:
        """Archive (``True``) or bring back (``False``) one run; idempotent."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            if archived:
                cur.execute(
                    self.sql(
                        "INSERT INTO run_archive (run_id, archived_at) VALUES (?, ?)"
                        " ON CONFLICT (run_id) DO NOTHING"
                    ),
                    (run_id, time.time()),
                )
            else:
                cur.execute(self.sql("DELETE FROM run_archive WHERE run_id = ?"), (run_id,))
            conn.commit()
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def archived_ids(self) -> set[str]:
        """The ids of every archived run."""
        return {str(run_id) for (run_id,) in self.query("SELECT run_id FROM run_archive")}
