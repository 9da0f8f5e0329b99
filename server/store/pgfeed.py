"""Live fan-out between replicas that share one PostgreSQL: the announce side (SQL the
writer runs in each batch's transaction).

Why LISTEN/NOTIFY and not Redis pub/sub: the replicas already share the database, so
there is no new service to run, secure and monitor, and a notification is sent only
when the transaction that stored the batch commits (never for a rolled-back batch,
never before its rows are readable by the other replicas).

A NOTIFY payload is limited to 8000 bytes, smaller than one batch can be, so the
writer stores each batch as the writer process's frame (store/handoff.py: its blocks
as raw bytes; a replica with viewers turns it into the live message's records, the
writer does no JSON) in the UNLOGGED table ``live_batches``, kept ``RETAIN_S``
seconds, and notifies a pointer:
``{"r": replica, "id": row id, "run": run_id, "u": urgent}``, or
``{"r": replica, "run": run_id, "hello": true}`` for a trainer's hello. Every replica
LISTENs on one channel per schema (:func:`channel_for`) and ignores its own ``r``.

The listen side (a thread that LISTENs and hands notes to the serving side) is
server/pg_listen.py: a listener is not storage.

Example:
    >>> channel_for("run-schema")
    'gradwatch_live_run-schema'
"""

from __future__ import annotations

import hashlib

# Rows of live_batches older than this are deleted: a replica whose LISTEN connection
# was away for longer cannot catch up from the table (its viewers are told "lagged").
RETAIN_S = 300.0
# How often a writer deletes expired rows (seconds).
PRUNE_EVERY_S = 30.0

LIVE_TABLE = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS live_batches (id BIGSERIAL PRIMARY KEY,"
    " replica TEXT NOT NULL, run_id TEXT NOT NULL, rank BIGINT NOT NULL, seq BIGINT NOT NULL,"
    " urgent BOOLEAN NOT NULL, frame BYTEA NOT NULL,"
    " created TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
)
# No compression of the frames: pglz on 300 KB of a batch took 17 ms, storing it
# plainly 1.3 ms; the rows live 5 minutes and are never read by history.
LIVE_STORAGE = "ALTER TABLE live_batches ALTER COLUMN frame SET STORAGE EXTERNAL"
LIVE_INDEX = "CREATE INDEX IF NOT EXISTS live_batches_created ON live_batches (created)"
# One statement per transaction: store its batches, then queue a pointer to each, in
# the order they were stored (sent at COMMIT).
ANNOUNCE_BATCHES = (
    "WITH row AS (INSERT INTO live_batches (replica, run_id, rank, seq, urgent, frame)"
    " SELECT %s, r, k, s, u, f FROM unnest(%s::text[], %s::bigint[], %s::bigint[],"
    " %s::boolean[], %b::bytea[]) AS b(r, k, s, u, f) RETURNING id, run_id, urgent)"
    " SELECT pg_notify(%s, json_build_object('r', %s::text, 'id', id, 'run', run_id,"
    " 'u', urgent)::text) FROM (SELECT * FROM row ORDER BY id) AS stored"
)
ANNOUNCE_HELLO = (
    "SELECT pg_notify(%s, json_build_object('r', %s::text, 'run', %s::text, 'hello', true)::text)"
)
PRUNE = "DELETE FROM live_batches WHERE created < clock_timestamp() - make_interval(secs => %s)"


def channel_for(schema: str) -> str:
    """The NOTIFY channel of the replicas that share ``schema`` (channels are per
    database, so deployments in different schemas of one database must not mix).

    >>> channel_for("public")
    'gradwatch_live_public'
    >>> len(channel_for("x" * 80)) <= 63
    True
    """
    name = f"gradwatch_live_{schema}"
    if len(name.encode()) <= 63:  # PostgreSQL truncates identifiers at 63 bytes
        return name
    return "gradwatch_live_" + hashlib.sha256(schema.encode()).hexdigest()[:40]
