"""Validated records as table rows, and the tables themselves.

Scalars go to their own columns (so the history API reads one column per series);
named scalars (``param_norms/<p>``, ``gate_norms/<p>/<g>``, ``profile/<m>/<key>``) go
to ONE packed row per record of ``named_scalars`` (store/named.py); ``nonfinite`` goes
to JSON text; each
per-timestep series goes to its own row of ``timesteps`` as packed little-endian
float64 (an ``array('d')`` blob): re-encoding 128 floats as JSON text cost ~10x
more than packing them, and the heatmap reads one module's series without touching
the others. NaN and infinities survive in the blob and in PostgreSQL's
``double precision``; in SQLite the numeric columns carry no type affinity, so the
strings ``"NaN"``/``"Infinity"`` are kept as they came.
"""

from __future__ import annotations

import sys
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import is_not, itemgetter
from typing import Any

from pydantic_core import to_json

from gradwatch.protocol.messages import MAX_RECORDS_PER_BATCH, NONFINITE_STRINGS

from ..columns import floats
from .archive import TABLE as ARCHIVE_TABLE
from .chunks import Chunks, add_block, scalar_out  # noqa: F401 (read as rows.scalar_out)
from .chunks import schema as chunk_schema
from .named import NamedBuilder, NamedGroup
from .named import schema as named_schema
from .set_rollups import schema as set_rollup_schema

# Numeric scalar columns of `steps`, in protocol names (docs/PROTOCOL.md).
NUMBER_FIELDS = ("t", "duration_s", "loss", "total_norm", "overhead")
INTEGER_FIELDS = ("graph_nodes", "rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")
JSON_FIELDS = ("nonfinite",)
SCALAR_FIELDS = (
    "loss",
    "duration_s",
    "total_norm",
    "graph_nodes",
    "rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "overhead",
)
_KNOWN_STEP = {
    "kind",
    "step",
    "epoch",
    "timesteps",
    "graph_truncated",
    *NUMBER_FIELDS,
    *INTEGER_FIELDS,
    *JSON_FIELDS,
}

STEP_COLUMNS = (
    "run_id",
    "rank",
    "step",
    "uid",
    "epoch",
    *NUMBER_FIELDS,
    *INTEGER_FIELDS,
    "graph_truncated",
    *JSON_FIELDS,
    "extra",
)
STEP_INSERT = (
    f"INSERT INTO steps ({', '.join(STEP_COLUMNS)})"  # noqa: S608
    f" VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
    # A guard, never expected to fire: a colliding row must not wedge ingest.
    " ON CONFLICT DO NOTHING"
)
TIMESTEP_INSERT = (
    "INSERT INTO timesteps (run_id, rank, step, module, series, n, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
EPOCH_INSERT = (
    "INSERT INTO epochs (run_id, rank, epoch, step, t, duration_s, steps, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
ALERT_INSERT = (
    "INSERT INTO alerts (run_id, rank, step, code, severity, state, subject, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def schema(number: str, integer: str, blob: str, serial: str, clustered: str = "") -> list[str]:
    """CREATE statements for one dialect's column types."""
    step_cols = ", ".join(
        [
            "run_id TEXT NOT NULL",
            f"rank {integer} NOT NULL",
            f"step {integer} NOT NULL",
            # seq * MAX_RECORDS_PER_BATCH + index: unique, so the key can cluster rows.
            f"uid {integer} NOT NULL",
            f"epoch {integer}",
            *(f"{c} {number}" for c in NUMBER_FIELDS),
            *(f"{c} {integer}" for c in INTEGER_FIELDS),
            f"graph_truncated {integer}",
            *(f"{c} TEXT" for c in JSON_FIELDS),
            "extra TEXT",
            "PRIMARY KEY (run_id, rank, step, uid)",
        ]
    )
    return [
        "CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, name TEXT NOT NULL,"
        f" world_size {integer} NOT NULL, started {number}, updated {number},"
        f" last_step {integer}, last_epoch {integer}, alerts {integer} NOT NULL DEFAULT 0,"
        " host TEXT, recurrent TEXT, modules TEXT)",
        f"CREATE TABLE IF NOT EXISTS ranks (run_id TEXT NOT NULL, rank {integer} NOT NULL,"
        f" hello TEXT NOT NULL, connected_at {number}, end_status TEXT, end_step {integer},"
        f" end_t {number}, PRIMARY KEY (run_id, rank))",
        f"CREATE TABLE IF NOT EXISTS batches (run_id TEXT NOT NULL, rank {integer} NOT NULL,"
        f" session TEXT NOT NULL, seq {integer} NOT NULL, stored_at {number},"
        " PRIMARY KEY (run_id, rank, session, seq))",
        # Clustered in SQLite (WITHOUT ROWID): a run's history is read in step order
        # straight from the table, with no index-to-row lookups.
        f"CREATE TABLE IF NOT EXISTS steps ({step_cols}){clustered}",
        f"CREATE TABLE IF NOT EXISTS timesteps (run_id TEXT NOT NULL, rank {integer} NOT NULL,"
        f" step {integer} NOT NULL, module TEXT NOT NULL, series TEXT NOT NULL, n {integer},"
        f" data {blob})",
        "CREATE INDEX IF NOT EXISTS timesteps_lookup"
        " ON timesteps (run_id, module, series, rank, step)",
        # An integer id per (run, rank, name) of every scalar series: its rollups' key.
        f"CREATE TABLE IF NOT EXISTS series (id {serial}, run_id TEXT NOT NULL,"
        f" rank {integer} NOT NULL, name TEXT NOT NULL, UNIQUE (run_id, rank, name))",
        # Named scalars as the versions before store/named.py kept them: still read.
        f"CREATE TABLE IF NOT EXISTS scalars (series {integer} NOT NULL, step {integer} NOT NULL,"
        f" value {number}, PRIMARY KEY (series, step)){clustered}",
        f"CREATE TABLE IF NOT EXISTS epochs (run_id TEXT NOT NULL, rank {integer} NOT NULL,"
        f" epoch {integer}, step {integer}, t {number}, duration_s {number}, steps {integer},"
        " data TEXT)",
        "CREATE INDEX IF NOT EXISTS epochs_run_rank ON epochs (run_id, rank, epoch)",
        f"CREATE TABLE IF NOT EXISTS alerts (id {serial}, run_id TEXT NOT NULL,"
        f" rank {integer} NOT NULL, step {integer}, code TEXT, severity TEXT, state TEXT,"
        " subject TEXT, data TEXT)",
        "CREATE INDEX IF NOT EXISTS alerts_run ON alerts (run_id, id)",
        "CREATE TABLE IF NOT EXISTS run_keys (run_id TEXT NOT NULL, family TEXT NOT NULL,"
        " key TEXT NOT NULL, sub TEXT NOT NULL, PRIMARY KEY (run_id, family, key, sub))",
        # Min/max per block of 2**level steps of each series (store/rollups.py).
        f"CREATE TABLE IF NOT EXISTS rollups (series {integer} NOT NULL,"
        f" level {integer} NOT NULL, block {integer} NOT NULL, min_step {integer},"
        f" min_v {number}, max_step {integer}, max_v {number}, n {integer} NOT NULL,"
        f" PRIMARY KEY (series, level, block)){clustered}",
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        ARCHIVE_TABLE.format(number=number),
        # Runs started before the rollups existed in this database have none: their
        # history is read from the rows (store/reads.py).
        "INSERT INTO meta (key, value) VALUES ('rollups_from',"  # noqa: S608 (a float)
        f" '{time.time()!r}') ON CONFLICT DO NOTHING",
        *named_schema(integer, blob, serial, clustered),
        *chunk_schema(integer, blob, clustered),
        *set_rollup_schema(integer, blob, serial, clustered),
    ]


def dumps(value: Any) -> str:
    """Compact JSON of stored values (non-finite numbers are already strings).

    pydantic-core's encoder: about 3x faster than ``json.dumps`` on dicts of floats.
    """
    return to_json(value).decode()


_LITTLE = sys.byteorder == "little"


def pack_series(values: Any) -> bytes:
    """Float64 little-endian bytes; non-finite strings become NaN/inf floats. A series
    that came packed (``{"f64": ...}``, schema.PackedSeries) already is these bytes."""
    packed_bytes = getattr(values, "f64", None)
    if packed_bytes is not None:
        return bytes(packed_bytes)
    try:
        packed = array("d", values)
    except TypeError:
        packed = array("d", [NONFINITE_STRINGS[v] if isinstance(v, str) else v for v in values])
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def unpack_series(data: bytes) -> list[float]:
    """A packed series' values (little-endian float64)."""
    return floats(data)


@dataclass
class SplitBatch:
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    timesteps: list[tuple[Any, ...]] = field(default_factory=list)
    # Named scalars by name set (store/named.py).
    named: dict[tuple[str, ...], NamedGroup] = field(default_factory=dict)
    epochs: list[tuple[Any, ...]] = field(default_factory=list)
    alerts: list[tuple[Any, ...]] = field(default_factory=list)
    # Problems the batch's alerts open: what the runs list counts (docs/API.md).
    problems: int = 0
    ends: list[tuple[str, int | None, Any]] = field(default_factory=list)
    keys: set[tuple[str, str, str]] = field(default_factory=set)
    last_step: int | None = None
    last_epoch: int | None = None
    # The batch's column blocks, stored as chunks (store/chunks.py).
    chunks: Chunks | None = None


_NUMBERS = itemgetter(*NUMBER_FIELDS)


def opens_problem(record: Any) -> int:
    """1 when an alert record opens a problem (the runs list counts problems, not records).

    A sender that groups alerts by cause says so (``opens_problem``); for one that does
    not, each ``raised`` record without a ``problem`` counts.
    """
    if record.opens_problem is not None:
        return int(record.opens_problem)
    return int(record.problem is None and record.state == "raised")


_INTEGERS = itemgetter(*INTEGER_FIELDS)
_SCALARS = itemgetter(*SCALAR_FIELDS)
_NONES = (None,) * len(SCALAR_FIELDS)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else dumps(value)


def split_batch(
    batch: Any, scalar: Callable[[Any], Any], session: str = "", arrays: bool = False
) -> SplitBatch:
    """Rows of every table for one validated batch (its records, then its column
    blocks as chunks: store/chunks.py; ``arrays``: their rollup groups as numpy
    matrices, for the rollups per set of series)."""
    out = SplitBatch()
    run_id, rank = batch.run_id, batch.rank
    last_step = -1
    last_epoch = -1
    seen: tuple[bool, ...] = ()
    builder = NamedBuilder(scalar, out.keys)
    # Unique per (run, rank, step) row: the batch's seq and the record's place in it,
    # salted with the session, where a new trainer process counts seq from 0 again.
    uid = (zlib.crc32(session.encode()) & 0xFFFFF) << 43 if session else 0
    uid += batch.seq * MAX_RECORDS_PER_BATCH
    for record in batch.records:
        uid += 1
        kind = record.kind
        if kind == "step":
            step = record.step
            last_step = max(last_step, step)
            last_epoch = max(last_epoch, record.epoch)
            d = record.__dict__
            extra = record.__pydantic_extra__
            row = [run_id, rank, step, uid, record.epoch]
            # itemgetter and map: the fields in C, not a generator per record.
            row.extend(map(scalar, _NUMBERS(d)))
            row.extend(_INTEGERS(d))
            row.append(None if record.graph_truncated is None else int(record.graph_truncated))
            row.append(_json_or_none(record.nonfinite))
            row.append(dumps(extra) if extra else None)
            out.steps.append(tuple(row))
            builder.add(record, step, uid)
            if record.timesteps:
                for module, series_map in record.timesteps.items():
                    for series, values in series_map.items():
                        out.timesteps.append(
                            (run_id, rank, step, module, series, len(values), pack_series(values))
                        )
                        out.keys.add(("timesteps", module, series))
            # Fields rarely change between records: look at each new set once (the
            # named ones' keys are added by the builder, once per name set).
            present = tuple(map(is_not, _SCALARS(d), _NONES))
            if present != seen:
                seen = present
                out.keys.update(("scalar", f, "") for f in SCALAR_FIELDS if d[f] is not None)
        elif kind == "epoch":
            last_epoch = max(last_epoch, record.epoch)
            if record.step is not None:
                last_step = max(last_step, record.step)
            out.epochs.append(
                (
                    run_id,
                    rank,
                    record.epoch,
                    record.step,
                    scalar(record.t),
                    scalar(record.duration_s),
                    record.steps,
                    record.model_dump_json(exclude_none=True),
                )
            )
        elif kind == "alert":
            out.problems += opens_problem(record)
            out.alerts.append(
                (
                    run_id,
                    rank,
                    record.step,
                    record.code,
                    record.severity,
                    record.state,
                    record.subject,
                    record.model_dump_json(),
                )
            )
        else:  # end
            out.ends.append((record.status, record.step, record.t))
    out.named = builder.groups
    if batch.columns:
        out.chunks = Chunks()
        for block in batch.columns:
            step, epoch = add_block(out.chunks, block, run_id, rank, uid, scalar, out.keys, arrays)
            last_step, last_epoch = max(last_step, step), max(last_epoch, epoch)
            uid += block.n
    out.last_step = last_step if last_step >= 0 else None
    out.last_epoch = last_epoch if last_epoch >= 0 else None
    return out
