"""A database keeps the version of its storage layout (store/tables.py): one of
another version is refused when it is opened, with one line that says what it is
and what to do; nothing in it is changed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gradwatch.server.settings import Settings
from gradwatch.server.store import open_store
from gradwatch.server.store.tables import SCHEMA_VERSION, SchemaMismatch


def test_a_new_database_records_its_layout_version(gradwatch_db, store_sql):
    open_store(Settings(db=gradwatch_db)).close()
    found = store_sql.execute(
        gradwatch_db, [("SELECT value FROM meta WHERE key = 'schema_version'", ())]
    )
    assert found == [(str(SCHEMA_VERSION),)]
    # Opened again: the same version is accepted, and its runs are still there.
    store = store_sql.open(gradwatch_db, "kept")
    store.close()
    with open_store(Settings(db=gradwatch_db)) as again:
        assert [r["id"] for r in again.list_runs()] == ["kept"]


@pytest.mark.parametrize("version", ["1", str(SCHEMA_VERSION + 1)])
def test_a_database_of_another_layout_is_refused_with_what_to_do(
    gradwatch_db, store_sql, version
):
    open_store(Settings(db=gradwatch_db)).close()
    store_sql.execute(
        gradwatch_db, [("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))]
    )
    with pytest.raises(SchemaMismatch) as caught:
        open_store(Settings(db=gradwatch_db))
    line = str(caught.value)
    assert "\n" not in line
    assert f"has storage layout {version}, this gradwatch reads layout {SCHEMA_VERSION}" in line
    assert "move it aside" in line and "gradwatch upload" in line
    # Refused, not repaired: the old layout's version is still what it was.
    found = store_sql.execute(
        gradwatch_db, [("SELECT value FROM meta WHERE key = 'schema_version'", ())]
    )
    assert found == [(version,)]


def test_gradwatch_report_on_a_database_of_another_layout_says_so_in_one_line(
    tmp_path, store_sql
):
    db = str(tmp_path / "old.db")
    open_store(Settings(db=db)).close()
    store_sql.execute(db, [("UPDATE meta SET value = '1' WHERE key = 'schema_version'", ())])
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", "report", "some-run", "--db", db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert f"has storage layout 1, this gradwatch reads layout {SCHEMA_VERSION}" in done.stderr
