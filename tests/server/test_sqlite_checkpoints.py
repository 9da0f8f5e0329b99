"""The SQLite store checkpoints its WAL on a thread of its own (not inside the writer's
commits): committed batches reach the database file while the store runs, the WAL is
emptied on close, and new databases use 16 KiB pages."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from gradwatch.server.schema import parse_message
from gradwatch.server.settings import Settings
from gradwatch.server.store.sqlite import SQLiteStore

HELLO = {"type": "hello", "protocol": 1, "run_id": "ckpt", "rank": 0}


def _batch(seq: int, steps: int = 50) -> object:
    records = [
        {"kind": "step", "step": seq * steps + i, "loss": 0.5,
         "timesteps": {"lstm": {"input": [1e-3] * 128}}}
        for i in range(steps)
    ]
    return parse_message(
        json.dumps({"type": "batch", "run_id": "ckpt", "rank": 0, "seq": seq, "records": records})
    )


def _steps_in_main_file(path: Path) -> int:
    """Step records in the database file itself (their chunks' counts), ignoring the WAL."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT COALESCE(SUM(n), 0) FROM step_chunks").fetchone()[0])
    except sqlite3.DatabaseError:
        return 0  # the table is not in the main file yet
    finally:
        conn.close()


def test_committed_batches_reach_the_database_file_while_the_store_runs(tmp_path):
    path = tmp_path / "g.db"
    store = SQLiteStore(Settings(db=str(path)))
    try:
        store.submit_hello(parse_message(json.dumps(HELLO))).result()
        for seq in range(4):
            assert store.submit_batch(_batch(seq)).result()
        # Nothing commits on this store from here: only the checkpoint thread can move
        # the 200 records from the WAL into the file.
        deadline = time.monotonic() + 30
        while _steps_in_main_file(path) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _steps_in_main_file(path) == 200
        assert path.stat().st_size > 0
    finally:
        store.close()


def test_close_empties_the_wal_and_new_databases_use_16k_pages(tmp_path):
    path = tmp_path / "g.db"
    with SQLiteStore(Settings(db=str(path))) as store:
        store.submit_hello(parse_message(json.dumps(HELLO))).result()
        assert store.submit_batch(_batch(0)).result()
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    assert _steps_in_main_file(path) == 50
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    conn.close()


def test_a_database_made_with_4k_pages_keeps_them_and_stays_usable(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("CREATE TABLE keep (x)")
    conn.commit()
    conn.close()
    with SQLiteStore(Settings(db=str(path))) as store:
        store.submit_hello(parse_message(json.dumps(HELLO))).result()
        assert store.submit_batch(_batch(0)).result()
        assert store.list_runs()[0]["last_step"] == 49
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    conn.close()
