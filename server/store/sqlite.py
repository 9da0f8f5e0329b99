"""SQLite storage: WAL, one writer thread, one read connection per thread.

``synchronous=NORMAL`` in WAL mode: a committed transaction survives a crash or
``kill -9`` of the server (it is in the WAL file); only a power loss may drop the
last few. ``Settings.sqlite_synchronous="FULL"`` fsyncs every commit instead.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, ClassVar

from ..settings import Settings
from . import rows
from .base import Store


class SQLiteStore(Store):
    """The default store: one file, no server to run.

    Example:
        >>> import tempfile, os
        >>> store = SQLiteStore(Settings(db=os.path.join(tempfile.mkdtemp(), "g.db")))
        >>> store.list_runs()
        []
        >>> store.close()
    """

    kind: ClassVar[str] = "sqlite"

    def __init__(self, settings: Settings) -> None:
        self.path = Path(settings.db)
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(settings)

    def connect(self) -> Any:
        conn = sqlite3.connect(
            self.path, timeout=30, check_same_thread=False, isolation_level="DEFERRED"
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.settings.sqlite_synchronous.upper()}")
        conn.execute("PRAGMA foreign_keys=OFF")
        # Readers must not block on the writer's checkpoints for long.
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def create_schema(self, conn: Any) -> None:
        # Numeric columns without a declared type keep "NaN"/"Infinity" strings as text
        # (a REAL column would turn NaN into NULL).
        for statement in rows.schema(
            number="",
            integer="INTEGER",
            blob="BLOB",
            serial="INTEGER PRIMARY KEY AUTOINCREMENT",
            clustered=" WITHOUT ROWID",
        ):
            conn.execute(statement)
        conn.commit()

    def scalar_in(self, value: Any) -> Any:
        return value
