"""Storage behind one interface; the backend is chosen by the ``--db`` value."""

from __future__ import annotations

from ..settings import Settings
from .base import Store, StoreDataError, StoreError
from .reads import RunNotFound


def open_store(settings: Settings) -> Store:
    """A SQLite store for a path, a PostgreSQL store for a ``postgresql://`` URL."""
    if settings.db_kind == "postgresql":
        from .postgres import PostgresStore

        return PostgresStore(settings)
    from .sqlite import SQLiteStore

    return SQLiteStore(settings)


__all__ = ["RunNotFound", "Store", "StoreDataError", "StoreError", "open_store"]
